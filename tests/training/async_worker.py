"""Asynchronous rollout on 8 simulated CPU devices: ``python async_worker.py CKPT_DIR``.

The sampler on devices 0-3 (a (4, 1, 1) mesh), the trainer on devices 4-7 ((2, 2, 1)), GRPO with
``staleness=1`` on a tiny random model: the asynchronous run (the next step sampled in a
background thread during this step's update) against the synchronous one with the same
placement, and an asynchronous resume. Prints one JSON line.
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import hashlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from jaxrl_llm.data.pipeline import PromptBatch  # noqa: E402
from jaxrl_llm.models import ModelConfig, Transformer  # noqa: E402
from jaxrl_llm.parallel import DEFAULT_RULES, make_mesh  # noqa: E402
from jaxrl_llm.rewards import Rewards  # noqa: E402
from jaxrl_llm.rollout import Sampler, SamplingConfig  # noqa: E402
from jaxrl_llm.training import Checkpointer, RLTrainer, init_train_state, make_train_step, recipe  # noqa: E402
from jaxrl_llm.training.step import train_state_shardings  # noqa: E402

CFG = ModelConfig(vocab_size=33, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=64)
PROMPTS = [[1, 2, 3, 4], [4, 3, 2], [5, 6], [2, 2, 2, 2], [3, 1], [6, 5, 4], [1, 1], [2, 5, 3]]


class Tok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(int(i)) for i in ids)


class Data:
    def __init__(self):
        self.pos = 0

    def __next__(self):
        idx = [(self.pos + i) % len(PROMPTS) for i in range(4)]
        self.pos += 4
        ids = [list(PROMPTS[i]) for i in idx]
        return PromptBatch(ids, [str(p) for p in ids], ids, {}, [f"toy:{i}" for i in idx])

    def get_state(self):
        return {"pos": self.pos}

    def set_state(self, state):
        self.pos = state["pos"]


def reward(prompts, completions, completion_ids, **_):
    return [sum(t == 7 for t in ids) / 8 for ids in completion_ids]


devs = jax.devices()
SAMPLER_MESH = make_mesh((4, 1, 1), devices=devs[:4])
TRAIN_MESH = make_mesh((2, 2, 1), devices=devs[4:])
GD, PARAMS = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
OPT = optax.adam(3e-2)
REC = recipe("grpo", num_samples=4, old_logp="recompute", is_weights="icepop")
STATE0 = init_train_state(PARAMS, OPT, seed=0)
ST_SH = train_state_shardings(OPT, STATE0, TRAIN_MESH)
STEP = make_train_step(GD, OPT, REC.objective, state_shardings=ST_SH)
SAMPLER = Sampler(GD, SamplingConfig(max_new_tokens=8, num_samples=4), length_buckets=(8,), mesh=SAMPLER_MESH,
                  param_rules=DEFAULT_RULES)


def trainer(asynchronous, ckpt=None):
    state = jax.device_put(STATE0, ST_SH)
    tr = RLTrainer(GD, state, STEP, SAMPLER, Data(), Rewards([reward]), REC, Tok(), seed=3, staleness=1,
                   asynchronous=asynchronous)
    if ckpt is not None:
        tr.checkpointer = Checkpointer(ckpt, keep_last=1)
    return tr


def digest(tree):
    return hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in jax.tree.leaves(jax.device_get(tree)))).hexdigest()


def summary(tr):
    keep = [{k: v for k, v in h.items() if not k.startswith(("time/", "async/")) and not k.endswith("/seconds")
             and k != "tokens_per_s"}
            for h in tr.history]
    return digest(tr.state.params), keep


def main(ckpt):
    sync = trainer(False)
    sync.run(3)
    asy = trainer(True)
    asy.run(3)
    # asynchronous resume: 2 steps (a rollout read ahead when the checkpoint is written), then a
    # fresh trainer restores and runs to 3
    first = trainer(True, ckpt)
    first.run(2)
    resumed = trainer(True, ckpt)
    resumed.restore()
    resumed.run(3)
    placed = {str(sorted(d.id for d in x.devices())) for x in jax.tree.leaves(asy.state.params)}
    overlap = [h.get("async/overlap_s") for h in asy.history]
    print(json.dumps({"sync": summary(sync), "async": summary(asy), "resumed": summary(resumed),
                      "overlap": overlap, "sample_s": [h.get("async/sample_s") for h in asy.history],
                      "intervals": [[h.get("async/sample_start"), h.get("async/sample_end"), h.get("async/update_start"),
                                     h.get("async/update_end")] for h in asy.history],
                      "trainer_devices": sorted(placed)}))


if __name__ == "__main__":
    main(sys.argv[1])

"""A tiny RL run for the resume tests: ``python rl_worker.py OUT_DIR STEPS [KILL_AT]``.

Tiny random Llama-style model with the SmolLM2 tokenizer, GRPO on one-digit addition, 4
prompts x 4 samples, 8 new tokens; checkpoints every 2 iterations. With KILL_AT, the process
SIGKILLs itself right after logging that iteration, once the saves already started are
committed (so a kill at iteration 3 deterministically leaves step 2, whatever the machine's load:
an asynchronous save of step 2 still in flight at iteration 3 would otherwise die with the process
and the resume would start from 0; a kill during a save is the damaged-checkpoint tests' case).
Prints a JSON line with the final params' digest.
"""

import hashlib
import json
import os
import signal
import sys

import gguf
import jax
import numpy as np
import optax
from flax import nnx

from jaxrl_llm.data import ListSource, PromptDataConfig, prompt_dataset
from jaxrl_llm.models import ModelConfig, Transformer, gguf_tokenizer, smollm2_path
from jaxrl_llm.rewards import Rewards
from jaxrl_llm.rollout import Sampler, SamplingConfig
from jaxrl_llm.tasks import get_task
from jaxrl_llm.training import Checkpointer, RLTrainer, init_train_state, make_train_step, recipe


def text_reward(prompts, completions, **_):
    """Varies with the sampled text (the random model never solves the task): real updates."""
    return [(len(c) % 5) / 4 for c in completions]


def main(out: str, steps: int, kill_at: int | None):
    tok = gguf_tokenizer(gguf.GGUFReader(str(smollm2_path())))
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                      intermediate_size=64)
    gd, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    rec = recipe("grpo", num_samples=4, num_minibatches=2)
    opt = optax.adam(1e-3)
    state = init_train_state(params, opt, seed=0)
    task = get_task("arithmetic", preset="add1")
    data = prompt_dataset(ListSource(task.rows("train", 64, seed=0)), tok,
                          PromptDataConfig(batch_size=4, chat=False, seed=3), process_index=0, process_count=1)
    sampler = Sampler(gd, SamplingConfig(max_new_tokens=8, num_samples=4, pad_token_id=tok.pad_token_id,
                                         stop_token_ids=(tok.eos_token_id,)), length_buckets=(32,))
    ckpt = Checkpointer(out, keep_last=2)
    log = None
    if kill_at is not None:
        def log(m):
            if m["iteration"] == kill_at:
                ckpt.wait()
                os.kill(os.getpid(), signal.SIGKILL)
    trainer = RLTrainer(gd, state, make_train_step(gd, opt, rec.objective), sampler, data, Rewards([task.reward, text_reward]),
                        rec, tok, seed=5, checkpointer=ckpt, checkpoint_every=2, log_fn=log)
    trainer.restore()
    resumed = trainer.iteration
    trainer.run(steps)
    leaves = jax.tree.leaves(jax.device_get(trainer.state))
    digest = hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in leaves)).hexdigest()
    print(json.dumps({"digest": digest, "resumed_from": resumed, "iteration": trainer.iteration,
                      "rewards": [h["rewards/total/mean"] for h in trainer.history]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)

"""Run with 8 simulated CPU devices: the planner's per-device memory against what the same
compiled train step (``train``) or sampler (``sampler``) really uses. Prints one JSON line.

Usage: ``plan_worker.py DATA,FSDP,TENSOR[,EXPERT] train|sampler [moe|moe-capacity]`` (a mixture
of experts, its experts split over the fourth mesh axis; dropless, or capacity factor 1.25).

"Really uses" is measured from the process's resident memory (``/proc/self/statm``), which
on simulated CPU devices holds every device's buffers: the state (params, optimiser state,
batch; or the sampler's params and prompts) put on the mesh, divided by the device count, against the planner's shard sums; and
the peak while the step runs (sampled every 0.2 ms by a thread), divided by the device
count, against the planner's peak (arguments + outputs - donated + temporaries).

Run it with ``MALLOC_ARENA_MAX=1`` (the test does): with glibc's per-thread arenas the 8
device threads keep memory XLA has freed, and the resident size overstates the program's.
"""

import gc
import json
import os
import sys
import threading
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from jaxrl_llm.models import ModelConfig  # noqa: E402
from jaxrl_llm.parallel import init_sharded  # noqa: E402
from jaxrl_llm.plan import PlanSpec, plan  # noqa: E402
from jaxrl_llm.training import TrainState  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


mesh = tuple(int(x) for x in sys.argv[1].split(","))
mode = sys.argv[2]
CFG = ModelConfig(vocab_size=16384, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64,
                  intermediate_size=1536, tie_embeddings=True, max_position_embeddings=1024)
if len(sys.argv) > 3 and sys.argv[3].startswith("moe"):  # most of the weights in 16 experts, top-2
    # 4 layers, not 8: the 8 simulated devices' buffers all live in this one process, and the
    # default suite runs it beside another test worker (8 layers and 512-wide experts peaked at
    # 9.9 GB resident)
    CFG = CFG.replace(family="qwen3_moe", qk_norm=True, num_layers=4, num_experts=16, num_experts_per_tok=2,
                      moe_intermediate_size=256, norm_topk_prob=True,
                      moe_capacity_factor=1.25 if sys.argv[3] == "moe-capacity" else None)
spec = PlanSpec(model=CFG, mesh=mesh, rows=16, seq_len=256, prompts=8 if mode == "sampler" else 0, num_samples=8,
                prompt_len=64, new_tokens=192, optimizer="adamw")
report = plan(spec, return_compiled=True)
compiled, st_sh, b_sh, mesh_, gd, opt, _ = report.pop("_compiled")
gc.collect()
base = rss()

# created in place on the mesh: an unsharded copy on one device would stay in the allocator
_, params = nnx.split(init_sharded(CFG, mesh_, seed=0))
rng = np.random.default_rng(0)
if mode == "train":
    t = report["train_step"]
    planned_state, planned_peak = t["params"] + t["opt_state"] + t["batch"], t["compiled_peak"]
    state = TrainState(params, jax.jit(opt.init, out_shardings=st_sh.opt_state)(params),
                       *jax.device_put((np.int32(0), np.asarray(jax.random.key_data(jax.random.key(0))), np.int32(0)),
                                       (st_sh.step, st_sh.key, st_sh.skipped)))
    B, L = spec.rows, spec.seq_len
    lm = np.zeros((B, L - 1), bool)
    lm[:, 64:] = True
    args = (state, jax.device_put({"tokens": rng.integers(0, CFG.vocab_size, (B, L)).astype(np.int32),
                                   "mask": np.ones((B, L), bool), "loss_mask": lm,
                                   "old_logp": np.where(lm, -5.0, 0.0).astype(np.float32),
                                   "advantages": np.where(lm, rng.standard_normal((B, 1)), 0.0).astype(np.float32)},
                                  b_sh))
else:
    s = report["sampler"]
    planned_state, planned_peak = s["params"], s["compiled_peak"]
    gcomp, p_sh, tok_sh = report.pop("_compiled_sampler")
    compiled = gcomp
    shape = (spec.prompts, spec.prompt_len)
    args = (params, jax.device_put(rng.integers(1, CFG.vocab_size, shape).astype(np.int32), tok_sh),
            jax.device_put(np.ones(shape, bool), tok_sh), jax.random.key(0))
del params
jax.block_until_ready(args)
gc.collect()
resident = rss()

peak = [resident]
running = [True]


def watch():
    while running[0]:
        peak[0] = max(peak[0], rss())
        time.sleep(0.0002)


w = threading.Thread(target=watch)
w.start()
out = compiled(*args)
jax.block_until_ready(out)
running[0] = False
w.join()
if mode == "train":
    assert np.isfinite(float(out[1]["loss"])), out[1]
else:
    assert out.tokens.shape == (spec.prompts * spec.num_samples, spec.new_tokens), out.tokens.shape
n = int(np.prod(mesh))
print(json.dumps({"mesh": mesh, "mode": mode, "planned_state": planned_state, "measured_state": (resident - base) / n,
                  "planned_peak": planned_peak, "measured_peak": (peak[0] - base) / n}))

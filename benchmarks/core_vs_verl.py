"""Side-by-side: one GRPO loss evaluation + gradient, jaxrl_llm (jit, XLA:CPU) vs verl 0.9.1 (torch CPU).

The work measured is what a trainer does per micro-batch once the forward pass has produced
per-token logprobs: GRPO advantages from sequence rewards, the clip-higher PPO loss with dual
clip, token-mean aggregation, a k3 KL term against the reference, and the gradient with
respect to the logprobs. Both sides get the same float32 inputs; the verl side runs in the
peer interpreter (.venv-peers) in a subprocess, one after the other on the same machine.

Run: ``.venv/bin/python benchmarks/core_vs_verl.py [--repeats 7]``; it prints a Markdown table
and, with ``--write``, replaces the "core_vs_verl" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxrl_llm as jl

sys.path.insert(0, str(Path(__file__).parent))
from _report import write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(64, 512, 8), (256, 1024, 8), (512, 2048, 16)]  # (B, T, G)

VERL_SIDE = r'''
import json, sys, time, statistics, numpy as np, torch
from verl.trainer.ppo import core_algos as ca
from verl.workers.config import ActorConfig
torch.set_num_threads(int(sys.argv[3]))
d = np.load(sys.argv[1])
reps = int(sys.argv[2])
lp0, old, ref, m, s, gid = (torch.tensor(d[k]) for k in ("lp", "old", "ref", "mask", "scores", "gid"))
B, T = lp0.shape
cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_mini_batch_size=B, ppo_micro_batch_size_per_gpu=B,
                  clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
pl = ca.get_policy_loss_fn("vanilla")
def step():
    tr = torch.zeros(B, T); tr[:, -1] = s
    adv, _ = ca.compute_grpo_vectorized_outcome_advantage(tr, m, gid.numpy())
    lp = lp0.clone().requires_grad_(True)
    loss, _ = pl(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=m, loss_agg_mode="token-mean", config=cfg)
    kl = ca.agg_loss(ca.kl_penalty(lp, ref, "low_var_kl"), m, "token-mean")
    (loss + 0.04 * kl).backward()
    return lp.grad
step()
times = []
for _ in range(reps):
    t0 = time.perf_counter(); g = step(); times.append(time.perf_counter() - t0)
np.save(sys.argv[1] + ".grad.npy", g.numpy())
print(json.dumps({"median": statistics.median(times), "torch": torch.__version__, "threads": torch.get_num_threads()}))
'''


def ours(lp, old, ref, m, s, gid, g):
    adv = jl.grpo_advantages(s, m, gid, g)
    pg, _ = jl.ppo_clip_loss(lp, old, adv, m, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    kl = jl.kl_penalty(lp, ref, "low_var_kl")
    return jl.aggregate(pg, m, "token-mean") + 0.04 * jl.aggregate(kl, m, "token-mean")


def bench(b, t, group, reps):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, t + 1, b)
    m = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
    lp = np.log(rng.uniform(0.01, 0.99, (b, t))).astype(np.float32)
    old = (lp + rng.normal(0, 0.2, (b, t))).astype(np.float32)
    ref = (lp + rng.normal(0, 0.2, (b, t))).astype(np.float32)
    s = rng.integers(0, 2, b).astype(np.float32)
    gid = np.repeat(np.arange(b // group), group).astype(np.int32)
    ng = b // group
    f = jax.jit(jax.grad(ours), static_argnums=6)
    args = [jnp.asarray(x) for x in (lp, old, ref, m, s, gid)]
    g = f(*args, ng).block_until_ready()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f(*args, ng).block_until_ready()
        times.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "in.npz")
        np.savez(path, lp=lp, old=old, ref=ref, mask=m, scores=s, gid=gid)
        exe = os.environ.get("JAXRL_LLM_PEER_PYTHON", str(ROOT / ".venv-peers/bin/python"))
        out = subprocess.run([exe, "-c", VERL_SIDE, path, str(reps), str(os.cpu_count())], capture_output=True,
                             text=True, check=True)
        verl = json.loads(out.stdout.strip().splitlines()[-1])
        g_verl = np.load(path + ".grad.npy")
    err = float(np.max(np.abs(np.asarray(g) - g_verl)) / np.max(np.abs(g_verl)))
    return statistics.median(times), verl, err


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--write", action="store_true")
    a = p.parse_args()
    rows = []
    for b, t, group in SHAPES:
        ours_s, verl, err = bench(b, t, group, a.repeats)
        rows.append(f"| {b} x {t} (G={group}) | {ours_s * 1e3:.2f} | {verl['median'] * 1e3:.2f} | "
                    f"{verl['median'] / ours_s:.1f}x | {err:.1e} |")
        print(rows[-1], flush=True)
    body = (f"GRPO advantages + clip-higher PPO loss (dual clip) + k3 KL, token-mean, and the "
            f"gradient w.r.t. the logprobs, per micro-batch. Median of {a.repeats} runs after warm-up; jaxrl_llm "
            f"jitted on XLA:CPU (jax {jax.__version__}), verl 0.9.1 eager on torch {verl['torch']} "
            f"({verl['threads']} threads), float32, same inputs, same run. Machine: {platform.machine()}, "
            f"{os.cpu_count()} cores. Reproduce: `.venv/bin/python benchmarks/core_vs_verl.py --write`.\n\n"
            "| batch (B x T) | jaxrl_llm ms | verl ms | speed-up | max grad diff / max grad |\n|---|---|---|---|---|\n"
            + "\n".join(rows))
    print(body)
    if a.write:
        write_section("core_vs_verl", body)

if __name__ == "__main__":
    sys.exit(main())

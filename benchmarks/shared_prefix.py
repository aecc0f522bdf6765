"""Prefix Grouper in the update: the time it saves as a curve over the prompt length.

Each prompt has ``G = 8`` completions of ``T = 128`` tokens; the batch is ``B`` prompts. Two
jitted programs are timed with and without ``rows_per_prompt`` (train.shared_prefix):

- ``logp``: the forward log-prob pass the loop runs for the old and the reference log-probs
  (``jaxrl_llm.training.providers.policy_logp``);
- ``step``: the whole train step (GRPO's clipped surrogate, its gradient and AdamW,
  ``make_train_step``), what one optimiser update costs.

Both take the same rows; the grouped program encodes each prompt once. Reported: medians of
``--repeats`` calls after one warm-up call, the ratio, and XLA's temporary memory of each compiled
step (``memory_analysis``). Models: the ~8M-parameter Qwen2-style model of ``rollout_vs_hf.py``
(random weights) and the embedded SmolLM2-135M-Instruct.

Run: ``.venv/bin/python benchmarks/shared_prefix.py [--models qwen2-8m,smollm2] [--repeats 3] [--write]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, write_section  # noqa: E402

import jaxrl_llm as jl  # noqa: E402
from jaxrl_llm.models import ModelConfig, Transformer  # noqa: E402
from jaxrl_llm.training import PolicyObjective, init_train_state, make_train_step  # noqa: E402
from jaxrl_llm.training.providers import policy_logp  # noqa: E402

G, T = 8, 128
# SmolLM2's row-by-row step at 4 x 8 x (64 + 128) already needs 17 GB of XLA temporaries; longer
# prompts do not fit a 24 GiB machine (--lengths to try)
LENGTHS = {"qwen2-8m": (32, 64, 128, 256, 512), "smollm2": (64,)}
PROMPTS = {"qwen2-8m": 8, "smollm2": 4}


def model(name: str):
    if name == "qwen2-8m":
        cfg = ModelConfig(family="qwen2", vocab_size=16384, hidden_size=256, num_layers=6, num_heads=8, num_kv_heads=2,
                          head_dim=32, intermediate_size=768, qkv_bias=True, tie_embeddings=True,
                          max_position_embeddings=1024)
        return nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    from jaxrl_llm.models import load_smollm2

    m, _ = load_smollm2()
    return nnx.split(m)


def batch(vocab: int, b: int, p: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    n = b * G
    prompts = rng.integers(1, vocab, (b, p))
    tokens = np.concatenate([np.repeat(prompts, G, axis=0), rng.integers(1, vocab, (n, T))], axis=1).astype(np.int32)
    mask = np.ones(tokens.shape, bool)
    loss_mask = np.zeros((n, p + T - 1), bool)
    loss_mask[:, p - 1:] = True
    return {"tokens": tokens, "mask": mask, "loss_mask": loss_mask,
            "old_logp": np.full(loss_mask.shape, -2.0, np.float32) * loss_mask,
            "advantages": rng.normal(0, 1, loss_mask.shape).astype(np.float32) * loss_mask,
            "prefix_mask": mask[:, :p]}


def median(fn, repeats: int) -> float:
    jax.block_until_ready(fn())  # warm-up (compiles)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(name: str, repeats: int, lengths=None) -> list[dict]:
    gd, params = model(name)
    cfg = nnx.merge(gd, params).cfg
    opt = optax.adamw(1e-6, weight_decay=0.0)
    rows = []
    for p in lengths or LENGTHS[name]:
        b = batch(cfg.vocab_size, PROMPTS[name], p)
        row = {"model": name, "P": p, "B": PROMPTS[name]}
        for r in (0, G):
            obj = PolicyObjective(jl.ppo_clip_loss, (("clip_low", 0.2), ("clip_high", 0.2)), rows_per_prompt=r)
            args = {k: jnp.asarray(b[k]) for k in obj.batch_keys()}
            kw = dict(prompt_len=p, rows_per_prompt=r) if r else {}
            row[f"logp_{r}"] = median(lambda: policy_logp(gd, 128, 1.0, False, params, (), args["tokens"],
                                                          args["mask"], **kw), repeats)
            step = make_train_step(gd, opt, obj, donate=False)
            state = init_train_state(params, opt)
            mem = step.lower(state, args).compile().memory_analysis()
            row[f"temp_mb_{r}"] = getattr(mem, "temp_size_in_bytes", 0) / 2 ** 20
            row[f"step_{r}"] = median(lambda: step(state, args), repeats)
        print(row, flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| model | B x G | prompt P | new T | logp row-by-row (s) | logp grouped (s) | ratio | step row-by-row (s) "
           "| step grouped (s) | ratio | step temp memory (MB) row-by-row / grouped |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['B']} x {G} | {r['P']} | {T} | {r['logp_0']:.3f} | {r[f'logp_{G}']:.3f} | "
                   f"{r['logp_0'] / r[f'logp_{G}']:.2f}x | {r['step_0']:.3f} | {r[f'step_{G}']:.3f} | "
                   f"{r['step_0'] / r[f'step_{G}']:.2f}x | {r['temp_mb_0']:.0f} / {r[f'temp_mb_{G}']:.0f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen2-8m,smollm2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lengths", default="", help="prompt lengths, e.g. 64,256 (default: per model)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    lengths = tuple(int(x) for x in args.lengths.split(",")) if args.lengths else None
    rows = []
    for name in args.models.split(","):
        rows += measure(name, args.repeats, lengths)
    body = (f"`.venv/bin/python benchmarks/shared_prefix.py --models {args.models} --repeats {args.repeats} --write` "
            f"({machine()}, {time.strftime('%Y-%m-%d')}; float32, medians of {args.repeats} calls after a warm-up "
            f"call).\n\nEach prompt's {G} completions of {T} tokens; `logp` is the old/reference log-prob pass, `step` "
            f"the whole GRPO train step (gradient and AdamW). Grouped = `train.shared_prefix` (each prompt encoded once "
            f"per pass, Prefix Grouper).\n\n" + table(rows))
    print(body)
    if args.write:
        write_section("Prefix Grouper in the update (train.shared_prefix)", body)


if __name__ == "__main__":
    main()

"""Decode throughput: jaxrl_llm's sampler vs ``transformers`` ``generate`` (torch CPU), same run.

Same model weights on both sides, 64-token prompts, 128 new tokens (HF: ``min_new_tokens`` so
that no row stops early; ours: no stop token), plain sampling at temperature 1 (HF's default
top-k of 50 switched off: equal work), ``G = 8`` completions per prompt (HF:
``num_return_sequences``): batch 8 = 1 prompt x 8, batch 32 = 4 prompts x 8. Our sampler
prefills each prompt once; HF prefills every row. Times are medians of ``--repeats`` runs
after a warm-up run (ours: after compilation, which is reported separately). Utilisation:
model FLOPs per run (2 x non-embedding parameters x tokens + LM head + attention) over the
time, relative to a float32 2048^3 matmul measured in the same run (XLA:CPU).

Models: a ~8M-parameter Qwen2-style model (random weights) and the embedded
SmolLM2-135M-Instruct (float32; bfloat16 on both sides; ours float32 weights decoded in bfloat16 against HF
in bfloat16). ``--distinct`` (default on) adds batches of 8 and 32 distinct prompts, greedy, one completion
each. ``--unroll true|false|auto`` unrolls or scans our sampler's layers (default auto: its own rule).

``--grid``: instead, distinct prompts only (greedy, one completion each) over a grid of
random-weight Qwen2-style models of 4 layers: hidden sizes 64, 256 and 576 (SmolLM2's width and
heads) x vocabularies 8,192 and 49,152 x batches 8 and 32 (issue 38's acceptance range).

Run: ``.venv/bin/python benchmarks/rollout_vs_hf.py [--repeats 3] [--write]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).parent))
from _report import machine, write_section  # noqa: E402

from jaxrl_llm.models import load_hf, load_smollm2, smollm2_path  # noqa: E402
from jaxrl_llm.rollout import SamplingConfig, Sampler  # noqa: E402

P, T, G = 64, 128, 8


#: --grid models: hidden -> (heads, kv heads, head_dim, intermediate); 576 is SmolLM2-135M's layout
GRID_WIDTHS = {64: (4, 2, 16, 192), 256: (8, 2, 32, 768), 576: (9, 3, 64, 1536)}
GRID_VOCABS = (8192, 49152)


def qwen2_grid(tmp: Path, hidden: int, vocab: int, layers: int = 4):
    """A random Qwen2-style model of the grid's widths, saved for both sides (``qwen2-8m``: hidden
    256, vocabulary 16,384, 6 layers)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    heads, kv, head_dim, inter = GRID_WIDTHS[hidden]
    cfg = AutoConfig.for_model("qwen2", vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                               num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                               intermediate_size=inter, tie_word_embeddings=True, max_position_embeddings=512)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg).float().eval()
    m.save_pretrained(str(tmp))
    return m


def grid(a, peak: float) -> None:
    """The --grid sweep (module docstring); its own section of docs/benchmarks.md."""
    import torch

    rows_out = []
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for hidden in GRID_WIDTHS:
            for vocab in GRID_VOCABS:
                d = Path(tmp) / f"h{hidden}v{vocab}"
                hf = qwen2_grid(d, hidden, vocab)
                ours = load_hf(d)
                total, _ = n_params(ours)
                for batch in (8, 32):
                    prompts = rng.integers(3, vocab, (batch, P))
                    t_ours, first = run_ours(ours, prompts, a.repeats, 1, True, None, "auto")
                    t_hf = run_hf(hf, prompts, a.repeats, 1, True)
                    row = (f"| {hidden} | {vocab} | {total / 1e6:.1f}M | {batch} | {t_hf:.3f} | {t_ours:.3f} | "
                           f"{t_hf / t_ours:.2f}x | {1e3 * t_ours / T:.2f} | {first:.1f} |")
                    rows_out.append(row)
                    print(row, flush=True)
                del hf, ours
    body = ("Decode of distinct prompts across model sizes: `jaxrl_llm.rollout.Sampler` with its defaults vs "
            f"`transformers` `generate` (torch {torch.__version__}, 2 threads), same weights, same run. Random "
            "Qwen2-style models of 4 layers (hidden 64: 4 heads of 16, 2 KV heads; 256: 8 of 32, 2 KV; 576: 9 of "
            "64, 3 KV, SmolLM2's), tied embeddings, float32; B distinct 64-token prompts, one greedy completion "
            "each, exactly 128 new tokens. Medians of "
            f"{a.repeats} runs after a warm-up run; ms/token = our time / 128 decode steps (prefill included). "
            f"Machine: {machine()} (float32 2048^3 matmul: {peak:.0f} GFLOP/s). "
            f"Reproduce: `.venv/bin/python benchmarks/rollout_vs_hf.py --grid --repeats {a.repeats} --write`.\n\n"
            "| hidden | vocab | params | batch | HF s | ours s | speed-up | ours ms/step | ours first call s |\n"
            "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows_out))
    print(body)
    if a.write:
        write_section("rollout_vs_hf (grid of distinct-prompt decodes)", body)


def qwen2_8m(tmp: Path):
    """The ~8M-parameter Qwen2-style model of the benchmarks (random weights), saved; the HF model."""
    return qwen2_grid(tmp, 256, 16384, layers=6)


def n_params(model) -> tuple[int, int]:
    _, params = nnx.split(model)
    total = sum(x.size for x in jax.tree.leaves(params))
    return total, model.cfg.vocab_size * model.cfg.hidden_size


def flops(model, rows: int, prompts: int) -> float:
    total, emb = n_params(model)
    cfg = model.cfg
    body = total - emb * (1 if cfg.tie_embeddings else 2)
    lm = 2 * cfg.hidden_size * cfg.vocab_size
    attn_tok = lambda ctx: 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * ctx  # noqa: E731
    prefill = prompts * P * (2 * body) + prompts * sum(attn_tok(c) for c in range(1, P + 1)) + prompts * lm
    decode = rows * T * (2 * body + lm) + rows * sum(attn_tok(P + c) for c in range(1, T + 1))
    return prefill + decode


def matmul_gflops() -> float:
    a = jnp.ones((2048, 2048), jnp.float32)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        f(a, a).block_until_ready()
        ts.append(time.perf_counter() - t0)
    return 2 * 2048 ** 3 / statistics.median(ts) / 1e9


def run_ours(model, prompts: np.ndarray, repeats: int, g: int = G, greedy: bool = False, weight_dtype=None,
             unroll="auto"):
    gd, params = nnx.split(model)
    sampler = Sampler(gd, SamplingConfig(max_new_tokens=T, num_samples=g, greedy=greedy, weight_dtype=weight_dtype),
                      length_buckets=(P,), unroll_layers=unroll)
    plist = [list(p) for p in prompts]
    t0 = time.perf_counter()
    out = sampler(params, plist, jax.random.key(0))

    first = time.perf_counter() - t0
    ts = []
    for i in range(repeats):
        t0 = time.perf_counter()
        out = sampler(params, plist, jax.random.key(i + 1))

        ts.append(time.perf_counter() - t0)
    assert int(out.lengths.min()) == T
    return statistics.median(ts), first


def run_hf(model, prompts: np.ndarray, repeats: int, g: int = G, greedy: bool = False):
    import torch

    ids = torch.tensor(prompts.astype(np.int64))
    sampling = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    kw = dict(**sampling, max_new_tokens=T, min_new_tokens=T, num_return_sequences=g,
              attention_mask=torch.ones_like(ids), pad_token_id=model.config.eos_token_id or 0)
    with torch.no_grad():
        model.generate(ids, **kw)
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            ts.append(time.perf_counter() - t0)
    assert out.shape == (len(prompts) * g, P + T)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--models", default="qwen2-8m,smollm2,smollm2-bf16,smollm2-bf16w",
                    help="qwen2-8m, smollm2 (float32), smollm2-bf16 (both in bfloat16), smollm2-bf16w (ours: float32 "
                         "weights decoded in bfloat16; HF in bfloat16)")
    ap.add_argument("--distinct", action="store_true", default=True,
                    help="also batches of distinct prompts, one greedy completion each (default on)")
    ap.add_argument("--no-distinct", dest="distinct", action="store_false")
    ap.add_argument("--unroll", choices=("auto", "true", "false"), default="auto",
                    help="our sampler's layers: unrolled, scanned, or its own rule (auto: scanned for float32 "
                         "models above 128 MiB)")
    ap.add_argument("--grid", action="store_true", help="the distinct-prompt grid over model sizes (docstring)")
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    if a.grid:
        return grid(a, matmul_gflops())
    unroll = {"auto": "auto", "true": True, "false": False}[a.unroll]
    unroll_text = {"auto": "the sampler's auto rule (scanned for float32 SmolLM2, unrolled otherwise)",
                   "true": "unrolled", "false": "scanned"}[a.unroll]
    peak = matmul_gflops()
    rows_out = []
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            weight_dtype = None
            if name == "qwen2-8m":
                hf = qwen2_8m(Path(tmp) / "q")
                ours = load_hf(Path(tmp) / "q")
            elif name in ("smollm2", "smollm2-bf16", "smollm2-bf16w"):
                # smollm2-bf16: both sides' models in bfloat16; smollm2-bf16w: ours keeps float32 weights
                # and decodes with them cast to bfloat16 (SamplingConfig.weight_dtype), HF in bfloat16
                bf16 = name != "smollm2"
                dt = "bfloat16" if name == "smollm2-bf16" else "float32"
                weight_dtype = "bfloat16" if name == "smollm2-bf16w" else None
                ours, _ = load_smollm2(param_dtype=dt, dtype=dt)
                p = smollm2_path()
                hf = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name,
                                                          dtype=torch.bfloat16 if bf16 else torch.float32).eval()
            else:
                raise SystemExit(f"unknown model {name!r}")
            total, _ = n_params(ours)
            shapes = [(8, G, False), (32, G, False)] + ([(8, 1, True), (32, 1, True)] if a.distinct else [])
            for batch, g, greedy in shapes:
                prompts = rng.integers(3, ours.cfg.vocab_size, (batch // g, P))
                t_ours, first = run_ours(ours, prompts, a.repeats, g, greedy, weight_dtype, unroll)
                t_hf = run_hf(hf, prompts, a.repeats, g, greedy)
                util = flops(ours, batch, batch // g) / t_ours / 1e9 / peak
                what = f"{batch // g} x {g} sampled" if g > 1 else f"{batch} distinct, greedy"
                row = (f"| {name} ({total / 1e6:.0f}M) | {batch} ({what}) | {t_hf:.2f} | {t_ours:.2f} | "
                       f"{t_hf / t_ours:.2f}x | {batch * T / t_ours:.0f} | {util:.0%} | {first:.0f} |")
                rows_out.append(row)
                print(row, flush=True)
            del hf
    body = ("Decode throughput of `jaxrl_llm.rollout.Sampler` vs `transformers` `generate` (torch "
            f"{torch.__version__}, 2 threads) on the same weights, same run: 64-token prompts, 128 new tokens, "
            "temperature-1 sampling without top-k/top-p, G = 8 completions per prompt (batch 8 = 1 prompt, "
            "batch 32 = 4 prompts); and batches of distinct prompts with one greedy completion each (no prefix "
            "shared: both sides prefill every row). smollm2-bf16w: ours keeps the float32 weights and decodes with "
            "them cast to bfloat16 (`SamplingConfig.weight_dtype`), against HF in bfloat16. "
            f"Our sampler's layers: {unroll_text}. "
            f"Medians of {a.repeats} runs after warm-up; utilisation = model FLOPs / time / "
            f"matmul rate ({peak:.0f} GFLOP/s for a float32 2048^3 matmul in this run). Machine: {machine()}. "
            f"Reproduce: `.venv/bin/python benchmarks/rollout_vs_hf.py --models {a.models}"
            f"{'' if a.distinct else ' --no-distinct'}{'' if a.unroll == 'auto' else ' --unroll ' + a.unroll}"
            f" --repeats {a.repeats} --write`.\n\n"
            "| model | batch (prompts) | HF s | ours s | speed-up | ours tokens/s | ours utilisation | ours first call s "
            "(compile + run) |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(rows_out))
    print(body)
    if a.write:  # the default models' section, or one of its own for another selection
        default = ap.get_default("models")
        write_section("rollout_vs_hf" if a.models == default and a.distinct and a.unroll == "auto" else
                      f"rollout_vs_hf ({a.models}{'' if a.distinct else ', no distinct'}"
                      f"{'' if a.unroll == 'auto' else ', unroll ' + a.unroll})", body)


if __name__ == "__main__":
    main()

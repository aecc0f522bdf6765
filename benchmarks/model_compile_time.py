"""Compile time of the model's forward (and forward + backward) against depth.

Layers are scanned, so the compiled program is the same for 2, 8 or 32 layers and compile
time stays flat. Model: SmolLM2-135M dimensions (d=576, 9/3 heads, vocab 49152) with the
layer count varied; batch 4 x 256 tokens, float32. Times are ``lower + compile`` with the
caches cleared between repeats (median of 3). Nothing is executed.

Run: ``.venv/bin/python benchmarks/model_compile_time.py [--write]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, str(Path(__file__).parent))
from _report import machine, write_section  # noqa: E402

from jaxrl_llm.models import Transformer, preset, token_logprobs  # noqa: E402

B, T = 4, 256


def compile_seconds(layers: int, backward: bool, repeats: int = 3) -> tuple[float, int]:
    cfg = preset("smollm2-135m", num_layers=layers)
    gd, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    tok = jax.ShapeDtypeStruct((B, T), jnp.int32)

    def fwd(p, t):
        return nnx.merge(gd, p)(t)[0]

    def loss(p, t):
        m = nnx.merge(gd, p)
        h, _ = m(t)
        return -jnp.mean(token_logprobs(h[:, :-1], m.unembedding(), t[:, 1:], with_entropy=False)[0])

    fn = jax.grad(loss) if backward else fwd
    times, ops = [], 0
    for _ in range(repeats):
        jax.clear_caches()
        t0 = time.perf_counter()
        lowered = jax.jit(fn).lower(params, tok)
        lowered.compile()
        times.append(time.perf_counter() - t0)
        ops = sum(1 for line in lowered.as_text().splitlines() if "=" in line)
    return sorted(times)[len(times) // 2], ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    rows = []
    for layers in (2, 8, 32):
        f, ops = compile_seconds(layers, False)
        g, _ = compile_seconds(layers, True)
        rows.append(f"| {layers} | {f:.2f} | {g:.2f} | {ops} |")
        print(rows[-1], flush=True)
    body = ("Compile time of the scanned model against depth (SmolLM2-135M dimensions, batch 4 x 256, float32; "
            "`lower` + `compile`, median of 3 with caches cleared; nothing executed). Machine: "
            f"{machine()}. Reproduce: `.venv/bin/python benchmarks/model_compile_time.py --write`.\n\n"
            "| layers | forward compile s | forward + backward compile s | ops in the lowered program |\n"
            "|---|---|---|---|\n" + "\n".join(rows))
    print(body)
    if a.write:
        write_section("model_compile_time", body)


if __name__ == "__main__":
    main()

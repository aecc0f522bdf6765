"""Memory of per-token log-probs (+ gradient): full ``[B, T, V]`` logits vs chunked.

The usual path (TRL's and verl's default) materialises the float32 logits of the whole
batch, takes ``log_softmax`` and gathers the target tokens; ``jaxrl_llm.models.token_logprobs``
walks the sequence in chunks under ``jax.checkpoint``. Both compute the gradient of the mean
log-prob w.r.t. the hidden states and the unembedding. Memory is XLA's own compiled memory
analysis (temporary buffers; arguments and outputs excluded), at SmolLM2 / Qwen2.5 vocab
sizes; the small case is also run and timed (median of 5) and its results compared.

Run: ``.venv/bin/python benchmarks/logprobs_memory.py [--write]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _report import machine, median_time, write_section  # noqa: E402

from jaxrl_llm.models import token_logprobs  # noqa: E402


def full(h, w, y):
    z = jax.nn.log_softmax(jnp.einsum("btd,dv->btv", h, w), -1)
    return jnp.mean(jnp.take_along_axis(z, y[..., None], -1))


def chunked(chunk):
    return lambda h, w, y: jnp.mean(token_logprobs(h, w, y, chunk_size=chunk, with_entropy=False)[0])


def temp_bytes(fn, b, t, d, v):
    args = (jax.ShapeDtypeStruct((b, t, d), jnp.float32), jax.ShapeDtypeStruct((d, v), jnp.float32),
            jax.ShapeDtypeStruct((b, t), jnp.int32))
    return jax.jit(jax.grad(fn, (0, 1))).lower(*args).compile().memory_analysis().temp_size_in_bytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    rows = []
    for b, t, d, v in ((8, 1024, 576, 49152), (8, 4096, 896, 151936)):
        logits_gb = b * t * v * 4 / 2**30
        f = temp_bytes(full, b, t, d, v) / 2**30
        c128 = temp_bytes(chunked(128), b, t, d, v) / 2**30
        c512 = temp_bytes(chunked(512), b, t, d, v) / 2**30
        rows.append(f"| {b} x {t}, D={d}, V={v} | {logits_gb:.2f} | {f:.2f} | {c512:.3f} | {c128:.3f} | "
                    f"{f / c128:.0f}x |")
        print(rows[-1], flush=True)
    # run a small case: same numbers, time
    rng = np.random.default_rng(0)
    b, t, d, v = 4, 512, 576, 49152
    h = jnp.asarray(rng.normal(size=(b, t, d)) * 0.05, jnp.float32)
    w = jnp.asarray(rng.normal(size=(d, v)) * 0.05, jnp.float32)
    y = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    gf, gc = jax.jit(jax.grad(full, (0, 1))), jax.jit(jax.grad(chunked(128), (0, 1)))
    rf, rc = gf(h, w, y), gc(h, w, y)
    err = max(float(jnp.abs(x - z).max() / jnp.abs(x).max()) for x, z in zip(rf, rc))
    tf = median_time(lambda: jax.block_until_ready(gf(h, w, y)), 5)
    tc = median_time(lambda: jax.block_until_ready(gc(h, w, y)), 5)
    body = ("Gradient of the mean token log-prob w.r.t. hidden states and unembedding: full float32 logits "
            "(the default path of TRL and verl) vs `jaxrl_llm.models.token_logprobs` (chunked, rematerialised). "
            "Temporary memory from XLA's compiled memory analysis (GiB). Machine: "
            f"{machine()}. Reproduce: `.venv/bin/python benchmarks/logprobs_memory.py --write`.\n\n"
            "| batch, width, vocab | [B,T,V] f32 logits GiB | full: temp GiB | chunk 512: temp GiB | "
            "chunk 128: temp GiB | full / chunk 128 |\n|---|---|---|---|---|---|\n" + "\n".join(rows)
            + f"\n\nRun at 4 x 512, V=49152: full {tf * 1e3:.0f} ms, chunked (128) {tc * 1e3:.0f} ms "
            f"(ratio {tc / tf:.2f}), max relative gradient difference {err:.1e}.")
    print(body)
    if a.write:
        write_section("logprobs_memory", body)


if __name__ == "__main__":
    main()

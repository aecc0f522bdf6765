"""Rollout time of sampler variants, one process, interleaved rounds (this VM's speed drifts
over minutes, so the variants alternate): float32 vs bfloat16 sampler weights
(``SamplingConfig.weight_dtype``) and the prompt's KV cache copied into every row vs shared by
the rows of a prompt (``SamplingConfig.shared_prompt_kv``).

SmolLM2-135M-Instruct (float32 weights, the embedded GGUF dequantised), ``--prompts`` random
prompts of ``--prompt-len`` tokens x 8 samples x ``--new-tokens`` tokens, temperature 1, no stop
token; the sampler's default layer loop for each (float32 SmolLM2: scanned; bf16: unrolled).
Shape (b) of issue 22 by default. Prints the first call (compile + run), each timed call and,
for the shared-prompt variants, the compiled sampler's temporary memory and whether its tokens
equal the copied cache's.

Run: ``.venv/bin/python benchmarks/sampler_dtype_ab.py [--variants float32,bfloat16,float32-shared]
[--rounds 2]``. Writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np
from flax import nnx

from jaxrl_llm.models import load_smollm2
from jaxrl_llm.rollout import Sampler, SamplingConfig
from jaxrl_llm.shapes import pad_prompts

VARIANTS = {"float32": (None, False), "bfloat16": ("bfloat16", False), "float32-shared": (None, True),
            "bfloat16-shared": ("bfloat16", True)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--variants", default="float32,bfloat16", help=f"comma-separated, from {', '.join(VARIANTS)}")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    names = a.variants.split(",")
    bad = [n for n in names if n not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants: unknown {bad} (choose from {', '.join(VARIANTS)})")
    model, _ = load_smollm2()
    gd, params = nnx.split(model)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, 1000, a.prompt_len)) for _ in range(a.prompts)]
    samplers = {}
    for n in names:
        wd, shared = VARIANTS[n]
        samplers[n] = Sampler(gd, SamplingConfig(max_new_tokens=a.new_tokens, num_samples=8, temperature=1.0,
                                                 weight_dtype=wd, shared_prompt_kv=shared),
                              length_buckets=(a.prompt_len,))
    first = {}
    for name, s in samplers.items():
        t0 = time.perf_counter()
        first[name] = s(params, prompts, jax.random.key(0))
        tokens, mask = pad_prompts(prompts, a.prompt_len, a.prompts, 0)
        temp = s._fn.lower(gd, params, tokens, mask, jax.random.key(0), s.config,
                           unroll_layers=s._unroll(params)).compile().memory_analysis().temp_size_in_bytes
        print(f"{name}: first call {time.perf_counter() - t0:.1f} s (with the memory analysis' compile); "
              f"temporary memory {temp / 2**20:.0f} MiB", flush=True)
    for name in samplers:
        base = name.replace("-shared", "")
        if name.endswith("-shared") and base in first:
            same = np.array_equal(np.asarray(first[name].tokens), np.asarray(first[base].tokens))
            print(f"{name}: same tokens as {base}: {same}", flush=True)
    times = {k: [] for k in samplers}
    for r in range(a.rounds):
        for name, s in samplers.items():
            t0 = time.perf_counter()
            out = s(params, prompts, jax.random.key(r + 1))
            times[name].append(time.perf_counter() - t0)
            assert int(out.lengths.min()) == a.new_tokens
    ref = statistics.median(times[names[0]])
    for name, ts in times.items():
        print(f"{name}: {[round(t, 2) for t in ts]} s, median {statistics.median(ts):.2f} s "
              f"({ref / statistics.median(ts):.2f}x {names[0]})", flush=True)


if __name__ == "__main__":
    main()

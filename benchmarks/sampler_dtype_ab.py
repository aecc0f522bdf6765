"""Rollout time with float32 vs bfloat16 sampler weights (``SamplingConfig.weight_dtype``), one
process, interleaved rounds (this VM's speed drifts over minutes, so A/B pairs alternate).

SmolLM2-135M-Instruct (float32 weights, the embedded GGUF dequantised), ``--prompts`` random
prompts of ``--prompt-len`` tokens x 8 samples x ``--new-tokens`` tokens, temperature 1, no stop
token; the sampler's default layer loop for each (float32 SmolLM2: scanned; bf16: unrolled).
Shape (b) of issue 22 by default. Prints the first call (compile + run) and each timed call.

Run: ``.venv/bin/python benchmarks/sampler_dtype_ab.py [--rounds 2]``. Writes nothing.
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    model, _ = load_smollm2()
    gd, params = nnx.split(model)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, 1000, a.prompt_len)) for _ in range(a.prompts)]
    samplers = {wd or "float32": Sampler(gd, SamplingConfig(max_new_tokens=a.new_tokens, num_samples=8, temperature=1.0,
                                                            weight_dtype=wd), length_buckets=(a.prompt_len,))
                for wd in (None, "bfloat16")}
    for name, s in samplers.items():
        t0 = time.perf_counter()
        s(params, prompts, jax.random.key(0))
        print(f"{name}: first call {time.perf_counter() - t0:.1f} s", flush=True)
    times = {k: [] for k in samplers}
    for r in range(a.rounds):
        for name, s in samplers.items():
            t0 = time.perf_counter()
            out = s(params, prompts, jax.random.key(r + 1))
            times[name].append(time.perf_counter() - t0)
            assert int(out.lengths.min()) == a.new_tokens
    for name, ts in times.items():
        print(f"{name}: {[round(t, 2) for t in ts]} s, median {statistics.median(ts):.2f} s", flush=True)
    print(f"bfloat16 weights: {statistics.median(times['float32']) / statistics.median(times['bfloat16']):.2f}x "
          f"faster", flush=True)


if __name__ == "__main__":
    main()

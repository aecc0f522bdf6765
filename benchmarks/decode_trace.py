"""Where a decode step's time goes: one greedy rollout of B distinct prompts traced with the JAX
profiler, the XLA:CPU thunks of the compiled program summed by kind and, for the costliest
fusions, named by the HLO operation they compute (from the compiled module's metadata).

Model: a random Qwen2-style model (``--hidden``, ``--vocab``, ``--layers``; heads as in
``rollout_vs_hf.py --grid``), 64-token prompts, ``--tokens`` new tokens, the sampler's defaults.

Run: ``.venv/bin/python benchmarks/decode_trace.py [--hidden 256 --vocab 8192 --batch 32]``.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).parent))
from rollout_vs_hf import GRID_WIDTHS, P, qwen2_grid  # noqa: E402

from jaxrl_llm.models import load_hf  # noqa: E402
from jaxrl_llm.rollout import SamplingConfig, Sampler  # noqa: E402
from jaxrl_llm.rollout.sampler import pad_prompts  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256, choices=sorted(GRID_WIDTHS))
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        qwen2_grid(Path(tmp), a.hidden, a.vocab)
        model = load_hf(tmp)
    gd, params = nnx.split(model)
    prompts = np.random.default_rng(0).integers(3, a.vocab, (a.batch, P)).tolist()
    sampler = Sampler(gd, SamplingConfig(max_new_tokens=a.tokens, num_samples=1, greedy=True), length_buckets=(P,))
    key = jax.random.key(0)
    for _ in range(2):  # compile, warm up
        np.asarray(sampler(params, prompts, key).tokens)
    t0 = time.perf_counter()
    np.asarray(sampler(params, prompts, key).tokens)
    wall = time.perf_counter() - t0
    out = tempfile.mkdtemp()
    with jax.profiler.trace(out, create_perfetto_trace=True):
        np.asarray(sampler(params, prompts, key).tokens)
    events = json.load(gzip.open(glob.glob(f"{out}/**/*.trace.json.gz", recursive=True)[0]))
    events = events["traceEvents"] if isinstance(events, dict) else events
    dur, cnt = collections.Counter(), collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and not name.startswith(("$", "ThunkExecutor", "SlinkyThreadPool", "np.", "end: ",
                                                         "PjitFunction")):
            dur[name] += e.get("dur", 0)
            cnt[name] += 1
    tokens, mask = pad_prompts(prompts, P, a.batch, 0)
    hlo = sampler._fn.lower(gd, params, tokens, mask, key, sampler.config,
                            unroll_layers=sampler._unroll(params)).compile().as_text()
    ops = {}
    for m in re.finditer(r"^\s*%(\S+) = (\S+) fusion\(.*?op_name=\"([^\"]+)\"", hlo, re.M):
        ops[m.group(1)] = (m.group(2), m.group(3).replace("jit(generate)/while/body/", ""))
    total = sum(dur.values()) / 1e3
    kinds = collections.Counter()
    for k, v in dur.items():
        kinds[re.sub(r"[.\d]+$", "", k)] += v
    print(f"hidden {a.hidden}, vocab {a.vocab}, batch {a.batch}, {a.tokens} tokens: {wall:.3f} s "
          f"({1e3 * wall / a.tokens:.2f} ms per step); thunks {total:.0f} ms in the traced run")
    print("\nby kind (ms per step):")
    for k, v in kinds.most_common(8):
        print(f"  {v / 1e3 / a.tokens:7.3f}  {k}")
    print(f"\ncostliest {a.top} (ms per step, calls per step, shape, operation):")
    for k, v in dur.most_common(a.top):
        shape, op = ops.get(k, ("?", "?"))
        print(f"  {v / 1e3 / a.tokens:7.3f}  {cnt[k] / a.tokens:5.1f}  {shape:24s} {op[:70]}")


if __name__ == "__main__":
    main()

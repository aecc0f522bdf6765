"""Where the time of one grouped GRPO update or one rollout goes, from a ``jax.profiler`` trace.

Runs the program once to compile, once under ``jax.profiler.trace``, then sums the trace's
device events by the HLO instruction they ran, maps each instruction to its ``op_name``
metadata (the JAX operation it came from) and prints the heaviest, plus totals per kind:

- ``update``: the shared-prefix train step (``make_train_step`` with ``rows_per_prompt = G``)
  on the random batch of ``benchmarks/shared_prefix.py`` (``--prompts`` B x G = 8 completions of
  ``--new-tokens`` tokens after a ``--prompt-len``-token prompt);
- ``rollout``: ``Sampler`` at B prompts x 8 samples (``--unroll`` to unroll the layers; ``--samples 1
  --greedy`` for distinct prompts decoded greedily, nothing shared).

Kinds: ``attention`` (the attention's score and value einsums, their transposes), ``dot``
(XLA's other matmul fusions: the projections), ``scan stacking`` (zero-filling, writing and slicing the
layer scan's stacked residuals and weights: ``broadcast_in_dim`` / ``dynamic_update_slice`` /
``dynamic_slice`` of arrays with a leading layer axis), ``logits`` (the ``[tokens, vocab]``
arrays), the rest ``other``.

Run: ``.venv/bin/python benchmarks/step_profile.py --what update --model qwen2-8m [--remat dots]`` (or
``--model smollm2 --prompts 4``; ``--what rollout --model smollm2 --prompts 4 --new-tokens 32``).
Prints; writes nothing.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _events(trace_dir: str) -> list[dict]:
    files = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
    if not files:
        raise SystemExit(f"no trace written under {trace_dir}")
    return [e for e in json.load(gzip.open(files[0]))["traceEvents"] if e.get("ph") == "X" and "dur" in e]


def _hlo_meta(hlo: str) -> dict[str, tuple[str, str]]:
    """instruction name -> (result shape, op_name) from optimized HLO text."""
    out = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) .*?op_name=\"([^\"]+)\"", hlo, re.M):
        out[m.group(1)] = (m.group(2), re.sub(r"^jit\([^)]*\)/", "", m.group(3)))
    return out


def _kind(shape: str, op: str, name: str, vocab: int, layers: int) -> str:
    if re.search(r"bcv|dv->|,dv|\.\.\.d,dv", op):  # the unembedding's einsums (token_logprobs, the sampler)
        return "logits"
    if re.search(r"kq[ds]\b|kqs,|kqd,", op):  # the attention's einsums (scores, values) and their transposes
        return "attention"
    if name.startswith(("ynn_fusion", "dot")) or op.endswith("dot_general"):
        return "logits" if f",{vocab}]" in shape or f"{vocab}," in shape.split("]")[0] else "dot"
    if f"[{layers}," in shape and any(k in op for k in ("broadcast_in_dim", "dynamic_update_slice", "dynamic_slice")):
        return "scan stacking"
    if f",{vocab}]" in shape:
        return "logits"
    return "other"


def summarize(events: list[dict], meta: dict, vocab: int, layers: int, top: int) -> None:
    agg, cnt, kinds = collections.Counter(), collections.Counter(), collections.Counter()
    for e in events:
        if e["name"] not in meta:
            continue
        shape, op = meta[e["name"]]
        key = (shape[:40], op[:100])
        agg[key] += e["dur"]
        cnt[key] += 1
        kinds[_kind(shape, op, e["name"], vocab, layers)] += e["dur"]
    total = sum(agg.values())
    print(f"traced device time: {total / 1e6:.2f} s")
    for k, v in kinds.most_common():
        print(f"  {k:14s} {v / 1e6:7.2f} s  {v / max(total, 1):5.1%}")
    print(f"heaviest {top} instructions (ms, calls, shape, JAX op):")
    for k, v in agg.most_common(top):
        print(f"  {v / 1e3:8.1f} {cnt[k]:5d}  {k[0]:40s} {k[1]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", choices=("update", "rollout"), default="update")
    ap.add_argument("--model", choices=("qwen2-8m", "smollm2"), default="qwen2-8m")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--unroll", action="store_true", help="rollout: unrolled layers")
    ap.add_argument("--samples", type=int, default=None,
                    help="rollout: completions per prompt (default 8; 1 with distinct prompts: nothing shared)")
    ap.add_argument("--greedy", action="store_true", help="rollout: greedy decoding (default: temperature 1)")
    ap.add_argument("--remat", choices=("none", "dots", "full"), default="none",
                    help="update: the model's remat policy (dots: recompute attention, keep the projections)")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    if a.samples is not None and a.samples < 1:
        raise SystemExit(f"--samples must be >= 1, got {a.samples}")

    from flax import nnx

    from shared_prefix import G, batch, model

    gd, params = model(a.model)
    merged = nnx.merge(gd, params)
    if a.remat != "none":  # the same weights under another remat policy (a static field of every layer)
        from jaxrl_llm.models import Transformer

        merged = nnx.merge(nnx.split(nnx.eval_shape(lambda: Transformer(merged.cfg.replace(remat=a.remat),
                                                                          rngs=nnx.Rngs(0))))[0], params)
        gd, params = nnx.split(merged)
    cfg = merged.cfg
    with tempfile.TemporaryDirectory() as tmp:
        if a.what == "update":
            import optax

            import jaxrl_llm as jl
            from jaxrl_llm.training import PolicyObjective, init_train_state, make_train_step

            opt = optax.adamw(1e-6, weight_decay=0.0)
            b = batch(cfg.vocab_size, a.prompts, a.prompt_len)
            if a.new_tokens != 128:
                raise SystemExit("--what update uses shared_prefix.py's 128 completion tokens")
            obj = PolicyObjective(jl.ppo_clip_loss, (("clip_low", 0.2), ("clip_high", 0.2)), rows_per_prompt=G)
            args = {k: jnp.asarray(b[k]) for k in obj.batch_keys()}
            step = make_train_step(gd, opt, obj, donate=False)
            state = init_train_state(params, opt)
            compiled = step.lower(state, args).compile()
            hlo = compiled.as_text()
            run = lambda: jax.block_until_ready(step(state, args))  # noqa: E731
        else:
            from jaxrl_llm.rollout import Sampler, SamplingConfig

            rng = np.random.default_rng(0)
            prompts = [list(rng.integers(1, 1000, a.prompt_len)) for _ in range(a.prompts)]
            cfg_s = SamplingConfig(max_new_tokens=a.new_tokens, num_samples=G if a.samples is None else a.samples, temperature=1.0,
                                   greedy=a.greedy)
            s = Sampler(gd, cfg_s,
                        length_buckets=(a.prompt_len,), unroll_layers=a.unroll)
            run = lambda: s(params, prompts, jax.random.key(1))  # noqa: E731
            run()
            hlo = ""
            try:  # the optimized HLO of the sampler's program for these shapes
                from jaxrl_llm.shapes import pad_prompts

                tokens, mask = pad_prompts(prompts, a.prompt_len, s._rows(len(prompts)), s.config.pad_token_id)
                hlo = s._fn.lower(gd, params, tokens, mask, jax.random.key(1), s.config,
                                  unroll_layers=s._unroll(params)).compile().as_text()
            except Exception as e:  # noqa: BLE001 -- reported; the trace's raw names are printed instead
                print(f"could not lower the sampler for its HLO ({type(e).__name__}: {e}); raw names only")
        run()
        t0 = time.perf_counter()
        run()
        print(f"{a.what} {a.model}: {time.perf_counter() - t0:.2f} s untraced")
        with jax.profiler.trace(os.path.join(tmp, "trace")):
            run()
        events = _events(os.path.join(tmp, "trace"))
        meta = _hlo_meta(hlo) if hlo else {e["name"]: ("?", e["name"]) for e in events if not e["name"].startswith("$")}
        summarize(events, meta, cfg.vocab_size, cfg.num_layers, a.top)


if __name__ == "__main__":
    main()

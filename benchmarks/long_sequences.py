"""Long sequences on this CPU, side by side: dense attention against blockwise, padded rows
against packed ones. Each case runs in its own process (peak resident memory is that process's
``ru_maxrss``); a case that needs more than ``--mem-cap`` GiB is stopped by an address-space limit
(``RLIMIT_AS``) and reported as out of memory instead of taking the machine down.

- ``decode``: SmolLM2-135M (the embedded GGUF, float32) decodes ``--new-tokens`` tokens greedily
  after a short prompt (stop tokens off), with ``model.attention=dense``, ``auto`` (on CPU dense
  while a call's scores stay under 64 MiB, as one row's decode step does here; blockwise above)
  and ``blockwise`` (512-key blocks): compile plus first run, then the median of the timed runs,
  tokens per second and peak RSS.
- ``update``: one GRPO train step (``remat=full``) of SmolLM2 on 8 rows of 4,096 to 8,192 tokens
  (a 256-token prompt, random completions): dense attention (padded rows), blockwise (padded),
  blockwise with packing (``train.max_tokens_per_microbatch=8192``).
- ``packing``: a long-tailed length distribution (32 rows, completion lengths log-normal with a
  median of 300 tokens, capped at 2,048): the padding fraction and the GRPO step time of SmolLM2
  padded (one row per micro-batch) against packed (micro-batches of one row as long as the
  longest prompt + completion), the same memory per micro-batch.

Run: ``.venv/bin/python benchmarks/long_sequences.py decode|update|packing [--write]`` (``--write``
puts the table into docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _report import machine, write_section  # noqa: E402

GiB = 2**30


# ------------------------------------------------------------------------------------ children
def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GiB


def child_decode(impl: str, new_tokens: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp

    from jaxrl_llm.models import load_smollm2
    from jaxrl_llm.rollout import Sampler, SamplingConfig
    from flax import nnx

    model, tok = load_smollm2(attention=impl, max_position_embeddings=new_tokens + 64)
    gd, params = nnx.split(model)
    ids = tok.encode("Write a long story about a lighthouse keeper.")
    cfg = SamplingConfig(max_new_tokens=new_tokens, greedy=True, num_samples=1, pad_token_id=0)
    sampler = Sampler(gd, cfg, length_buckets=(32,), unroll_layers=False)
    t0 = time.perf_counter()
    roll = sampler(params, [ids], jax.random.key(0))
    jax.block_until_ready(roll.tokens)
    first = time.perf_counter() - t0
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        roll = sampler(params, [ids], jax.random.key(i + 1))
        jax.block_until_ready(roll.tokens)
        times.append(time.perf_counter() - t0)
    n = int(jnp.sum(roll.mask))
    return {"first_s": first, "median_s": statistics.median(times), "tokens": n, "peak_rss_gib": _rss_gib()}


def _smollm2_step(impl: str, packed: int, microbatches: int = 1):
    import optax
    from flax import nnx

    from jaxrl_llm.models import load_smollm2
    from jaxrl_llm.training import init_train_state, make_train_step, recipe
    from jaxrl_llm.training.packed_step import make_packed_train_step

    model, _ = load_smollm2(attention=impl, remat="full", max_position_embeddings=16384)
    gd, params = nnx.split(model)
    opt = optax.adamw(1e-6)
    state = init_train_state(params, opt, seed=0)
    obj = recipe("grpo", num_samples=8).objective
    step = (make_packed_train_step(gd, opt, obj, budget=packed) if packed
            else make_train_step(gd, opt, obj, num_microbatches=microbatches))
    return state, step


def _rows(lengths, prompt: int, vocab: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    n, width = len(lengths), prompt + max(lengths)
    tokens = rng.integers(1, vocab, (n, width)).astype(np.int32)
    mask = np.zeros((n, width), bool)
    loss = np.zeros((n, width - 1), bool)
    for i, t in enumerate(lengths):
        mask[i, :prompt + t] = True
        loss[i, prompt - 1:prompt + t - 1] = True
    return {"tokens": tokens, "mask": mask, "loss_mask": loss,
            "old_logp": rng.normal(-3.0, 0.5, (n, width - 1)).astype(np.float32),
            "advantages": np.repeat(rng.normal(0, 1, (n, 1)), width - 1, 1).astype(np.float32)}


def child_update(impl: str, packed: int, lengths: list[int], prompt: int, repeats: int, microbatches: int = 1) -> dict:
    import jax

    state, step = _smollm2_step(impl, packed, microbatches)
    batch = _rows(lengths, prompt, 49152)
    t0 = time.perf_counter()
    state, m = step(state, batch)
    jax.block_until_ready(m["loss"])
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(m["loss"])
        times.append(time.perf_counter() - t0)
    out = {"first_s": first, "median_s": statistics.median(times) if times else None, "loss": float(m["loss"]),
           "peak_rss_gib": _rss_gib()}
    if packed:
        out["padding_fraction"] = float(m["packing/padding_fraction"])
        out["microbatches"] = int(m["packing/microbatches"])
    return out


def _run_child(args: list[str], cap_gib: float) -> dict:
    def limit():
        cap = int(cap_gib * GiB)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True,
                          preexec_fn=limit, env=env)
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    tail = proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else [f"exit {proc.returncode}"]
    oom = any(s in proc.stderr for s in ("RESOURCE_EXHAUSTED", "Out of memory", "MemoryError", "std::bad_alloc",
                                         "Cannot allocate", "out of memory")) or proc.returncode < 0
    return {"failed": ("out of memory" if oom else "error") + f" under the {cap_gib:g} GiB cap: {tail[0][:160]}"}


# ---------------------------------------------------------------------------------------- main
def _cell(r: dict, key: str, fmt: str) -> str:
    return "-" if "failed" in r or r.get(key) is None else format(r[key], fmt)


def bench_decode(a) -> str:
    rows = []
    names = {"dense": "dense", "auto": "auto (dense here: one row's scores stay under 64 MiB)",
             "blockwise": "blockwise, 512-key blocks"}
    for impl in ("dense", "auto", "blockwise"):
        r = _run_child(["decode", impl, str(a.new_tokens), str(a.repeats)], a.mem_cap)
        print(impl, r, flush=True)
        rows.append((names[impl], r))
    lines = [f"SmolLM2-135M (float32, scanned layers), one prompt, {a.new_tokens} new tokens greedy (stop tokens off), "
             f"median of {a.repeats} after a first run; {machine()}.", "",
             "| attention | first run (s, with compile) | decode (s) | tokens/s | peak RSS (GiB) |", "|---|---|---|---|---|"]
    for impl, r in rows:
        tps = "-" if "failed" in r else f"{r['tokens'] / r['median_s']:.1f}"
        lines.append(f"| {impl} | {_cell(r, 'first_s', '.1f')} | {_cell(r, 'median_s', '.1f')} | {tps} | "
                     f"{_cell(r, 'peak_rss_gib', '.2f')} |" + (f" {r['failed']}" if "failed" in r else ""))
    return "\n".join(lines)


def bench_update(a) -> str:
    import numpy as np

    lengths = [int(x) for x in np.linspace(a.min_len, a.max_len, 8).round()]
    cases = [("dense, padded", "dense", 0), ("blockwise, padded", "blockwise", 0),
             (f"blockwise, packed ({a.max_len + a.prompt} tokens per micro-batch)", "blockwise", a.max_len + a.prompt)]
    rows = []
    for name, impl, packed in cases:
        r = _run_child(["update", impl, str(packed), ",".join(map(str, lengths)), str(a.prompt), str(a.repeats)],
                       a.mem_cap)
        print(name, r, flush=True)
        rows.append((name, r))
    lines = [f"One GRPO train step of SmolLM2-135M (float32, `remat=full`, AdamW) on 8 rows: a {a.prompt}-token "
             f"prompt and completions of {lengths} tokens; each case in its own process under a {a.mem_cap:g} GiB "
             f"address-space cap; {machine()}.", "",
             "| attention, layout | first step (s, with compile) | step (s) | peak RSS (GiB) | result |",
             "|---|---|---|---|---|"]
    for name, r in rows:
        lines.append(f"| {name} | {_cell(r, 'first_s', '.0f')} | {_cell(r, 'median_s', '.0f')} | "
                     f"{_cell(r, 'peak_rss_gib', '.2f')} | {r.get('failed', 'ran')} |")
    return "\n".join(lines)


def bench_packing(a) -> str:
    import numpy as np

    rng = np.random.default_rng(0)
    lengths = [int(x) for x in np.minimum(np.exp(rng.normal(np.log(300), 0.9, 32)), 2048).round().clip(8)]
    budget = a.prompt + max(lengths)
    rows = []
    n = len(lengths)
    # the same memory per micro-batch: one padded row of the longest length, or one packed row of as many tokens
    for name, packed, mbs in ((f"padded, {n} micro-batches of one row", 0, n),
                              (f"packed, micro-batches of one {budget}-token row", budget, 1)):
        r = _run_child(["update", "auto", str(packed), ",".join(map(str, lengths)), str(a.prompt), str(a.repeats),
                        str(mbs)], a.mem_cap)
        print(name, r, flush=True)
        rows.append((name, r, mbs))
    real = sum(lengths) + a.prompt * len(lengths)
    padded_frac = 1 - real / (len(lengths) * (a.prompt + max(lengths)))
    lines = [f"One GRPO train step of SmolLM2-135M (float32, `remat=full`, AdamW, `model.attention=auto`) on 32 rows "
             f"with a long tail: a {a.prompt}-token prompt and completions log-normal around 300 tokens (median "
             f"{int(np.median(lengths))}, max {max(lengths)}); median of {a.repeats} steps after a first; {machine()}.",
             "", "| layout | padding fraction | micro-batches | step (s) | peak RSS (GiB) |", "|---|---|---|---|---|"]
    for name, r, mbs in rows:
        frac = r.get("padding_fraction", padded_frac)
        lines.append(f"| {name} | {frac:.2f} | {r.get('microbatches', mbs)} | {_cell(r, 'median_s', '.1f')} | "
                     f"{_cell(r, 'peak_rss_gib', '.2f')} |" + (f" {r['failed']}" if "failed" in r else ""))
    if all("median_s" in r for _, r, _ in rows):
        lines += ["", f"Packed / padded step time: {rows[1][1]['median_s'] / rows[0][1]['median_s']:.2f}."]
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        kind, *rest = sys.argv[2:]
        if kind == "decode":
            out = child_decode(rest[0], int(rest[1]), int(rest[2]))
        else:
            out = child_update(rest[0], int(rest[1]), [int(x) for x in rest[2].split(",")], int(rest[3]),
                               int(rest[4]), int(rest[5]) if len(rest) > 5 else 1)
        print(json.dumps(out))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("decode", "update", "packing"))
    p.add_argument("--new-tokens", type=int, default=4096)
    p.add_argument("--min-len", type=int, default=4096 - 256)
    p.add_argument("--max-len", type=int, default=8192 - 256)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--mem-cap", type=float, default=18.0, help="GiB of address space per case")
    p.add_argument("--write", action="store_true")
    a = p.parse_args()
    body = {"decode": bench_decode, "update": bench_update, "packing": bench_packing}[a.what](a)
    cmd = f"`.venv/bin/python benchmarks/long_sequences.py {a.what}" + (
        f" --repeats {a.repeats}" if a.repeats != 1 else "") + "`"
    body = f"Command: {cmd}.\n\n" + body
    print(body)
    if a.write:
        title = {"decode": "Long decode: dense against blockwise attention",
                 "update": "Long rows: a GRPO update of 8 rows of 4k-8k tokens",
                 "packing": "Packing: a long-tailed length distribution"}[a.what]
        write_section(title, body)


if __name__ == "__main__":
    main()

"""Large allocations on huge pages (jaxrl_llm/launch.py), on and off, on one grouped GRPO update.

XLA:CPU allocates each large temporary of a step with ``posix_memalign``; glibc maps it fresh
(``mmap``) and unmaps it when freed, so every step faults its working set in again. With
``JAXRL_LLM_HUGEPAGES=1`` the ``jaxrl-llm`` command runs itself with
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` so those mappings use transparent huge pages. This
benchmark times the shared-prefix train step of ``shared_prefix.py`` (GRPO's clipped surrogate,
its gradient and AdamW; ``B`` prompts x 8 completions x 128 tokens after a ``P``-token prompt)
in fresh processes with and without the tunable, alternating, and reports per call: wall time,
system CPU time and minor page faults (``getrusage``). With ``--with-rollout`` every timed
train step follows a rollout of ``B`` random prompts (``Sampler``, 8 x 128 new tokens each), as
in the RL loop, and the rollout is timed too. Results are the same numbers either way
(checked: the loss after the calls).

Run: ``.venv/bin/python benchmarks/allocator_ab.py [--model qwen2-8m] [--prompts 8] [--prompt-len 256]
[--with-rollout] [--rounds 2] [--calls 3] [--write]``.
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

HERE = Path(__file__).resolve().parent
RESULT = "ALLOCATOR_AB "
LABELS = {"glibc": "glibc defaults", "hugepages": "`glibc.malloc.hugetlb=1` (`JAXRL_LLM_HUGEPAGES=1`)"}


def _usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_stime, r.ru_minflt


def worker(model_name: str, prompts: int, prompt_len: int, calls: int, with_rollout: bool, remat: str) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    sys.path.insert(0, str(HERE))
    from shared_prefix import G, batch, model

    import jaxrl_llm as jl
    from jaxrl_llm.training import PolicyObjective, init_train_state, make_train_step

    from flax import nnx

    gd, params = model(model_name)
    if remat != "none":  # the same weights under another remat policy (a static field of every layer)
        from jaxrl_llm.models import Transformer

        merged = nnx.merge(gd, params)
        gd = nnx.split(nnx.eval_shape(lambda: Transformer(merged.cfg.replace(remat=remat), rngs=nnx.Rngs(0))))[0]
    opt = optax.adamw(1e-6, weight_decay=0.0)
    vocab = nnx.merge(gd, params).cfg.vocab_size
    b = batch(vocab, prompts, prompt_len)
    obj = PolicyObjective(jl.ppo_clip_loss, (("clip_low", 0.2), ("clip_high", 0.2)), rows_per_prompt=G)
    args = {k: jnp.asarray(b[k]) for k in obj.batch_keys()}
    step = make_train_step(gd, opt, obj, donate=False)
    state = init_train_state(params, opt)
    rollout = None
    if with_rollout:
        from jaxrl_llm.rollout import Sampler, SamplingConfig

        sampler = Sampler(gd, SamplingConfig(max_new_tokens=128, num_samples=G, temperature=1.0),
                          length_buckets=(prompt_len,))
        rng = np.random.default_rng(0)
        prompt_ids = [list(rng.integers(1, vocab, prompt_len)) for _ in range(prompts)]

        def rollout():
            return sampler(params, prompt_ids, jax.random.key(0)).tokens

        rollout()  # compile + first call
    jax.block_until_ready(step(state, args))  # compile + first call
    res = {k: [] for k in ("wall_s", "sys_s", "minflt", "loss", "rollout_wall_s", "rollout_sys_s", "rollout_minflt")}
    for _ in range(calls):
        if rollout is not None:
            u0 = _usage()
            rollout()
            u1 = _usage()
            for k, i in (("rollout_wall_s", 0), ("rollout_sys_s", 1), ("rollout_minflt", 2)):
                res[k].append(u1[i] - u0[i])
        u0 = _usage()
        out = jax.block_until_ready(step(state, args))
        u1 = _usage()
        for k, i in (("wall_s", 0), ("sys_s", 1), ("minflt", 2)):
            res[k].append(u1[i] - u0[i])
        res["loss"].append(float(out[1]["loss"]))
        del out
    res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    res["tunables"] = os.environ.get("GLIBC_TUNABLES", "")
    return res


def run(allocator: str, a) -> dict:
    sys.path.insert(0, str(HERE.parent))
    from jaxrl_llm.launch import OPT_IN, malloc_environment

    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", OPT_IN)}
    if allocator == "hugepages":
        env = malloc_environment(dict(env, **{OPT_IN: "1"})) or env
    cmd = [sys.executable, __file__, "--worker", "--model", a.model, "--prompts", str(a.prompts),
           "--prompt-len", str(a.prompt_len), "--calls", str(a.calls), "--remat", a.remat] + (
               ["--with-rollout"] if a.with_rollout else [])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT)]
    if p.returncode != 0 or not lines:
        raise SystemExit(f"worker failed (exit {p.returncode}):\n" + "\n".join(p.stderr.splitlines()[-15:]))
    return json.loads(lines[-1][len(RESULT):])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2-8m", choices=("qwen2-8m", "smollm2"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--allocators", default="glibc,hugepages", help="comma-separated, from glibc, hugepages")
    ap.add_argument("--with-rollout", action="store_true", help="a rollout before every timed train step, as in the loop")
    ap.add_argument("--remat", choices=("none", "dots", "full"), default="none", help="the model's remat policy")
    ap.add_argument("--rounds", type=int, default=2, help="processes per allocator, alternating")
    ap.add_argument("--calls", type=int, default=3, help="timed calls per process, after one warm-up call")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    a = ap.parse_args()
    if a.worker:
        print(RESULT + json.dumps(worker(a.model, a.prompts, a.prompt_len, a.calls, a.with_rollout, a.remat)), flush=True)
        return
    kinds = a.allocators.split(",")
    bad = [k for k in kinds if k not in LABELS]
    if bad:
        raise SystemExit(f"--allocators: unknown {bad} (choose from {', '.join(LABELS)})")
    res = {k: [] for k in kinds}
    for r in range(a.rounds):
        for kind in kinds:
            out = run(kind, a)
            res[kind].append(out)
            print(f"round {r} {kind:10s}: " + json.dumps(out), flush=True)
    losses = {k: sorted({x for o in res[k] for x in o["loss"]}) for k in res}
    if len({tuple(v) for v in losses.values()}) != 1:
        raise SystemExit(f"the loss differs with the allocator: {losses}")

    def med(k, key):
        return statistics.median(x for o in res[k] for x in o[key])

    rows = []
    for k in kinds:
        row = f"| {LABELS[k]} | {med(k, 'wall_s'):.2f} | {med(k, 'sys_s'):.2f} | {med(k, 'minflt'):,.0f} |"
        if a.with_rollout:
            row += f" {med(k, 'rollout_wall_s'):.2f} | {med(k, 'rollout_sys_s'):.2f} |"
        rows.append(row + f" {max(o['peak_rss_gb'] for o in res[k]):.1f} |")
    head = "| allocator | step s | system CPU s per step | minor page faults per step |"
    if a.with_rollout:
        head += " rollout s | rollout system CPU s |"
    head += " peak RSS GB |"
    head += "\n|" + "---|" * (head.count("|") - 1) + "\n"
    ratios = ", ".join(f"{k} {med(kinds[0], 'wall_s') / med(k, 'wall_s'):.2f}x" for k in kinds[1:])
    sys.path.insert(0, str(HERE))
    from _report import machine, write_section

    body = (
        f"One shared-prefix GRPO train step (`make_train_step`, clipped surrogate + gradient + AdamW, float32) of "
        f"the {a.model} model{f' (`remat={a.remat}`)' if a.remat != 'none' else ''} at {a.prompts} prompts x 8 "
        f"completions x ({a.prompt_len} + 128) tokens"
        + (", each after a rollout of the same prompts (8 x 128 new tokens each, `Sampler`) as in the RL loop"
           if a.with_rollout else "")
        + f", in fresh processes with glibc's default allocator settings and with large allocations on transparent "
        f"huge pages (what `JAXRL_LLM_HUGEPAGES=1` makes the `jaxrl-llm` command set for itself, "
        f"jaxrl_llm/launch.py), alternating, {a.rounds} processes each, medians of {a.calls} calls per "
        f"process after one warm-up call. Same loss bit for bit. Machine: {machine()}. Reproduce: "
        f"`.venv/bin/python benchmarks/allocator_ab.py --model {a.model} --prompts {a.prompts} --prompt-len "
        f"{a.prompt_len} --allocators {a.allocators}{' --with-rollout' if a.with_rollout else ''}"
        f"{f' --remat {a.remat}' if a.remat != 'none' else ''} --rounds "
        f"{a.rounds} --calls {a.calls} --write`.\n\n" + head + "\n".join(rows)
        + f"\n\nTrain step against {kinds[0]}: {ratios}.")
    print(body)
    if a.write:
        write_section(f"allocator_ab ({a.model}, {a.prompts}x8x({a.prompt_len}+128)"
                      f"{', with rollouts' if a.with_rollout else ''}{f', remat={a.remat}' if a.remat != 'none' else ''})",
                      body)


if __name__ == "__main__":
    main()

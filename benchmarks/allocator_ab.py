"""Large allocations on huge pages (jaxrl_llm/launch.py), on and off, on one grouped GRPO update.

XLA:CPU allocates each large temporary of a step with ``posix_memalign``; glibc maps it fresh
(``mmap``) and unmaps it when freed, so every step faults its working set in again. With
``JAXRL_LLM_HUGEPAGES=1`` the ``jaxrl-llm`` command runs itself with
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` so those mappings use transparent huge pages. This benchmark times the shared-prefix train step of
``shared_prefix.py`` (GRPO's clipped surrogate, its gradient and AdamW; ``B`` prompts x 8
completions x 128 tokens after a ``P``-token prompt) in fresh processes with and without the
tunable, alternating, and reports per call: wall time, system CPU time and minor page faults
(``getrusage``). Results are the same numbers either way (checked: the loss after the calls).

Run: ``.venv/bin/python benchmarks/allocator_ab.py [--model qwen2-8m] [--prompts 8] [--prompt-len 256]
[--rounds 2] [--calls 3] [--write]``.
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
TUNABLE = "glibc.malloc.hugetlb=1"


def worker(model_name: str, prompts: int, prompt_len: int, calls: int) -> dict:
    import jax
    import jax.numpy as jnp
    import optax

    sys.path.insert(0, str(HERE))
    from shared_prefix import G, batch, model

    import jaxrl_llm as jl
    from jaxrl_llm.training import PolicyObjective, init_train_state, make_train_step

    from flax import nnx

    gd, params = model(model_name)
    opt = optax.adamw(1e-6, weight_decay=0.0)
    vocab = nnx.merge(gd, params).cfg.vocab_size
    b = batch(vocab, prompts, prompt_len)
    obj = PolicyObjective(jl.ppo_clip_loss, (("clip_low", 0.2), ("clip_high", 0.2)), rows_per_prompt=G)
    args = {k: jnp.asarray(b[k]) for k in obj.batch_keys()}
    step = make_train_step(gd, opt, obj, donate=False)
    state = init_train_state(params, opt)
    jax.block_until_ready(step(state, args))  # compile + first call
    walls, sys_s, faults, losses = [], [], [], []
    for _ in range(calls):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = jax.block_until_ready(step(state, args))
        walls.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        sys_s.append(r1.ru_stime - r0.ru_stime)
        faults.append(r1.ru_minflt - r0.ru_minflt)
        losses.append(float(out[1]["loss"]))
        del out
    return {"wall_s": walls, "sys_s": sys_s, "minflt": faults, "loss": losses,
            "tunables": os.environ.get("GLIBC_TUNABLES", "")}


def run(tuned: bool, a) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES",)}
    if tuned:
        env["GLIBC_TUNABLES"] = TUNABLE
    p = subprocess.run([sys.executable, __file__, "--worker", "--model", a.model, "--prompts", str(a.prompts),
                        "--prompt-len", str(a.prompt_len), "--calls", str(a.calls)], env=env, capture_output=True,
                       text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT)]
    if p.returncode != 0 or not lines:
        raise SystemExit(f"worker failed (exit {p.returncode}):\n" + "\n".join(p.stderr.splitlines()[-15:]))
    return json.loads(lines[-1][len(RESULT):])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2-8m", choices=("qwen2-8m", "smollm2"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="process pairs (off, on), alternating")
    ap.add_argument("--calls", type=int, default=3, help="timed calls per process, after one warm-up call")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    a = ap.parse_args()
    if a.worker:
        print(RESULT + json.dumps(worker(a.model, a.prompts, a.prompt_len, a.calls)), flush=True)
        return
    res = {False: [], True: []}
    for r in range(a.rounds):
        for tuned in (False, True):
            out = run(tuned, a)
            res[tuned].append(out)
            print(f"round {r} {'huge pages' if tuned else 'default   '}: " + json.dumps(out), flush=True)
    losses = {t: {x for o in res[t] for x in o["loss"]} for t in res}
    if losses[False] != losses[True]:
        raise SystemExit(f"the loss differs with the allocator setting: {losses}")

    def med(t, k):
        return statistics.median(x for o in res[t] for x in o[k])

    rows = []
    for t in (False, True):
        rows.append(f"| {'`' + TUNABLE + '`' if t else 'glibc defaults'} | {med(t, 'wall_s'):.2f} | "
                    f"{med(t, 'sys_s'):.2f} | {med(t, 'minflt'):,.0f} |")
    ratio = med(False, "wall_s") / med(True, "wall_s")
    sys.path.insert(0, str(HERE))
    from _report import machine, write_section

    body = (
        f"One shared-prefix GRPO train step (`make_train_step`, clipped surrogate + gradient + AdamW, float32) of "
        f"the {a.model} model at {a.prompts} prompts x 8 completions x ({a.prompt_len} + 128) tokens, in fresh "
        f"processes with glibc's default allocator settings and with large allocations on transparent huge pages "
        f"(what `JAXRL_LLM_HUGEPAGES=1` makes the `jaxrl-llm` command set for itself, jaxrl_llm/launch.py), alternating, {a.rounds} processes "
        f"each, medians of {a.calls} calls per process after one warm-up call. Same loss bit for bit. "
        f"Machine: {machine()}. Reproduce: `.venv/bin/python benchmarks/allocator_ab.py --model {a.model} "
        f"--prompts {a.prompts} --prompt-len {a.prompt_len} --rounds {a.rounds} --calls {a.calls} --write`.\n\n"
        "| allocator | step s | system CPU s per step | minor page faults per step |\n|---|---|---|---|\n"
        + "\n".join(rows) + f"\n\nHuge pages: {ratio:.2f}x faster.")
    print(body)
    if a.write:
        write_section(f"allocator_ab ({a.model}, {a.prompts}x8x({a.prompt_len}+128))", body)


if __name__ == "__main__":
    main()

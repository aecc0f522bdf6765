"""The execution options swept on our GRPO step (issue 38: the ``auto`` rule is written from
this table, not guessed): each combination of ``model.remat`` (none, dots),
``rollout.shared_prompt_kv`` (off, on) and ``rollout.unroll_layers`` (the sampler's auto rule,
unrolled), optionally with bfloat16 sampler weights (``--bf16``: ``rollout.sampler_dtype=bfloat16``
with recomputed old log-probs), at the realistic shapes of ``grpo_step_vs_peers.py`` (tiny: 8
prompts, SmolLM2: 4 prompts; 248-256-token prompts x 8 completions x 128 tokens) and the given
betas. Each cell is one run of ``grpo_step_vs_peers.py --impls ours`` (its own process; medians of
``--repeats`` steps after ``--warmup``): step seconds and the process's peak RSS.

Run: ``.venv/bin/python benchmarks/auto_sweep.py --models tiny --betas 0,0.04 [--bf16] [--write]``
(SmolLM2: about 5 minutes per cell).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _report import machine, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def cell(model: str, beta: float, remat: str, kv: bool, unroll: str, bf16: bool, a) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "grpo_step_vs_peers.py"), "--models", model, "--impls", "ours",
           "--shape", "realistic", "--beta", str(beta), "--repeats", str(a.repeats), "--warmup", str(a.warmup),
           "--remat", remat, "--unroll", unroll, "--shared-prompt-kv", str(kv).lower()] + (["--bf16"] if bf16 else [])
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    line = next(x for x in out.stdout.splitlines() if x.startswith(f"[{model}] ours: "))
    return json.loads(line.split(": ", 1)[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tiny")
    ap.add_argument("--betas", default="0,0.04")
    ap.add_argument("--bf16", action="store_true", help="also each combination with bfloat16 sampler weights")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--remat", default="none,dots", help="the model.remat values swept")
    ap.add_argument("--kv", default="false,true", help="the rollout.shared_prompt_kv values swept")
    ap.add_argument("--unroll", default="auto,true", help="the rollout.unroll_layers values swept")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    grid = (a.remat.split(","), [v == "true" for v in a.kv.split(",")], a.unroll.split(","))
    rows = []
    for model in a.models.split(","):
        for beta in (float(b) for b in a.betas.split(",")):
            base = None
            for (remat, kv, unroll), bf16 in itertools.product(itertools.product(*grid),
                                                              (False, True) if a.bf16 else (False,)):
                r = cell(model, beta, remat, kv, unroll, bf16, a)
                if "error" in r:
                    row = f"| {model} | {beta:g} | {remat} | {kv} | {unroll} | {bf16} | error: {r['error'][:80]} | | |"
                else:
                    base = base or r["step_s"]
                    rss = f"{r['peak_rss_gb']:.1f} GB" if "peak_rss_gb" in r else ""
                    row = (f"| {model} | {beta:g} | {remat} | {kv} | {unroll} | {bf16} | {r['step_s']:.2f} | "
                           f"{base / r['step_s']:.2f}x | {rss} |")
                rows.append(row)
                print(row, flush=True)
    body = ("Our GRPO step over the execution options (issue 38's sweep; `auto` is written from it): "
            "`grpo_step_vs_peers.py --impls ours --shape realistic` per cell, medians of "
            f"{a.repeats} steps after {a.warmup} warm-up step(s); speed-up against the cell with every option at "
            f"its current default (the first row of each model and beta). Machine: {machine()}. Reproduce: "
            f"`.venv/bin/python benchmarks/auto_sweep.py --models {a.models} --betas {a.betas} --remat {a.remat} "
            f"--kv {a.kv} --unroll {a.unroll}"
            f"{' --bf16' if a.bf16 else ''} --repeats {a.repeats} --warmup {a.warmup} --write`.\n\n"
            "| model | beta | model.remat | shared_prompt_kv | unroll_layers | bf16 sampler | step s | vs defaults | "
            "peak RSS |\n|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    print(body)
    if a.write:
        write_section(f"auto_sweep ({a.models}, beta {a.betas}{', bf16' if a.bf16 else ''})", body)


if __name__ == "__main__":
    main()

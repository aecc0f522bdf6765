#!/usr/bin/env bash
# One-step-off-policy training on the tiny preset (experiments/tiny_grpo.py), over seeds (default
# 0 1 2): on-policy GRPO, rollout.staleness=1 with IcePop, and rollout.staleness=1 without a
# correction (old log-probs recomputed in both stale arms). Prints held-out greedy accuracy after
# SFT and after RL per arm, and the stale arms' logged mismatch (mean over steps of
# offpolicy/approx_kl_k3 and of offpolicy/ratio_max).
# Usage: [OUT=runs/staleness_compare] [EXTRA="run.steps=100"] bash scripts/staleness_compare.sh [seeds...]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/staleness_compare}"
EXTRA="${EXTRA:-}"
seeds=("$@")
[ $# -eq 0 ] && seeds=(0 1 2)
STALE="rollout.staleness=1 recipe.old_logp=recompute"
for seed in "${seeds[@]}"; do
  # shellcheck disable=SC2086
  .venv/bin/jaxrl-llm train tiny_grpo run.seed="$seed" $EXTRA run.out="$OUT/onpolicy_seed${seed}"
  # shellcheck disable=SC2086
  .venv/bin/jaxrl-llm train tiny_grpo run.seed="$seed" $STALE recipe.is_weights=icepop $EXTRA \
    run.out="$OUT/icepop_seed${seed}"
  # shellcheck disable=SC2086
  .venv/bin/jaxrl-llm train tiny_grpo run.seed="$seed" $STALE $EXTRA run.out="$OUT/nocorr_seed${seed}"
done
.venv/bin/python - "$OUT" "${seeds[@]}" <<'PY'
import json, sys
import numpy as np
out = sys.argv[1]

def mismatch(run):
    k3, rmax = [], []
    for line in open(f"{out}/{run}/metrics.jsonl"):
        d = json.loads(line)
        if "offpolicy/approx_kl_k3" in d:
            k3.append(d["offpolicy/approx_kl_k3"])
            rmax.append(d["offpolicy/ratio_max"])
    return (np.mean(k3), np.mean(rmax)) if k3 else (float("nan"), float("nan"))

print("| seed | after SFT | on-policy | stale + IcePop | stale, no correction | k3 / ratio max (IcePop arm) | "
      "k3 / ratio max (no correction) |")
print("|---|---|---|---|---|---|---|")
acc = {a: [] for a in ("onpolicy", "icepop", "nocorr")}
for seed in sys.argv[2:]:
    s = {a: json.load(open(f"{out}/{a}_seed{seed}/summary.json")) for a in acc}
    for a in acc:
        acc[a].append(s[a]["eval_after"]["eval/accuracy"])
    mi, mn = mismatch(f"icepop_seed{seed}"), mismatch(f"nocorr_seed{seed}")
    print(f"| {seed} | {s['onpolicy']['eval_after_sft']['eval/accuracy']:.3f} | {acc['onpolicy'][-1]:.3f} | "
          f"{acc['icepop'][-1]:.3f} | {acc['nocorr'][-1]:.3f} | {mi[0]:.2e} / {mi[1]:.2f} | {mn[0]:.2e} / {mn[1]:.2f} |")
print("| mean |  | " + " | ".join(f"{np.mean(acc[a]):.3f}" for a in acc) + " |  |  |")
PY

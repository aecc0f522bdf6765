#!/usr/bin/env bash
# The tiny mixture of experts (experiments/tiny_moe_grpo.py: 8 experts, top-2) over seeds (default
# 0 1 2), with and without routing replay. Prints held-out greedy accuracy after SFT and after
# GRPO, the training reward of the first and last 5 steps, and the logged router mismatch
# (moe/router_mismatch: mean over steps and the largest step) per run.
# Usage: [OUT=runs/moe_compare] [EXTRA="run.steps=100"] bash scripts/moe_compare.sh [seeds...]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/moe_compare}"
EXTRA="${EXTRA:-}"
seeds=("$@")
[ $# -eq 0 ] && seeds=(0 1 2)
for seed in "${seeds[@]}"; do
  for replay in true false; do
    # shellcheck disable=SC2086
    .venv/bin/jaxrl-llm train tiny_moe_grpo run.seed="$seed" train.routing_replay="$replay" $EXTRA \
      run.out="$OUT/replay_${replay}_seed${seed}"
  done
done
.venv/bin/python - "$OUT" "${seeds[@]}" <<'PY'
import json, sys
out = sys.argv[1]
print("| seed | routing replay | after SFT | after GRPO | reward, first 5 -> last 5 steps | router mismatch, mean (max) |")
print("|---|---|---|---|---|---|")
for seed in sys.argv[2:]:
    for replay in ("true", "false"):
        run = f"{out}/replay_{replay}_seed{seed}"
        s = json.load(open(f"{run}/summary.json"))
        mm = [m["moe/router_mismatch"] for m in map(json.loads, open(f"{run}/metrics.jsonl")) if "moe/router_mismatch" in m]
        print(f"| {seed} | {replay} | {s['eval_after_sft']['eval/accuracy']:.3f} | **{s['eval_after']['eval/accuracy']:.3f}** "
              f"| {s['reward_first_5']:.3f} -> {s['reward_last_5']:.3f} | {100 * sum(mm) / len(mm):.2f}% ({100 * max(mm):.2f}%) |")
PY

#!/usr/bin/env bash
# Knapsack RL's rollout allocation against uniform allocation on the tiny preset
# (experiments/tiny_grpo.py) at the same total samples (16 prompts x 8 per step), over seeds
# (default 0 1 2). A 256-problem training set, so every problem is seen again about every 16
# steps and has a pass-rate estimate from its last visit (the paper's multi-epoch setting).
# Prints per seed and arm the mean over RL steps after the first epoch of Knapsack RL's
# "effective gradient ratio" (samples in groups with a reward spread:
# prompts/effective_samples_frac) and of the fraction of groups with a spread, and held-out
# greedy accuracy after RL.
# Usage: [OUT=runs/knapsack_compare] [EXTRA="run.steps=150"] bash scripts/knapsack_compare.sh [seeds...]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/knapsack_compare}"
EXTRA="${EXTRA:-}"
seeds=("$@")
[ $# -eq 0 ] && seeds=(0 1 2)
COMMON="data.train_rows=256 run.steps=150"
for seed in "${seeds[@]}"; do
  # shellcheck disable=SC2086
  .venv/bin/jaxrl-llm train tiny_grpo run.seed="$seed" $COMMON $EXTRA run.out="$OUT/uniform_seed${seed}"
  # shellcheck disable=SC2086
  .venv/bin/jaxrl-llm train tiny_grpo run.seed="$seed" $COMMON recipe.allocator=knapsack $EXTRA \
    run.out="$OUT/knapsack_seed${seed}"
done
.venv/bin/python scripts/knapsack_table.py "$OUT" "${seeds[@]}"

#!/usr/bin/env bash
# Curricula (SEC's category bandit, PCL's prompt value model) vs uniform sampling on mixed-difficulty
# arithmetic (experiments/tiny_curriculum.py), equal steps and samples, over seeds (default 0 1 2).
# Every arm of a seed starts from the same SFT warm-up (deterministic in the seed). Prints held-out
# greedy accuracy after SFT and at every evaluation, and per arm the steps to the target: the first
# evaluation at which the arm reaches the uniform arm's final accuracy (the mean of its last three
# evaluations).
# Usage: [OUT=runs/curriculum_compare] [ARMS="sec pcl"] [EXTRA="run.steps=300 ..."] bash scripts/curriculum_compare.sh [seeds...]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/curriculum_compare}"
EXTRA="${EXTRA:-}"
ARMS="${ARMS:-sec}"
seeds=("$@")
[ $# -eq 0 ] && seeds=(0 1 2)
# a run whose summary exists is not run again (an interrupted comparison continues)
run() {  # run <out dir> <overrides...>
  local out="$1"; shift
  [ -f "$out/summary.json" ] && return 0
  # shellcheck disable=SC2086
  .venv/bin/jaxrl-llm train tiny_curriculum "$@" $EXTRA run.out="$out"
}
for seed in "${seeds[@]}"; do
  run "$OUT/uniform_seed${seed}" run.seed="$seed" recipe.selector=none rollout.candidates=1
  for arm in $ARMS; do
    if [ "$arm" = sec ]; then  # the experiment's own selector, with its arguments (column=level, ...)
      run "$OUT/sec_seed${seed}" run.seed="$seed"
    else
      run "$OUT/${arm}_seed${seed}" run.seed="$seed" recipe.selector="$arm"
    fi
  done
done
.venv/bin/python scripts/curriculum_table.py "$OUT" "$ARMS" "${seeds[@]}"

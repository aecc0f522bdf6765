#!/usr/bin/env bash
# GiGPO vs GRPO (episode-level advantage only) on the grid world with the tiny model, equal steps
# and samples, over seeds (default 0 1 2): the same SFT warm-up per seed, then the RL steps each.
# Prints held-out success (128 greedy episodes) after SFT and after RL for every run.
# Usage: [OUT=runs/agent_grid_compare] [EXTRA="optim.lr=1e-3"] [PARALLEL=1] \
#        bash scripts/agent_grid_compare.sh [seeds...]
#   EXTRA: config overrides for both arms; PARALLEL=1 runs the two arms of a seed side by side
#   (about 8 min per run on 2 idle CPU cores, one at a time)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/agent_grid_compare}"
EXTRA="${EXTRA:-}"
seeds=("$@")
[ $# -eq 0 ] && seeds=(0 1 2)
for seed in "${seeds[@]}"; do
  for adv in gigpo grpo; do
    # shellcheck disable=SC2086
    cmd=(.venv/bin/jaxrl-llm train agent_grid_gigpo run.seed="$seed" recipe.advantage="$adv" $EXTRA
         run.out="$OUT/${adv}_seed${seed}")
    if [ "${PARALLEL:-0}" = 1 ]; then "${cmd[@]}" > "$OUT.${adv}_seed${seed}.log" 2>&1 & else "${cmd[@]}"; fi
  done
  wait
done
.venv/bin/python - "$OUT" "${seeds[@]}" <<'PY'
import json, sys
out = sys.argv[1]
print("| seed | after SFT | GiGPO after RL | GRPO after RL |")
print("|---|---|---|---|")
for seed in sys.argv[2:]:
    g = json.load(open(f"{out}/gigpo_seed{seed}/summary.json"))
    b = json.load(open(f"{out}/grpo_seed{seed}/summary.json"))
    print(f"| {seed} | {g['eval_after_sft']['eval/success']:.3f} | {g['eval_after']['eval/success']:.3f} | "
          f"{b['eval_after']['eval/success']:.3f} |")
PY

#!/usr/bin/env bash
# SEC curriculum vs uniform sampling on mixed-difficulty addition (experiments/tiny_curriculum.py),
# equal steps and samples, over seeds (default 0 1 2): both arms share the SFT warm-up of a seed.
# Prints held-out greedy accuracy after SFT and every 25 RL steps per arm, and the first step at
# which the SEC arm reaches the uniform arm's final accuracy.
# Usage: [OUT=runs/curriculum_compare] [EXTRA="recipe.selector.temperature=0.4"] bash scripts/curriculum_compare.sh [seeds...]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/curriculum_compare}"
EXTRA="${EXTRA:-}"
seeds=("$@")
[ $# -eq 0 ] && seeds=(0 1 2)
for seed in "${seeds[@]}"; do
  # shellcheck disable=SC2086
  .venv/bin/jaxrl-llm train tiny_curriculum run.seed="$seed" $EXTRA run.out="$OUT/sec_seed${seed}"
  # shellcheck disable=SC2086
  .venv/bin/jaxrl-llm train tiny_curriculum run.seed="$seed" recipe.selector=none rollout.candidates=1 $EXTRA \
    run.out="$OUT/uniform_seed${seed}"
done
.venv/bin/python - "$OUT" "${seeds[@]}" <<'PY'
import json, sys
out = sys.argv[1]

def curve(run):
    pts = {}
    for line in open(f"{out}/{run}/metrics.jsonl"):
        d = json.loads(line)
        if "eval/accuracy" in d:  # on the line of the RL step it follows ("step": the iteration)
            pts[d["step"]] = d["eval/accuracy"]
    return pts

rows = []
for seed in sys.argv[2:]:
    s = json.load(open(f"{out}/sec_seed{seed}/summary.json"))
    sec, uni = curve(f"sec_seed{seed}"), curve(f"uniform_seed{seed}")
    steps = sorted(set(sec) & set(uni))
    final = uni[steps[-1]]
    reach = next((t for t in steps if sec[t] >= final), None)
    rows.append((seed, s["eval_after_sft"]["eval/accuracy"], steps, sec, uni, reach))
print("| seed | after SFT | step: SEC / uniform ... | SEC reaches uniform's final at |")
print("|---|---|---|---|")
for seed, sft, steps, sec, uni, reach in rows:
    pts = ", ".join(f"{t}: {sec[t]:.3f} / {uni[t]:.3f}" for t in steps)
    print(f"| {seed} | {sft:.3f} | {pts} | {reach if reach is not None else 'never'} |")
PY

#!/usr/bin/env bash
# The runs of the SmolLM2 sections of notebooks/dapo_clip_higher.ipynb and
# notebooks/dr_grpo_length_bias.ipynb (issue 39): the main job's setting (experiments/smollm2_grpo.py,
# SmolLM2-135M-Instruct with LoRA, arithmetic, 4 prompts x 8 samples) with room for sentence-long
# answers (48 new tokens) and two updates per rollout batch (the second is off-policy, so the clip
# can act), 60 RL steps, three arms per seed:
#   grpo             symmetric clip (0.2 / 0.2), GRPO's length normalisation (the control of both claims)
#   grpo_cliphigher  recipe.loss.clip_high=0.28 (DAPO's clip-higher)
#   dr_grpo          recipe.name=dr_grpo (no std normalisation, token sums over a constant)
# A finished run is skipped by the trainer (it resumes from its checkpoint), so re-running this
# script completes what is missing. About 10 min per run on 2 CPU cores.
# Usage: [OUT=runs/paper_notebooks/smollm2] bash scripts/smollm2_claims.sh [seeds...]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/paper_notebooks/smollm2}"
seeds=("$@")
[ $# -eq 0 ] && seeds=(0 1 2)
COMMON="rollout.max_new_tokens=48 recipe.num_minibatches=2 run.steps=60 run.eval_every=0 run.checkpoint_every=20 \
run.log_samples_every=20 run.plot=false run.tensorboard=false run.console_every=0"
for seed in "${seeds[@]}"; do
  for arm in grpo grpo_cliphigher dr_grpo; do
    case "$arm" in
      grpo) extra="" ;;
      grpo_cliphigher) extra="recipe.loss.clip_high=0.28" ;;
      dr_grpo) extra="recipe.name=dr_grpo" ;;
    esac
    # shellcheck disable=SC2086
    .venv/bin/jaxrl-llm train smollm2_grpo run.seed="$seed" $COMMON $extra run.out="$OUT/${arm}_seed${seed}"
  done
done

#!/usr/bin/env bash
# README command 1: set everything up and run the main job.
# Until the model, rollout and training issues land, the main job is the toy sequence-RL
# comparison of ten recipes composed from jaxrl_llm.core (about 30 s on 2 CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=plot bash scripts/setup.sh
exec .venv/bin/python experiments/toy_sum_rl.py "$@"

#!/usr/bin/env bash
# README command 1: set everything up and run the main job.
# The main job: GRPO (LoRA) on the embedded SmolLM2-135M-Instruct for small-number arithmetic,
# held-out accuracy before/after, checkpoint, HF export, reward-curve plot (about 5 min on
# 2 CPU cores; experiments/smollm2_grpo.py). Arguments are config overrides (run.seed=1 ...).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=plot bash scripts/setup.sh
exec .venv/bin/jaxrl-llm train smollm2_grpo "$@"

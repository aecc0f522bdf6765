#!/usr/bin/env bash
# Create .venv-tunix: google-tunix (JAX RL post-training library) for the side-by-side GRPO
# benchmark (benchmarks/grpo_step_vs_peers.py). Its own environment, without torch: tunix pins
# its own jax/flax/transformers stack. Versions are the ones that resolved together on CPU;
# bump them deliberately. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
stamp=".venv-tunix/.tunix-installed-v1"
[ -f "$stamp" ] && exit 0
[ -x .venv-tunix/bin/python ] || "$PY" -m venv .venv-tunix
P=.venv-tunix/bin/python
$P -m pip install --quiet --upgrade pip
$P -m pip install --quiet jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 optax==0.2.8 orbax-checkpoint==0.12.8 \
    grain==0.2.18 transformers==5.12.1 google-tunix==0.1.7
$P - <<'PYCHECK'
import importlib.util
import jax, tunix.rl.grpo.grpo_learner  # noqa: F401
from importlib.metadata import version
assert importlib.util.find_spec("torch") is None, "torch must not be in .venv-tunix"
print("tunix:", version("google-tunix"), "jax", jax.__version__)
PYCHECK
touch "$stamp"

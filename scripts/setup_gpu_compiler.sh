#!/usr/bin/env bash
# Make .venv-gpu: this project with jax-cuda12-plugin, jax-cuda12-pjrt, ptxas from the
# nvidia-cuda-nvcc-cu12 wheel and cuDNN (JAX's cuDNN attention asks the library its version while
# tracing), so that `jaxrl-llm plan --target h100:8` compiles for an XLA GPU target description
# (jaxrl_llm/specs) on this host without a GPU (about 4 GB; no torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
JAX_VERSION="$(sed -n 's/.*"jax>=\([0-9.]*\),.*/\1/p' pyproject.toml | head -1)"
if [ ! -x .venv-gpu/bin/python ]; then
  "$PY" -m venv .venv-gpu
fi
stamp=".venv-gpu/.jaxrl_llm-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv-gpu/bin/python -m pip install --quiet --upgrade pip
  .venv-gpu/bin/python -m pip install --quiet "jax==${JAX_VERSION}" "jaxlib==${JAX_VERSION}" \
    "jax-cuda12-plugin==${JAX_VERSION}" "jax-cuda12-pjrt==${JAX_VERSION}" "nvidia-cuda-nvcc-cu12>=12.6" \
    "nvidia-cudnn-cu12>=9.8,<10"
  .venv-gpu/bin/python -m pip install --quiet -e .
  touch "$stamp"
fi
echo ".venv-gpu ready: $(.venv-gpu/bin/python -c 'import jax, jax_cuda12_plugin; print("jax", jax.__version__)')"

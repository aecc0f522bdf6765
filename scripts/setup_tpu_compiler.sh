#!/usr/bin/env bash
# Make .venv-tpu: this project with jax[tpu] (libtpu), so that `jaxrl-llm plan --target tpu-...`
# compiles the train step and sampler for a TPU topology with the TPU compiler on this (CPU-only)
# host; nothing runs on a TPU. About 0.8 GB. `jaxrl-llm plan --target ...` run from .venv finds it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
JAX_VERSION="$(sed -n 's/.*"jax>=\([0-9.]*\),.*/\1/p' pyproject.toml | head -1)"
if [ ! -x .venv-tpu/bin/python ]; then
  "$PY" -m venv .venv-tpu
fi
stamp=".venv-tpu/.jaxrl_llm-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv-tpu/bin/python -m pip install --quiet --upgrade pip
  .venv-tpu/bin/python -m pip install --quiet "jax[tpu]==${JAX_VERSION}"
  .venv-tpu/bin/python -m pip install --quiet -e .
  touch "$stamp"
fi
echo ".venv-tpu ready: $(.venv-tpu/bin/python -c 'import jax, libtpu; print("jax", jax.__version__, "libtpu", getattr(libtpu, "__version__", "?"))')"

#!/usr/bin/env bash
# Make .venv-tpu or .venv-gpu: this project with a chip's compiler, so that
# `jaxrl-llm plan --target ...` (run from .venv, which finds them) compiles the train step and the
# sampler for those chips on this CPU-only host; nothing runs on them.
#   tpu: jax[tpu] (libtpu), for TPU topologies. About 0.8 GB.
#   gpu: jax-cuda12-plugin, jax-cuda12-pjrt, ptxas from the nvidia-cuda-nvcc-cu12 wheel and cuDNN
#        (JAX's cuDNN attention asks the library its version while tracing), for an XLA GPU target
#        description (jaxrl_llm/specs). About 4 GB; no torch.
# Usage: bash scripts/setup_compiler.sh tpu|gpu
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:?usage: setup_compiler.sh tpu|gpu}"
PY="${PYTHON:-python3}"
JAX_VERSION="$(sed -n 's/.*"jax>=\([0-9.]*\),.*/\1/p' pyproject.toml | head -1)"
case "$kind" in
  tpu) pkgs=("jax[tpu]==${JAX_VERSION}")
       check='import jax, libtpu; print("jax", jax.__version__, "libtpu", getattr(libtpu, "__version__", "?"))' ;;
  gpu) pkgs=("jax==${JAX_VERSION}" "jaxlib==${JAX_VERSION}" "jax-cuda12-plugin==${JAX_VERSION}"
             "jax-cuda12-pjrt==${JAX_VERSION}" "nvidia-cuda-nvcc-cu12>=12.6" "nvidia-cudnn-cu12>=9.8,<10")
       check='import jax, jax_cuda12_plugin; print("jax", jax.__version__)' ;;
  *) echo "setup_compiler.sh: unknown compiler '$kind' (tpu or gpu)" >&2; exit 2 ;;
esac
venv=".venv-$kind"
if [ ! -x "$venv/bin/python" ]; then
  "$PY" -m venv "$venv"
fi
stamp="$venv/.jaxrl_llm-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet "${pkgs[@]}"
  "$venv/bin/python" -m pip install --quiet -e .
  touch "$stamp"
fi
echo "$venv ready: $("$venv/bin/python" -c "$check")"

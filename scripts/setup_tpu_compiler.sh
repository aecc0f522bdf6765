#!/usr/bin/env bash
# Make .venv-tpu (the TPU compiler, libtpu) for `jaxrl-llm plan --target tpu-...`: see setup_compiler.sh.
exec bash "$(dirname "$0")/setup_compiler.sh" tpu

#!/usr/bin/env bash
# Make .venv-gpu (the XLA GPU compiler, no GPU needed) for `jaxrl-llm plan --target h100:8`: see setup_compiler.sh.
exec bash "$(dirname "$0")/setup_compiler.sh" gpu

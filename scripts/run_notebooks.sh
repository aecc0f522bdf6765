#!/usr/bin/env bash
# Execute the notebooks at full size and save them with their outputs (plots included), in a fresh
# Jupyter kernel each (nbclient). Without arguments: every notebook of notebooks/; with NAMEs: those
# whose file name contains one of them, e.g. `bash scripts/run_notebooks.sh canon ngrpo`.
# Runtimes are in notebooks/README.md. The test suite runs the same notebooks in fast mode
# (tests/test_notebooks.py).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=plot,notebooks,agents bash scripts/setup.sh
exec .venv/bin/python scripts/run_notebooks.py --save "$@"

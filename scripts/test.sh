#!/usr/bin/env bash
# README command 2: set everything up and run the test suite (CI runs exactly this).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=dev,peers,plot bash scripts/setup.sh
bash scripts/setup_peers.sh
exec .venv/bin/python -m pytest "$@"

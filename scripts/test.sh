#!/usr/bin/env bash
# README command 2: set everything up and run the test suite (CI runs exactly this).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=dev,peers,plot,notebooks,agents,tasks,textarena,verifiers,openenv bash scripts/setup.sh
bash scripts/setup_peers.sh
# two workers: most tests are bound by single-threaded XLA compilation, so one process leaves
# a core idle; --dist loadfile keeps each file (and its module fixtures) on one worker
# large allocations on huge pages, as the jaxrl-llm command does for itself (jaxrl_llm/launch.py):
# every test process's train steps fault in 512x fewer pages
TUNED=$(.venv/bin/python -c "from jaxrl_llm.launch import malloc_environment as m; e = m(); print(e['GLIBC_TUNABLES'] if e else '')")
if [ -n "$TUNED" ]; then export GLIBC_TUNABLES="$TUNED"; fi
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"

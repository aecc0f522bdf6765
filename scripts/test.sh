#!/usr/bin/env bash
# README command 2: set everything up and run the test suite (CI runs exactly this).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=dev,peers,plot,notebooks,agents,tasks,textarena,verifiers,openenv bash scripts/setup.sh
bash scripts/setup_peers.sh
# two workers: most tests are bound by single-threaded XLA compilation, so one process leaves
# a core idle; --dist loadfile keeps each file (and its module fixtures) on one worker.
# --max-worker-restart=0: a crashed worker is reported as a failure and the run stops (tests
# not yet handed out do not run); pytest-xdist 3.8 can wait forever for a replacement worker
# under --dist loadfile.
exec .venv/bin/python -m pytest -n 2 --dist loadfile --max-worker-restart=0 "$@"

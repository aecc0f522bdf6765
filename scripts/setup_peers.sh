#!/usr/bin/env bash
# Create .venv-peers: the peer libraries our conformance tests compare against.
# torch is pinned to the 2.13.0 CPU build and installed first (anything unpinned pulls a
# multi-GB CUDA wheel); verl 0.9.1 needs --no-deps and pins transformers<5.11, which is why
# it lives in its own environment rather than in an extra of ours. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
stamp=".venv-peers/.peers-installed-v1"
[ -f "$stamp" ] && exit 0
[ -x .venv-peers/bin/python ] || "$PY" -m venv .venv-peers
P=.venv-peers/bin/python
$P -m pip install --quiet --upgrade pip
$P -m pip install --quiet torch==2.13.0 numpy
$P -m pip install --quiet --no-deps verl==0.9.1
$P -m pip install --quiet packaging ray "tensordict>=0.8.0,<=0.10.0,!=0.9.0" omegaconf \
    "transformers>=5.5.3,<5.11,!=5.6.0" codetiming orjson trl==1.16.0 torch==2.13.0
$P -c "import torch, verl.trainer.ppo.core_algos, trl; print('peers: torch', torch.__version__, 'trl', trl.__version__)"
touch "$stamp"

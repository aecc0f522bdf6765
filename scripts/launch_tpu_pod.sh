#!/usr/bin/env bash
# Run the same command on every worker of a TPU VM / pod slice (multi-controller JAX: each
# worker is one process; jaxrl_llm.parallel.initialize() finds the others on TPU).
# Usage: scripts/launch_tpu_pod.sh TPU_NAME ZONE "command" [extra gcloud args]
# See docs/tpu_pod.md. Not run by this project's CI (no TPU).
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 TPU_NAME ZONE \"command\" [extra gcloud args]" >&2
  exit 2
fi
name=$1 zone=$2 cmd=$3
shift 3
exec gcloud compute tpus tpu-vm ssh "$name" --zone="$zone" --worker=all --command="$cmd" "$@"

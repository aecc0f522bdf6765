#!/usr/bin/env bash
# Run the default test suite (or the pytest arguments given) and sample, every 5 s, each
# pytest-xdist worker's memory mappings (/proc/PID/maps lines) and resident memory, and the
# machine's used memory. Prints the peaks at the end; the samples go to $LOG.
#
# Why: an XLA:CPU program keeps its machine code in mappings of its own, and past the kernel's
# vm.max_map_count (cat /proc/sys/vm/max_map_count) XLA aborts the worker with no message.
# tests/conftest.py clears JAX's caches after every test file to stay well below it
# (docs/results.md, "Test suite time").
#
# Usage: bash scripts/watch_test_workers.sh [pytest args]     (LOG=path to keep the samples)
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=${LOG:-$(mktemp -t test-workers.XXXXXX)}

sample() {  # every 5 s: used memory, and each worker's mappings and RSS
  local parent=$1
  while kill -0 "$parent" 2>/dev/null; do
    local line="$(date +%T) used_mb=$(free -m | awk '/Mem:/{print $3}')"
    # the xdist workers are the pytest controller's children (execnet starts them)
    for p in $(pgrep -P "$(pgrep -P "$parent" -x python | head -1)" 2>/dev/null || true); do
      local maps rss
      maps=$({ wc -l < "/proc/$p/maps"; } 2>/dev/null || echo 0)
      rss=$({ awk '/VmRSS/{print int($2/1024)}' "/proc/$p/status"; } 2>/dev/null || echo 0)
      line="$line worker=$p maps=$maps rss_mb=$rss"
    done
    echo "$line" >> "$LOG"
    sleep 5
  done
}

# pytest in the foreground (Ctrl-C stops it), the sampler in the background
sample $$ &
SAMPLER=$!
rc=0
.venv/bin/python -m pytest -n 2 --dist loadfile --max-worker-restart=0 "$@" || rc=$?
kill "$SAMPLER" 2>/dev/null || true
echo "samples: $LOG (vm.max_map_count $(cat /proc/sys/vm/max_map_count))"
awk '{for (i = 1; i <= NF; i++) {split($i, kv, "="); v = kv[2] + 0
        if (kv[1] == "maps" && v > m) m = v; if (kv[1] == "used_mb" && v > u) u = v
        if (kv[1] == "rss_mb" && v > r) r = v}}
     END {print "peak mappings in a worker:", m + 0, "| peak worker RSS (MB):", r + 0, "| peak used memory (MB):", u + 0}' "$LOG"
exit $rc

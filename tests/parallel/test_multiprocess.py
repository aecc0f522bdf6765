"""Two local CPU processes joined by ``jax.distributed`` (4 devices each) train like one
process with 8 devices, checkpoint collectively, and the checkpoint restores in one process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

WORKER = Path(__file__).with_name("multiprocess_worker.py")


def _env():
    return {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run(*args, timeout=600):
    return subprocess.Popen([sys.executable, str(WORKER), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_env())


def _wait(p, timeout=600):
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out[-4000:]
    return out


def test_two_processes_equal_one_and_the_checkpoint_restores_in_one(tmp_path):
    single, multi = tmp_path / "single", tmp_path / "multi"
    single.mkdir()
    multi.mkdir()
    _wait(_run("--out", single))
    port = _free_port()
    procs = [_run("--out", multi, "--num-processes", 2, "--process-id", i, "--port", port) for i in range(2)]
    try:
        outs = [_wait(p) for p in procs]
    finally:
        for p in procs:
            p.kill()
    # each process supplied only its own half of the rows
    assert "process 0 rows [0, 1, 2, 3, 4, 5, 6, 7]" in outs[0] and "process 1 rows [8, 9, 10, 11" in outs[1]
    a, b = np.load(single / "params.npz"), np.load(multi / "params.npz")
    assert sorted(a) == sorted(b) and len(a) > 10
    for k in a:
        if np.issubdtype(a[k].dtype, np.floating):
            assert np.max(np.abs(a[k].astype(np.float64) - b[k])) <= 1e-6, k
        else:  # step, skip counter, RNG key data
            assert np.array_equal(a[k], b[k]), k
    assert int(b[str(len(b) - 1)]) == 0  # nothing skipped
    # the collective checkpoint restores in one process on one device, bit for bit
    out = _wait(_run("--out", multi, "--restore", multi / "ckpt"))
    assert "restored step 2" in out
    r = np.load(multi / "restored.npz")
    assert all(np.array_equal(b[k], r[k]) for k in b)

"""Context parallelism on 8 simulated CPU devices equals one device: log-probs, entropies and
gradients of packed and padded rows through a grouped-query model with local and global
layers and soft-caps, for every attention implementation (``tests/parallel/context_worker.py``),
and the train step on a mesh with a context axis (``tests/training/sharded_step_worker.py``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _worker(*args):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("context_worker.py")), *args],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Involuntary full rematerialization" not in proc.stderr, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("impls", ["blockwise,splash", pytest.param("dense", marks=pytest.mark.slow)])
def test_context_parallel_logprobs_and_gradients_equal_one_device(impls):
    res = _worker("--impls", impls)
    assert set(res) == {f"{m}/{i}" for m in ("(1, 2, 1, 4)", "(2, 1, 2, 2)") for i in impls.split(",")}
    for key, r in res.items():
        assert r["logp"] < 1e-5 and r["entropy"] < 1e-5, (key, r)
        assert r["grad"] < 1e-5 * r["grad_scale"], (key, r)

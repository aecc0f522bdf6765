"""The train step on 8 simulated CPU devices (data x fsdp x tensor meshes) equals one device."""

import json
import os
import subprocess
import sys
from pathlib import Path


import pytest

# the mesh with every axis and the pure tensor split by default (suite time); all four with -m slow
ALL = ["8,1,1", "2,4,1", "2,2,2", "1,1,8"]


@pytest.mark.parametrize("meshes", [["2,2,2", "1,1,8"], pytest.param(ALL, marks=pytest.mark.slow)],
                         ids=["default", "all"])
def test_train_step_on_meshes_matches_single_device(meshes):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("sharded_step_worker.py")), *meshes],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(res) == {f"({m.replace(',', ', ')})" for m in meshes}
    for shape, r in res.items():
        assert r["step"] == 2 and r["params"] < 1e-5 and r["loss"] < 1e-5, (shape, r)
        if shape != "(8, 1, 1)":  # pure data parallelism replicates the parameters
            assert r["sharded"], shape

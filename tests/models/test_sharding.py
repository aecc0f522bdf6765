"""Sharded execution on 8 simulated CPU devices equals the single-device model."""

from __future__ import annotations

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
def test_sharded_forward_decode_and_loading_on_8_devices(meshes):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("sharding_worker.py")), *meshes],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(res) == {f"({m.replace(',', ', ')})" for m in meshes}
    for shape, r in res.items():
        assert r["forward"] < 1e-5 and r["decode"] < 1e-5 and r["loaded"] < 1e-5, (shape, r)

"""Training 2N iterations straight equals N, SIGKILL, resume for N more: bitwise on CPU."""

import json
import signal
import subprocess
import sys
from pathlib import Path

WORKER = str(Path(__file__).parent / "rl_worker.py")


def run(*args, expect_kill=False):
    p = subprocess.run([sys.executable, WORKER, *map(str, args)], capture_output=True, text=True, timeout=600)
    if expect_kill:
        assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
        return None
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_sigkill_and_resume_is_bitwise_identical(tmp_path):
    straight = run(tmp_path / "a", 4)
    run(tmp_path / "b", 4, 3, expect_kill=True)  # killed after iteration 3; checkpoint of 2 exists
    resumed = run(tmp_path / "b", 4)
    assert resumed["resumed_from"] == 2
    assert resumed["iteration"] == straight["iteration"] == 4
    assert resumed["digest"] == straight["digest"]
    assert resumed["rewards"] == straight["rewards"]  # the restored history continues too

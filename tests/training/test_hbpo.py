"""HBPO end to end: budget variants of every prompt in the data pipeline, the budget-aware
reward and the hierarchical advantage by prompt group, config checks."""

import dataclasses

import pytest

from jaxrl_llm.config import Choice, ConfigError
from jaxrl_llm.data import ListSource, PromptDataConfig, prompt_dataset


class Tok:
    def __call__(self, text):
        return {"input_ids": [ord(c) % 50 + 1 for c in text]}


def test_prompt_budget_variants_are_consecutive_with_a_budget_column():
    rows = [{"prompt": f"q{i}", "answer": i} for i in range(3)]
    cfg = PromptDataConfig(batch_size=2, chat=False, budgets=(4, 8), shuffle=False, budget_template="{prompt}|{budget}")
    batch = next(prompt_dataset(ListSource(rows, "rows"), Tok(), cfg, process_index=0, process_count=1))
    assert batch.prompts == ["q0|4", "q0|8", "q1|4", "q1|8"]
    assert batch.columns["budget"] == [4, 8, 4, 8] and batch.columns["answer"] == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="budget_template must contain"):
        prompt_dataset(ListSource(rows, "rows"), Tok(), dataclasses.replace(cfg, budget_template="{prompt}"),
                       process_index=0, process_count=1)


def _cfg(tmp_path, budgets=(4, 8)):
    from jaxrl_llm.training.runner import DataSpec, RecipeSpec
    from test_runner import tiny

    base = tiny(tmp_path / "hbpo", steps=1, eval_every=0, export_hf=False, plot=False, log_samples_every=0)
    return dataclasses.replace(
        base, data=dataclasses.replace(base.data, budgets=budgets),
        rollout=dataclasses.replace(base.rollout, prompt_buckets=(64,)),  # the budget text lengthens the prompts
        recipe=RecipeSpec(name="grpo", advantage=Choice("hbpo", {"budgets": [4, 8], "max_length": 8.0}),
                          shaping=Choice("hbpo", {"budgets": [4, 8], "max_length": 8.0})))


def test_hbpo_config_checks(tmp_path):
    from jaxrl_llm.training.runner import check_rl

    from jaxrl_llm.training.runner import RecipeSpec

    cfg = _cfg(tmp_path)
    base = check_rl(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, budgets=()), recipe=RecipeSpec()))
    assert check_rl(_cfg(tmp_path))["rows_per_step"] == 2 * base["rows_per_step"]  # two budget variants
    with pytest.raises(ConfigError, match="recipe.advantage=hbpo reads budgets \\[4, 8\\] by prompt group; "
                                          "data.budgets must be the same"):
        check_rl(_cfg(tmp_path, budgets=(4,)))


@pytest.mark.slow  # SFT + one RL step through the runner (~25 s); the parts are tested in tests/core
def test_hbpo_run(tmp_path):
    import json

    from jaxrl_llm.training.runner import run_rl

    s = run_rl(_cfg(tmp_path))
    assert s["steps"] == 1
    rows = [json.loads(x) for x in (tmp_path / "hbpo" / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if "rewards/shaped/mean" in r][0]
    assert step["rewards/shaped/mean"] <= 4.0  # min(f1, f2) <= beta

"""Rationale-enriched DPO (METHODS.md #236) in the pipeline and a run: each pair's rationale is a
third row (the judging prompt with both answers, then the rationale), the loss reads its sum."""

import dataclasses
import json

import numpy as np
import pytest

from jaxrl_llm.config import ConfigError
from jaxrl_llm.data import ListSource, PreferenceDataConfig, preference_dataset
from jaxrl_llm.data.pipeline import RATIONALE_TEMPLATE, rationale_prompt
from jaxrl_llm.data.sources import DataError
from jaxrl_llm.training.configs import PairsSpec, PreferenceRecipeSpec, PreferenceRunConfig
from jaxrl_llm.training.preference import preference_arrays
from jaxrl_llm.training.preference_runner import check_preference

ROWS = [{"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2), "why": f"{i}+1 is {i + 1}"}
        for i in range(4)]


def _tok():
    from jaxrl_llm.data.char_tokenizer import char_tokenizer

    return char_tokenizer()


def test_the_rationale_is_a_third_row_after_the_judging_prompt():
    tok = _tok()
    cfg = PreferenceDataConfig(batch_size=4, chat=False, shuffle=False, rationale_field="why",
                               rationale_template="Q {prompt} A {chosen} B {rejected}:")
    b = next(preference_dataset(ListSource(ROWS, "pairs"), tok, cfg, process_index=0, process_count=1))
    assert b.slots == 3 and b.num_pairs == 4
    a = preference_arrays(b)
    assert a["tokens"].shape[:2] == (4, 3)
    row = a["tokens"][1, 2][a["mask"][1, 2]]
    text = tok.decode(row)
    assert text.startswith("Q 1+1= A 2 B 3:") and "1+1 is 2" in text
    scored = tok.decode(a["tokens"][1, 2, 1:][a["loss_mask"][1, 2]])
    assert scored.startswith("1+1 is 2")  # only the rationale is scored, not its prompt
    assert rationale_prompt("", "q", "a", "b") == RATIONALE_TEMPLATE.format(prompt="q", chosen="a", rejected="b")
    bad = [dict(ROWS[0], why="   ")]
    with pytest.raises(DataError, match="pairs:0: field 'why' must be a non-empty string"):
        next(preference_dataset(ListSource(bad, "pairs"), tok, cfg, process_index=0, process_count=1))


def test_config_errors():
    base = PreferenceRunConfig()
    rdpo = PreferenceRecipeSpec(name="rdpo")
    with pytest.raises(ConfigError, match="needs a pairs file"):
        check_preference(dataclasses.replace(base, recipe=rdpo))
    with pytest.raises(ConfigError, match="pairs.rationale_field / pairs.rationale_template are read by a rationale"):
        check_preference(dataclasses.replace(base, pairs=PairsSpec(source="p.jsonl", eval_source="e.jsonl",
                                                                   rationale_field="why")))
    with pytest.raises(ConfigError, match=r"pairs.rationale_template may use \{prompt\}.*KeyError"):
        check_preference(dataclasses.replace(base, recipe=rdpo, pairs=PairsSpec(
            source="p.jsonl", eval_source="e.jsonl", rationale_field="why", rationale_template="{question}")))


@pytest.mark.slow
def test_a_rationale_dpo_run(tmp_path):
    from jaxrl_llm.training.configs import ModelSpec, RunSpec, SFTSpec
    from jaxrl_llm.training.preference_runner import run_preference

    for name in ("pairs", "held"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS * 2))
    base = PreferenceRunConfig()
    cfg = dataclasses.replace(
        base, model=ModelSpec(source="tiny", hidden_size=32, num_layers=1), control=False,
        recipe=PreferenceRecipeSpec(name="dpo", loss=dataclasses.replace(PreferenceRecipeSpec().loss, name="rdpo")),
        pairs=PairsSpec(source=str(tmp_path / "pairs.jsonl"), eval_source=str(tmp_path / "held.jsonl"), held_out=4,
                        batch_size=4, rationale_field="why"),
        sft=SFTSpec(steps=1, batch_size=4), data=dataclasses.replace(base.data, eval_rows=4, train_rows=16),
        run=RunSpec(out=str(tmp_path / "rdpo"), steps=2, eval_every=0, checkpoint_every=2, keep_last=1,
                    export_hf=False, plot=False, log_samples_every=0, progress=False))
    rep = run_preference(cfg)
    rows = [json.loads(x) for x in (tmp_path / "rdpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 2 and all(np.isfinite(r["pref/rationale_loss"]) and r["pref/rationale_loss"] > 0
                                   for r in steps)
    assert rep["preference"]["objective"] == "rdpo"

"""MPO (METHODS.md #201): the easy / hard split of pairs by a reward model's score gap, the
preference run's ``pairs.split``, and the RL stage's start from the DPO model
(``model.init_params``)."""

import dataclasses
import json

import jax
import numpy as np
import pytest

import jaxrl_llm.core as core
from jaxrl_llm.config import ConfigError
from jaxrl_llm.data.sources import WHERE, DataError
from jaxrl_llm.training.configs import PairsSpec, PreferenceRunConfig
from jaxrl_llm.training.preference_runner import _mpo_split, check_preference


def test_easy_pairs_hand_values_and_identity():
    c = np.array([3.0, 1.0, 0.5, -1.0, 2.5])
    r = np.array([1.0, 1.0, 0.0, 2.0, 2.0])  # gaps 2, 0, 0.5, -3, 0.5
    assert np.asarray(core.mpo_easy_pairs(c, r, threshold=1.0)).tolist() == [True, False, False, False, False]
    assert np.asarray(core.mpo_easy_pairs(c, r, threshold=0.5)).tolist() == [True, False, True, False, True]
    # a pair the reward model reverses is hard at any threshold >= its gap
    assert not bool(core.mpo_easy_pairs(c, r, threshold=0.0)[3])
    # identity: threshold -inf keeps every pair (DPO on all the data)
    assert np.asarray(core.mpo_easy_pairs(c, r, threshold=-np.inf)).all()
    with pytest.raises((ValueError, TypeError)):
        core.mpo_easy_pairs(c, r[:3], threshold=0.0)


def _rows():
    gaps = [4.0, 0.1, 2.0, -1.0]
    return [{"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2), "score_chosen": 5.0,
             "score_rejected": 5.0 - g, WHERE: f"pairs.jsonl:{i + 1}"} for i, g in enumerate(gaps)]


def test_split_keeps_the_easy_or_the_hard_pairs_and_names_a_bad_row():
    spec = PairsSpec(source="p.jsonl", eval_source="e.jsonl", split="easy", margin=1.0)
    easy, info = _mpo_split(_rows(), spec)
    assert [r["prompt"] for r in easy] == ["0+1=", "2+1="]
    assert info == {"mpo_split": "easy", "mpo_easy": 2, "mpo_hard": 2}
    hard, _ = _mpo_split(_rows(), dataclasses.replace(spec, split="hard"))
    assert [r["prompt"] for r in hard] == ["1+1=", "3+1="]
    bad = _rows()
    bad[2]["score_rejected"] = "n/a"
    with pytest.raises(DataError, match="pairs.jsonl:3: .*'score_rejected'.* finite number, got 'n/a'"):
        _mpo_split(bad, spec)
    del bad[2]["score_rejected"]
    with pytest.raises(DataError, match="pairs.jsonl:3"):
        _mpo_split(bad, spec)


def test_config_errors():
    base = PreferenceRunConfig()
    f = dict(source="p.jsonl", eval_source="e.jsonl")
    with pytest.raises(ConfigError, match="pairs.split must be"):
        check_preference(dataclasses.replace(base, pairs=PairsSpec(split="medium", margin=1.0, **f)))
    with pytest.raises(ConfigError, match="needs a pairs file"):
        check_preference(dataclasses.replace(base, pairs=PairsSpec(split="easy", margin=1.0)))
    with pytest.raises(ConfigError, match="needs pairs.margin"):
        check_preference(dataclasses.replace(base, pairs=PairsSpec(split="easy", **f)))
    with pytest.raises(ConfigError, match="needs pairs.margin.*got 'big'"):
        check_preference(dataclasses.replace(base, pairs=PairsSpec(split="easy", margin="big", **f)))
    with pytest.raises(ConfigError, match="model.init_params starts an RL run"):
        check_preference(dataclasses.replace(base, model=dataclasses.replace(base.model, init_params="x")))


def dpo_on_easy_pairs(tmp_path, steps=2) -> dict:
    """MPO's first stage on a tiny model: DPO on the easy pairs of a scored pairs file (the
    preference run's report)."""
    from jaxrl_llm.training.configs import ModelSpec, PreferenceRecipeSpec, RunSpec, SFTSpec
    from jaxrl_llm.training.preference_runner import run_preference

    rows = [{k: v for k, v in r.items() if k != WHERE} for r in _rows()] * 4
    for name in ("pairs", "held"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = PreferenceRunConfig()
    pref = dataclasses.replace(
        base, model=ModelSpec(source="tiny", hidden_size=32, num_layers=1), control=False,
        recipe=PreferenceRecipeSpec(name="dpo"),
        pairs=PairsSpec(source=str(tmp_path / "pairs.jsonl"), eval_source=str(tmp_path / "held.jsonl"), held_out=4,
                        batch_size=4, split="easy", margin=1.0),
        sft=SFTSpec(steps=1, batch_size=4), data=dataclasses.replace(base.data, eval_rows=4, train_rows=16),
        run=RunSpec(out=str(tmp_path / "dpo"), steps=steps, eval_every=0, checkpoint_every=steps, keep_last=1,
                    export_hf=False, plot=False, log_samples_every=0, progress=False))
    return run_preference(pref)


@pytest.mark.slow
def test_two_stages_dpo_on_easy_pairs_then_rl_from_its_parameters(tmp_path):
    """Stage 1 trains DPO on the easy pairs of a scored pairs file; stage 2's RL policy and KL
    reference start from its final_params (checked against the saved tree), and it runs."""
    import orbax.checkpoint as ocp

    from jaxrl_llm.training.runner import RecipeSpec, _setup, run_rl
    from test_runner import tiny

    rep = dpo_on_easy_pairs(tmp_path)
    assert rep["pairs"]["mpo_easy"] == 8 and rep["pairs"]["mpo_hard"] == 8 and rep["pairs"]["pairs"] == 16
    rl = tiny(tmp_path / "rl", steps=1, eval_every=0, export_hf=False, plot=False, log_samples_every=0)
    rl = dataclasses.replace(rl, model=dataclasses.replace(rl.model, init_params=rep["final_params"], remat="none"))
    s = _setup(rl, {})
    with ocp.StandardCheckpointer() as c:
        want = c.restore(rep["final_params"], s.params)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(s.params), jax.tree.leaves(want)))
    fresh = _setup(dataclasses.replace(rl, model=dataclasses.replace(rl.model, init_params="")), {})
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(fresh.params), jax.tree.leaves(want)))
    # the RL stage runs (a KL recipe: its reference is the DPO model)
    kl = dataclasses.replace(RecipeSpec().kl, coef=0.05)
    out = run_rl(dataclasses.replace(rl, recipe=RecipeSpec(name="grpo", kl=kl), sft=dataclasses.replace(rl.sft, steps=0)))
    assert out["steps"] == 1

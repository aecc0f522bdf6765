"""SPIN's self-play loop (pairs.source=spin): pairs of the reference answer and the policy's own
sample, one preference phase per iteration against the previous iterate, resume."""

import dataclasses
import json

import numpy as np
import pytest

from jaxrl_llm.config import ConfigError
from jaxrl_llm.training.configs import PairsSpec, PreferenceRecipeSpec, RunSpec, SFTSpec
from jaxrl_llm.training.preference_runner import check_preference, run_preference, spin_pairs


class FakeSampler:
    class config:
        num_samples = 2

    def __call__(self, params, prompt_ids, key, *frozen):
        n = len(prompt_ids) * 2
        toks = np.array([[5, 6], [0, 0]] * len(prompt_ids))  # first sample "56", second empty
        mask = np.array([[1, 1], [0, 0]] * len(prompt_ids), bool)
        return type("R", (), {"tokens": toks[:n], "mask": mask[:n]})()


class Tok:
    def __call__(self, text):
        return {"input_ids": [1, 2]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(str(int(i)) for i in ids)


def test_spin_pairs_use_the_policy_sample_right_or_wrong():
    rows = [{"prompt": "1+1=", "solution": "56", "answer": 56}, {"prompt": "2+2=", "solution": "4", "answer": 4}]
    pairs, info = spin_pairs(rows, FakeSampler(), None, Tok(), 0)
    assert [p["rejected"] for p in pairs] == ["56", "56"] and [p["chosen"] for p in pairs] == ["56", "4"]
    assert info == {"pairs": 2, "identical_to_chosen": 1}


def tiny(tmp_path, **pairs):
    from jaxrl_llm.training.configs import PreferenceRunConfig

    base = PreferenceRunConfig()
    return dataclasses.replace(
        base, pairs=PairsSpec(source="spin", prompts=32, held_out=8, batch_size=8, iterations=2, **pairs),
        recipe=PreferenceRecipeSpec(name="spin"), sft=SFTSpec(steps=30, batch_size=16, lr=3e-3),
        data=dataclasses.replace(base.data, eval_rows=16, train_rows=64), control=False,
        run=RunSpec(out=str(tmp_path / "spin"), steps=4, eval_every=0, checkpoint_every=4, keep_last=1,
                    export_hf=False, plot=False, log_samples_every=0, progress=False))


def test_spin_iterations_train_against_the_previous_iterate_and_resume(tmp_path, monkeypatch):
    from jaxrl_llm.training import checkpoint

    cfg = tiny(tmp_path)
    calls = []

    def sigterm_at_preference_step_2(self):  # 30 SFT steps, then the preference steps
        calls.append(1)
        return len(calls) == 32
    monkeypatch.setattr(checkpoint.PreemptionGuard, "should_stop", sigterm_at_preference_step_2)
    cut = run_preference(cfg)  # pre-empted in iteration 0: stops there, no next iteration, no final policy
    assert cut["preempted"] and cut["preempted_phase"] == "spin iteration 0" and cut["preempted_step"] == 2
    assert not (tmp_path / "spin" / "ckpt_spin1").exists() and not (tmp_path / "spin" / "final_params").exists()
    assert json.loads((tmp_path / "spin" / "summary.json").read_text())["preempted"]
    monkeypatch.undo()
    out = run_preference(cfg)  # resumes iteration 0 at step 2, then iteration 1
    assert "preempted" not in out
    rows = [json.loads(x) for x in (tmp_path / "spin" / "metrics.jsonl").read_text().splitlines()]
    its = [r["spin/iteration"] for r in rows if "spin/iteration" in r]
    assert sorted(set(its)) == [0, 1] and len(its) == 8
    # each iteration starts from its reference (the policy equals the opponent): DPO's loss is log 2 exactly
    starts = [r for r in rows if r.get("step") == 1]
    assert len(starts) == 2 and all(abs(r["loss"] - np.log(2.0)) < 1e-6 for r in starts)
    assert out["preference"]["iterations"] == 2 and "pairs_iteration1" in out
    assert (tmp_path / "spin" / "ckpt").is_dir() and (tmp_path / "spin" / "ckpt_spin1").is_dir()
    again = run_preference(cfg)  # resumes: every phase is complete, nothing trains again
    assert again["eval_after_dpo"] == out["eval_after_dpo"]


def test_spin_config_errors():
    from jaxrl_llm.training.configs import PreferenceRunConfig

    base = PreferenceRunConfig()
    with pytest.raises(ConfigError, match="pairs.iterations=2 is SPIN's self-play"):
        check_preference(dataclasses.replace(base, pairs=PairsSpec(iterations=2)))
    with pytest.raises(ConfigError, match="pairs.source=spin trains against the previous iterate"):
        check_preference(dataclasses.replace(base, pairs=PairsSpec(source="spin"),
                                             recipe=PreferenceRecipeSpec(name="simpo")))
    with pytest.raises(ConfigError, match="loss 'kto' takes unpaired rows"):
        check_preference(dataclasses.replace(base, pairs=PairsSpec(source="spin"),
                                             recipe=PreferenceRecipeSpec(name="kto")))
    with pytest.raises(ConfigError, match="pairs.iterations must be >= 1"):
        check_preference(dataclasses.replace(base, pairs=PairsSpec(source="spin", iterations=0)))

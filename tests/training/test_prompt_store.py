"""The per-prompt statistics store: hand-computed updates and lookups, exact JSON round trip,
the loop's updates (every sampled group, raw rewards, after the step) and its inputs to
estimators (the state from before the step), and bitwise resume."""

import json

import numpy as np
import pytest

from jaxrl_llm.algorithms.estimators import PROVIDED_INPUTS
from jaxrl_llm.training import PromptStore, StepBatch
from jaxrl_llm.training.prompt_store import STORE_INPUTS, prompt_keys
from jaxrl_llm.training.providers import PROVIDERS
from test_rl_recipes_extra import make


def _two_rounds() -> PromptStore:
    st = PromptStore(pass_threshold=1.0)
    # step 0: prompt a (rows 0-2) and b (rows 3-5)
    st.observe(0, ["a", "b"], [1.0, 0.0, 1.0, 0.5, np.nan, 0.0], [4, 7, 6, 3, 9, 2], [0, 0, 0, 1, 1, 1])
    # step 2: a again (rows 0-1), c (row 2)
    st.observe(2, ["a", "c"], [0.0, 2.0, 1.0], [5, 3, 8], [0, 0, 1])
    return st


def test_observe_and_lookup_by_hand():
    st = _two_rounds()
    got = st.lookup(["a", "b", "c", "never"])
    # a: rewards 1, 0, 1, 0, 2 -> 3 passes of 5, mean 0.8, var E[r^2] - m^2 = 6/5 - 0.64 = 0.56
    # b: 0.5, NaN (failed), 0 -> no pass; mean over the 2 scored = 0.25, var 0.0625; lengths 3, 9, 2
    # c: one pass, one sample
    np.testing.assert_allclose(got["prompt_seen"], [5, 3, 1, 0])
    np.testing.assert_allclose(got["prompt_pass_rate"], [0.6, 0.0, 1.0, 0.0])
    np.testing.assert_allclose(got["prompt_reward_mean"], [0.8, 0.25, 1.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(got["prompt_reward_var"], [0.56, 0.0625, 0.0, 0.0], rtol=1e-5)
    np.testing.assert_allclose(got["prompt_length_mean"], [5.0, 14 / 3, 8.0, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(got["prompt_last_step"], [2, 0, 2, -1])
    a = st.records["a"]
    assert (a["visits"], a["min_pass_length"], a["first_step"], a["last_pass_rate"]) == (2, 3, 0, 0.5)
    assert st.records["b"]["min_pass_length"] is None and st.records["b"]["last_reward_mean"] == 0.25
    assert st.summary() == {"prompts/distinct": 3.0, "prompts/never_passed_frac": pytest.approx(1 / 3),
                            "prompts/always_passed_frac": pytest.approx(1 / 3)}


def test_state_round_trips_through_json_exactly():
    st = _two_rounds()
    st.observe(3, ["a"], [0.1, 0.7], [1, 2], [0, 0])  # sums that are not exact in binary
    st.slot("shaping/x")["a"] = 3.0
    back = PromptStore(1.0)
    back.load_state_dict(json.loads(json.dumps(st.state_dict())))
    assert back.state_dict() == st.state_dict()
    for k, v in st.lookup(["a", "b"]).items():
        np.testing.assert_array_equal(back.lookup(["a", "b"])[k], v)
    with pytest.raises(ValueError, match="pass_threshold is 0.5"):
        PromptStore(0.5).load_state_dict(st.state_dict())


def test_bad_input_is_named():
    st = PromptStore()
    with pytest.raises(ValueError, match="group ids must index the 1 keys"):
        st.observe(0, ["a"], [1.0, 1.0], [1, 1], [0, 1])
    with pytest.raises(ValueError, match="equal"):
        st.observe(0, ["a"], [1.0], [1, 1], [0, 0])
    with pytest.raises(ValueError, match="pass_threshold"):
        PromptStore(float("nan"))


def test_keys_separate_budget_variants():
    assert prompt_keys(["f:1", "f:1"], {"budget": [64, 128]}) == ["f:1#budget=64", "f:1#budget=128"]
    assert prompt_keys(["f:1", "f:2"], {"answer": ["1", "2"]}) == ["f:1", "f:2"]


def test_every_store_input_is_declared_and_provided():
    for name in STORE_INPUTS:
        assert PROVIDED_INPUTS[name] == "sequence" and name in PROVIDERS


def test_the_loop_feeds_the_store_and_estimators_read_the_state_before_the_step(tmp_path):
    tr = make("grpo", g=4, prompts_per_step=2, rows=[((5, 6, 7), False), ((8, 9, 10), False), ((11, 12, 13), False)])
    expect: dict[str, list] = {}
    read_history = False
    for it in range(4):
        before = PromptStore(1.0)
        before.load_state_dict(tr.store.state_dict())
        m = tr.step()
        b, keys = tr.last_batch, tr._last_keys
        assert keys == [f"toy:{(2 * it + j) % 3}" for j in range(2)]
        # a provider run on this step's batch reads the store as it was before the step
        fake = StepBatch({"group_ids": b["group_ids"]}, b["scores"], b["valid"], 0, [], [], {}, {}, keys=keys)
        tr_before = type("T", (), {"store": before})()
        PROVIDERS["prompt_pass_rate"](tr_before, fake)
        want_rate = [np.mean(np.array(expect.get(keys[g], [np.nan])) >= 1.0) if keys[g] in expect else 0.0
                     for g in b["group_ids"]]
        np.testing.assert_allclose(fake.inputs["prompt_pass_rate"], want_rate)
        PROVIDERS["prompt_reward_mean"](tr_before, fake)
        want_mean = [np.mean(expect[keys[g]]) if keys[g] in expect else 0.0 for g in b["group_ids"]]
        np.testing.assert_allclose(fake.inputs["prompt_reward_mean"], want_mean, rtol=1e-6)
        read_history |= bool((fake.inputs["prompt_reward_mean"] > 0).any())
        for g, key in enumerate(keys):
            expect.setdefault(key, []).extend(b["scores"][b["group_ids"] == g].tolist())
        assert m["prompts/distinct"] == len(expect)
        assert m["prompts/new_frac"] == np.mean([k not in before.records for k in keys])
    assert read_history  # not vacuous: some step's rows read a non-zero history
    for key, scores in expect.items():
        rec = tr.store.records[key]
        assert rec["samples"] == len(scores) and rec["passes"] == sum(s >= 1.0 for s in scores)
        assert rec["reward_sum"] == pytest.approx(sum(scores), rel=1e-6)
    assert tr.store.records["toy:0"]["last_step"] == 3 and tr.store.records["toy:0"]["visits"] == 3

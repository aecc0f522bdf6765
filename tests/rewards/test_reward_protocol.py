"""The reward protocol: weighted combination, per-function metrics, failure isolation."""

import logging
import math
import time

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.rewards import ArrayReward, RewardSpec, Rewards, call_with_timeout, RewardTimeout

PROMPTS = ["p0", "p1", "p2", "p3", "p4"]
COMPLETIONS = ["ok 1", "boom", "ok 3", "sleep", "nan"]
ANSWERS = ["1", "2", "3", "4", "5"]


def correct(prompts, completions, *, answer, **_):
    return [float(c.split()[-1] == a) for c, a in zip(completions, answer)]


def raises_on_boom(prompts, completions, **_):
    if any(c == "boom" for c in completions):
        raise ZeroDivisionError("boom row")
    return [0.5] * len(completions)


def sleeps_on_sleep(prompts, completions, **_):
    if any(c == "sleep" for c in completions):
        time.sleep(3.0)
    return [0.25] * len(completions)


def nan_on_nan(prompts, completions, **_):
    return [float("nan") if c == "nan" else 2.0 for c in completions]


def test_weighted_total_and_metrics():
    r = Rewards([correct, RewardSpec(lambda p, c, **_: [1.0] * len(c), weight=0.5, name="const")])
    out = r(PROMPTS, ["x 1", "x 9", "x 3", "x 4", "x 0"], answer=ANSWERS)
    np.testing.assert_allclose(out.per_fn["correct"], [1, 0, 1, 1, 0])
    np.testing.assert_allclose(out.total, [1.5, 0.5, 1.5, 1.5, 0.5])
    assert out.metrics["rewards/correct/mean"] == pytest.approx(0.6)
    assert out.metrics["rewards/correct/std"] == pytest.approx(np.std([1, 0, 1, 1, 0]))
    assert out.metrics["rewards/const/mean"] == 1.0
    assert out.metrics["rewards/total/mean"] == pytest.approx(1.1)
    assert out.metrics["rewards/failed_rows"] == 0
    assert r.names == ["correct", "const"]


def test_failures_get_default_for_their_rows_only_and_are_counted(caplog):
    """Acceptance: one that raises, one that sleeps past the timeout and one that returns NaN,
    inside one scoring batch: their failing rows get the default, other rows are scored."""
    r = Rewards([
        correct,
        RewardSpec(raises_on_boom, default=-1.0, timeout_s=1.0),
        RewardSpec(sleeps_on_sleep, default=-2.0, timeout_s=0.5),
        RewardSpec(nan_on_nan, default=-3.0, timeout_s=1.0),
    ])
    with caplog.at_level(logging.WARNING, logger="jaxrl_llm.rewards"):
        out = r(PROMPTS, COMPLETIONS, answer=ANSWERS)
    np.testing.assert_allclose(out.per_fn["correct"], [1, 0, 1, 0, 0])
    np.testing.assert_allclose(out.per_fn["raises_on_boom"], [0.5, -1.0, 0.5, 0.5, 0.5])
    np.testing.assert_allclose(out.per_fn["sleeps_on_sleep"], [0.25, 0.25, 0.25, -2.0, 0.25])
    np.testing.assert_allclose(out.per_fn["nan_on_nan"], [2.0, 2.0, 2.0, 2.0, -3.0])
    assert out.failed["raises_on_boom"].tolist() == [False, True, False, False, False]
    assert out.failed["sleeps_on_sleep"].tolist() == [False, False, False, True, False]
    assert out.failed["nan_on_nan"].tolist() == [False, False, False, False, True]
    m = out.metrics
    assert (m["rewards/raises_on_boom/errors"], m["rewards/raises_on_boom/timeouts"]) == (1, 0)
    assert (m["rewards/sleeps_on_sleep/errors"], m["rewards/sleeps_on_sleep/timeouts"]) == (0, 1)
    assert m["rewards/nan_on_nan/nonfinite"] == 1
    assert m["rewards/failed_rows"] == 3
    np.testing.assert_allclose(out.total, [1 + 0.5 + 0.25 + 2, 0 - 1 + 0.25 + 2, 1 + 0.5 + 0.25 + 2,
                                           0 + 0.5 - 2 + 2, 0 + 0.5 + 0.25 - 3])
    assert "ZeroDivisionError: boom row" in caplog.text  # logged with its traceback
    assert m["rewards/sleeps_on_sleep/seconds"] < 2.9  # did not wait for the sleeper


def test_without_row_fallback_the_whole_batch_defaults():
    r = Rewards([RewardSpec(raises_on_boom, default=-1.0, row_fallback=False)])
    out = r(PROMPTS, COMPLETIONS)
    np.testing.assert_allclose(out.total, [-1.0] * 5)
    assert out.metrics["rewards/raises_on_boom/errors"] == 5


def test_none_means_not_applicable():
    def only_even(prompts, completions, **_):
        return [1.0 if i % 2 == 0 else None for i in range(len(completions))]

    out = Rewards([only_even, RewardSpec(lambda p, c, **_: [1.0] * len(c), name="one")])(PROMPTS, COMPLETIONS)
    np.testing.assert_allclose(out.total, [2, 1, 2, 1, 2])
    assert np.isnan(out.per_fn["only_even"][1]) and not out.failed["only_even"].any()
    assert out.metrics["rewards/only_even/mean"] == 1.0


def test_bad_return_values_are_isolated_with_clear_messages(caplog):
    def wrong_len(prompts, completions, **_):
        return [1.0]

    def not_numbers(prompts, completions, **_):
        return ["a"] * len(completions)

    with caplog.at_level(logging.WARNING, logger="jaxrl_llm.rewards"):
        out = Rewards([wrong_len, not_numbers], row_fallback=False)(PROMPTS, COMPLETIONS)
    assert out.metrics["rewards/wrong_len/errors"] == 5 and out.metrics["rewards/not_numbers/errors"] == 5
    assert "returned 1 values for 5 completions" in caplog.text
    assert "non-number at row 0" in caplog.text


def test_process_isolation_kills_a_hanging_function():
    def spin(prompts, completions, **_):
        if "sleep" in completions:
            while True:
                pass
        return [1.0] * len(completions)

    t0 = time.perf_counter()
    out = Rewards([RewardSpec(spin, timeout_s=1.0, isolation="process", default=-1.0)])(PROMPTS, COMPLETIONS)
    np.testing.assert_allclose(out.total, [1, 1, 1, -1, 1])
    assert out.metrics["rewards/spin/timeouts"] == 1
    assert time.perf_counter() - t0 < 10
    import multiprocessing

    assert not [p for p in multiprocessing.active_children() if p.is_alive()]


def test_process_isolation_relays_exceptions():
    out = Rewards([RewardSpec(raises_on_boom, isolation="process", default=-1.0)])(PROMPTS, COMPLETIONS)
    np.testing.assert_allclose(out.total, [0.5, -1.0, 0.5, 0.5, 0.5])


def test_call_with_timeout():
    assert call_with_timeout(lambda: 3, 1.0) == 3
    with pytest.raises(RewardTimeout):
        call_with_timeout(lambda: time.sleep(2), 0.2)
    with pytest.raises(KeyError):
        call_with_timeout(lambda: {}["x"], 1.0, "process")
    with pytest.raises(ValueError, match="isolation"):
        call_with_timeout(lambda: 1, 1.0, "docker")


def test_columns_and_loop_fields_are_passed():
    seen = {}

    def spy(prompts, completions, **cols):
        seen.update(cols)
        return [0.0] * len(completions)

    Rewards([spy])(["a", "b"], ["x", "y"], answer=["1", "2"], completion_lengths=[3, 4], group_ids=[0, 0])
    assert seen == {"answer": ["1", "2"], "completion_lengths": [3, 4], "group_ids": [0, 0]}


def test_array_reward_runs_jax_inline():
    def length_bonus(ids, mask, target=None):
        return jnp.sum(mask, axis=-1) * 0.1 + jnp.where(target is None, 0.0, jnp.asarray(target, jnp.float32))

    ids = [[5, 6, 7], [8], [9, 9]]
    out = Rewards([ArrayReward(length_bonus)])(["a"] * 3, ["x"] * 3, completion_ids=ids, target=[1, 0, 2])
    np.testing.assert_allclose(out.total, [1.3, 0.1, 2.2], rtol=1e-6)


def test_argument_errors():
    with pytest.raises(ValueError, match="at least one"):
        Rewards([])
    with pytest.raises(ValueError, match="2 weights for 1"):
        Rewards([correct], weights=[1, 2])
    with pytest.raises(ValueError, match="timeout_s"):
        RewardSpec(correct, timeout_s=0)
    with pytest.raises(TypeError, match="callable"):
        RewardSpec(3)
    with pytest.raises(ValueError, match="weight"):
        RewardSpec(correct, weight=math.inf)
    r = Rewards([correct])
    with pytest.raises(ValueError, match="column 'answer' has 1 entries for 2"):
        r(["a", "b"], ["x", "y"], answer=["1"])
    with pytest.raises(ValueError, match="2 prompts for 1"):
        r(["a", "b"], ["x"], answer=["1"])


def test_duplicate_names_are_made_unique():
    r = Rewards([correct, correct], weights=[1.0, 2.0])
    assert r.names == ["correct_1", "correct_2"]
    out = r(["a"], ["x 1"], answer=["1"])
    assert out.total[0] == 3.0

"""Rollout budget allocation (Knapsack RL, GVM-RAFT): hand values, the exact knapsack against
brute force, and the authors' rules for prompts outside the knapsack."""

import itertools

import numpy as np
import pytest

import jaxrl_llm.core as C
from jaxrl_llm.core.allocation import _knapsack_gains


def test_knapsack_value_by_hand():
    # p = 1/2, N = 4: P(spread) = 1 - 2/16 = 7/8; info gain = 1/2 * 1/4 = 1/8
    assert C.knapsack_value(0.5, 4) == pytest.approx(7 / 64)
    # p = 0.25, N = 2: 1 - 1/16 - 9/16 = 3/8; info = 0.25 * 0.5625
    assert C.knapsack_value(0.25, 2) == pytest.approx(3 / 8 * 0.25 * 0.5625)
    np.testing.assert_array_equal(C.knapsack_value([0.0, 1.0], 8), [0.0, 0.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        C.knapsack_value(1.5, 2)


def _brute(p, budget, min_n, max_extra):
    best, arg = -1.0, None
    for ks in itertools.product(range(max_extra + 1), repeat=len(p)):
        if sum(ks) != budget:
            continue
        v = sum(_knapsack_gains(q, min_n, max_extra)[k] for q, k in zip(p, ks))
        if v > best + 1e-12:
            best, arg = v, ks
    return best, arg


def test_knapsack_solve_is_the_exact_optimum():
    rng = np.random.default_rng(0)
    for _ in range(60):
        k = int(rng.integers(1, 4))
        max_extra = int(rng.integers(1, 5))
        budget = int(rng.integers(0, k * max_extra + 1))
        p = rng.uniform(0.05, 0.95, k)
        out = C.knapsack_solve(p, budget, 2, max_extra)
        assert out.sum() == budget and (out >= 0).all() and (out <= max_extra).all()
        best, _ = _brute(p, budget, 2, max_extra)
        got = sum(_knapsack_gains(q, 2, max_extra)[c] for q, c in zip(p, out))
        assert got == pytest.approx(best, abs=1e-12)


def test_knapsack_solve_by_hand_and_overflow():
    # one prompt at p = 1/2 and one at 0.1, 3 extra rollouts, at most 2 each: the values with
    # min_n = 2 are v(p, 2 + k); p = 1/2 gains 1/8 (1 - 2/2^m): m = 3 -> 3/32, m = 4 -> 7/64;
    # p = 0.1: 0.081 (1 - 0.1^m - 0.9^m): m = 3 -> 0.0219, m = 4 -> 0.0277
    # (2, 1): 7/64 + 0.0219 = 0.1313 beats (1, 2): 3/32 + 0.0277 = 0.1215
    np.testing.assert_array_equal(C.knapsack_solve([0.5, 0.1], 3, 2, 2), [2, 1])
    # more budget than the items can take (2 x 2): the rest spread, first items first
    np.testing.assert_array_equal(C.knapsack_solve([0.5, 0.1], 7, 2, 2), [4, 3])
    np.testing.assert_array_equal(C.knapsack_solve([0.5, 0.1], 0, 2, 2), [0, 0])
    with pytest.raises(ValueError, match="budget"):
        C.knapsack_solve([0.5], -1, 2, 2)


def test_knapsack_allocate_rules_by_hand():
    # valid prompts at p = 1/2, 0, 1 and one without an estimate; n = 8, budget 32.
    # before the knapsack: 2 + 2 + 2 + 8 = 14, 18 left. p = 1/2 needs log(0.1)/log(0.5) = 3.3 -> 3
    # rollouts < 18: the surplus 15 goes to the p = 0 prompts, the unestimated one counting as
    # p = 0 (the authors' code): 8 and 7; the knapsack spends 3 on the p = 1/2 prompt
    counts, info = C.knapsack_allocate([1, 1, 1, 0], [0.5, 0.0, 1.0, 0.7], 8)
    np.testing.assert_array_equal(counts, [5, 10, 2, 15])
    assert info == {"effective": 1, "fallback": True, "fallback_ratio": 3 / 18}
    # no fallback: everything left goes through the knapsack (capped at max_n = 16 each)
    counts, info = C.knapsack_allocate([1, 1, 1, 1], [0.5, 0.1, 0.9, 0.3], 8, max_n=16, fallback=False)
    assert counts.sum() == 32 and (counts >= 2).all() and (counts <= 16).all() and not info["fallback"]
    extra = C.knapsack_solve(np.array([0.5, 0.1, 0.9, 0.3]), 24, 2, 14)
    np.testing.assert_array_equal(counts, 2 + extra)
    # nobody in (0, 1): the rest to the p = 0 prompts
    counts, _ = C.knapsack_allocate([1, 1], [0.0, 1.0], 4)
    np.testing.assert_array_equal(counts, [6, 2])
    # only p = 1 prompts: uniform
    counts, _ = C.knapsack_allocate([1, 1], [1.0, 1.0], 4)
    np.testing.assert_array_equal(counts, [4, 4])
    # nothing estimated yet: the default n each (the unestimated prompts count as p = 0 and
    # nothing is left to spread)
    counts, _ = C.knapsack_allocate([0, 0, 0], [0.0, 0.0, 0.0], 8)
    np.testing.assert_array_equal(counts, [8, 8, 8])


def test_knapsack_allocate_every_prompt_in_the_knapsack_with_a_surplus():
    # all prompts 0 < p < 1 and they need few rollouts: the authors' code would divide by zero
    # (no p = 0 prompt and no prompt outside the knapsack); the knapsack gets the whole budget
    counts, info = C.knapsack_allocate([1, 1], [0.5, 0.5], 16, max_n=128)
    assert counts.sum() == 32 and not info["fallback"]


def test_knapsack_allocate_errors_name_the_argument():
    with pytest.raises(ValueError, match="min_n"):
        C.knapsack_allocate([1], [0.5], 8, min_n=-1)
    with pytest.raises(ValueError, match="max_n=1 is below min_n=2"):
        C.knapsack_allocate([1], [0.5], 8, max_n=1)
    with pytest.raises(ValueError, match="budget of 4"):
        C.knapsack_allocate([0, 0], [0, 0], 8, budget=4)
    with pytest.raises(ValueError, match="cost"):
        C.knapsack_allocate([1], [0.5], 8, cost="other")


def test_gvm_ratios_and_rounding_by_hand():
    # G / sqrt(p + alpha / p^(beta - 1)), beta = 2: p = 1/4 -> 2 / sqrt(0.25 + 0.004) ; p = 1 -> 1 / sqrt(1.001)
    r = C.gvm_sample_ratios([2.0, 1.0, 3.0, 0.0], [0.25, 1.0, 0.0, 0.5])
    a, b = 2 / np.sqrt(0.25 + 1e-3 / 0.25), 1 / np.sqrt(1.001)
    np.testing.assert_allclose(r, [a / (a + b), b / (a + b), 0, 0], rtol=1e-12)
    # rounding keeps the total: 0.5 * 3 = 1.5 -> 2, 0.25 * 3 = 0.75 -> 1 (x2) = 4, one too many: the
    # entry that gained most by rounding (+0.5) loses one
    np.testing.assert_array_equal(C.round_preserving_sum([0.5, 0.25, 0.25], 3), [1, 1, 1])
    # 1.4, 1.4, 4.2 round to 6, one short: the largest loss (0.4, a tie) goes up, the first of the tie
    np.testing.assert_array_equal(C.round_preserving_sum([0.2, 0.2, 0.6], 7), [2, 1, 4])
    with pytest.raises(ValueError, match="no prompt"):
        C.gvm_sample_ratios([0.0, 1.0], [0.5, 0.0])

"""Reward shaping, batch filters and the masked / grouped statistics."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxrl_llm.core import shaping as S
from jaxrl_llm.core import stats as ST


def test_overlong_penalty_hand_computed():
    out = np.asarray(S.overlong_penalty(np.array([10, 16, 18, 20, 24]), max_length=20, buffer_length=4,
                                        penalty_factor=1.0))
    np.testing.assert_allclose(out, [0, 0, -0.5, -1.0, -2.0])
    with pytest.raises(ValueError, match="buffer_length"):
        S.overlong_penalty(np.array([1]), max_length=4, buffer_length=8)


def test_kimi_length_reward():
    lengths = np.array([10, 20, 30, 5, 5], np.float32)
    correct = np.array([1, 0, 1, 1, 0], bool)
    g = np.array([0, 0, 0, 1, 1], np.int32)
    out = np.asarray(S.kimi_length_reward(lengths, correct, g, 2))
    np.testing.assert_allclose(out, [0.5, 0.0, -0.5, 0.0, 0.0])


def test_dynamic_sampling_mask():
    s = np.array([1, 1, 0, 1, 1, 0], np.float32)
    g = np.array([0, 0, 1, 1, 2, 3], np.int32)
    keep = np.asarray(S.dynamic_sampling_mask(s, g, 4))
    np.testing.assert_array_equal(keep, [False, False, True, True, True, True])
    keep = np.asarray(S.dynamic_sampling_mask(s, g, 4, keep_singletons=False))
    np.testing.assert_array_equal(keep, [False, False, True, True, False, False])


def test_pf_ppo():
    s = np.array([-2.0, 0.5, 1.0, 3.0], np.float32)
    np.testing.assert_allclose(np.asarray(S.pf_ppo_weights(s, "pow", 2.0)), s**2 + 1e-8, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(S.pf_ppo_weights(s, "max_min")), [1, 1e-8, 1e-8, 1], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(S.pf_ppo_weights(s, "max_random")), [0.1, 0.1, 0.1, 0.4], rtol=1e-6)
    idx = S.pf_ppo_resample(jax.random.key(0), s, "max_min")
    assert set(np.asarray(idx).tolist()) <= {0, 3}
    assert np.array_equal(np.asarray(idx), np.asarray(S.pf_ppo_resample(jax.random.key(0), s, "max_min")))


def test_masked_whiten_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 5)).astype(np.float32)
    m = rng.random((4, 5)) > 0.3
    v = x[m]
    exp = (x - v.mean()) / np.sqrt(v.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(np.asarray(ST.masked_whiten(x, m))[m], exp[m], rtol=1e-5)


@given(st.lists(st.floats(-10, 10, width=32), min_size=1, max_size=20), st.integers(1, 5), st.integers(0, 99))
def test_property_group_stats_match_numpy(xs, ng, seed):
    x = np.asarray(xs, np.float32)
    g = np.random.default_rng(seed).integers(0, ng, x.shape[0]).astype(np.int32)
    st_ = ST.group_stats(x, g, ng)
    for i in range(x.shape[0]):
        grp = x[g == g[i]]
        assert float(st_.count[i]) == len(grp)
        np.testing.assert_allclose(float(st_.mean[i]), grp.mean(), rtol=1e-4, atol=1e-4)
        exp_std = grp.std(ddof=1) if len(grp) > 1 else 0.0
        np.testing.assert_allclose(float(st_.std[i]), exp_std, rtol=1e-3, atol=1e-3)


def test_dense_group_ids():
    ids, n = ST.dense_group_ids(["b", "b", "a", "c", "a"])
    assert n == 3 and ids.tolist() == [0, 0, 1, 2, 1]


def test_masked_mean_empty_is_zero():
    assert float(ST.masked_mean(np.ones(3, np.float32), np.zeros(3))) == 0.0

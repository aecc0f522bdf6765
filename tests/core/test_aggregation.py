"""Aggregation modes: hand values, exact micro-batch combination, empty batches."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxrl_llm.core import aggregation as G

X = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], np.float32)
M = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], np.float32)


@pytest.mark.parametrize("mode,expected", [
    ("token-mean", (1 + 2 + 4) / 3),
    ("token-sum", 1 + 2 + 4),
    ("seq-mean-token-mean", ((1 + 2) / 2 + 4 / 1) / 2),
    ("seq-mean-token-sum", ((1 + 2) + 4) / 2),
    ("seq-mean-token-sum-norm", ((1 + 2) + 4) / 2 / 3),
])
def test_hand_computed(mode, expected):
    np.testing.assert_allclose(float(G.aggregate(X, M, mode)), expected, rtol=1e-6)
    np.testing.assert_allclose(float(jax.jit(G.aggregate, static_argnums=2)(X, M, mode)), expected, rtol=1e-6)


def test_horizon_constant():
    np.testing.assert_allclose(float(G.aggregate(X, M, "seq-mean-token-sum-norm", horizon=10)), 7 / 2 / 10)


@pytest.mark.parametrize("mode", G.AGG_MODES)
@pytest.mark.parametrize("n_micro", [1, 2, 4, 8])
def test_micro_batches_combine_exactly(mode, n_micro):
    """Sum of (sum, weight) pairs over micro-batches == the whole batch: value and gradient."""
    rng = np.random.default_rng(n_micro)
    x = rng.normal(size=(16, 11)).astype(np.float32)
    lengths = rng.integers(0, 12, 16)
    m = (np.arange(11)[None] < lengths[:, None]).astype(np.float32)

    def whole(x):
        return G.aggregate(x, m, mode)

    def micro(x):
        xs, ms = x.reshape(n_micro, -1, 11), m.reshape(n_micro, -1, 11)
        s, w = jax.vmap(lambda a, b: G.aggregate_sum_weight(a, b, mode))(xs, ms)
        return G.finalize(jnp.sum(s), jnp.sum(w))

    v1, g1 = jax.value_and_grad(whole)(x)
    v2, g2 = jax.value_and_grad(micro)(x)
    np.testing.assert_allclose(float(v2), float(v1), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g2), np.asarray(g1), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("mode", G.AGG_MODES)
def test_all_masked_is_zero_with_zero_gradient(mode):
    v, g = jax.value_and_grad(lambda x: G.aggregate(x, np.zeros_like(X), mode))(X)
    assert float(v) == 0.0 and np.all(np.asarray(g) == 0)


@pytest.mark.parametrize("mode", G.AGG_MODES)
def test_bf16_and_garbage_under_mask(mode):
    x = X.copy()
    x[2] = np.nan  # masked row with NaN must not leak
    v = G.aggregate(jnp.asarray(x, jnp.bfloat16), M, mode)
    assert v.dtype == jnp.float32
    np.testing.assert_allclose(float(v), float(G.aggregate(X, M, mode)), rtol=1e-2)


@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 100))
def test_property_token_mean_is_a_weighted_average(b, t, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(b, t)).astype(np.float32)
    m = (rng.random((b, t)) > 0.4).astype(np.float32)
    v = float(G.aggregate(x, m, "token-mean"))
    if m.sum() == 0:
        assert v == 0.0
    else:
        assert x[m > 0].min() - 1e-5 <= v <= x[m > 0].max() + 1e-5


def test_errors():
    with pytest.raises(ValueError, match="'mode'"):
        G.aggregate(X, M, "mean")
    with pytest.raises(ValueError, match="'mask'"):
        G.aggregate(X, M[:2], "token-mean")
    with pytest.raises(ValueError, match="'horizon'"):
        G.aggregate(X, M, "seq-mean-token-sum-norm", horizon=0)

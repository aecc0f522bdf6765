"""Guide's loss (arXiv:2506.13923) by hand: the authors' worked rule (the 0.9 percentile of the
hinted row's ratios, r / (r + gamma), no clip), PPO's clip on plain rows, the gradient, the
other gamma strategies, and the masked per-row quantile against numpy's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.core import guide_loss, masked_row_quantile, ppo_clip_loss


def test_worked_example_of_the_authors_rule():
    # a hinted row with token ratios [0.5, 0.9, 1.0, 1.2, 2.0] (a sixth, padded position ignored)
    r = np.array([[0.5, 0.9, 1.0, 1.2, 2.0, 7.0]], np.float32)
    m = np.array([[1, 1, 1, 1, 1, 0]], bool)
    adv = np.full_like(r, 1.62018)
    loss, met = guide_loss(jnp.log(r), jnp.zeros_like(r), adv, m, np.array([1.0]))
    gamma = 1.68  # numpy.quantile([0.5, 0.9, 1.0, 1.2, 2.0], 0.9): 1.2 + 0.6 * (2.0 - 1.2)
    want = -1.62018 * np.array([0.22936, 0.34884, 0.37313, 0.41667, 0.54348])  # r / (r + 1.68), 5 digits
    np.testing.assert_allclose(np.asarray(loss)[0, :5], want, rtol=2e-5)
    assert float(loss[0, 5]) == 0.0
    assert float(met["hinted_gamma_mean"]) == pytest.approx(gamma, rel=1e-6)
    assert float(met["hinted_frac"]) == 1.0 and float(met["clip_frac"]) == 0.0


def test_plain_rows_are_ppo_without_dual_clip_and_hinted_rows_unclipped():
    rng = np.random.default_rng(0)
    b, t = 6, 7
    lp, olp = rng.normal(-1.0, 0.6, (b, t)).astype(np.float32), rng.normal(-1.0, 0.6, (b, t)).astype(np.float32)
    adv = rng.normal(size=(b, t)).astype(np.float32)
    m = rng.random((b, t)) < 0.8
    hinted = np.array([0, 1, 0, 1, 1, 0], np.float32)
    loss, met = guide_loss(lp, olp, adv, m, hinted, clip_low=0.2)
    ppo, _ = ppo_clip_loss(lp, olp, adv, m, clip_low=0.2, dual_clip=None)
    plain = hinted == 0
    np.testing.assert_allclose(np.asarray(loss)[plain], np.asarray(ppo)[plain], rtol=1e-6)
    r = np.exp(lp - olp)
    for i in np.flatnonzero(~plain):
        g = max(np.quantile(r[i][m[i]], 0.9), 1e-4)
        np.testing.assert_allclose(np.asarray(loss)[i][m[i]], (-adv[i] * r[i] / (r[i] + g))[m[i]], rtol=1e-5)
    # the clip fraction counts plain tokens only
    assert 0.0 <= float(met["clip_frac"]) <= 1.0

    # the gradient of a hinted token: -A gamma r / (r + gamma)^2 (gamma held fixed)
    def total(x):
        lo, _ = guide_loss(x, olp, adv, m, hinted)
        return jnp.sum(lo)

    grad = np.asarray(jax.grad(total)(jnp.asarray(lp)))
    for i in np.flatnonzero(~plain):
        g = max(np.quantile(r[i][m[i]], 0.9), 1e-4)
        want = -adv[i] * g * r[i] / (r[i] + g) ** 2
        np.testing.assert_allclose(grad[i][m[i]], want[m[i]], rtol=1e-4, atol=1e-7)
        assert np.all(grad[i][~m[i]] == 0)


def test_constant_and_power_strategies_and_row_independence():
    r = np.array([[0.5, 2.0, 1.0], [3.0, 1.0, 0.2]], np.float32)
    m = np.ones_like(r, bool)
    adv = np.ones_like(r)
    lo, _ = guide_loss(np.log(r), np.zeros_like(r), adv, m, [1, 1], gamma_strategy="constant", gamma=1.0)
    np.testing.assert_allclose(np.asarray(lo), -r / (r + 1.0), rtol=1e-6)
    lo, _ = guide_loss(np.log(r), np.zeros_like(r), adv, m, [1, 1], gamma_strategy="power", gamma=0.5)
    np.testing.assert_allclose(np.asarray(lo), -np.sqrt(r), rtol=1e-6)
    # per-row scope: a row's loss does not depend on the other rows (micro-batching cannot change it)
    full, _ = guide_loss(np.log(r), np.zeros_like(r), adv, m, [1, 1])
    one, _ = guide_loss(np.log(r[1:]), np.zeros_like(r[1:]), adv[1:], m[1:], [1])
    np.testing.assert_allclose(np.asarray(full)[1:], np.asarray(one), rtol=1e-7)


def test_masked_row_quantile_equals_numpy_on_ragged_rows():
    rng = np.random.default_rng(1)
    v = rng.exponential(size=(9, 11)).astype(np.float32)
    m = rng.random((9, 11)) < 0.6
    m[0] = False  # an empty row: 1.0
    m[1] = False
    m[1, 3] = True  # one entry: itself
    for q in (0.0, 0.25, 0.5, 0.9, 1.0):
        got = np.asarray(masked_row_quantile(v, m, q))
        want = [np.quantile(v[i][m[i]], q) if m[i].any() else 1.0 for i in range(9)]
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_bad_arguments_are_named():
    x = np.zeros((2, 3), np.float32)
    m = np.ones((2, 3), bool)
    with pytest.raises(ValueError, match="gamma_strategy"):
        guide_loss(x, x, x, m, [0, 1], gamma_strategy="median")
    with pytest.raises(ValueError, match="percentile's level"):
        guide_loss(x, x, x, m, [0, 1], gamma=1.5)
    with pytest.raises(ValueError, match="'hinted' must have shape \\[2\\]"):
        guide_loss(x, x, x, m, [0, 1, 1])
    with pytest.raises(ValueError, match="'q' must be in"):
        masked_row_quantile(x, m, 2.0)

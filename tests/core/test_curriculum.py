"""Curricula and prompt priorities (jaxrl_llm.core.curriculum): hand values and limit cases."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.core as C


def test_td_update_moves_observed_arms_only():
    q = jnp.array([0.0, 1.0, 0.5])
    out = C.td_update(q, jnp.array([1.0, 0.0, 9.0]), jnp.array([True, True, False]), 0.25)
    np.testing.assert_allclose(out, [0.25, 0.75, 0.5])  # 0 + .25 (1 - 0); 1 + .25 (0 - 1); unobserved kept
    np.testing.assert_allclose(C.td_update(q, jnp.ones(3), jnp.ones(3, bool), 1.0), [1, 1, 1])  # alpha 1: the reward
    np.testing.assert_allclose(C.td_update(q, jnp.ones(3), jnp.ones(3, bool), 0.0), q)  # alpha 0: frozen
    with pytest.raises(ValueError, match="alpha"):
        C.td_update(q, q, jnp.ones(3, bool), 1.5)


def test_boltzmann_probs():
    p = C.boltzmann_probs(jnp.array([0.0, np.log(3.0), 5.0]), jnp.array([True, True, False]), 1.0)
    np.testing.assert_allclose(p, [0.25, 0.75, 0.0], rtol=1e-6)
    # a high temperature tends to uniform, a low one to the argmax
    np.testing.assert_allclose(C.boltzmann_probs(jnp.array([0.0, 1.0]), jnp.ones(2, bool), 1e4), [0.5, 0.5], atol=1e-4)
    np.testing.assert_allclose(C.boltzmann_probs(jnp.array([0.0, 1.0]), jnp.ones(2, bool), 1e-3), [0.0, 1.0], atol=1e-6)
    np.testing.assert_array_equal(C.boltzmann_probs(jnp.zeros(2), jnp.zeros(2, bool), 1.0), [0.0, 0.0])


def test_variance_promotion_score_and_uncertainty_priority():
    p = jnp.array([0.0, 0.5, 1.0, 0.25])
    np.testing.assert_allclose(C.variance_promotion_score(p), [0.0, 0.25, 0.0, 0.1875])
    np.testing.assert_allclose(C.variance_promotion_score(p, jnp.array([1.0, 0.0, 0.5, 0.0]), outcome_weight=0.8,
                                                          diversity_weight=0.2), [0.2, 0.2, 0.1, 0.15])
    np.testing.assert_allclose(C.uncertainty_priority(p), [0.05, 0.55, 0.05, np.sqrt(0.1875) + 0.05], rtol=1e-6)


def test_kl_adaptive_forgetting():
    d = jnp.array([0.0, 0.06, 0.005, 1.0])
    # D = 0 -> 1 clipped to 0.96; D = D_half -> 0.5 clipped to 0.875; 2^(-1/12) = 0.9439 inside the range
    np.testing.assert_allclose(C.kl_adaptive_forgetting(d), [0.96, 0.875, 2 ** (-1 / 12), 0.875], rtol=1e-6)
    np.testing.assert_allclose(C.kl_adaptive_forgetting(jnp.array([0.06]), rho_min=0.1, rho_max=1.0), [0.5])
    with pytest.raises(ValueError, match="rho_min"):
        C.kl_adaptive_forgetting(d, rho_min=0.99, rho_max=0.9)


def test_mean_abs_logp_change_and_beta_tracker():
    stored = jnp.array([[-1.0, -2.0, -3.0], [-0.5, 0.0, 0.0]])
    now = jnp.array([[-1.5, -1.0, -9.0], [-0.25, 0.0, 0.0]])
    m = jnp.array([[1, 1, 0], [0, 0, 0]])
    np.testing.assert_allclose(C.mean_abs_logp_change(stored, now, m), [0.75, 0.0])  # (0.5 + 1) / 2; no tokens: 0
    a, b = C.beta_tracker_update(jnp.array([0.5, 4.0]), jnp.array([0.5, 4.0]), jnp.array([1.0, 0.0]),
                                 jnp.array([0.96, 0.875]))
    np.testing.assert_allclose(a, [1.48, 3.5])
    np.testing.assert_allclose(b, [0.48, 4.5])
    # with rho = 1 the tracker counts successes and failures exactly (a Beta posterior)
    a, b = jnp.array(0.5), jnp.array(0.5)
    for r in (1.0, 1.0, 0.0):
        a, b = C.beta_tracker_update(a, b, r, 1.0)
    assert (float(a), float(b)) == (2.5, 1.5)


def test_single_stream_advantages_are_globally_normalised():
    s = jnp.array([1.0, 0.0, 1.0, 0.0])
    base = jnp.array([0.5, 0.5, 0.25, 0.9])
    m = jnp.array([[1, 1], [1, 0], [1, 1], [0, 0]])
    raw = np.array([0.5, -0.5, 0.75, -0.9])
    want = (raw - raw.mean()) / (raw.std(ddof=1) + 1e-8)
    out = np.asarray(C.single_stream_advantages(s, base, m))
    np.testing.assert_allclose(out, np.where(np.asarray(m, bool), want[:, None], 0.0), rtol=1e-5)
    # invalid rows leave the statistics and get 0
    v = jnp.array([True, True, True, False])
    raw3 = raw[:3]
    want3 = (raw3 - raw3.mean()) / (raw3.std(ddof=1) + 1e-8)
    out = np.asarray(C.single_stream_advantages(s, base, m, v))
    np.testing.assert_allclose(out[:3, 0], want3, rtol=1e-5)
    assert not out[3].any()


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="rewards"):
        C.td_update(jnp.zeros(3), jnp.zeros(2), jnp.ones(3, bool), 0.5)
    with pytest.raises(ValueError, match="baseline"):
        C.single_stream_advantages(jnp.zeros(3), jnp.zeros(2), jnp.ones((3, 2)))
    with pytest.raises(ValueError, match="current_logp"):
        C.mean_abs_logp_change(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="epsilon"):
        C.uncertainty_priority(jnp.zeros(2), epsilon=-1.0)

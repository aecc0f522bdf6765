"""Bad input gets an error that names the argument; degenerate-but-legal input stays finite."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.core as C

B, T = 4, 3
LP = np.log(np.full((B, T), 0.5, np.float32))
M = np.ones((B, T), np.float32)
GID = np.array([0, 0, 1, 1], np.int32)
S = np.array([1.0, 0.0, 1.0, 1.0], np.float32)
Z = np.zeros((B, T, 5), np.float32)

BAD = {
    "entropy rank 0": (lambda: C.entropy_from_logits(np.float32(1.0)), "logits"),
    "entropy int logits": (lambda: C.entropy_from_logits(np.ones((2, 3), np.int32)), "logits"),
    "sum_pi_squared int logits": (lambda: C.sum_pi_squared_from_logits(np.ones((2, 3), np.int32)), "logits"),
    "chunk_size float": (lambda: C.chunked_entropy(Z, 2.5), "chunk_size"),
    "chunk_size zero": (lambda: C.chunked_sum_pi_squared(Z, 0), "chunk_size"),
    "float tokens": (lambda: C.chunked_logprobs_and_entropy(Z, np.zeros((B, T), np.float32)), "tokens"),
    "masked_sum mask shape": (lambda: C.masked_sum(LP, M[:, :1]), "mask"),
    "masked_var mask shape": (lambda: C.masked_var(LP, M[0]), "mask"),
    "group_sum ids out of range": (lambda: C.group_sum(S, np.array([0, 1, 2, 3], np.int32), 2), "group_ids"),
    "group_sum rank": (lambda: C.group_sum(LP, GID, 2), "x"),
    "ratio_metrics mask shape": (lambda: C.ratio_metrics(LP, M[:, :2]), "mask"),
    "dppo_tv negative clip": (lambda: C.dppo_tv_loss(LP, LP, LP, M, clip_low=-1.0), "clip_low"),
    "dppo_kl negative c": (lambda: C.dppo_kl_loss(LP, LP, LP, M, clip_ratio_c=-1.0), "clip_ratio_c"),
    "kl_cov negative coef": (lambda: C.kl_cov_loss(LP, LP, LP, M, ppo_kl_coef=-0.1), "ppo_kl_coef"),
    "kl_in_reward vector coef": (lambda: C.kl_in_reward(LP, LP, LP, M, np.ones(3)), "coef"),
    "rejection negative lower": (lambda: C.rollout_rejection_mask(LP, LP, M, upper=2.0, lower=-1.0), "lower"),
    "rejection lower > upper": (lambda: C.rollout_rejection_mask(LP, LP, M, upper=2.0, lower=3.0), "lower"),
    "pf_ppo negative power": (lambda: C.pf_ppo_weights(S, "pow", -1.0), "power"),
    "overlong negative factor": (lambda: C.overlong_penalty(S, 20, 5, penalty_factor=-1.0), "penalty_factor"),
    "bnpo r_min == r_max": (lambda: C.bnpo_advantages(S, M, GID, 2, r_min=1.0, r_max=1.0), "r_max"),
    "bnpo per-component range": (lambda: C.bnpo_advantages(np.stack([S, S], 1), M, GID, 2, r_min=np.array([0.0, 1.0]),
                                                           r_max=np.array([1.0, 1.0])), "r_max"),
    "otb wrong sum_pi_squared": (lambda: C.optimal_token_baseline_advantages(LP, LP, LP[:, :1], M, GID, 2),
                                 "sum_pi_squared"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_names_the_argument(case):
    fn, name = BAD[case]
    with pytest.raises((ValueError, TypeError), match=f"'{name}'"):
        fn()


@pytest.mark.parametrize("fn", [
    lambda s: C.grpo_advantages(s, M, GID, 2, epsilon=0.0),
    lambda s: C.grpo_passk_advantages(s, M, GID, 2, epsilon=0.0),
    lambda s: C.lite_ppo_advantages(s, M, GID, 2, epsilon=0.0),
])
def test_epsilon_zero_with_all_equal_rewards_is_zero_not_nan(fn):
    out = np.asarray(fn(np.ones(B, np.float32)))
    assert np.all(out == 0)


def test_orpo_is_finite_at_probability_one():
    out, g = jax.value_and_grad(lambda c: jnp.sum(C.orpo_loss(c, jnp.array([-1.0, -2.0])).losses))(
        jnp.array([0.0, -1e-9]))
    assert np.isfinite(float(out)) and np.all(np.isfinite(np.asarray(g)))


def test_bnpo_beta_fit_ignores_one_sample_groups():
    # two real groups (success rates 0.5 and 0.25) plus a singleton: the fit must equal the
    # fit without the singleton, so the two real groups' advantages are unchanged
    s = np.array([1, 0, 1, 0, 1, 0, 0, 0, 1], np.float32)
    gid = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2], np.int32)
    m = np.ones((9, T), np.float32)
    with_single = np.asarray(C.bnpo_advantages(s, m, gid, 3))
    without = np.asarray(C.bnpo_advantages(s[:8], m[:8], gid[:8], 2))
    np.testing.assert_allclose(with_single[:8], without, rtol=1e-5)
    assert np.all(with_single[8] == 0)


def test_group_std_gradient_is_finite_for_singleton_and_equal_groups():
    g = jax.grad(lambda x: jnp.sum(C.group_stats(x, jnp.array([0, 1, 1]), 2).std))(jnp.array([1.0, 2.0, 2.0]))
    assert np.all(np.isfinite(np.asarray(g)))

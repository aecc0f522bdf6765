"""Test battery for the advantage estimators (jit, masks, order, vmap, bf16) and the paper identities."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxrl_llm.core import advantages as A

B, T, NG = 8, 5, 2
GID = np.array([0, 1, 0, 1, 0, 1, 0, 1], np.int32)  # interleaved groups


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 2, B).astype(np.float32)
    s[:2] = [1.0, 0.0]
    lengths = rng.integers(1, T + 1, B)
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    return s, mask


# Every outcome estimator as f(scores, mask, group_ids, num_groups, valid) -> [B, T]
OUTCOME = {
    "grpo": lambda s, m, g, n, v=None: A.grpo_advantages(s, m, g, n, valid=v),
    "grpo_nostd": lambda s, m, g, n, v=None: A.grpo_advantages(s, m, g, n, scale_by_std=False, valid=v),
    "dr_grpo": lambda s, m, g, n, v=None: A.dr_grpo_advantages(s, m, g, n, valid=v),
    "rloo": lambda s, m, g, n, v=None: A.rloo_advantages(s, m, g, n, valid=v),
    "rpp_baseline": lambda s, m, g, n, v=None: A.reinforce_pp_baseline_advantages(s, m, g, n, valid=v),
    "opo": lambda s, m, g, n, v=None: A.opo_advantages(s, m, g, n, valid=v),
    "passk": lambda s, m, g, n, v=None: A.grpo_passk_advantages(s, m, g, n, valid=v),
    "gdpo": lambda s, m, g, n, v=None: A.gdpo_advantages(jnp.stack([s, 1 - s], 1), m, g, n, valid=v),
    "gpg": lambda s, m, g, n, v=None: A.gpg_advantages(s, m, g, n, valid=v),
    "lite_ppo": lambda s, m, g, n, v=None: A.lite_ppo_advantages(s, m, g, n, valid=v),
    "bnpo": lambda s, m, g, n, v=None: A.bnpo_advantages(s, m, g, n, valid=v),
    "ngrpo": lambda s, m, g, n, v=None: A.ngrpo_advantages(s, m, g, n, valid=v),
}
# estimators whose output does not depend on batch-wide statistics (only on the group)
GROUP_LOCAL = {"grpo", "grpo_nostd", "dr_grpo", "rloo", "opo", "passk", "ngrpo"}


@pytest.mark.parametrize("name", OUTCOME)
def test_jit_equals_eager_and_masked_outside(name):
    s, m = _inputs()
    f = OUTCOME[name]
    eager = f(s, m, GID, NG)
    jitted = jax.jit(f, static_argnums=3)(s, m, GID, NG)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), atol=1e-6)
    assert eager.shape == (B, T) and eager.dtype == jnp.float32
    assert np.all(np.asarray(eager)[m == 0] == 0)


@pytest.mark.parametrize("name", OUTCOME)
def test_group_order_does_not_matter(name):
    s, m = _inputs(1)
    perm = np.random.default_rng(3).permutation(B)
    a = np.asarray(OUTCOME[name](s, m, GID, NG))
    b = np.asarray(OUTCOME[name](s[perm], m[perm], GID[perm], NG))
    np.testing.assert_allclose(a[perm], b, atol=1e-5)


@pytest.mark.parametrize("name", OUTCOME)
def test_padding_row_equals_filtered(name):
    """An invalid (padding) row changes nothing for the others and gets advantage 0."""
    s, m = _inputs(2)
    ref = np.asarray(OUTCOME[name](s, m, GID, NG))
    s2 = np.concatenate([s, [7.0]]).astype(np.float32)
    m2 = np.concatenate([m, np.ones((1, T), np.float32)])
    g2 = np.concatenate([GID, [0]]).astype(np.int32)
    v2 = np.array([True] * B + [False])
    out = np.asarray(OUTCOME[name](s2, m2, g2, NG, v2))
    np.testing.assert_allclose(out[:B], ref, atol=1e-5)
    assert np.all(out[B] == 0)


@pytest.mark.parametrize("name", OUTCOME)
def test_vmap_over_batches(name):
    s, m = _inputs(3)
    s2, m2 = _inputs(4)
    f = lambda s, m: OUTCOME[name](s, m, GID, NG)
    stacked = jax.vmap(f)(jnp.stack([s, s2]), jnp.stack([m, m2]))
    np.testing.assert_allclose(np.asarray(stacked[1]), np.asarray(f(s2, m2)), atol=1e-5)


@pytest.mark.parametrize("name", OUTCOME)
def test_bf16_inputs(name):
    s, m = _inputs(5)
    ref = np.asarray(OUTCOME[name](s, m, GID, NG))
    out = OUTCOME[name](jnp.asarray(s, jnp.bfloat16), jnp.asarray(m, jnp.bfloat16), GID, NG)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-2)  # {0, 1} rewards are exact in bf16


@pytest.mark.parametrize("name", sorted(GROUP_LOCAL - {"passk"}))
def test_all_equal_group_is_zero(name):
    """A group whose rewards are all equal carries no signal (NGRPO: only when all correct)."""
    s = np.array([1, 0, 1, 1, 1, 0, 1, 1], np.float32)  # group 0 all 1, group 1 mixed
    m = np.ones((B, T), np.float32)
    out = np.asarray(OUTCOME[name](s, m, GID, NG))
    assert np.allclose(out[GID == 0], 0, atol=1e-6)
    assert not np.allclose(out[GID == 1], 0)


def test_grpo_hand_computed():
    s = np.array([1, 0, 0, 1, 1, 1], np.float32)
    g = np.array([0, 0, 0, 1, 1, 2], np.int32)
    m = np.ones((6, 2), np.float32)
    out = np.asarray(A.grpo_advantages(s, m, g, 3))[:, 0]
    std0 = np.std([1, 0, 0], ddof=1)
    exp = [(1 - 1 / 3) / (std0 + 1e-6), (-1 / 3) / (std0 + 1e-6), (-1 / 3) / (std0 + 1e-6), 0, 0, 1 / (1 + 1e-6)]
    np.testing.assert_allclose(out, exp, rtol=1e-6)  # singleton: mean 0, std 1 (verl)


def test_rloo_hand_computed():
    s = np.array([3, 1, 2], np.float32)
    out = np.asarray(A.rloo_advantages(s, np.ones((3, 1)), np.zeros(3, np.int32), 1))[:, 0]
    np.testing.assert_allclose(out, [3 - 1.5, 1 - 2.5, 2 - 2.0], rtol=1e-6)


def test_opo_hand_computed():
    s = np.array([1.0, 0.0], np.float32)
    m = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.float32)
    out = np.asarray(A.opo_advantages(s, m, np.zeros(2, np.int32), 1))
    b = (3 * 1 + 1 * 0) / 4
    np.testing.assert_allclose(out[:, 0], [1 - b, -b], rtol=1e-6)


def test_gae_hand_computed():
    r = np.array([[0.0, 0.0, 1.0]], np.float32)
    v = np.array([[0.5, 0.2, 0.1]], np.float32)
    m = np.ones((1, 3), np.float32)
    g, lam = 0.9, 0.8
    d2 = 1.0 - 0.1
    d1 = 0 + g * 0.1 - 0.2
    d0 = 0 + g * 0.2 - 0.5
    a2 = d2
    a1 = d1 + g * lam * a2
    a0 = d0 + g * lam * a1
    adv, ret = A.gae_advantages(r, v, m, g, lam, whiten=False)
    np.testing.assert_allclose(np.asarray(adv)[0], [a0, a1, a2], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ret)[0], [a0 + 0.5, a1 + 0.2, a2 + 0.1], rtol=1e-6)


def test_gae_skips_masked_observation_tokens():
    """A masked token in the middle neither adds a TD error nor breaks the recursion."""
    r = np.array([[0.0, 5.0, 1.0]], np.float32)
    v = np.array([[0.5, 9.0, 0.1]], np.float32)
    with_hole = np.asarray(A.gae_advantages(r, v, np.array([[1, 0, 1]], np.float32), 1.0, 1.0, whiten=False)[0])
    r2, v2 = r[:, [0, 2]], v[:, [0, 2]]
    filtered = np.asarray(A.gae_advantages(r2, v2, np.ones((1, 2), np.float32), 1.0, 1.0, whiten=False)[0])
    np.testing.assert_allclose(with_hole[0, [0, 2]], filtered[0], rtol=1e-6)


def test_remax_hand_computed():
    r = np.array([[0.0, 0.0, 2.0]], np.float32)
    adv, ret = A.remax_advantages(r, np.array([0.5], np.float32), np.ones((1, 3), np.float32))
    np.testing.assert_allclose(np.asarray(adv)[0], [1.5, 1.5, 1.5])


def test_reinforce_pp_whitened_over_batch():
    r = np.zeros((4, 3), np.float32)
    r[:, -1] = [1, 0, 1, 0]
    m = np.ones((4, 3), np.float32)
    adv, ret = A.reinforce_pp_advantages(r, m, 1.0)
    a = np.asarray(adv)
    assert abs(a.mean()) < 1e-6 and abs(a.std(ddof=1) - 1) < 1e-3


def test_passk_only_best_sample_learns():
    s = np.array([0.2, 0.9, 0.5, 0.1], np.float32)
    out = np.asarray(A.grpo_passk_advantages(s, np.ones((4, 1)), np.zeros(4, np.int32), 1,
                                             scale_by_std=False))[:, 0]
    np.testing.assert_allclose(out, [0, 0.4, 0, 0], rtol=1e-6)


def test_gpg_alpha():
    s = np.array([1, 0, 0, 0], np.float32)
    out = np.asarray(A.gpg_advantages(s, np.ones((4, 1)), np.zeros(4, np.int32), 1))[:, 0]
    np.testing.assert_allclose(out, 4.0 * (s - 0.25), rtol=1e-6)


def test_lite_ppo_uses_batch_std():
    s = np.array([1, 0, 1, 1, 0, 0], np.float32)
    g = np.array([0, 0, 0, 1, 1, 1], np.int32)
    out = np.asarray(A.lite_ppo_advantages(s, np.ones((6, 1)), g, 2))[:, 0]
    gm = np.array([2 / 3] * 3 + [1 / 3] * 3)
    np.testing.assert_allclose(out, (s - gm) / (np.std(s, ddof=1) + 1e-6), rtol=1e-5)


# ------------------------------------------------------------------ paper identities
def test_ngrpo_all_wrong_group_gets_minus_inv_sqrt_g_plus_1():
    for gsize in (4, 8, 16):
        s = np.zeros(gsize, np.float32)
        out = np.asarray(A.ngrpo_advantages(s, np.ones((gsize, 1)), np.zeros(gsize, np.int32), 1))[:, 0]
        np.testing.assert_allclose(out, -1 / math.sqrt(gsize + 1), rtol=1e-5)
        ones = np.asarray(A.ngrpo_advantages(s + 1, np.ones((gsize, 1)), np.zeros(gsize, np.int32), 1))
        np.testing.assert_allclose(ones, 0, atol=1e-7)


def _ngrpo(s, g, n, valid=None):
    s = np.asarray(s, np.float32)
    return np.asarray(A.ngrpo_advantages(s, np.ones((len(s), 1)), np.asarray(g, np.int32), n, valid=valid))[:, 0]


def test_ngrpo_single_sample_group_follows_authors_code():
    """G = 1: no virtual sample, mean 0 and std 1 (verl's GRPO convention), A = r / (1 + eps)."""
    np.testing.assert_array_equal(_ngrpo([0.0], [0], 1), [0.0])
    np.testing.assert_allclose(_ngrpo([1.0], [0], 1), [1.0 / (1.0 + 1e-6)], rtol=1e-7)
    np.testing.assert_allclose(_ngrpo([0.3, 1.0], [0, 1], 2), np.array([0.3, 1.0]) / (1 + 1e-6), rtol=1e-7)
    out = np.asarray(A.ngrpo_advantages(np.array([1.0], np.float32), np.ones((1, 1)), np.zeros(1, np.int32), 1,
                                        r_max=2.0, epsilon=0.5))[:, 0]
    np.testing.assert_allclose(out, [1.0 / 1.5], rtol=1e-7)  # r_max plays no part for G = 1


def test_ngrpo_hand_values_for_groups_of_two_or_more():
    # all-wrong group of G: every A = -1/sqrt(G+1) (the paper's identity, up to epsilon)
    for gsize in (2, 3, 5):
        np.testing.assert_allclose(_ngrpo(np.zeros(gsize), np.zeros(gsize), 1), -1 / math.sqrt(gsize + 1),
                                   rtol=1e-5)
        np.testing.assert_array_equal(_ngrpo(np.ones(gsize), np.zeros(gsize), 1), 0.0)  # all correct: 0 / eps
    # G = 2, r = (0, 1): values (0, 1, 1), mean 2/3, unbiased std sqrt(1/3)
    sd = math.sqrt(1 / 3)
    np.testing.assert_allclose(_ngrpo([0.0, 1.0], [0, 0], 1), [(-2 / 3) / (sd + 1e-6), (1 / 3) / (sd + 1e-6)],
                               rtol=1e-6)


def test_ngrpo_mixed_batch_single_group_does_not_change_larger_group():
    big = np.array([0.0, 1.0, 0.0, 0.0, 1.0], np.float32)
    alone = _ngrpo(big, np.zeros(5), 1)
    for single in (0.0, 1.0):
        s = np.concatenate([[single], big[:2], [0.5], big[2:]])  # interleaved with two singletons
        g = np.array([1, 0, 0, 2, 0, 0, 0])
        out = _ngrpo(s, g, 3)
        np.testing.assert_array_equal(out[[1, 2, 4, 5, 6]], alone)
        np.testing.assert_allclose(out[[0, 3]], np.array([single, 0.5]) / (1 + 1e-6), rtol=1e-7)


def test_ngrpo_group_with_one_valid_row_is_a_single_sample_group():
    s = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 1.0], np.float32)
    g = np.array([0, 0, 0, 1, 1, 1])
    valid = np.array([True, False, False, True, True, True])
    out = _ngrpo(s, g, 2, valid)
    np.testing.assert_allclose(out[0], 1.0 / (1 + 1e-6), rtol=1e-7)  # only valid row of group 0
    np.testing.assert_array_equal(out[1:3], 0.0)  # padding rows
    np.testing.assert_array_equal(out[3:], _ngrpo(s[3:], g[3:] - 1, 1))  # group 1 as if alone
    np.testing.assert_array_equal(_ngrpo(s[:3], g[:3], 1, valid[:3]), [out[0], 0.0, 0.0])
    # a group with no valid row at all: every advantage 0, no NaN
    np.testing.assert_array_equal(_ngrpo(s[:3], g[:3], 1, np.zeros(3, bool)), 0.0)


def _binary_groups(seed, n_groups=5, g=6):
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 2, n_groups * g).astype(np.float32)
    gid = np.repeat(np.arange(n_groups), g).astype(np.int32)
    return s, gid, np.ones((n_groups * g, 1), np.float32)


def test_bnpo_alpha_beta_one_is_reinforce_with_group_mean_baseline():
    s, gid, m = _binary_groups(0)
    out = np.asarray(A.bnpo_advantages(s, m, gid, 5, alpha=1.0, beta=1.0))[:, 0]
    ref = np.asarray(A.grpo_advantages(s, m, gid, 5, scale_by_std=False))[:, 0]
    np.testing.assert_allclose(out, ref, atol=1e-6)


def test_bnpo_alpha_beta_three_halves_is_grpo_population_std():
    s, gid, m = _binary_groups(1)
    out = np.asarray(A.bnpo_advantages(s, m, gid, 5, alpha=1.5, beta=1.5))[:, 0]
    grpo = np.asarray(A.grpo_advantages(s, m, gid, 5, unbiased_std=False, epsilon=0.0))[:, 0]
    mixed = np.isfinite(grpo) & (np.abs(grpo) > 0)
    np.testing.assert_allclose(out[mixed], (math.pi / 8) * grpo[mixed], rtol=1e-4)


def test_bnpo_decomposition_averages_components():
    s, gid, m = _binary_groups(2)
    s2 = np.random.default_rng(9).integers(0, 2, s.shape[0]).astype(np.float32)
    both = np.asarray(A.bnpo_advantages(np.stack([s, s2], 1), m, gid, 5))
    a1 = np.asarray(A.bnpo_advantages(s, m, gid, 5))
    a2 = np.asarray(A.bnpo_advantages(s2, m, gid, 5))
    np.testing.assert_allclose(both, (a1 + a2) / 2, atol=1e-5)


def test_bnpo_degenerate_batch_is_finite():
    s = np.ones(6, np.float32)
    out = A.bnpo_advantages(s, np.ones((6, 1)), np.repeat(np.arange(2), 3).astype(np.int32), 2)
    assert np.all(np.isfinite(np.asarray(out)))


# ------------------------------------------------------------------ properties
@given(st.lists(st.floats(-5, 5, width=32), min_size=2, max_size=12), st.integers(1, 4), st.integers(0, 10))
def test_property_grpo_and_rloo_sum_to_zero_per_group(rewards, n_groups, seed):
    s = np.asarray(rewards, np.float32)
    rng = np.random.default_rng(seed)
    gid = rng.integers(0, n_groups, s.shape[0]).astype(np.int32)
    m = np.ones((s.shape[0], 1), np.float32)
    for f in (A.grpo_advantages, A.rloo_advantages, A.dr_grpo_advantages):
        out = np.asarray(f(s, m, gid, n_groups))[:, 0]
        for g in range(n_groups):
            sel = gid == g
            if sel.sum() > 1:
                assert abs(out[sel].sum()) < 1e-3 * max(1.0, np.abs(out[sel]).max())


@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=10))
def test_property_grpo_binary_is_bounded_and_monotone(rewards):
    s = np.asarray(rewards, np.float32)
    out = np.asarray(A.grpo_advantages(s, np.ones((len(s), 1)), np.zeros(len(s), np.int32), 1))[:, 0]
    assert np.all(np.isfinite(out))
    if s.min() < s.max():
        assert out[s == 1].min() > 0 > out[s == 0].max()


# ------------------------------------------------------------------ input checks
def test_errors_name_the_argument():
    s, m = _inputs()
    with pytest.raises(ValueError, match="'mask'"):
        A.grpo_advantages(s, m[:, None], GID, NG)
    with pytest.raises(ValueError, match="'scores'"):
        A.grpo_advantages(s[:3], m, GID, NG)
    with pytest.raises(ValueError, match="'num_groups'"):
        A.grpo_advantages(s, m, GID, 0)
    with pytest.raises(TypeError, match="'group_ids'"):
        A.grpo_advantages(s, m, GID.astype(np.float32), NG)
    with pytest.raises(ValueError, match="group_ids"):
        A.grpo_advantages(s, m, GID + 5, NG)
    with pytest.raises(ValueError, match="'values'"):
        A.gae_advantages(np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32), np.ones((2, 3)))
    with pytest.raises(ValueError, match="'singleton'"):
        A.rloo_advantages(s, m, GID, NG, singleton="bad")


# ---------------------------------------------------------------- Optimal Token Baseline
def _otb_inputs(seed=0, holes=False):
    rng = np.random.default_rng(seed)
    _, m = _inputs(seed)
    if holes:
        m[m.sum(1) >= 3, 1] = 0.0
    r = (rng.normal(size=(B, T)) * m).astype(np.float32)
    lp = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(np.float32)
    sp = rng.uniform(0.1, 1.0, (B, T)).astype(np.float32)
    return r, lp, sp, m


def test_otb_hand_computed():
    # one group of two, T = 2, both full length (no zero tail); w_t = 1 - 2 pi_t + sum pi^2
    r = np.array([[0.0, 1.0], [2.0, 0.0]], np.float32)
    pi = np.array([[0.5, 0.25], [0.5, 1.0]], np.float32)
    sp = np.array([[0.5, 0.5], [0.5, 1.0]], np.float32)
    m = np.ones((2, 2), np.float32)
    adv, ret = A.optimal_token_baseline_advantages(r, np.log(pi), sp, m, np.zeros(2, np.int32), 1, epsilon=0.0)
    # w = [[0.5, 1.0], [0.5, 0.0]] -> W = [[0.5, 1.5], [0.5, 0.5]]; G = [[1, 1], [2, 0]]
    # B_0 = (1*0.5 + 2*0.5) / 1 = 1.5; B_1 = (1*1.5 + 0*0.5) / 2 = 0.75
    np.testing.assert_allclose(np.asarray(ret), [[1.0, 1.0], [2.0, 0.0]])
    np.testing.assert_allclose(np.asarray(adv), [[-0.5, 0.25], [0.5, -0.75]], rtol=1e-6)


def test_otb_zero_tail_and_singleton():
    r, lp, sp, _ = _otb_inputs(1)
    m = np.zeros((3, T), np.float32)
    m[0, :5], m[1, :2], m[2, :3] = 1, 1, 1
    gid = np.array([0, 0, 1], np.int32)
    r3, lp3, sp3 = r[:3] * 0 + 1.0, lp[:3], sp[:3]
    adv, ret = A.optimal_token_baseline_advantages(r3, lp3, sp3, m, gid, 2)
    adv0, _ = A.optimal_token_baseline_advantages(r3, lp3, sp3, m, gid, 2, handle_zero_tail=False)
    adv, adv0, ret = map(np.asarray, (adv, adv0, ret))
    np.testing.assert_allclose(adv[0, 2:], ret[0, 2:])  # unique longest: no baseline beyond length 2
    np.testing.assert_allclose(adv[:2, :2], adv0[:2, :2])  # shared positions unchanged
    np.testing.assert_allclose(adv[2], ret[2] * m[2])  # singleton group: A = G


def test_otb_alignments_agree_for_prefix_masks_and_differ_with_holes():
    r, lp, sp, m = _otb_inputs(2)
    pos = A.optimal_token_baseline_advantages(r, lp, sp, m, GID, NG, align="position")
    resp = A.optimal_token_baseline_advantages(r, lp, sp, m, GID, NG, align="response")
    for a, b in zip(pos, resp):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    r, lp, sp, m = _otb_inputs(2, holes=True)
    pos, _ = A.optimal_token_baseline_advantages(r, lp, sp, m, GID, NG, align="position")
    resp, _ = A.optimal_token_baseline_advantages(r, lp, sp, m, GID, NG, align="response")
    assert np.abs(np.asarray(pos) - np.asarray(resp)).max() > 1e-3


@pytest.mark.parametrize("align", ["position", "response"])
def test_otb_padding_row_equals_filtered_and_order_free(align):
    r, lp, sp, m = _otb_inputs(3, holes=True)
    valid = np.ones(B, bool)
    valid[5] = False
    f = lambda *a, g=GID, v=None: A.optimal_token_baseline_advantages(*a, g, NG, align=align, valid=v)  # noqa: E731
    full, _ = f(r, lp, sp, m, v=valid)
    keep = np.flatnonzero(valid)
    sub, _ = f(r[keep], lp[keep], sp[keep], m[keep], g=GID[keep])
    np.testing.assert_allclose(np.asarray(full)[keep], np.asarray(sub), atol=1e-6)
    assert np.all(np.asarray(full)[5] == 0)
    perm = np.random.default_rng(0).permutation(B)
    shuf, _ = f(r[perm], lp[perm], sp[perm], m[perm], g=GID[perm])
    np.testing.assert_allclose(np.asarray(shuf), np.asarray(f(r, lp, sp, m)[0])[perm], atol=1e-6)


def test_otb_equal_weights_reduce_to_group_mean_return():
    # with sum pi^2 = 2 pi - 1 + c every token has w = c, W_t = c (t + 1) equal across the
    # group at each position, so for equal lengths B_t is the group mean of G_t
    r, lp, _, _ = _otb_inputs(4)
    m = np.ones((B, T), np.float32)
    sp = 2 * np.exp(lp) - 1 + 0.3
    adv, ret = A.optimal_token_baseline_advantages(r, lp, sp, m, GID, NG)
    ret = np.asarray(ret)
    mean = np.stack([ret[GID == g].mean(0) for g in range(NG)])[GID]
    np.testing.assert_allclose(np.asarray(adv), ret - mean, atol=1e-5)


def test_otb_errors_name_the_argument():
    r, lp, sp, m = _otb_inputs(0)
    with pytest.raises(ValueError, match="sum_pi_squared"):
        A.optimal_token_baseline_advantages(r, lp, sp[:, :2], m, GID, NG)
    with pytest.raises(ValueError, match="align"):
        A.optimal_token_baseline_advantages(r, lp, sp, m, GID, NG, align="turn")
    with pytest.raises(ValueError, match="is_weights"):
        A.optimal_token_baseline_advantages(r, lp, sp, m, GID, NG, is_weights=sp[:3])


def test_egae_bootstraps_truncated_rows_and_is_gae_otherwise():
    import jaxrl_llm.core as C

    v = np.array([[.5, .6, .55, .7]], np.float32)
    m = np.ones((1, 4), np.float32)
    r = np.array([[0, 0, 0, 1.]], np.float32)
    none = np.zeros_like(r)  # a truncated row: its outcome is unknown, the caller leaves it out
    adv, _ = C.egae_advantages(none, v, m, np.array([True]), 1.0, 0.95, whiten=False)
    np.testing.assert_allclose(adv[0], [0.187875, 0.0925, 0.15, 0.0], atol=1e-6)  # V(s_l) := V(s_{l-1})
    fin, _ = C.egae_advantages(r, v, m, np.array([False]), 1.0, 0.95, whiten=False)
    np.testing.assert_allclose(fin, C.gae_advantages(r, v, m, 1.0, 0.95, whiten=False)[0], atol=1e-6)
    lam1, _ = C.egae_advantages(none, v, m, np.array([True]), 1.0, 1.0, whiten=False)
    np.testing.assert_allclose(lam1[0], 0.7 - v[0], atol=1e-6)  # gamma = lam = 1: V(s_{l-1}) - V(s_t)
    # per-token rewards of a truncated row (a KL penalty in the reward) are kept
    kl = np.array([[-0.1, 0.0, -0.2, 0.0]], np.float32)
    with_kl, _ = C.egae_advantages(kl, v, m, np.array([True]), 1.0, 1.0, whiten=False)
    np.testing.assert_allclose(with_kl[0], 0.7 - v[0] + np.cumsum(kl[0][::-1])[::-1], atol=1e-6)
    # ragged rows, one truncated and one finished, whitened together = GAE where nothing is truncated
    m2 = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], np.float32)
    r2 = np.array([[0, 0, 1, 0], [0, 0, 0, 1]], np.float32)
    v2 = np.array([[.1, .2, .3, 0], [.4, .3, .2, .1]], np.float32)
    np.testing.assert_allclose(C.egae_advantages(r2, v2, m2, np.array([False, False]), 0.9, 0.8)[0],
                               C.gae_advantages(r2, v2, m2, 0.9, 0.8)[0], atol=1e-6)


def test_rto_token_rewards_hand_values():
    import jaxrl_llm.core as C

    d = C.rto_token_rewards(np.array([[0.5, -2.0, 0.1]]), np.zeros((1, 3)), np.ones((1, 3)))
    np.testing.assert_allclose(d, [[0.025, -0.05, 0.005]], atol=1e-7)  # x 0.05, clipped at +-0.05
    np.testing.assert_allclose(C.rto_token_rewards(np.array([[0.5, -2.0]]), np.zeros((1, 2)), np.ones((1, 2)),
                                                   clip=0.0), [[0.025, -0.1]], atol=1e-7)  # clip 0: none
    # with the outcome 1.5 on the last token and the KL -0.01 (old - ref): GAE as in the authors' example
    r = d + np.array([[-0.001, 0.0, 0.002]]) + np.array([[0, 0, 1.5]])
    adv, ret = C.gae_advantages(r, np.array([[.5, .6, .8]]), np.ones((1, 3)), 1.0, 0.95, whiten=False)
    np.testing.assert_allclose(adv, [[0.904567, 0.821650, 0.707000]], atol=1e-5)


def test_gated_distillation_hand_values_and_identity():
    import jaxrl_llm.core as C

    adv = np.array([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]], np.float32)
    old = np.log(np.array([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]], np.float32))
    teacher = np.log(np.array([[0.25, 1.0, 0.5], [0.25, 1.0, 0.5]], np.float32))
    mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
    got = C.gated_distillation_advantages(adv, old, teacher, mask, np.array([True, False]), coef=2.0)
    # the good row gains 2 (log pi_T - log pi_old): -2 log 2, +2 log 2, 0; the other row is untouched
    np.testing.assert_allclose(np.asarray(got), [[1 - 2 * np.log(2), 1 + 2 * np.log(2), 1.0], [-1.0, -1.0, 0.0]],
                               rtol=1e-6)
    same = C.gated_distillation_advantages(adv, old, teacher, mask, np.array([True, True]), coef=0.0)
    np.testing.assert_allclose(np.asarray(same), adv * mask)
    with pytest.raises(ValueError, match="coef"):
        C.gated_distillation_advantages(adv, old, teacher, mask, np.array([True, True]), coef=-1.0)

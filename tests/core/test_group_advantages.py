"""The papers' group estimators (jaxrl_llm.core.group_advantages): hand-computed values (the
worked examples of the methods' sources, recomputed by hand), the papers' identities and limit
cases, invalid rows == filtered rows, zero outside the mask. (jit == eager, vmap, bf16 and
all-masked batches: tests/core/test_battery.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

import jaxrl_llm.core as C

# two groups of four: A = [1, 0, 0, 1], B = [1, 1, 1, 0]
S = np.array([1, 0, 0, 1, 1, 1, 1, 0], np.float32)
GID = np.array([0, 0, 0, 0, 1, 1, 1, 1], np.int32)
M = np.ones((8, 3), np.float32)
LEN = np.array([3, 5, 2, 4, 2, 2, 3, 6], np.float32)
MLEN = (np.arange(6)[None] < LEN[:, None]).astype(np.float32)


def rows(a):
    """The per-row value of a broadcast [B, T] advantage (its first token)."""
    return np.asarray(a)[:, 0]


def close(a, b, tol=2e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, rtol=tol)


# ------------------------------------------------------------------------------------------- A-GRAE


def test_agrae_hand_values():
    # GRPO: A = +-0.8660 (p = 0.5), B = [.5, .5, .5, -1.5] (p = 0.75); p_bar = 0.625
    # A: A_diff = 0.5 * 0.866 / sqrt(.5) = 0.6124, A_easy = 0.5 * 0.866 / (1 - sqrt(.5)) = 1.4784,
    #    mix 0.375 * 1.4784 + 0.625 * 0.6124 = 0.9371; positives x min(1, 0.625)
    a = rows(C.agrae_advantages(S, M, GID, 2))
    g = 0.5 * 0.8660254 / np.array([np.sqrt(.5), 1 - np.sqrt(.5)])
    mix_a = 0.375 * g[1] + 0.625 * g[0]
    gb = np.array([0.5, -1.5])
    mix_b = 0.375 * 0.5 * gb / (1 - np.sqrt(.75)) + 0.625 * 0.5 * gb / np.sqrt(.75)
    close(a, [0.625 * mix_a, -mix_a, -mix_a, 0.625 * mix_a, *(0.625 * mix_b[0],) * 3, mix_b[1]], 1e-4)
    close(a[:4], [0.5857, -0.9371, -0.9371, 0.5857], 1e-4)
    close(a[4:], [0.5501, 0.5501, 0.5501, -2.6405], 1e-4)


def test_agrae_identities():
    # p_q = 1/4 everywhere: sqrt p = 1/2 so A_diff = A_easy = GRPO, positives scaled by min(1, p_bar / alpha_s)
    s = np.array([1, 0, 0, 0, 0, 1, 0, 0], np.float32)
    grpo = rows(C.grpo_advantages(s, M, GID, 2))
    a = rows(C.agrae_advantages(s, M, GID, 2))
    close(a, np.where(grpo > 0, 0.25 * grpo, grpo), 1e-5)
    close(rows(C.agrae_advantages(s, M, GID, 2, alpha_s=0.25)), grpo, 1e-5)  # p_bar >= alpha_s: no damping
    # one-sample groups and constant groups get 0
    assert np.all(rows(C.agrae_advantages(np.array([1., 0.]), np.ones((2, 2)), np.array([0, 1]), 2)) == 0)


# ------------------------------------------------------------------------------------------- CANON


@pytest.mark.parametrize("mu,want_b", [(1.0, [0.5, 0.5, 0.0, -1.0]), (0.5, [0.25, 0.25, 0.25, -0.75]),
                                       (0.0, [0.0, 0.0, 0.5, -0.5])])
def test_canon_hand_values(mu, want_b):
    # A: lengths [3, 5, 2, 4] -> S = {rows 2, 0} (R_S = .5), L = {3, 1} (R_L = .5): +-0.5 for every mu
    # B: lengths [2, 2, 3, 6] -> S = {4, 5} (R_S = 1), L = {6, 7} (R_L = 0.5)
    a = rows(C.canon_advantages(S, LEN, M, GID, 2, mu=mu))
    close(a, [0.5, -0.5, -0.5, 0.5] + want_b)


@given(st.lists(st.integers(0, 3), min_size=8, max_size=8), st.lists(st.integers(1, 9), min_size=8, max_size=8))
def test_canon_half_mu_is_dr_grpo_for_even_groups(r, lengths):
    s = np.asarray(r, np.float32)
    a = C.canon_advantages(s, np.asarray(lengths, np.float32), M, GID, 2, mu=0.5)
    close(a, C.dr_grpo_advantages(s, M, GID, 2), 1e-5)


def test_canon_odd_group_is_not_dr_grpo_and_variants_and_normalizer():
    s, m, g = np.array([1, 0, 0], np.float32), np.ones((3, 2)), np.zeros(3, np.int32)
    close(rows(C.canon_advantages(s, np.array([1., 2, 3]), m, g, 1, mu=0.5)), [0.5, -0.5, -0.5])  # paper: even G only
    # the entropy variant moves alpha: equal at alpha = 1, different otherwise
    close(C.canon_advantages(S, LEN, M, GID, 2, variant="entropy"), C.canon_advantages(S, LEN, M, GID, 2))
    a_len = rows(C.canon_advantages(S, LEN, M, GID, 2, alpha=2.0))
    a_ent = rows(C.canon_advantages(S, LEN, M, GID, 2, alpha=2.0, variant="entropy"))
    close(a_len[6], 2 * 1 - 1.0)   # row 6 in L: alpha r - R_S
    close(a_ent[6], 1 - 2 * 1.0)   # entropy variant: r - alpha R_S
    close(C.canon_advantages(S, LEN, M, GID, 2, normalizer=4.0), C.canon_advantages(S, LEN, M, GID, 2) / 4)


def test_canon_ties_keep_row_order_and_singletons():
    s, g = np.array([0, 1, 1, 0], np.float32), np.zeros(4, np.int32)
    # all lengths equal: S = rows {0, 1} (R_S = .5), L = {2, 3} (R_L = .5)
    close(rows(C.canon_advantages(s, np.ones(4), np.ones((4, 1)), g, 1)), [-0.5, 0.5, 0.5, -0.5])
    # one-sample group: R_S = R_L = 0, the row is in L: mu (alpha r + beta) + (1 - mu) r
    close(rows(C.canon_advantages(np.array([0.7]), np.ones(1), np.ones((1, 1)), np.zeros(1, np.int32), 1,
                                  mu=0.3, beta=0.1)), [0.3 * 0.8 + 0.7 * 0.7])


# ------------------------------------------------------------------------------------------- Stratified


def test_stratified_hand_values_and_identities():
    st_ = np.array([0, 0, 0, 1, 0, 0, 0, 0], np.int32)
    # group A, strata {0,1,2} (r = 1,0,0: mean 1/3, pop std .4714) and {3} (alone: 0); global pop std 0.5
    a = rows(C.stratified_advantages(S, st_, M, GID, 2, alpha=0.5, num_strata=2))
    close(a[:4], [0.5 * 1.4142 + 0.5 * 1, 0.5 * -0.7071 - 0.5, 0.5 * -0.7071 - 0.5, 0.5], 1e-4)
    # one stratum per group: SAN = global = (r - mean) / pop std for any alpha
    one = rows(C.stratified_advantages(S, np.zeros(8, np.int32), M, GID, 2, alpha=0.7, num_strata=1))
    pop = rows(C.grpo_advantages(S, M, GID, 2, unbiased_std=False))
    close(one, pop, 1e-5)
    # alpha = 0 is GRPO with this std whatever the strata; strata constant within a stratum give 0
    close(C.stratified_advantages(S, st_, M, GID, 2, alpha=0.0, num_strata=2), C.grpo_advantages(
        S, M, GID, 2, unbiased_std=False), 1e-5)
    split = np.array([0, 1, 1, 0, 0, 0, 0, 0], np.int32)  # A's strata {1, 1} and {0, 0}: each constant
    close(rows(C.stratified_advantages(S, split, M, GID, 2, alpha=1.0, num_strata=2))[:4], [0, 0, 0, 0])


# ------------------------------------------------------------------------------------------- SEED-GRPO


def test_semantic_entropy_and_seed_grpo_hand_values():
    ans = np.array([0, 1, 2, 0, 4, 4, 4, 7], np.int32)  # A: {4, 7, 9, 4} -> 3 clusters; B: {2, 2, 2, 5} -> 2
    se, se_max = C.semantic_entropy(ans, GID, 2)
    close(se[:4], -(np.log(.5) + 2 * np.log(.25)) / 3)   # 1.1552
    close(se[4:], -(np.log(.75) + np.log(.25)) / 2)      # 0.8370
    close(se_max, np.log(4))
    a = rows(C.seed_grpo_advantages(S, ans, M, GID, 2))
    grpo = rows(C.grpo_advantages(S, M, GID, 2))
    close(a, grpo * (1 - np.asarray(se) / np.log(4)), 1e-5)
    close(a[0], 0.8660254 * (1 - 1.1552453 / 1.3862944), 1e-5)  # 0.1443
    e = rows(C.seed_grpo_advantages(S, ans, M, GID, 2, modulation="exponential", alpha=0.5))
    close(e, grpo * np.exp(-0.5 * np.asarray(se) / np.log(4)), 1e-5)
    f = rows(C.seed_grpo_advantages(S, ans, M, GID, 2, modulation="focal", gamma=2.0))
    close(f, grpo * (1 - np.asarray(se) / np.log(4)) ** 2, 1e-5)


def test_seed_grpo_identities():
    ans = np.array([0, 1, 2, 3, 4, 5, 6, 7], np.int32)  # all distinct: SE = SE_max, linear f = 0
    close(C.seed_grpo_advantages(S, ans, M, GID, 2), np.zeros((8, 3)))
    close(C.seed_grpo_advantages(S, ans, M, GID, 2, alpha=0.0), C.grpo_advantages(S, M, GID, 2))
    same = np.array([0, 0, 0, 0, 4, 4, 4, 4], np.int32)  # one cluster: SE = 0, unchanged
    close(C.seed_grpo_advantages(S, same, M, GID, 2), C.grpo_advantages(S, M, GID, 2))
    # probability-weighted clusters: equal sequence log-probs are the frequencies
    se_f, _ = C.semantic_entropy(np.array([0, 1, 2, 0, 4, 4, 4, 7]), GID, 2)
    se_p, _ = C.semantic_entropy(np.array([0, 1, 2, 0, 4, 4, 4, 7]), GID, 2, seq_logp=np.full(8, -30.0))
    close(se_f, se_p, 1e-5)
    se_w, _ = C.semantic_entropy(np.array([0, 1, 2, 0, 4, 4, 4, 7]), GID, 2,
                                 seq_logp=np.log(np.array([.4, .1, .1, .4, .2, .2, .2, .4])))
    close(se_w[4:], -(np.log(.6) + np.log(.4)) / 2, 1e-5)


# ------------------------------------------------------------------------------------------- HAPO (TLGA)


def test_hapo_token_group_average_hand_values():
    a = rows(C.hapo_token_group_advantages(S, MLEN, GID, 2))
    # A: token-weighted mean (3 + 4) / 14 = .5, pop std .5 -> +-1; B: mu = 7/13, sigma = .4985
    mu, sd = 7 / 13, np.sqrt((7 * (6 / 13) ** 2 + 6 * (7 / 13) ** 2) / 13)
    close(a, [1, -1, -1, 1, *((1 - mu) / sd,) * 3, -mu / sd], 1e-5)
    close(a[4:], [0.9258, 0.9258, 0.9258, -1.0801], 1e-4)
    # equal lengths: (r - mean) / population std; zero outside the response
    close(C.hapo_token_group_advantages(S, M, GID, 2), C.grpo_advantages(S, M, GID, 2, unbiased_std=False), 1e-5)
    assert np.all(np.asarray(C.hapo_token_group_advantages(S, MLEN, GID, 2))[MLEN == 0] == 0)


def test_hapo_fallback_to_grpo():
    # one long correct response among short wrong ones: |A| >= 5 somewhere -> GRPO for that group
    s = np.array([1, 0, 0, 0, 0, 0, 0, 0], np.float32)
    m = np.zeros((8, 40), np.float32)
    m[0, :1] = 1
    m[1:, :40] = 1
    a = C.hapo_token_group_advantages(s, m, np.zeros(8, np.int32), 1)
    close(a, C.grpo_advantages(s, m, np.zeros(8, np.int32), 1), 1e-6)
    no_fb = C.hapo_token_group_advantages(s, m, np.zeros(8, np.int32), 1, fallback=1e9)
    assert float(np.asarray(no_fb)[0, 0]) > 5


# ------------------------------------------------------------------------------------------- RiskPO


def test_riskpo_hand_values():
    # one bundle of two questions; papers S = [2, 1, 1, 1]; a = 1, b = 1.4 (0.8 * 3 = 2.4 -> 1 + .4 * 1), sigma_S .5
    # A_rv = (S - a)+ - (S - b)+ - (b - a) over 0.6 = [0, -.6667, ...]; A_cv = 0; / (1 + 1.5) / .5
    a = rows(C.riskpo_advantages(S, M, GID, 2, bundle_size=2))
    per_paper = np.array([0, -0.4 / 0.6, -0.4 / 0.6, -0.4 / 0.6]) / 2.5 / 0.5
    sd_a, sd_b = np.std([1, 0, 0, 1], ddof=1), np.std([1, 1, 1, 0], ddof=1)
    close(a, np.concatenate([per_paper / sd_a, per_paper / sd_b]), 1e-4)
    close(a, [0, -0.9238, -0.9238, -0.9238, 0, -1.0667, -1.0667, -1.0667], 1e-4)
    # the DAPO-math script: nonpositive off, sum_mean credit: A_p = [0.5333, 0, 0, 0] split by deviations (.5, .25)
    b = rows(C.riskpo_advantages(S, M, GID, 2, bundle_size=2, credit="sum_mean", nonpositive=False))
    close(b, [0.5333 * 0.5 / 0.75, 0, 0, 0, 0.5333 * 0.25 / 0.75, 0, 0, 0], 1e-4)


def test_riskpo_identity_and_properties():
    s = np.array([0.2, 0.9, 0.5, 0.1, 1.0, 0.0, 0.3, 0.3], np.float32)
    a = rows(C.riskpo_advantages(s, M, GID, 2, bundle_size=1, omega=0.0, nonpositive=False, alpha=0.0, beta=1.0,
                                 credit="uniform"))
    want = np.concatenate([(g - g.min()) / (np.std(g, ddof=1) + 1e-6) for g in (s[:4], s[4:])])
    close(a, want, 1e-4)
    # nonpositive: every advantage <= 0; a bundle of equal papers gives 0
    assert np.all(rows(C.riskpo_advantages(s, M, GID, 2, bundle_size=2)) <= 1e-7)
    close(C.riskpo_advantages(np.ones(8, np.float32), M, GID, 2, bundle_size=2), np.zeros((8, 3)))
    with pytest.raises(ValueError, match="0 <= alpha < beta <= 1"):
        C.riskpo_advantages(s, M, GID, 2, alpha=0.9, beta=0.5)


def test_riskpo_row_order_within_groups_does_not_matter_between_groups():
    perm = np.array([4, 0, 5, 1, 6, 2, 7, 3])  # interleave the groups, keeping each group's row order
    a = np.asarray(C.riskpo_advantages(S, M, GID, 2, bundle_size=2))
    b = np.asarray(C.riskpo_advantages(S[perm], M, GID[perm], 2, bundle_size=2))
    close(b, a[perm])


# ------------------------------------------------------------------------------------------- ADORA, LOOP


def test_adora_hand_values_and_identity():
    # A: correct lengths {3, 4} -> max 4 > mean wrong (5 + 2) / 2 = 3.5: weight 1
    # B: correct {2, 2, 3} -> 3 < wrong 6: weight 0.1
    a = rows(C.adora_advantages(S, MLEN, GID, 2))
    close(a, [0.8660, -0.8660, -0.8660, 0.8660, 0.05, 0.05, 0.05, -0.15], 1e-4)
    close(C.adora_advantages(S, MLEN, GID, 2, lam=1.0), C.grpo_advantages(S, MLEN, GID, 2), 1e-6)
    # the truncated wrong response (length 6 >= 6) is excluded: no eligible wrong answer -> weight 1
    close(rows(C.adora_advantages(S, MLEN, GID, 2, length_threshold=6))[4:], [0.5, 0.5, 0.5, -1.5], 1e-4)
    # no correct response: lam (all zero anyway for a constant group; here non-binary scores)
    s = np.array([0.1, 0.3, 0.2, 0.4, 1, 1, 1, 0], np.float32)
    close(rows(C.adora_advantages(s, MLEN, GID, 2))[:4], 0.1 * rows(C.grpo_advantages(s, MLEN, GID, 2))[:4], 1e-5)


def test_drop_small_advantages_is_loop_with_rloo():
    s = np.array([1, 0, 0, 1, 0.001, 0, 0, 0], np.float32)
    rl = C.rloo_advantages(s, M, GID, 2)
    out = rows(C.drop_small_advantages(rl, M, 0.01))
    close(out[:4], [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert np.all(out[4:] == 0)  # |A| = 0.00133 < 0.01: dropped


# ------------------------------------------------------------------------------------------- shared properties

CASES = {
    "agrae": lambda s, m, v: C.agrae_advantages(s, m, GID, 2, valid=v),
    "canon": lambda s, m, v: C.canon_advantages(s, LEN, m, GID, 2, mu=0.3, valid=v),
    "stratified": lambda s, m, v: C.stratified_advantages(s, np.array([0, 1, 0, 1, 1, 0, 0, 1]), m, GID, 2,
                                                          alpha=0.4, num_strata=2, valid=v),
    "seed_grpo": lambda s, m, v: C.seed_grpo_advantages(s, np.array([0, 0, 2, 3, 4, 4, 6, 4]), m, GID, 2, valid=v),
    "hapo": lambda s, m, v: C.hapo_token_group_advantages(s, m, GID, 2, valid=v),
    "riskpo": lambda s, m, v: C.riskpo_advantages(s, m, GID, 2, bundle_size=2, valid=v),
    "adora": lambda s, m, v: C.adora_advantages(s, m, GID, 2, valid=v),
}
SCORES = np.array([0.3, 1, 0, 0.8, 1, 0.2, 0.6, 0], np.float32)


@pytest.mark.parametrize("name", list(CASES))
def test_invalid_rows_are_filtered_rows(name):
    """A row marked invalid changes nothing else and gets 0: the same as removing it (its value
    under the mask is garbage). RiskPO's papers are positional, so the last row of a group is
    the one removed."""
    fn = CASES[name]
    v = np.ones(8, bool)
    v[7] = False
    garbage = SCORES.copy()
    garbage[7] = 1e6
    a = np.asarray(fn(garbage, MLEN, v))
    assert np.all(a[7] == 0) and np.all(np.isfinite(a))
    b = np.asarray(fn(SCORES, MLEN, v))
    close(a, b)
    # outside the response mask: zero
    assert np.all(a[MLEN == 0] == 0)


@pytest.mark.parametrize("name", list(CASES))
def test_no_gradient_flows_to_the_scores(name):
    g = jax.grad(lambda s: jnp.sum(CASES[name](s, MLEN, None)))(jnp.asarray(SCORES))
    assert np.all(np.asarray(g) == 0)


# ------------------------------------------------------------------------------------------- HICRA, COPO


def test_hicra_verl_form_hand_values():
    adv = np.array([[.866] * 4, [-.866] * 4, [-.866] * 4, [.866] * 4], np.float32)
    m = np.ones((4, 4), np.float32)
    m[0, 3] = 0  # row 0 (correct) has 3 tokens, below the group's mean length 3.75: untouched
    H = np.zeros((4, 4), np.float32)
    H[3] = [0.1, 2.0, 0.5, 1.5]  # row 3: threshold sort(H)[int(0.7 * 4) = 2] = 1.5 -> only t = 1 is high
    g = np.zeros(4, np.int32)
    out = np.asarray(C.hicra_advantages(adv * m, m, g, 1, entropy=H))
    close(out[3], [0.866, 0.866 * 1.2, 0.866, 0.866])
    close(out[:3], (adv * m)[:3])
    plan = np.zeros((4, 4), np.float32)
    plan[3, 3] = 1
    close(np.asarray(C.hicra_advantages(adv * m, m, g, 1, entropy=H, planning_mask=plan))[3],
          [0.866, 1.0392, 0.866, 1.0392], 1e-4)
    close(C.hicra_advantages(adv * m, m, g, 1, entropy=H, alpha=0.0), adv * m)  # alpha = 0: unchanged


def test_hicra_paper_form():
    adv = np.array([[0.5, 0.5], [-0.5, -0.5]], np.float32)
    plan = np.array([[0, 1], [1, 0]], np.float32)
    out = C.hicra_advantages(adv, np.ones((2, 2)), np.zeros(2, np.int32), 1, planning_mask=plan, form="paper")
    close(out, [[0.5, 0.6], [-0.4, -0.5]])  # credit amplified, blame softened on planning tokens
    with pytest.raises(ValueError, match="needs planning_mask"):
        C.hicra_advantages(adv, np.ones((2, 2)), np.zeros(2, np.int32), 1, form="paper")


def test_copo_hand_values():
    s = np.array([1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0], np.float32)
    g = np.repeat([0, 1, 2], 4).astype(np.int32)
    ans = np.array([0, 1, 2, 0, 4, 4, 4, 7, 8, 8, 8, 8], np.int32)
    # p = [.5, .75, 0] -> global [0.2182, 0.8729, -1.0911]; H_A = 1.5 bits -> w = sigmoid(2.5) on correct rows
    a = rows(C.copo_advantages(s, ans, np.ones((12, 1)), g, 3))
    close(a, [0.8169, 0.2182, 0.2182, 0.8169, 0.7684, 0.7684, 0.7684, 0.8729, -1.0911, -1.0911, -1.0911, -1.0911],
          1e-4)
    # the plain gate: wrong rows blend too
    soft = rows(C.copo_advantages(s, ans, np.ones((12, 1)), g, 3, gate="soft"))
    w = 1 / (1 + np.exp(-5 * (1.5 - 1)))
    close(soft[1], (1 - w) * 0.2182 + w * -0.8660, 1e-4)
    # one prompt in the batch: no global signal
    one = rows(C.copo_advantages(s[:4], ans[:4], np.ones((4, 1)), np.zeros(4, np.int32), 1))
    close(one, [w * 0.8660, 0, 0, w * 0.8660], 1e-4)


def test_arm_hand_values_and_identities():
    # T_low of [-.1, -.2, -3, -.05, -1]: ceil(0.2 * 5) = 1 token, the least likely: -3
    close(C.low_probability_confidence(np.array([[-0.1, -0.2, -3.0, -0.05, -1.0]]), np.ones((1, 5))), [-3.0])
    close(C.low_probability_confidence(np.array([[-0.1, -0.2, -3.0, -0.05, -1.0]]), np.ones((1, 5)), fraction=0.5),
          [-(3.0 + 1.0 + 0.2) / 3])
    g, m = np.zeros(4, np.int32), np.ones((4, 2), np.float32)
    s = np.array([1, 0, 0, 1], np.float32)
    conf = np.array([-0.5, -1.2, -2.0, -0.9], np.float32)
    a = rows(C.arm_advantages(s, m, g, 1, conf, np.full(4, -1.0), alpha=0.1))
    close(a, [0.8160, -0.8460, -0.7660, 0.8560], 1e-4)           # GRPO +-0.866 + 0.1 (c(q) - c(o))
    close(C.arm_advantages(s, m, g, 1, conf, np.full(4, -1.0), alpha=0.0), C.grpo_advantages(s, m, g, 1))
    # no positive reward in the group: unchanged; correct_only shifts the correct rows only
    z = np.zeros(4, np.float32)
    close(C.arm_advantages(z, m, g, 1, conf, np.full(4, -1.0), alpha=0.1), np.zeros((4, 2)))
    co = rows(C.arm_advantages(s, m, g, 1, conf, np.full(4, -1.0), alpha=0.1, correct_only=True))
    close(co, [0.8160, -0.8660, -0.8660, 0.8560], 1e-4)


def test_aspo_hand_values_and_properties():
    a = np.array([.5, .5, .5, -1.5], np.float32)
    correct = np.array([1, 1, 1, 0], bool)
    out = rows(C.aspo_advantages(a, correct, np.array([100, 400, 700, -1.]), np.full(4, 1000.), np.ones((4, 1)),
                                 np.zeros(4, np.int32), 1))
    # raw -2 (p - 400) / 1000 = [.6, 0, -.6] clipped to +-0.7 x 0.5 = +-0.35
    close(out, [0.85, 0.5, 0.15, -1.5])
    # an all-correct group has A = 0: nothing is shaped; a single tool user: p - mean p = 0
    close(rows(C.aspo_advantages(np.zeros(4, np.float32), np.ones(4, bool), np.array([1, 5, 9, 2.]), np.full(4, 10.),
                                 np.ones((4, 1)), np.zeros(4, np.int32), 1)), np.zeros(4))
    close(rows(C.aspo_advantages(a, correct, np.array([100, -1, -1, -1.]), np.full(4, 1000.), np.ones((4, 1)),
                                 np.zeros(4, np.int32), 1)), a)
    # the sign is kept for k < 1 whatever delta
    big = rows(C.aspo_advantages(a, correct, np.array([0, 400, 900, -1.]), np.full(4, 10.), np.ones((4, 1)),
                                 np.zeros(4, np.int32), 1, delta=-100.0))
    assert np.all(np.sign(big) == np.sign(a))


# --------------------------------------------------------------------------------------------- D^3S


def _d3s_example():
    """The worked example: two groups of 4, scores [1,0,0,0 | 1,1,0,1]."""
    sc = np.array([1, 0, 0, 0, 1, 1, 0, 1], np.float32)
    m = (np.arange(4)[None] < np.array([4, 3, 2, 4, 4, 3, 4, 1])[:, None]).astype(np.float32)
    gid = np.repeat(np.arange(2, dtype=np.int32), 4)
    h = np.zeros((8, 4), np.float32)
    h[0], h[4], h[6] = [.9, .1, .5, .05], [.2, 1.5, .3, .8], [1.1, .2, .4, .6]
    return np.asarray(C.grpo_advantages(sc, m, gid, 2)), h, m, gid


def test_max_variance_subset_is_the_brute_force_argmax():
    import itertools

    rng = np.random.default_rng(0)
    for trial in range(60):
        g, size = int(rng.integers(2, 7)), None
        size = int(rng.integers(1, g + 1))
        x = rng.normal(size=2 * g).astype(np.float32)
        gid = np.repeat(np.arange(2, dtype=np.int32), g)
        got = np.asarray(C.max_variance_subset(x, gid, 2, size))
        for q in range(2):
            vals = x[gid == q]
            best = max(np.var(vals[list(c)]) for c in itertools.combinations(range(g), size))
            assert got[gid == q].sum() == size
            assert np.var(vals[got[gid == q]]) == pytest.approx(best, rel=1e-5, abs=1e-6), trial


def test_max_variance_subset_edges():
    a, _, _, gid = _d3s_example()
    row = a[:, 0]
    np.testing.assert_array_equal(C.max_variance_subset(row, gid, 2, 2), [1, 1, 0, 0, 1, 0, 1, 0])  # ties: row order
    np.testing.assert_array_equal(C.max_variance_subset(row, gid, 2, 1), [1, 0, 0, 0, 0, 0, 1, 0])  # largest |A|
    np.testing.assert_array_equal(C.max_variance_subset(row, gid, 2, 9), np.ones(8))  # a group smaller than size
    v = np.array([1, 1, 1, 1, 1, 0, 0, 0], bool)  # invalid rows never kept; group 1 keeps its only valid row
    np.testing.assert_array_equal(C.max_variance_subset(row, gid, 2, 2, valid=v), [1, 1, 0, 0, 1, 0, 0, 0])
    # PODS: within a group the advantages are increasing in the rewards, so the subsets agree
    r = np.array([0.2, 0.9, 0.4, 0.0, 1.0, 0.3, 0.7, 0.5], np.float32)
    a2 = np.asarray(C.grpo_advantages(r, np.ones((8, 1)), gid, 2))[:, 0]
    np.testing.assert_array_equal(C.max_variance_subset(a2, gid, 2, 3), C.max_variance_subset(r, gid, 2, 3))
    with pytest.raises(ValueError, match="size must be >= 1"):
        C.max_variance_subset(row, gid, 2, 0)


def test_d3s_mask_worked_example_and_full_sizes_are_grpo():
    a, h, m, gid = _d3s_example()
    keep = C.d3s_mask(a, h, m, gid, 2, samples_per_group=2, token_fraction=0.25, batch_samples=3)
    want = np.zeros((8, 4))
    want[0, 0] = want[6, 0] = want[6, 3] = 1  # |A| H: 1.65 (6,0), 1.35 (0,0), 0.90 (6,3) of 12 kept-row tokens
    np.testing.assert_array_equal(keep, want)
    # every row and every token: the response mask itself (GRPO)
    np.testing.assert_array_equal(C.d3s_mask(a, h, m, gid, 2, samples_per_group=4, token_fraction=1.0), m)
    # without the cross-batch step the four per-group rows stay; their tokens 15 -> ceil(0.5 * 15) = 8 kept
    k2 = np.asarray(C.d3s_mask(a, h + 0.01, m, gid, 2, samples_per_group=2, token_fraction=0.5))
    assert set(np.flatnonzero(k2.sum(1))) <= {0, 1, 4, 6} and k2.sum() == 8
    # the sizes may be traced: the schedule's values inside jit
    f = jax.jit(lambda n, k: C.d3s_mask(a, h, m, gid, 2, samples_per_group=n, token_fraction=k, batch_samples=3))
    np.testing.assert_array_equal(f(2, 0.25), want)
    with pytest.raises(ValueError, match="token_fraction must be in"):
        C.d3s_mask(a, h, m, gid, 2, samples_per_group=2, token_fraction=0.0)



def test_brpo_hand_values_and_identities():
    import jaxrl_llm.core as CC

    s = np.array([[0.0, 1.0], [1.0, 1.0]], np.float32)
    g = np.zeros(2, np.int32)
    u = CC.brpo_budget_prior(2, "uniform")
    # R = [[.5, .5], [1, .5]]; V2 = [.75, .5]; V1 = [[0, 0], [0, .5]]; A = R - (j V1 + (2 - j) V2) / 2
    np.testing.assert_allclose(np.asarray(CC.brpo_advantages(s, g, 1, prior=u)), [[-0.25, 0.25], [0.25, 0.0]],
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(CC.brpo_budget_prior(4, "linear")), [0.1, 0.2, 0.3, 0.4], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(CC.brpo_budget_prior(3, "base")), [0, 0, 1])
    # one budget, v2only: the group-mean baseline (GRPO without the std)
    one = np.array([[1.0], [0.0], [0.0], [1.0]], np.float32)
    gid = np.array([0, 0, 1, 1], np.int32)
    np.testing.assert_allclose(np.asarray(CC.brpo_advantages(one, gid, 2, prior=CC.brpo_budget_prior(1),
                                                             variant="v2only"))[:, 0], [0.5, -0.5, -0.5, 0.5])
    # the base prior: every segment's return is the final budget's score
    r = np.asarray(CC.brpo_advantages(s, g, 1, prior=CC.brpo_budget_prior(2, "base"), variant="none"))
    np.testing.assert_allclose(r, [[1, 1], [1, 1]])
    with pytest.raises(ValueError, match="variant"):
        CC.brpo_advantages(s, g, 1, prior=u, variant="v3")



def test_xrpo_novelty_bonus_by_hand():
    sc = np.array([1, 1, 0, 0], np.float32)
    lp = np.log(np.array([[.9, .9], [.3, .3], [.5, .5], [.5, .5]], np.float32))
    m = np.ones((4, 2), np.float32)
    g = np.zeros(4, np.int32)
    base = np.asarray(C.grpo_advantages(sc, m, g, 1))[:, 0]
    s_ = np.log([.9, .3, .5, .5])
    eta = np.exp(s_ - s_.mean())
    bonus1 = min(max(2.5 * (1 - eta[1]), 0), 0.5 * base[1])  # capped at kappa A
    out = np.asarray(C.xrpo_novelty_advantages(sc, lp, m, g, 1))[:, 0]
    np.testing.assert_allclose(out, [base[0], base[1] + bonus1, base[2], base[3]], rtol=1e-5)
    assert bonus1 == pytest.approx(0.5 * base[1])
    np.testing.assert_allclose(np.asarray(C.xrpo_novelty_advantages(sc, lp, m, g, 1, lam=0.0)),
                               np.asarray(C.grpo_advantages(sc, m, g, 1)), rtol=1e-6)


def test_r3_entropy_ranking_by_hand():
    # group 0: three failures; group 1: one success (keeps its scores)
    sc = np.array([0, 0, 0, 1, 0], np.float32)
    ent = np.array([[3, 0, 0, 0], [1, 1, 1, 1], [2, 2, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]], np.float32)
    m = np.ones((5, 4), np.float32)
    g = np.array([0, 0, 0, 1, 1], np.int32)
    # peak (top 1 of 4) [3, 1, 2], global [.75, 1, 1]: row 0 dominates rows 1 and 2; rows 1, 2 tie (0)
    r = np.asarray(C.r3_entropy_rank_rewards(sc, ent, m, g, 2, r_max=0.4, peak_frac=0.25))
    np.testing.assert_allclose(r, [0.4, 0.2, 0.0, 1.0, 0.0], atol=1e-6)
    with pytest.raises(ValueError, match="peak_frac"):
        C.r3_entropy_rank_rewards(sc, ent, m, g, 2, r_max=0.4, peak_frac=0.0)



def test_decs_rewards_and_per_position_advantages_by_hand():
    m = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
    r = np.asarray(C.decs_token_rewards(np.array([1, 0], bool), np.array([2, 0]), m, beta=0.1, max_length=4.0))
    # past the correct response's end (its padding) 1 + beta, as the authors' code holds it
    np.testing.assert_allclose(r, [[1.1, 1.1, 1 + 0.1 * (1 - 3 / 4), 1.1], [0, 0, 0, 0]], rtol=1e-6)
    a = np.asarray(C.decs_advantages(r, m, np.zeros(2, np.int32), 1))
    # position 0: values 1.1 and 0: mean .55, unbiased std .7778 -> +-0.7071; position 2: 1.025 and 0 (padding
    # counted): +-0.7071 on the real token, the padded one masked
    np.testing.assert_allclose(a[:, :3], [[0.70710, 0.70710, 0.70710], [-0.70710, -0.70710, 0.0]], atol=1e-4)
    # without the padding in the statistics, position 2 has one response: mean = itself, advantage 0
    b = np.asarray(C.decs_advantages(r, m, np.zeros(2, np.int32), 1, pad_in_stats=False))
    np.testing.assert_allclose(b[0, 2], 0.0, atol=1e-6)

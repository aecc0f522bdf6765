"""Segment credit from Monte-Carlo values at cut points (jaxrl_llm.core.segments): SPO-chain's
cut points and advantages, PAV's progress advantages, hand values from the methods' sources and
their identities. (jit, vmap, bf16, all-masked: test_battery.py.)"""

import numpy as np

import jaxrl_llm.core as C

P = np.array([[.95, .5, .99, .97, .6, .92, .3, .98, .99, .4, .95, .97]], np.float32)
LP, M = np.log(P), np.ones_like(P)


def test_spo_cut_points_every_kth_low_probability_token():
    # low-probability tokens 1, 4, 6, 9 (the code's cut points 0, 3, 5, 8 are "after" token t - 1); every 2nd kept
    assert np.nonzero(np.asarray(C.spo_cut_points(LP, M, interval=2)))[1].tolist() == [1, 6]
    assert np.nonzero(np.asarray(C.spo_cut_points(LP, M, interval=1)))[1].tolist() == [1, 4, 6, 9]
    m = M.copy()
    m[0, 6:] = 0  # padding is never a cut point
    assert np.nonzero(np.asarray(C.spo_cut_points(LP, m, interval=1)))[1].tolist() == [1, 4]


def test_spo_chain_hand_values():
    cuts = np.asarray(C.spo_cut_points(LP, M, interval=2))
    v = np.zeros_like(P)
    v[0, 1], v[0, 6] = 0.5, 0.8
    raw, keep = C.spo_chain_advantages(np.array([1.0]), v, cuts, M, LP, prob_mask=False, whiten=False)
    np.testing.assert_allclose(raw[0], [0, .3, .3, .3, .3, .3, .2, .2, .2, .2, .2, .2], atol=1e-6)
    adv, keep = C.spo_chain_advantages(np.array([1.0]), v, cuts, M, LP, whiten=False)
    np.testing.assert_allclose(adv[0], [0, .3, 0, 0, .3, 0, .2, 0, 0, .2, 0, 0], atol=1e-6)
    assert np.asarray(keep)[0].tolist() == (P[0] < 0.9).tolist()
    # a cut before the first token (the prompt's value): p_0 = .2, cuts before tokens 0, 4, 9
    p2 = P.copy()
    p2[0, 0] = 0.2
    cuts2 = np.asarray(C.spo_cut_points(np.log(p2), M, interval=2))
    assert np.nonzero(cuts2)[1].tolist() == [0, 4, 9]
    v2 = np.zeros_like(P)
    v2[0, 0], v2[0, 4], v2[0, 9] = 0.5, 0.7, 0.6
    raw2, _ = C.spo_chain_advantages(np.array([0.0]), v2, cuts2, M, np.log(p2), prob_mask=False, whiten=False)
    np.testing.assert_allclose(raw2[0], [.2] * 4 + [-.1] * 5 + [-.6] * 3, atol=1e-6)
    masked, _ = C.spo_chain_advantages(np.array([0.0]), v2, cuts2, M, np.log(p2), whiten=False)
    np.testing.assert_allclose(masked[0], [.2, .2, 0, 0, -.1, 0, -.1, 0, 0, -.6, 0, 0], atol=1e-6)


def test_spo_chain_telescopes_and_whitens_over_the_kept_tokens():
    rng = np.random.default_rng(0)
    lp = np.log(rng.uniform(0.05, 0.99, (4, 10))).astype(np.float32)
    m = (np.arange(10)[None] < np.array([[10], [7], [3], [9]])).astype(np.float32)
    cuts = np.asarray(C.spo_cut_points(lp, m, interval=1))
    v = rng.uniform(0, 1, (4, 10)).astype(np.float32)
    s = np.array([1., 0., 1., 0.5], np.float32)
    raw, _ = C.spo_chain_advantages(s, v, cuts, m, lp, prob_mask=False, whiten=False)
    for i in range(4):  # one value per segment; the segment values sum to score - V(first cut)
        c = np.nonzero(cuts[i])[0]
        if not len(c):
            assert np.all(raw[i] == 0)
            continue
        seg = [raw[i, c[j]] for j in range(len(c))]
        np.testing.assert_allclose(sum(seg), s[i] - v[i, c[0]], atol=1e-5)
        assert np.all(np.asarray(raw)[i, :c[0]] == 0)
    adv, keep = C.spo_chain_advantages(s, v, cuts, m, lp)
    kept = np.asarray(adv)[np.asarray(keep)]
    assert abs(kept.mean()) < 1e-5 and abs(kept.std(ddof=1) - 1) < 1e-3


def test_pav_hand_values_and_limits():
    np.testing.assert_allclose(C.best_of_k_value(np.array([0.25, 0.5, 1.0, 0.0]), 4),
                               [1 - .75 ** 4, 1 - .5 ** 4, 1, 0], atol=1e-6)
    # one cut before token 0 with V = 0.25 parent ... the SPO authors' PAV table: Q + 5 (Bo4(V') - Bo4(V))
    m = np.ones((3, 2), np.float32)
    lp = np.log(np.full((3, 2), 0.5, np.float32))
    cuts = np.zeros((3, 2), bool)
    cuts[:, 0] = True
    v = np.array([[0.25, 0], [0.5, 0], [0.5, 0]], np.float32)
    s = np.array([0.5, 1.0, 0.0], np.float32)
    adv, _ = C.pav_advantages(s, v, cuts, m, lp, whiten=False)
    np.testing.assert_allclose(np.asarray(adv)[:, 0], [1.76953, 1.3125, -4.6875], atol=1e-5)
    # alpha = 0: the segment's end value (the MC Q-value)
    q, _ = C.pav_advantages(s, v, cuts, m, lp, alpha=0.0, whiten=False)
    np.testing.assert_allclose(np.asarray(q)[:, 0], s, atol=1e-6)

"""The papers' reward designs (jaxrl_llm.core.reward_shaping): hand values from the methods'
sources, their identities and edge cases, invalid rows. (jit, vmap, bf16: test_battery.py.)"""

import numpy as np
import pytest

import jaxrl_llm.core as C

G1 = np.zeros(4, np.int32)


def close(a, b, tol=2e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, rtol=tol)


def test_thinkless_reward_table():
    close(C.thinkless_reward(np.array([1, 1, 0, 0], bool), np.array([1, 0, 0, 1], bool)), [1, 0.5, -1, -1])
    # with Dr.GRPO advantages the example of the paper's code: r = [1, .5, -1, -1] -> A = [1.125, .625, -.875, -.875]
    r = np.asarray(C.thinkless_reward(np.array([1, 1, 0, 0], bool), np.array([1, 0, 0, 1], bool)))
    close(r - r.mean(), [1.125, 0.625, -0.875, -0.875])


def test_grpo_lambda_selects_the_most_accurate_groups():
    c = np.array([1, 1, 1, 0, 1, 0, 0, 0], bool)
    L = np.array([3, 5, 2, 4, 3, 5, 2, 4], np.float32)
    g = np.repeat([0, 1], 4).astype(np.int32)
    r = C.grpo_lambda_reward(c, L, g, 2, top_fraction=0.5)
    # group 0 (p = .75) selected: Kimi length reward 0.5 - (L - 2) / 3, wrong rows min(0, .)
    close(r, [1 + 1 / 6, 1 - 0.5, 1 + 0.5, -1 / 6, 1, 0, 0, 0], 1e-5)
    close(C.grpo_lambda_reward(c, L, g, 2, top_fraction=0.0), c.astype(np.float32))      # GRPO's reward
    both = np.asarray(C.grpo_lambda_reward(c, L, g, 2, top_fraction=1.0))
    assert both[4] != 1 and both[5] <= 0                                                  # every group penalised
    # a group with no correct answer is never selected
    z = np.zeros(8, bool)
    close(C.grpo_lambda_reward(z, L, g, 2, top_fraction=1.0), np.zeros(8))


def test_concise_reward_and_its_identity():
    r = C.concise_reward(np.ones(4, bool), np.array([3, 5, 2, 4.]), G1, 1, max_length=8)
    close(r, [1.625, 1.375, 1.75, 1.5])
    a = C.grpo_advantages(np.asarray(r), np.ones((4, 1)), G1, 1)[:, 0]
    lens = np.array([3, 5, 2, 4.])
    close(a, -(lens - lens.mean()) / (lens.std(ddof=1) + 1e-6 * 8), 1e-4)  # -GRPO(L) in an all-correct group
    mixed = np.array([1, 0, 1, 1], bool)
    close(C.concise_reward(mixed, lens, G1, 1, max_length=8), mixed.astype(np.float32))


def test_otc_tool_reward():
    g = np.zeros(4, np.int32)
    close(C.otc_tool_reward(np.array([0, 1, 1, 1], bool), np.array([0, 1, 2, 3.]), g, 1),
          [0, 1, np.sin(np.pi * 4 / 3 / 2), np.sin(np.pi * 1.5 / 2)])          # n = 1: peaks at one call
    # n = 0 (a correct answer without calls): 1 at no call, cos(m pi / (2m + 1)) otherwise
    close(C.otc_tool_reward(np.ones(3, bool), np.array([0, 1, 2.]), np.zeros(3, np.int32), 1),
          [1, 0.5, np.cos(2 * np.pi / 5)])
    # the fewest calls among the correct rows score 1; wrong rows 0 whatever their calls
    close(C.otc_tool_reward(np.array([1, 1], bool), np.array([0., 0.]), np.zeros(2, np.int32), 1), [1, 1])
    close(C.otc_tool_reward(np.array([1, 1, 0], bool), np.array([2., 1., 1.]), np.zeros(3, np.int32), 1)[1:], [1, 0])
    close(C.otc_tool_reward(np.ones(3, bool), np.array([0, 1, 2.]), np.zeros(3, np.int32), 1, mode="ppo"),
          [1, 0.5, np.cos(2 * np.pi / 5)])


def test_fapo_reward_and_majority_guided_sign():
    r = np.asarray(C.fapo_reward(np.array([1, 1, 0, 1], bool), np.array([0, 1, 0, 0], bool)))
    close(r, [1, 0, -1, 1])
    close(C.grpo_advantages(r, np.ones((4, 1)), G1, 1)[:, 0], [0.7833, -0.2611, -1.3056, 0.7833], 1e-4)
    # the flawed row's advantage has the sign of (n_wrong - n_clean)
    many_wrong = np.asarray(C.fapo_reward(np.array([1, 0, 0, 1], bool), np.array([1, 0, 0, 0], bool)))
    assert C.grpo_advantages(many_wrong, np.ones((4, 1)), G1, 1)[0, 0] > 0
    # wrong rows are never penalised further
    close(C.fapo_reward(np.array([0], bool), np.array([1], bool)), [-1])


def test_posterior_reward():
    r = C.posterior_reward(np.array([1, 1, 0, 1.]), np.array([1, 0, 0, 1.]), np.array([.8, .9, .3, .4]))
    close(r, [2.8, 1.0, 0.0, 2.4])
    close(C.grpo_advantages(np.asarray(r), np.ones((4, 1)), G1, 1)[:, 0], [0.9692, -0.4265, -1.2018, 0.6591], 1e-4)


def test_empo_reward():
    close(C.empo_reward(np.array([0, 0, 2, 3]), G1, 1, empty=np.array([0, 0, 0, 1], bool)), [0.5, 0.5, 0.25, 0])
    close(C.empo_reward(np.array([0, 1, 2, 3]), G1, 1), np.zeros(4))          # all distinct: thresholded
    close(C.empo_reward(np.array([0, 1, 2, 3]), G1, 1, threshold=False), np.full(4, 0.25))
    close(C.empo_reward(np.array([0, 0, 0, 0]), G1, 1), np.ones(4))
    # two groups, an invalid row
    r = C.empo_reward(np.array([0, 0, 2, 3, 4, 4, 4, 4]), np.repeat([0, 1], 4), 2,
                      valid=np.array([1, 1, 1, 1, 1, 1, 1, 0], bool))
    close(r, [0.5, 0.5, 0.25, 0.25, 1, 1, 1, 0])


def test_self_play_win_rate():
    s = np.array([1, 0, 0, 1.])
    hard = (s[:, None] > s[None]) + 0.5 * (s[:, None] == s[None])
    close(C.self_play_win_rate(hard, G1, 1), [5 / 6, 1 / 6, 1 / 6, 5 / 6])
    soft = 1 / (1 + np.exp(-(s[:, None] - s[None])))
    close(C.self_play_win_rate(soft, G1, 1), [0.654039, 0.345961, 0.345961, 0.654039], 1e-5)
    # intransitive preferences are fine: rock-paper-scissors gives everyone 1/2
    rps = np.array([[.5, 1, 0], [0, .5, 1], [1, 0, .5]])
    close(C.self_play_win_rate(rps, np.zeros(3, np.int32), 1), [0.5, 0.5, 0.5])
    close(C.self_play_win_rate(np.ones((1, 1)), np.zeros(1, np.int32), 1), [0.5])  # no opponent
    with pytest.raises(ValueError, match="square"):
        C.self_play_win_rate(np.ones((2, 3)), np.zeros(2, np.int32), 1)


def test_dot_truncation_lengths():
    L = np.array([100] * 11 + [1000], np.float32)
    # mean 175, unbiased std 259.8: threshold floor(954.4) = 954; 1000 - 954 >= 32: cut
    out = np.asarray(C.dot_truncation_lengths(L, np.ones(12, bool), np.zeros(12, np.int32), 1))
    assert out.tolist() == [100] * 11 + [954]
    # the largest z-score of n samples is (n - 1) / sqrt(n): with alpha = 3 nothing is cut below 11 samples
    for n in (4, 8, 10):
        x = np.array([1] * (n - 1) + [10 ** 6], np.float32)
        assert np.asarray(C.dot_truncation_lengths(x, np.ones(n, bool), np.zeros(n, np.int32), 1)).tolist() == \
            x.astype(int).tolist()
    # not all correct: untouched; a cut smaller than min_cut: untouched; a fractional min_cut
    c = np.ones(12, bool)
    c[0] = False
    assert np.asarray(C.dot_truncation_lengths(L, c, np.zeros(12, np.int32), 1)).tolist() == L.astype(int).tolist()
    assert np.asarray(C.dot_truncation_lengths(L, np.ones(12, bool), np.zeros(12, np.int32), 1, min_cut=50))[-1] == 1000
    assert np.asarray(C.dot_truncation_lengths(L, np.ones(12, bool), np.zeros(12, np.int32), 1, min_cut=0.04))[-1] \
        == 954  # need max(floor(1000 x .04), 16) = 40 <= 46


def test_hbpo_reward_and_advantages():
    b = np.array([512, 512, 2560, 2560.], np.float32)
    L = np.array([300, 900, 1500, 2000.], np.float32)
    c = np.array([1, 1, 1, 0], bool)
    R = np.asarray(C.hbpo_reward(c, L, b))
    f = lambda x: 4 * np.cos(np.pi * x / 8192)  # noqa: E731
    f1 = f(L) - np.abs(L - b) / 4096
    np.testing.assert_allclose(R, [min(f1[0], f(512)), min(f1[1], f(512)), min(f1[2], f(2560)), 0], rtol=1e-5)
    np.testing.assert_allclose(R, [3.92180, 3.66938, 2.22228, 0], atol=1e-4)
    # f1(b, b) = f2(b): answering exactly at the budget earns its full credit
    np.testing.assert_allclose(C.hbpo_reward(np.ones(2, bool), np.array([1024., 2048.]), np.array([1024., 2048.])),
                               f(np.array([1024., 2048.])), rtol=1e-6)
    # a format failure is -1; a correct answer past L_max earns nothing
    np.testing.assert_allclose(C.hbpo_reward(np.array([1, 1], bool), np.array([10., 5000.]), np.array([512., 512.]),
                                             format_ok=np.array([0, 1], bool)), [-1, 0])
    g, q = np.array([0, 0, 1, 1]), np.zeros(4, np.int32)
    a = np.asarray(C.hbpo_advantages(R, np.ones((4, 1)), g, 2, b, q, 1))[:, 0]
    np.testing.assert_allclose(a, [0.6888, 0.5484, -1.2396, -2.4750], atol=1e-4)
    a2 = np.asarray(C.hbpo_advantages(R, np.ones((4, 1)), g, 2, b, q, 1, intra_coef=2.0))[:, 0]
    np.testing.assert_allclose(a2, [0.5612, 0.4209, -2.3507, -3.5861], atol=1e-4)  # the released code
    # one budget (>= 1024: f1 >= f2 below it), every rollout correct within it: A = 0; all wrong: every row -f2(b)
    ok = np.asarray(C.hbpo_reward(np.ones(4, bool), np.array([100, 700, 1300, 2000.]), np.full(4, 2048.)))
    np.testing.assert_allclose(C.hbpo_advantages(ok, np.ones((4, 1)), np.zeros(4, np.int32), 1, np.full(4, 2048.),
                                                 np.zeros(4, np.int32), 1), np.zeros((4, 1)), atol=1e-6)
    np.testing.assert_allclose(C.hbpo_advantages(np.zeros(4), np.ones((4, 1)), g, 2, b, q, 1)[:, 0], -f(b), rtol=1e-5)


def test_triangular_length_reward_and_curriculum_budget():
    """Train Long, Think Short: the triangle and the paper's schedule (256 -> 87 in 3 drops)."""
    close(C.triangular_length_reward(np.array([0, 50, 100, 150, 200, 250]), 100.0), [0, 0.5, 1, 0.5, 0, 0])
    close(C.triangular_length_reward(np.array([0, 50, 100, 150]), 100.0, band=True), [1, 1, 1, 0.5])
    close(C.triangular_length_reward(np.array([4, 12]), np.array([8.0, 8.0]), r_max=2.0), [1, 1])
    # the worked example: weights (0.6, 0.3, 0.1), both tags (format 2), correct, L = 100
    for ell, want in ((50, 0.95), (150, 0.95), (250, 0.8)):
        close(0.6 + 0.3 * C.triangular_length_reward(np.array([ell]), 100.0) + 0.1 * 2, [want])
    assert [round(C.curriculum_budget(t), 1) for t in (0, 149, 150, 299, 300, 450, 10_000)] == \
        [256.0, 256.0, 178.6, 178.6, 124.7, 87.0, 87.0]
    assert C.curriculum_budget(300, schedule="linear") == pytest.approx(256 - 2 * (256 - 87) / 3)
    assert C.curriculum_budget(10_000, initial=100, final=100) == 100  # no decay: a fixed budget
    with pytest.raises(ValueError, match="schedule must be"):
        C.curriculum_budget(0, schedule="cosine")
    with pytest.raises(ValueError, match="budget"):
        C.triangular_length_reward(np.array([1]), 0.0)


def test_hapo_history_reward_and_update():
    """The authors' worked example (h = 4) and the history's rules: no history -> no length
    reward; a correct answer always beats a wrong one; the history only shrinks."""
    correct, L = np.array([1, 1, 0, 0], bool), np.array([3, 5, 2, 9])
    close(C.hapo_history_reward(correct, L, np.full(4, 4.0)), [1.382683, 0.617317, 0, -1], 1e-5)
    close(C.hapo_history_reward(correct, L, np.zeros(4)), [1, 1, 0, 0])  # first encounter
    close(C.hapo_history_reward(correct, np.array([100, 3, 1, 1]), np.full(4, 4.0)), [0.3, 1.382683, 0, 0], 1e-5)
    # linear variant: correct 1 - L/h below h, 0 to 1.1h, then -(L - 1.1h)/h floored; wrong never positive
    close(C.hapo_history_reward(np.array([1, 1, 1, 0, 0], bool), np.array([2, 4.2, 8, 4.2, 20]), np.full(5, 4.0),
                                mode="linear"), [1.5, 1.0, 0.3, 0, -1], 1e-5)
    close(C.hapo_history_update(np.array([4.0, 0.0, 5.0]), np.array([1, 1, 0, 0, 0, 1], bool),
                                np.array([3, 5, 2, 9, 1, 7]), np.array([0, 0, 1, 1, 2, 2]), 3), [3, 0, 5])
    close(C.hapo_history_update(np.array([0.0]), np.array([0, 1], bool), np.array([2, 6]), np.array([0, 0]), 1), [6])
    with pytest.raises(ValueError, match="mode must be"):
        C.hapo_history_reward(correct, L, np.full(4, 4.0), mode="exp")


def test_interleaved_length_cap_by_hand():
    cap = C.interleaved_length_cap
    kw = dict(low=1000, high=3000, compress_steps=3, expand_steps=1)
    # stair: low over the compression steps, then high; periodic
    assert [cap(s, shape="stair", **kw) for s in range(9)] == [1000, 1000, 1000, 3000] * 2 + [1000]
    # cosine over the period P = 4: high, mid, low, mid
    assert [cap(s, **kw) for s in range(5)] == [3000, 2000, 1000, 2000, 3000]
    # stair-cosine: a half cosine over the 3 compression steps (3000, 2500, 1500), then high
    assert [cap(s, shape="stair_cosine", **kw) for s in range(4)] == [3000, 2500, 1500, 3000]
    # rounded down to the block, at least one block
    assert cap(1, block=512, **kw) == 1536 and cap(2, low=10, high=3000, compress_steps=3, expand_steps=1,
                                                      block=512) == 512
    assert [cap(s, low=7, high=7, compress_steps=0, expand_steps=5) for s in range(3)] == [7, 7, 7]
    for bad, msg in [(dict(low=0), "low must be an int >= 1"), (dict(low=4000), "must be <= high"),
                     (dict(compress_steps=0, expand_steps=0), "must be >= 1"), (dict(shape="step"), "shape must be")]:
        with pytest.raises(ValueError, match=msg):
            cap(0, **{**kw, **bad})


def test_region_consistency_reward_hand_values_and_identities():
    # one group of four: [2, 4], [3, 4], [3, 5], no region. Votes (K = 4): cell 2: 1/4, 3: 3/4, 4: 3/4, 5: 1/4
    st, en = np.array([2, 3, 3, 0], np.int32), np.array([4, 4, 5, 0], np.int32)
    has = np.array([1, 1, 1, 0], bool)
    close(C.region_consistency_reward(st, en, has, G1, 1, grid=8),
          [(0.25 + 0.75 + 0.75) / 3, 0.75, (0.75 + 0.75 + 0.25) / 3, 0.0])
    # unanimous: 1 each; disjoint: 1/K each
    same = C.region_consistency_reward(np.full(4, 1, np.int32), np.full(4, 3, np.int32), np.ones(4, bool), G1, 1, grid=8)
    close(same, np.ones(4))
    apart = C.region_consistency_reward(np.array([0, 2, 4, 6], np.int32), np.array([1, 3, 5, 7], np.int32),
                                        np.ones(4, bool), G1, 1, grid=8)
    close(apart, np.full(4, 0.25))
    # groups vote separately; an invalid row neither votes nor counts in K; start > end is no region
    gid = np.array([0, 0, 1, 1], np.int32)
    r = C.region_consistency_reward(np.array([1, 1, 1, 5], np.int32), np.array([2, 2, 2, 3], np.int32),
                                    np.ones(4, bool), gid, 2, grid=8, valid=np.array([1, 1, 1, 0], bool))
    close(r, [1.0, 1.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="grid"):
        C.region_consistency_reward(st, en, has, G1, 1, grid=0)


def test_cgpo_calibrated_reward():
    r = np.array([2.0, 0.0, 5.0, -1.0], np.float32)
    base = np.array([1.0, 0.0, 0.0, -1.0], np.float32)
    ok = np.array([1, 1, 0, 1], bool)
    sig = lambda z: 1 / (1 + np.exp(-z))
    close(C.cgpo_calibrated_reward(r, base, ok), [sig(1.0), 0.5, 0.0, 0.5])
    # a violation is below every feasible response, however high the reward model scores it
    assert float(C.cgpo_calibrated_reward(np.array([1e3], np.float32), np.zeros(1, np.float32),
                                          np.zeros(1, bool))[0]) == 0.0


def test_cosine_length_reward_by_hand():
    import math

    c = np.array([1, 1, 0, 0, 1], bool)
    ln = np.array([0.0, 500.0, 0.0, 1000.0, 1500.0], np.float32)
    want = [1.0, 0.5 + 0.5 * (1 + math.cos(math.pi / 2)) / 2, 0.0, -0.5, 0.5 + 0.5 * (1 + math.cos(1.5 * math.pi)) / 2]
    close(C.cosine_length_reward(c, ln, max_length=1000.0), want)
    # past max_length the authors' cosine rises again; clamped it stays at the floor
    close(C.cosine_length_reward(c, ln, max_length=1000.0, clamp_length=True)[4], 0.5)
    # equal bounds: the plain correctness reward
    close(C.cosine_length_reward(c, ln, max_length=10.0, min_correct=1.0, max_correct=1.0, min_wrong=0.0,
                                 max_wrong=0.0), c.astype(np.float32))


def test_auto_cei_reward_by_hand():
    import math

    c = np.array([1, 0, 0, 0], bool)
    refused = np.array([0, 0, 1, 1], bool)
    steps = np.array([5, 5, 13, 3], np.float32)
    close(C.auto_cei_reward(c, refused, steps, c1=13.0, c2=0.4), [1, -1, 0.0, 2 / (1 + math.exp(4.0)) - 1])


def test_ares_entropy_reward_by_hand():
    import math

    import jaxrl_llm.core as C

    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    # easy, correct, 10 HWE tokens against a target of 4: margin max(1, 0.6) = 1, over = 5 > kappa 2
    # -> Huber 5 - 1 = 4, penalty min(0.5, 4 / 3 x 0.5) = 0.5 (capped)
    # medium, correct, 5 vs 4: |d| - margin(1) = 0 -> 0
    # hard, wrong, 8 vs 4: margin max(1, 1.4) = 1.4, sigmoid(2.6 / 3) x 0.6 (cap 0.5 x 1.2)
    # hard, correct, 0 vs 4: d = -4 < -1.4 -> -min(0.6, 0.5 Huber(2.6; 4) / 5.4 x 0.6)
    got = np.asarray(C.ares_entropy_reward(np.array([10.0, 5.0, 8.0, 0.0]), np.array([4.0] * 4),
                                           np.array([True, True, False, True]), np.array([0, 1, 2, 2])))
    hub = 0.5 * 2.6 ** 2 / 4
    np.testing.assert_allclose(got, [-0.5, 0.0, sig(2.6 / 3) * 0.6, -min(0.6, 0.5 * hub / 5.4 * 0.6)], rtol=1e-5)
    assert np.all(np.asarray(C.ares_entropy_reward(np.array([10.0]), np.array([4.0]), np.array([True]),
                                                   np.array([0]), alpha=0.0)) == 0)  # identity

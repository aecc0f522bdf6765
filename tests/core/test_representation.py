"""VERL's effective rank and its dynamics, the bonus and the capped shaping (METHODS.md #166):
hand values on states whose ranks are known, the paper's identities, input checks."""

import jax
import numpy as np
import pytest

import jaxrl_llm.core as C


def simplex(n, d=None):
    """``n`` standard basis rows: any ``k + 1`` of them, centred, have ``k`` equal singular values
    (the regular simplex), so their effective rank is exactly ``k``."""
    d = d or n
    return np.eye(n, d, dtype=np.float32)


def test_effective_rank_of_simplices_and_degenerate_rows():
    h = np.stack([simplex(6), simplex(6)])
    m = np.ones((2, 6), bool)
    m[1, 3:] = False  # 3 rows: a triangle, rank 2
    np.testing.assert_allclose(C.effective_rank(h, m), [5.0, 2.0], atol=1e-4)
    # identical rows: no spread (exp of zero entropy) is 1; fewer than 2 rows: 0
    same = np.ones((1, 4, 3), np.float32)
    np.testing.assert_allclose(C.effective_rank(same, np.ones((1, 4), bool)), [1.0], atol=1e-6)
    np.testing.assert_allclose(C.effective_rank(h[:1], np.eye(1, 6, dtype=bool)), [0.0])


def test_dynamics_hand_values_stride_one():
    # prefix rank ER_j = j + 1 (windows of j + 2 simplex rows), j = 0..4 for 6 rows
    # ERV_j = (j + 1) - mean(1..j) = (j + 1) / 2 for j >= 1: 1, 1.5, 2, 2.5 -> 1.75
    # ERA_j = 0.5 for j >= 2
    er, erv, era = C.effective_rank_dynamics(simplex(6)[None], np.ones((1, 6), bool), stride=1, max_len=512)
    np.testing.assert_allclose([er[0], erv[0], era[0]], [5.0, 1.75, 0.5], atol=1e-4)


def test_dynamics_stride_and_short_rows():
    h = simplex(8)[None]
    # stride 3, 7 rows: checkpoints t = 3, 6: ER(4 rows) = 3, ER(7 rows) = 6: ERV = 6 - 3 = 3, no ERA
    m = np.zeros((1, 8), bool)
    m[0, :7] = True
    er, erv, era = C.effective_rank_dynamics(h, m, stride=3)
    np.testing.assert_allclose([er[0], erv[0], era[0]], [6.0, 3.0, 0.0], atol=1e-4)
    # 6 rows with stride 3 (not more than 2 strides): the code's empty dynamics
    m[0, 6] = False
    _, erv, era = C.effective_rank_dynamics(h, m, stride=3)
    assert float(erv[0]) == 0.0 and float(era[0]) == 0.0


def test_dynamics_keep_the_last_max_len_states_and_follow_the_mask_in_order():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(1, 12, 16)).astype(np.float32)
    full = np.ones((1, 12), bool)
    # max_len 7: the dynamics of the last 7 states equal those of the 7 states alone
    a = C.effective_rank_dynamics(h, full, stride=2, max_len=7)
    b = C.effective_rank_dynamics(h[:, 5:], full[:, 5:], stride=2, max_len=7)
    np.testing.assert_allclose([a[1][0], a[2][0]], [b[1][0], b[2][0]], atol=1e-5)
    # but the whole-response rank uses every state
    assert abs(float(a[0][0]) - float(b[0][0])) > 1e-3
    # a mask with holes: the masked states, in order, as if contiguous
    holes = np.ones((1, 12), bool)
    holes[0, [2, 7]] = False
    c = C.effective_rank_dynamics(h, holes, stride=2)
    d = C.effective_rank_dynamics(h[:, holes[0]], np.ones((1, 10), bool), stride=2)
    np.testing.assert_allclose(np.array(c).ravel(), np.array(d).ravel(), atol=1e-5)


def test_rank_is_invariant_to_a_shift_and_an_orthogonal_map():
    rng = np.random.default_rng(1)
    h = rng.normal(size=(2, 9, 5)).astype(np.float32)
    m = np.ones((2, 9), bool)
    q, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    moved = (h @ q.astype(np.float32)) + 3.0
    for x, y in zip(C.effective_rank_dynamics(h, m, stride=2), C.effective_rank_dynamics(moved, m, stride=2)):
        np.testing.assert_allclose(x, y, atol=1e-4)


def test_bonus_hand_values():
    b = np.ones(3, np.float32)
    # era 2 -> rel 1, tau = sigmoid(2); erv 1 -> rel 0; er 3 -> rel 2
    got = C.effective_rank_bonus(np.array([3.0]), np.array([1.0]), np.array([2.0]), b)
    tau = 1 / (1 + np.exp(-2.0))
    np.testing.assert_allclose(got, [tau * np.tanh(2.0)], rtol=1e-6)
    # a zero baseline: every deviation clips at +-5
    got = C.effective_rank_bonus(np.array([2.0]), np.array([-1.0]), np.array([-0.5]), np.zeros(3))
    tau = 1 / (1 + np.exp(10.0))
    np.testing.assert_allclose(got, [tau * np.tanh(5.0) + (1 - tau) * np.tanh(-5.0)], rtol=1e-6)
    # weight scales; weight 0 gives nothing
    assert float(C.effective_rank_bonus(np.array([3.0]), np.array([1.0]), np.array([2.0]), b, weight=0.0)[0]) == 0.0


def test_capped_bonus_on_the_last_or_every_token():
    adv = np.array([[1.0, 1.0, 1.0, 0.0], [-2.0, -2.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]], np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], bool)
    bonus = np.array([0.2, 5.0, -1.0], np.float32)
    got = np.asarray(C.capped_bonus_advantages(adv, bonus, mask, kappa=2.0))
    want = adv.copy()
    want[0, 2] += 0.2          # under the cap |1| / 2
    want[1, 1] += 1.0          # capped at |-2| / 2
    # a negative bonus adds nothing (relu)
    np.testing.assert_allclose(got, want)
    every = np.asarray(C.capped_bonus_advantages(adv, bonus, mask, kappa=2.0, at="all"))
    want_all = adv + np.where(mask, np.minimum(np.maximum(bonus, 0)[:, None], np.abs(adv) / 2), 0)
    np.testing.assert_allclose(every, want_all)
    # a zero advantage stays zero (the cap is 0): the bonus never creates a signal of its own
    assert np.all(every[adv == 0] == 0)


def test_jit_and_gradient_free_inputs_checked():
    f = jax.jit(lambda h, m: C.effective_rank_dynamics(h, m, stride=2, max_len=6))
    rng = np.random.default_rng(2)
    h = rng.normal(size=(3, 8, 4)).astype(np.float32)
    m = np.ones((3, 8), bool)
    for x, y in zip(f(h, m), C.effective_rank_dynamics(h, m, stride=2, max_len=6)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="stride"):
        C.effective_rank_dynamics(h, m, stride=0)
    with pytest.raises(ValueError, match="max_len"):
        C.effective_rank_dynamics(h, m, max_len=1)
    with pytest.raises(ValueError, match="at must be"):
        C.capped_bonus_advantages(np.zeros((1, 2)), np.zeros(1), np.ones((1, 2), bool), at="first")
    with pytest.raises(ValueError, match="kappa"):
        C.capped_bonus_advantages(np.zeros((1, 2)), np.zeros(1), np.ones((1, 2), bool), kappa=0.0)

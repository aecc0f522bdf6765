"""Unit tests of jaxrl_llm.core.preference (values by hand, jit/vmap, bf16, gradients, errors)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_llm.core import preference as P

TOL = dict(atol=1e-6, rtol=1e-6)


def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def _logsig(x):
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _batch(seed=0, b=6):
    rng = np.random.default_rng(seed)
    c = -rng.uniform(5, 60, b).astype(np.float32)
    r = -rng.uniform(5, 60, b).astype(np.float32)
    rc = (c + rng.normal(0, 2, b)).astype(np.float32)
    rr = (r + rng.normal(0, 2, b)).astype(np.float32)
    lc = rng.integers(1, 30, b).astype(np.int32)
    lr = rng.integers(1, 30, b).astype(np.int32)
    return c, r, rc, rr, lc, lr


def _ls(loss_type):
    return {"robust": 0.1, "exo_pair": 1e-3}.get(loss_type, 0.0)


# ------------------------------------------------------------------------------ hand values


def test_dpo_sigmoid_by_hand():
    c, r = np.array([-10.0, -3.0], np.float32), np.array([-12.0, -2.0], np.float32)
    rc, rr = np.array([-11.0, -3.5], np.float32), np.array([-11.5, -1.0], np.float32)
    out = P.dpo_loss(c, r, rc, rr, beta=0.1)
    # pair 0: c - rc = 1, r - rr = -0.5, h = 0.15; pair 1: 0.5, -1.0 -> h = 0.15 as well
    for i, (cl, rl) in enumerate([(1.0, -0.5), (0.5, -1.0)]):
        h = 0.1 * (cl - rl)
        assert out.losses[i] == pytest.approx(-_logsig(h), rel=1e-6)
        assert out.chosen_rewards[i] == pytest.approx(0.1 * cl, rel=1e-6)
        assert out.rejected_rewards[i] == pytest.approx(0.1 * rl, rel=1e-6)
    assert out.metrics["reward_accuracy"] == 1.0
    assert out.metrics["reward_margin"] == pytest.approx(0.15, rel=1e-6)
    assert out.metrics["chosen_rewards"] == pytest.approx(0.075, rel=1e-6)
    assert out.metrics["chosen_logps"] == pytest.approx(-6.5, rel=1e-6)


def test_cdpo_and_robust_by_hand():
    c, r, rc, rr = (np.array([x], np.float32) for x in (-4.0, -6.0, -5.0, -5.0))
    h, eps = 0.5 * (1.0 - (-1.0)), 0.2  # beta 0.5
    cdpo = P.dpo_loss(c, r, rc, rr, beta=0.5, label_smoothing=eps).losses[0]
    assert cdpo == pytest.approx(-(1 - eps) * _logsig(h) - eps * _logsig(-h), rel=1e-6)
    rob = P.dpo_loss(c, r, rc, rr, beta=0.5, loss_type="robust", label_smoothing=eps).losses[0]
    assert rob == pytest.approx((-(1 - eps) * _logsig(h) + eps * _logsig(-h)) / (1 - 2 * eps), rel=1e-6)


def test_ipo_by_hand_with_and_without_lengths():
    c, r = np.array([-20.0, -9.0], np.float32), np.array([-30.0, -4.0], np.float32)
    rc, rr = np.array([-22.0, -10.0], np.float32), np.array([-29.0, -4.0], np.float32)
    lc, lr = np.array([4, 1]), np.array([5, 0])  # 0 is clamped to 1 (TRL: clamp(min=1))
    beta = 0.25
    out = P.dpo_loss(c, r, rc, rr, lc, lr, beta=beta, loss_type="ipo")
    expected = [(2.0 / 4 - (-1.0) / 5 - 1 / (2 * beta)) ** 2, (1.0 / 1 - 0.0 / 1 - 2.0) ** 2]
    np.testing.assert_allclose(out.losses, expected, **TOL)
    # rewards stay on the summed log-ratios (TRL 1.16)
    np.testing.assert_allclose(out.chosen_rewards, [0.5, 0.25], **TOL)
    no_len = P.dpo_loss(c, r, rc, rr, beta=beta, loss_type="ipo").losses
    np.testing.assert_allclose(no_len, [(3.0 - 2.0) ** 2, (1.0 - 2.0) ** 2], **TOL)


def test_other_dpo_types_by_hand():
    c, r, rc, rr = (np.array([x], np.float32) for x in (-7.0, -9.0, -8.0, -8.5))
    beta, cl, rl = 0.3, 1.0, -0.5
    h = beta * (cl - rl)
    expect = {
        "hinge": max(0.0, 1 - h),
        "sppo_hard": (cl - 0.5 / beta) ** 2 + (rl + 0.5 / beta) ** 2,
        "nca_pair": -_logsig(beta * cl) - 0.5 * _logsig(-beta * cl) - 0.5 * _logsig(-beta * rl),
        "bco_pair": -_logsig(beta * cl) - _logsig(-beta * rl),
        "apo_zero": 1 - _sig(beta * cl) + _sig(beta * rl),
        "apo_down": _sig(beta * cl) + 1 - _sig(beta * (cl - rl)),
        "discopop": -_logsig(h) * (1 - _sig(h / 0.05)) + math.exp(-h) * _sig(h / 0.05),
    }
    for lt, val in expect.items():
        assert P.dpo_loss(c, r, rc, rr, beta=beta, loss_type=lt).losses[0] == pytest.approx(val, rel=1e-5), lt
    eps = 0.01
    exo = _sig(h) * (_logsig(h) - math.log(1 - eps)) + _sig(-h) * (_logsig(-h) - math.log(eps))
    got = P.dpo_loss(c, r, rc, rr, beta=beta, loss_type="exo_pair", label_smoothing=eps).losses[0]
    assert got == pytest.approx(exo, rel=1e-5)


def test_simpo_by_hand():
    c, r = np.array([-12.0, -5.0], np.float32), np.array([-20.0, -2.0], np.float32)
    lc, lr = np.array([6, 5]), np.array([8, 1])
    beta, gamma = 2.0, 0.5
    out = P.simpo_loss(c, r, lc, lr, beta=beta, gamma=gamma)
    for i in range(2):
        ac, ar = c[i] / lc[i], r[i] / lr[i]
        z = beta * (ac - ar) - gamma
        assert out.losses[i] == pytest.approx(-_logsig(z), rel=1e-6)
        assert out.chosen_rewards[i] == pytest.approx(beta * ac, rel=1e-6)
    assert out.metrics["reward_accuracy"] == 1.0  # -2 > -2.5 and -1 > -2


def test_alphapo_by_hand():
    c, r = np.array([-3.0], np.float32), np.array([-6.0], np.float32)
    one = np.array([3]), np.array([2])
    alpha, beta = 0.5, 2.0
    rw = lambda a: (1 - math.exp(a) ** (-alpha)) / alpha  # noqa: E731
    z = beta * (rw(-1.0) - rw(-3.0)) - 0.5
    out = P.simpo_loss(c, r, *one, beta=beta, gamma=0.5, alpha=alpha)
    assert out.losses[0] == pytest.approx(-_logsig(z), rel=1e-5)
    assert out.chosen_rewards[0] == pytest.approx(beta * rw(-1.0), rel=1e-5)


def test_cpo_by_hand():
    c, r = np.array([-4.0], np.float32), np.array([-9.0], np.float32)
    assert P.cpo_loss(c, r, beta=0.1).losses[0] == pytest.approx(-_logsig(0.5), rel=1e-6)
    assert P.cpo_loss(c, r, beta=0.1, loss_type="hinge").losses[0] == pytest.approx(0.5, rel=1e-6)
    ipo = P.cpo_loss(c, r, np.array([2]), np.array([3]), beta=0.1, loss_type="ipo")
    assert ipo.losses[0] == pytest.approx((-2.0 + 3.0 - 5.0) ** 2, rel=1e-6)
    assert ipo.chosen_rewards[0] == pytest.approx(-0.2, rel=1e-6)


def test_orpo_by_hand():
    ac, ar = np.array([-0.2, -3.0], np.float32), np.array([-1.5, -0.01], np.float32)
    out = P.orpo_loss(ac, ar, beta=0.1)
    lo = [(a - b) - (math.log(1 - math.exp(a)) - math.log(1 - math.exp(b))) for a, b in zip(ac, ar)]
    np.testing.assert_allclose(out.losses, [-0.1 * _logsig(x) for x in lo], rtol=1e-5)
    assert out.metrics["log_odds_chosen"] == pytest.approx(np.mean(lo), rel=1e-5)
    assert out.metrics["log_odds_ratio"] == pytest.approx(np.mean([_logsig(x) for x in lo]), rel=1e-5)


def test_orpo_log1mexp_is_accurate_and_gradients_finite():
    a = np.array([-1e-6, -1e-3, -0.5, -math.log(2), -0.7, -5.0, -40.0], np.float32)
    b = np.full_like(a, -1.0)
    lo = P.orpo_loss(a, b).metrics["log_odds_chosen"]
    exact = np.mean([(float(x) + 1.0) - (math.log(-math.expm1(float(x))) - math.log(-math.expm1(-1.0)))
                     for x in a])
    assert float(lo) == pytest.approx(exact, rel=1e-5)
    g = jax.grad(lambda x: P.orpo_loss(x, b).losses.sum())(jnp.asarray(a))
    assert np.all(np.isfinite(g))


def test_kto_by_hand_and_reference_point():
    p = np.array([-10.0, -12.0, -7.0], np.float32)
    ref = np.array([-11.0, -11.0, -7.5], np.float32)
    lab = np.array([True, False, True])
    z0 = P.kto_kl_reference_point(np.array([-5.0, -6.0], np.float32), np.array([-5.5, -6.1], np.float32))
    assert float(z0) == pytest.approx(0.3, rel=1e-6)
    out = P.kto_loss(p, ref, lab, z0, beta=0.5, desirable_weight=1.0, undesirable_weight=2.0)
    exp = [1 - _sig(0.5 * (1.0 - 0.3)), 2.0 * (1 - _sig(0.5 * (0.3 + 1.0))), 1 - _sig(0.5 * (0.5 - 0.3))]
    np.testing.assert_allclose(out.losses, exp, rtol=1e-6)
    np.testing.assert_allclose(out.chosen_rewards, [0.5, 0.0, 0.25], **TOL)
    np.testing.assert_allclose(out.rejected_rewards, [0.0, -0.5, 0.0], **TOL)
    assert out.metrics["chosen_rewards"] == pytest.approx(0.375, rel=1e-6)
    assert out.metrics["reward_margin"] == pytest.approx(0.875, rel=1e-6)
    assert out.metrics["kl"] == pytest.approx(0.3, rel=1e-6)
    neg = P.kto_kl_reference_point(np.array([-5.0], np.float32), np.array([-4.0], np.float32))
    assert float(neg) == 0.0


def test_kto_reference_point_pmean_over_named_axis():
    pk = np.array([[-1.0, -2.0], [-3.0, -3.0]], np.float32)
    rk = np.array([[-2.0, -2.0], [-3.0, -4.0]], np.float32)  # device means 0.5 and 0.5 -> 0.5
    f = jax.vmap(lambda a, b: P.kto_kl_reference_point(a, b, axis_name="d"), axis_name="d")
    np.testing.assert_allclose(f(pk, rk), [0.5, 0.5], **TOL)


def test_kto_paired_equals_unpaired_on_concatenation():
    c, r, rc, rr, _, _ = _batch(3)
    z0 = jnp.float32(0.7)
    paired = P.kto_paired_loss(c, r, rc, rr, z0, beta=0.2, desirable_weight=1.0, undesirable_weight=1.5)
    un = P.kto_loss(np.concatenate([c, r]), np.concatenate([rc, rr]),
                    np.concatenate([np.ones_like(c, bool), np.zeros_like(r, bool)]), z0,
                    beta=0.2, desirable_weight=1.0, undesirable_weight=1.5)
    assert float(paired.losses.mean()) == pytest.approx(float(un.losses.mean()), rel=1e-6)
    # in-batch (former TRL kto_pair) reference points: z_c from the rejected half and vice versa
    inb = P.kto_paired_loss(c, r, rc, rr, beta=0.2)
    cl, rl = c - rc, r - rr
    z_c, z_r = max(0.0, float(np.mean(rl))), max(0.0, float(np.mean(cl)))
    exp = 0.5 * (1 / (1 + np.exp(0.2 * (cl - z_c))) + 1 / (1 + np.exp(0.2 * (z_r - rl))))
    np.testing.assert_allclose(inb.losses, exp, rtol=1e-5)
    assert float(inb.metrics["kl_chosen"]) == pytest.approx(z_c, abs=1e-6)


# ------------------------------------------------------------------------------ transforms


def _all_calls():
    c, r, rc, rr, lc, lr = _batch(1)
    lab = np.arange(len(c)) % 3 != 0
    calls = {f"dpo-{lt}": (lambda lt: lambda c, r, rc, rr: P.dpo_loss(
        c, r, rc, rr, lc, lr, loss_type=lt, label_smoothing=_ls(lt)))(lt) for lt in P.DPO_LOSS_TYPES}
    calls["simpo"] = lambda c, r, rc, rr: P.simpo_loss(c, r, lc, lr)
    for lt in P.CPO_LOSS_TYPES:
        calls[f"cpo-{lt}"] = (lambda lt: lambda c, r, rc, rr: P.cpo_loss(c, r, loss_type=lt))(lt)
    calls["orpo"] = lambda c, r, rc, rr: P.orpo_loss(c, r)  # valid (< 0) if extreme averages
    calls["kto"] = lambda c, r, rc, rr: P.kto_loss(c, rc, lab, P.kto_kl_reference_point(r, rr))
    calls["kto_paired"] = lambda c, r, rc, rr: P.kto_paired_loss(c, r, rc, rr)
    return calls, (c, r, rc, rr)


def test_jit_equals_eager_and_vmap_equals_per_batch():
    calls, args = _all_calls()

    def all_fns(*a):
        return {name: fn(*a) for name, fn in calls.items()}

    jit_all = jax.jit(all_fns)  # one compilation for every function keeps the test fast
    jitted = jit_all(*args)
    for name, fn in calls.items():
        eager = fn(*args)
        for x, y in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted[name])):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7, err_msg=name)
    stacked = [np.stack([a, a[::-1] - 1.0, a * 0.5]) for a in args]
    vm = jax.jit(jax.vmap(all_fns))(*stacked)
    for k in range(3):
        single = jit_all(*(s[k] for s in stacked))
        for name in calls:
            for x, y in zip(jax.tree.leaves(vm[name]), jax.tree.leaves(single[name])):
                np.testing.assert_allclose(x[k], y, rtol=1e-5, atol=1e-6, err_msg=f"{name} vmap[{k}]")


def test_bf16_inputs_are_promoted():
    calls, args = _all_calls()
    bf = [jnp.asarray(a, jnp.bfloat16) for a in args]
    rounded = [b.astype(jnp.float32) for b in bf]
    for name, fn in calls.items():
        out = fn(*bf)
        ref = fn(*rounded)
        full = fn(*args)
        assert out.losses.dtype == jnp.float32, name
        assert np.all(np.isfinite(out.losses)), name
        np.testing.assert_allclose(out.losses, ref.losses, rtol=1e-6, atol=1e-6, err_msg=name)
        # bf16 rounding of the inputs (|x| < 60, 8 bits) moves the losses a little only
        scale = 1.0 + np.abs(full.losses)
        assert np.all(np.abs(out.losses - full.losses) <= 0.3 * scale), name


# ------------------------------------------------------------------------------ gradients


def test_dpo_sigmoid_gradient_is_analytic():
    c, r, rc, rr, _, _ = _batch(2)
    beta = 0.2
    gc, gr, grc = jax.grad(lambda a, b, d: P.dpo_loss(a, b, d, rr, beta=beta).losses.sum(),
                           argnums=(0, 1, 2))(c, r, rc)
    h = beta * ((c - rc) - (r - rr))
    s = 1 / (1 + np.exp(h))  # sigmoid(-h)
    np.testing.assert_allclose(gc, -beta * s, rtol=1e-5)
    np.testing.assert_allclose(gr, beta * s, rtol=1e-5)
    np.testing.assert_allclose(grc, beta * s, rtol=1e-5)  # refs are not stop-gradiented


def test_ipo_and_simpo_gradients_are_analytic():
    c, r, rc, rr, lc, lr = _batch(4)
    beta = 0.5
    g = jax.grad(lambda a: P.dpo_loss(a, r, rc, rr, lc, lr, beta=beta, loss_type="ipo").losses.sum())(c)
    d = (c - rc) / lc - (r - rr) / lr
    np.testing.assert_allclose(g, 2 * (d - 1 / (2 * beta)) / lc, rtol=1e-4)
    g = jax.grad(lambda a: P.simpo_loss(a, r, lc, lr, beta=2.0, gamma=0.5).losses.sum())(c)
    z = 2.0 * (c / lc - r / lr) - 0.5
    np.testing.assert_allclose(g, -2.0 / lc / (1 + np.exp(z)), rtol=1e-4)


def test_no_gradient_through_rewards_metrics_and_kto_reference_point():
    c, r, rc, rr, _, _ = _batch(5)

    def aux(a):
        o = P.dpo_loss(a, r, rc, rr)
        return o.chosen_rewards.sum() + sum(o.metrics.values())

    np.testing.assert_array_equal(jax.grad(aux)(c), 0.0)
    lab = np.ones(len(c), bool)
    gz = jax.grad(lambda z: P.kto_loss(c, rc, lab, z).losses.sum())(jnp.float32(0.3))
    assert float(gz) == 0.0
    gk = jax.grad(lambda k: P.kto_kl_reference_point(k, rr))(r)
    np.testing.assert_array_equal(gk, 0.0)


# ------------------------------------------------------------------------------ errors


def test_shape_and_dtype_errors_name_the_argument():
    c, r, rc, rr, lc, lr = _batch(0)
    with pytest.raises(ValueError, match="rejected_logps"):
        P.dpo_loss(c, r[:-1], rc, rr)
    with pytest.raises(ValueError, match="chosen_logps"):
        P.dpo_loss(c[:, None], r, rc, rr)
    with pytest.raises(ValueError, match="ref_rejected_logps"):
        P.dpo_loss(c, r, rc, rr[None])
    with pytest.raises(TypeError, match="chosen_logps"):
        P.dpo_loss(c.astype(np.int32), r, rc, rr)
    with pytest.raises(ValueError, match="rejected_lengths"):
        P.dpo_loss(c, r, rc, rr, lc, lr[:-1], loss_type="ipo")
    with pytest.raises(ValueError, match="rejected_lengths"):
        P.dpo_loss(c, r, rc, rr, lc, None, loss_type="ipo")
    with pytest.raises(ValueError, match="chosen_lengths"):
        P.simpo_loss(c, r, None, None)
    with pytest.raises(ValueError, match="loss_type"):
        P.dpo_loss(c, r, rc, rr, loss_type="kto_pair")
    with pytest.raises(ValueError, match="loss_type"):
        P.cpo_loss(c, r, loss_type="simpo")
    with pytest.raises(ValueError, match="beta"):
        P.dpo_loss(c, r, rc, rr, beta=0.0)
    with pytest.raises(ValueError, match="label_smoothing"):
        P.dpo_loss(c, r, rc, rr, loss_type="exo_pair")  # EXO needs eps > 0 (TRL raises too)
    with pytest.raises(ValueError, match="label_smoothing"):
        P.dpo_loss(c, r, rc, rr, loss_type="robust", label_smoothing=0.5)
    with pytest.raises(ValueError, match="label_smoothing"):
        P.dpo_loss(c, r, rc, rr, loss_type="hinge", label_smoothing=0.1)
    with pytest.raises(ValueError, match="label_smoothing"):
        P.cpo_loss(c, r, loss_type="ipo", label_smoothing=0.1)
    with pytest.raises(ValueError, match="kl_ref_point"):
        P.kto_loss(c, rc, np.ones(len(c), bool), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="is_desirable"):
        P.kto_loss(c, rc, np.ones(len(c) + 1, bool), 0.0)
    with pytest.raises(ValueError, match="ref_logps"):
        P.kto_loss(c, rc[:2], np.ones(len(c), bool), 0.0)
    with pytest.raises(ValueError, match="undesirable_weight"):
        P.kto_loss(c, rc, np.ones(len(c), bool), 0.0, undesirable_weight=-1.0)


# ------------------------------------------------------------------------------ properties

_f = st.floats(-200.0, 0.0, allow_nan=False, width=32)
_pairs = st.lists(st.tuples(_f, _f, _f, _f), min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(_pairs, st.floats(0.01, 1.0), st.floats(0.0, 5.0))
def test_dpo_sigmoid_decreases_with_chosen_margin(rows, beta, bump):
    c, r, rc, rr = (np.array(x, np.float32) for x in zip(*rows))
    base = P.dpo_loss(c, r, rc, rr, beta=beta).losses
    more = P.dpo_loss(c + np.float32(bump), r, rc, rr, beta=beta).losses
    assert np.all(np.asarray(more) <= np.asarray(base) + 1e-6)
    assert np.all(np.isfinite(base))


@settings(max_examples=40, deadline=None)
@given(_pairs, st.floats(0.01, 1.0))
def test_zero_smoothing_variants_equal_sigmoid(rows, beta):
    c, r, rc, rr = (np.array(x, np.float32) for x in zip(*rows))
    sig = P.dpo_loss(c, r, rc, rr, beta=beta).losses
    rob = P.dpo_loss(c, r, rc, rr, beta=beta, loss_type="robust", label_smoothing=0.0).losses
    np.testing.assert_allclose(rob, sig, rtol=1e-6, atol=1e-7)
    # CPO sigmoid is DPO sigmoid with zero reference log-probs
    zeros = np.zeros_like(c)
    np.testing.assert_allclose(P.cpo_loss(c, r, beta=beta).losses,
                               P.dpo_loss(c, r, zeros, zeros, beta=beta).losses, rtol=1e-6, atol=1e-7)
    # SimPO with unit lengths and gamma 0 is CPO sigmoid
    one = np.ones(len(c), np.int32)
    np.testing.assert_allclose(P.simpo_loss(c, r, one, one, beta=beta, gamma=0.0).losses,
                               P.cpo_loss(c, r, beta=beta).losses, rtol=1e-6, atol=1e-7)


def test_tgdpo_hand_values_gradients_and_dpo_limit():
    import jax

    import jaxrl_llm.core as C

    # beta 0.1, alpha 0.5; chosen u = [.2, -.1, .3] with token rewards v = [1, -2, .5]; rejected u = [-.2, .1], v = [-1, 3]
    uw, vw = np.array([[.2, -.1, .3]], np.float32), np.array([[1, -2, .5]], np.float32)
    ul, vl = np.array([[-.2, .1]], np.float32), np.array([[-1, 3]], np.float32)
    zw, zl = np.zeros_like(uw), np.zeros_like(ul)
    out = C.tgdpo_loss(uw, ul, zw, zl, vw, vl, np.ones_like(uw), np.ones_like(ul))
    cw, cl = 0.1 * (1 + 0.05 * vw), 0.1 * (1 - 0.05 * vl)       # [.105, .09, .1025], [.105, .085]
    h = np.sum(cw * uw) - np.sum(cl * ul)                         # 0.05525
    np.testing.assert_allclose(out.losses, [np.log1p(np.exp(-h))], rtol=1e-5)
    np.testing.assert_allclose(out.losses, [0.665904], rtol=1e-5)
    g = jax.grad(lambda a: C.tgdpo_loss(a, ul, zw, zl, vw, vl, np.ones_like(uw), np.ones_like(ul)).losses[0])(uw)
    np.testing.assert_allclose(g, -(1 - 1 / (1 + np.exp(-h))) * cw, rtol=1e-5)
    # alpha = 0: DPO on summed log-ratios
    dpo = C.sigmoid_dpo_loss(uw.sum(1), ul.sum(1), zw.sum(1), zl.sum(1), beta=0.1)
    np.testing.assert_allclose(C.tgdpo_loss(uw, ul, zw, zl, vw, vl, np.ones_like(uw), np.ones_like(ul),
                                            alpha=0.0).losses, dpo.losses, rtol=1e-6)


def test_c3po_scopes_hand_values_and_dpo_identity():
    pc = np.array([-3.0, -4.0, -6.0, -2.0], np.float32)
    pr = np.array([-5.0, -1.0, -9.0, -7.0], np.float32)
    rc = np.array([-3.5, -3.0, -5.0, -2.0], np.float32)
    rr = np.array([-4.0, -2.0, -9.0, -6.0], np.float32)
    n = np.array([2.0, 4.0, 3.0, 1.0], np.float32)
    every_in = P.c3po_loss(pc, pr, rc, rr, n, np.zeros(4, np.int32), beta=0.2)
    dpo = P.sigmoid_dpo_loss(pc, pr, rc, rr, beta=0.2)
    np.testing.assert_allclose(every_in.losses, dpo.losses, rtol=1e-6)
    out = P.c3po_loss(pc, pr, rc, rr, n, np.array([0, 1, 2, 1], np.int32), beta=0.2, near_coef=0.5, out_coef=2.0)
    h = 0.2 * ((-3.0 + 3.5) - (-5.0 + 4.0))
    want = [math.log1p(math.exp(-h)), 0.5 * 4.0 / 4.0, 2.0 * 6.0 / 3.0, 0.5 * 2.0 / 1.0]
    np.testing.assert_allclose(out.losses, want, rtol=1e-6)
    np.testing.assert_allclose(out.metrics["c3po_near_nll"], (1.0 + 2.0) / 2, rtol=1e-6)
    np.testing.assert_allclose(out.metrics["c3po_out_nll"], 2.0, rtol=1e-6)
    # gradients: an out-of-scope pair pulls only the chosen (original) response's likelihood up
    g = jax.grad(lambda c, r: jnp.sum(P.c3po_loss(c, r, rc, rr, n, np.array([2, 2, 2, 2], np.int32)).losses),
                 argnums=(0, 1))(jnp.asarray(pc), jnp.asarray(pr))
    np.testing.assert_allclose(g[0], -1.0 / n, rtol=1e-6)
    assert np.all(np.asarray(g[1]) == 0)
    with pytest.raises(ValueError, match="near_coef"):
        P.c3po_loss(pc, pr, rc, rr, n, np.zeros(4, np.int32), near_coef=-1.0)


def test_rationale_dpo_hand_values_and_identity():
    import math

    import jaxrl_llm.core as C

    c, r, rc, rr = np.array([-2.0]), np.array([-3.0]), np.array([-2.5]), np.array([-2.5])
    why = np.array([-10.0])
    out = C.rationale_dpo_loss(c, r, rc, rr, why, beta=0.5, gamma=0.2)
    # DPO: -log sigmoid(0.5 x ((-2 + 2.5) - (-3 + 2.5))) = -log sigmoid(0.5); rationale: -log sigmoid(-2)
    want = math.log1p(math.exp(-0.5)) + math.log1p(math.exp(2.0))
    np.testing.assert_allclose(np.asarray(out.losses), [want], rtol=1e-6)
    np.testing.assert_allclose(float(out.metrics["rationale_loss"]), math.log1p(math.exp(2.0)), rtol=1e-6)
    zero = C.rationale_dpo_loss(c, r, rc, rr, why, beta=0.5, gamma=0.0)
    dpo = C.sigmoid_dpo_loss(c, r, rc, rr, beta=0.5)
    np.testing.assert_allclose(np.asarray(zero.losses), np.asarray(dpo.losses) + math.log(2.0), rtol=1e-6)

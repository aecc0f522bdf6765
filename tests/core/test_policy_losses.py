"""Test battery for the policy losses (jit, masks, gradients, vmap, bf16) and the GPPO / GSPO identities."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxrl_llm.core import aggregation as G
from jaxrl_llm.core import policy_losses as P

B, T = 6, 7

LOSSES = {
    "ppo": lambda lp, o, a, m: P.ppo_clip_loss(lp, o, a, m, clip_low=0.2, clip_high=0.28),
    "ppo_nodual": lambda lp, o, a, m: P.ppo_clip_loss(lp, o, a, m, dual_clip=None),
    "gppo": lambda lp, o, a, m: P.gppo_loss(lp, o, a, m),
    "gspo_token": lambda lp, o, a, m: P.gspo_loss(lp, o, a, m, clip_low=0.05, clip_high=0.05),
    "gspo_seq": lambda lp, o, a, m: P.gspo_loss(lp, o, a, m, clip_low=0.05, clip_high=0.05, variant="sequence"),
    "cispo": lambda lp, o, a, m: P.cispo_loss(lp, o, a, m),
    "sapo": lambda lp, o, a, m: P.sapo_loss(lp, o, a, m),
    "gpg": lambda lp, o, a, m: P.gpg_loss(lp, o, a, m),
    "reinforce": lambda lp, o, a, m: P.reinforce_loss(lp, a, m, old_logp=o),
    "clip_cov": lambda lp, o, a, m: P.clip_cov_loss(lp, o, a, m, key=jax.random.key(1), clip_cov_ratio=0.1,
                                                     clip_cov_lb=0.0, clip_cov_ub=10.0),
    "kl_cov": lambda lp, o, a, m: P.kl_cov_loss(lp, o, a, m, kl_cov_ratio=0.1),
    "gmpo": lambda lp, o, a, m: P.gmpo_loss(lp, o, a, m),
    "dro": lambda lp, o, a, m: P.dro_loss(lp, o, a, m, beta=0.5),
    "dppo_tv": lambda lp, o, a, m: P.dppo_tv_loss(lp, o, a, m),
    "dppo_kl": lambda lp, o, a, m: P.dppo_kl_loss(lp, o, a, m),
}
# losses whose value at logp == old_logp has the plain policy gradient -A grad(logp)
ON_POLICY_PG = ["ppo", "ppo_nodual", "gppo", "gspo_token", "gspo_seq", "cispo", "sapo", "gpg", "reinforce",
                "dro", "dppo_tv", "dppo_kl", "gmpo"]


def _inputs(seed=0, seq_adv=False):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, B)
    m = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    lp = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(np.float32)
    old = np.clip(lp + rng.normal(0, 0.3, (B, T)), -10, -1e-3).astype(np.float32)
    adv = rng.normal(size=(B, 1 if seq_adv else T)).astype(np.float32)
    adv = np.broadcast_to(adv, (B, T)).copy()
    return lp, old, adv, m


def _scalar(name, mode="token-mean"):
    def f(lp, o, a, m):
        loss, _ = LOSSES[name](lp, o, a, m)
        return G.aggregate(loss, m, mode)
    return f


@pytest.mark.parametrize("name", LOSSES)
def test_jit_equals_eager(name):
    lp, o, a, m = _inputs(seq_adv=name == "gmpo")
    f = _scalar(name)
    v1, g1 = jax.value_and_grad(f)(lp, o, a, m)
    v2, g2 = jax.jit(jax.value_and_grad(f))(lp, o, a, m)
    np.testing.assert_allclose(float(v1), float(v2), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), rtol=1e-5, atol=1e-7)
    loss, met = LOSSES[name](lp, o, a, m)
    assert loss.shape == (B, T) and np.all(np.asarray(loss)[m == 0] == 0)
    assert all(np.ndim(v) == 0 and np.isfinite(float(v)) for v in met.values())


@pytest.mark.parametrize("name", LOSSES)
def test_every_loss_reports_the_common_metrics(name):
    lp, o, a, m = _inputs(7, seq_adv=name == "gmpo")
    _, met = LOSSES[name](lp, o, a, m)
    missing = set(P.COMMON_METRICS) - set(met)
    assert not missing, f"{name} lacks {missing}"


@pytest.mark.parametrize("name", LOSSES)
def test_all_masked_row_is_finite_with_zero_gradient(name):
    lp, o, a, m = _inputs(1, seq_adv=name == "gmpo")
    m[2] = 0.0
    lp[2] = -30.0  # garbage under the mask must not leak
    for mode in G.AGG_MODES:
        v, g = jax.value_and_grad(_scalar(name, mode))(lp, o, a, m)
        assert np.isfinite(float(v))
        assert np.all(np.asarray(g)[2] == 0)
        assert np.all(np.isfinite(np.asarray(g)))
    m[:] = 0.0
    v, g = jax.value_and_grad(_scalar(name))(lp, o, a, m)
    assert float(v) == 0.0 and np.all(np.asarray(g) == 0)


@pytest.mark.parametrize("name", LOSSES)
def test_masked_row_equals_filtered(name):
    lp, o, a, m = _inputs(2, seq_adv=name == "gmpo")
    ref_v, ref_g = jax.value_and_grad(_scalar(name))(lp, o, a, m)
    pad = lambda x, val: np.concatenate([x, np.full((1, T), val, np.float32)])
    v, g = jax.value_and_grad(_scalar(name))(pad(lp, -1.0), pad(o, -2.0), pad(a, 5.0), pad(m, 0.0))
    np.testing.assert_allclose(float(v), float(ref_v), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(g)[:B], np.asarray(ref_g), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", LOSSES)
def test_vmap_and_bf16(name):
    x1, x2 = _inputs(3, seq_adv=name == "gmpo"), _inputs(4, seq_adv=name == "gmpo")
    f = _scalar(name)
    stacked = jax.vmap(f)(*[jnp.stack([u, w]) for u, w in zip(x1, x2)])
    np.testing.assert_allclose(float(stacked[1]), float(f(*x2)), rtol=1e-5, atol=1e-6)
    bf = [jnp.asarray(x, jnp.bfloat16) for x in x2]
    v = f(*bf)
    assert v.dtype == jnp.float32 and np.isfinite(float(v))
    np.testing.assert_allclose(float(v), float(f(*x2)), atol=0.1)


@pytest.mark.parametrize("name", ON_POLICY_PG)
def test_on_policy_gradient_is_the_policy_gradient(name):
    """At logp == old_logp every surrogate's gradient is -A grad(logp) (token-mean)."""
    lp, _, a, m = _inputs(5, seq_adv=name in ("gmpo", "gspo_seq", "gspo_token"))
    f = _scalar(name, "seq-mean-token-mean" if name in ("gmpo", "gspo_seq", "gspo_token") else "token-mean")
    g = np.asarray(jax.grad(f)(lp, lp, a, m))
    if name in ("gmpo", "gspo_seq", "gspo_token"):
        n = m.sum(1, keepdims=True)
        exp = -a * m / n / (m.sum(1) > 0).sum()
    else:
        exp = -a * m / m.sum()
    np.testing.assert_allclose(g, exp, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ["token-sum", "token-mean"])
def test_dro_on_policy_is_reinforce_and_off_policy_adds_beta_log_ratio(mode):
    """verl's ``dro``: d/dlogp of -(A logp - beta/2 (logp - old)^2) is -A + beta (logp - old) per token,
    so at logp == old_logp the update is REINFORCE's."""
    lp, o, a, m = _inputs(6)
    beta = 0.7
    den = 1.0 if mode == "token-sum" else m.sum()
    dro = lambda lp_, o_: G.aggregate(P.dro_loss(lp_, o_, a, m, beta=beta)[0], m, mode)
    rf = lambda lp_: G.aggregate(P.reinforce_loss(lp_, a, m)[0], m, mode)
    g_on = np.asarray(jax.grad(dro)(lp, lp))
    np.testing.assert_allclose(g_on, -a * m / den, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(g_on, np.asarray(jax.grad(rf)(lp)), rtol=1e-6, atol=1e-7)
    g_off = np.asarray(jax.grad(dro)(lp, o))
    np.testing.assert_allclose(g_off, (-a + beta * (lp - o)) * m / den, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_off - np.asarray(jax.grad(rf)(lp)), beta * (lp - o) * m / den, rtol=1e-5,
                               atol=1e-6)


def test_ppo_hand_computed_with_dual_clip():
    lp = np.log(np.array([[0.5, 0.5, 0.5, 0.5]], np.float32))
    old = np.log(np.array([[0.25, 0.9, 0.05, 0.5]], np.float32))  # ratios 2, 0.556, 10, 1
    a = np.array([[1.0, -1.0, -1.0, 2.0]], np.float32)
    loss, met = P.ppo_clip_loss(lp, old, a, np.ones((1, 4)), clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    r = np.array([2.0, 0.5 / 0.9, 10.0, 1.0])
    exp = [
        max(-1 * r[0], -1 * 1.28),  # A>0, clipped at 1.28 -> -1.28
        max(1 * r[1], 1 * 0.8),  # A<0, ratio < 0.8 -> 0.8
        min(max(1 * r[2], 1 * 1.28), 3.0),  # A<0, ratio 10 -> dual clip 3
        -2.0,
    ]
    np.testing.assert_allclose(np.asarray(loss)[0], exp, rtol=1e-5)
    np.testing.assert_allclose(float(met["clip_frac"]), 0.5, rtol=1e-6)  # tokens 0 and 1 (pl2 > pl1)
    np.testing.assert_allclose(float(met["clip_frac_lower"]), 0.25, rtol=1e-6)


def test_gppo_forward_equals_clip_higher_ppo_and_keeps_clipped_gradients():
    lp, o, a, m = _inputs(6)
    o = (lp - np.random.default_rng(0).normal(0, 0.6, lp.shape)).astype(np.float32)
    ppo = lambda x: P.ppo_clip_loss(x, o, a, m, clip_low=0.2, clip_high=0.28, dual_clip=3.0)[0]
    gppo = lambda x: P.gppo_loss(x, o, a, m, clip_low=0.2, clip_high=0.28, dual_clip=3.0)[0]
    np.testing.assert_allclose(np.asarray(gppo(lp)), np.asarray(ppo(lp)), rtol=1e-6, atol=1e-7)
    r = np.exp(lp - o)
    hi = (a > 0) & (r > 1.28) & (m > 0)
    lo = (a < 0) & (r < 0.8) & (m > 0)
    assert hi.any() and lo.any()
    g_ppo = np.asarray(jax.grad(lambda x: jnp.sum(ppo(x)))(lp))
    g_gppo = np.asarray(jax.grad(lambda x: jnp.sum(gppo(x)))(lp))
    assert np.all(g_ppo[hi | lo] == 0)
    np.testing.assert_allclose(g_gppo[hi], -a[hi] * 1.28, rtol=1e-5)
    np.testing.assert_allclose(g_gppo[lo], -a[lo] * 0.8, rtol=1e-5)
    rest = (m > 0) & ~hi & ~lo
    np.testing.assert_allclose(g_gppo[rest], g_ppo[rest], rtol=1e-5, atol=1e-7)


def test_gspo_token_equals_sequence_for_sequence_advantages():
    lp, o, a, m = _inputs(7, seq_adv=True)
    f = lambda v: lambda x: G.aggregate(P.gspo_loss(x, o, a, m, clip_low=0.1, clip_high=0.1, variant=v)[0],
                                        m, "seq-mean-token-mean")
    v1, g1 = jax.value_and_grad(f("token"))(lp)
    v2, g2 = jax.value_and_grad(f("sequence"))(lp)
    np.testing.assert_allclose(float(v1), float(v2), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), rtol=1e-4, atol=1e-7)


def test_clip_cov_drops_exactly_k_random_candidates():
    rng = np.random.default_rng(0)
    lp = np.log(rng.uniform(0.05, 0.95, (16, 32))).astype(np.float32)
    a = rng.normal(size=(16, 32)).astype(np.float32)
    m = np.ones((16, 32), np.float32)
    k = int(0.05 * m.sum())
    drops = []
    for seed in (0, 1):
        _, met = P.clip_cov_loss(lp, lp, a, m, key=jax.random.key(seed), clip_cov_ratio=0.05,
                                 clip_cov_lb=-1e9, clip_cov_ub=1e9)
        drops.append(float(met["clip_frac"]) * m.sum())
        loss, _ = P.clip_cov_loss(lp, lp, a, m, key=jax.random.key(seed), clip_cov_ratio=0.05,
                                  clip_cov_lb=-1e9, clip_cov_ub=1e9)
        assert int((np.asarray(loss) == 0).sum()) >= k
    np.testing.assert_allclose(drops, [k, k])
    l0 = P.clip_cov_loss(lp, lp, a, m, key=jax.random.key(0), clip_cov_ratio=0.05, clip_cov_lb=-1e9,
                         clip_cov_ub=1e9)[0]
    l1 = P.clip_cov_loss(lp, lp, a, m, key=jax.random.key(1), clip_cov_ratio=0.05, clip_cov_lb=-1e9,
                         clip_cov_ub=1e9)[0]
    assert not np.array_equal(np.asarray(l0) == 0, np.asarray(l1) == 0)  # different random tokens


def test_kl_cov_penalises_top_covariance_tokens():
    lp, o, a, m = _inputs(8)
    loss, met = P.kl_cov_loss(lp, o, a, m, kl_cov_ratio=0.2, ppo_kl_coef=1.0)
    base = -a * np.exp(lp - o)
    diff = (np.asarray(loss) - base * m) * m
    k = max(1, int(np.floor(m.sum() * 0.2)))
    sel = np.abs(diff) > 1e-4
    assert int(sel.sum()) == k
    np.testing.assert_allclose(diff[sel], np.abs(lp - o)[sel], rtol=1e-4)


def test_rollout_is_weights_truncate_and_icepop():
    lp = np.log(np.array([[0.5, 0.5, 0.5]], np.float32))
    roll = np.log(np.array([[0.1, 0.45, 0.9]], np.float32))  # ratios 5, 1.11, 0.556
    m = np.ones((1, 3), np.float32)
    w, _ = P.rollout_is_weights(lp, roll, m, upper=2.0)
    np.testing.assert_allclose(np.asarray(w)[0], [2.0, 0.5 / 0.45, 0.5 / 0.9], rtol=1e-5)
    w, _ = P.rollout_is_weights(lp, roll, m, upper=2.0, lower=0.6)
    np.testing.assert_allclose(np.asarray(w)[0], [0.0, 0.5 / 0.45, 0.0], rtol=1e-5)
    w, _ = P.rollout_is_weights(lp, roll, m, level="sequence", upper=10.0)
    np.testing.assert_allclose(np.asarray(w)[0], [5 * (0.5 / 0.45) * (0.5 / 0.9)] * 3, rtol=1e-5)


@given(st.floats(-3, 3), st.floats(-3, 3), st.floats(0.01, 0.5), st.floats(0.01, 0.5))
def test_property_ppo_loss_is_pessimistic(log_ratio, adv, eps_low, eps_high):
    """The clipped surrogate is never below the unclipped one (it is a lower bound of the
    objective), and with the dual clip never above -c A for A < 0."""
    lp = np.array([[-1.0]], np.float32)
    old = (lp - np.float32(log_ratio)).astype(np.float32)
    a = np.array([[adv]], np.float32)
    loss, _ = P.ppo_clip_loss(lp, old, a, np.ones((1, 1)), clip_low=eps_low, clip_high=eps_high, dual_clip=None)
    r = float(np.exp(lp - old)[0, 0])
    assert float(loss[0, 0]) >= -adv * r - 1e-4 * (1 + abs(adv * r))


def test_errors_name_the_argument():
    lp, o, a, m = _inputs()
    with pytest.raises(ValueError, match="'old_logp'"):
        P.ppo_clip_loss(lp, o[:, :3], a, m)
    with pytest.raises(ValueError, match="'dual_clip'"):
        P.ppo_clip_loss(lp, o, a, m, dual_clip=0.5)
    with pytest.raises(ValueError, match="'clip_low'"):
        P.ppo_clip_loss(lp, o, a, m, clip_low=-0.1)
    with pytest.raises(ValueError, match="'variant'"):
        P.gspo_loss(lp, o, a, m, variant="x")
    with pytest.raises(TypeError, match="'logp'"):
        P.ppo_clip_loss(lp.astype(np.int32), o, a, m)
    with pytest.raises(ValueError, match="'lower'"):
        P.rollout_is_weights(lp, o, m, upper=1.0, lower=2.0)
    with pytest.raises(ValueError, match="'mode'"):
        P.rollout_rejection_mask(lp, o, m, mode="nope", upper=1.0)


# losses whose per-token value depends only on its own sequence (no batch statistics)
SEQUENCE_LOCAL = [n for n in LOSSES if n not in ("clip_cov", "kl_cov")]


@pytest.mark.parametrize("name", SEQUENCE_LOCAL)
@pytest.mark.parametrize("mode", G.AGG_MODES)
def test_four_micro_batches_give_the_whole_batch_update(name, mode):
    """Exact normalisation: summing (sum, weight) pairs of 4 micro-batches and dividing once
    reproduces the whole-batch loss and gradient (Clip-Cov / KL-Cov use per-call batch
    statistics, like verl, and are excluded)."""
    rng = np.random.default_rng(11)
    b = 8
    lengths = rng.integers(0, T + 1, b)
    m = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    lp = np.log(rng.uniform(0.05, 0.95, (b, T))).astype(np.float32)
    o = np.clip(lp + rng.normal(0, 0.3, (b, T)), -10, -1e-3).astype(np.float32)
    a = np.repeat(rng.normal(size=(b, 1)), T, 1).astype(np.float32)

    def whole(x):
        return G.aggregate(LOSSES[name](x, o, a, m)[0], m, mode)

    def micro(x):
        tot_s, tot_w = 0.0, 0.0
        for i in range(4):
            sl = slice(2 * i, 2 * i + 2)
            s, w = G.aggregate_sum_weight(LOSSES[name](x[sl], o[sl], a[sl], m[sl])[0], m[sl], mode)
            tot_s, tot_w = tot_s + s, tot_w + w
        return G.finalize(tot_s, tot_w)

    v1, g1 = jax.value_and_grad(whole)(lp)
    v2, g2 = jax.value_and_grad(micro)(lp)
    np.testing.assert_allclose(float(v2), float(v1), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(g2), np.asarray(g1), rtol=1e-6, atol=1e-8)


def test_gppo_general_form_scales_the_clipped_gradient_and_keeps_the_value():
    """GPPO's general form: beta1 scales the gradient of low-side clipped tokens (ratio < 1 - eps_low,
    A < 0), beta2 of high-side ones; the loss value is that of beta1 = beta2 = 1 (clip-higher PPO's)."""
    import jax

    lp0 = jnp.log(jnp.array([[0.5, 0.5, 0.5, 0.5]]))
    lp = lp0 + jnp.log(jnp.array([[0.5, 1.6, 1.0, 0.5]]))  # ratios 0.5 (low), 1.6 (high), 1.0, 0.5
    adv = jnp.array([[-1.0, 1.0, 1.0, 1.0]])  # the last: ratio 0.5 with A > 0 is not clipped
    m = jnp.ones((1, 4))

    def f(x, **kw):
        return jnp.sum(P.gppo_loss(x, lp0, adv, m, dual_clip=None, **kw)[0])

    g1, g2 = jax.grad(f)(lp), jax.grad(lambda x: f(x, beta1=0.25, beta2=0.5))(lp)
    np.testing.assert_allclose(f(lp), f(lp, beta1=0.25, beta2=0.5), rtol=1e-6)
    # d/dlogp of -A * (1 -+ eps) * beta: low side A = -1 -> +0.8 beta1; high side A = 1 -> -1.28 beta2
    np.testing.assert_allclose(np.asarray(g1)[0, :2], [0.8, -1.28], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g2)[0, :2], [0.8 * 0.25, -1.28 * 0.5], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g2)[0, 2:], np.asarray(g1)[0, 2:], rtol=1e-6)  # unclipped: unchanged
    with pytest.raises(ValueError, match="'dual_clip' must be > 1, or None for no dual clip"):
        P.gppo_loss(lp, lp0, adv, m, dual_clip=1.0)


def test_papo_hand_values_gradient_and_ppo_identity():
    import math

    lp = np.log(np.array([[0.5, 0.4, 0.9]], np.float32))
    old = lp.copy()  # on-policy: the PPO term is -A
    adv = np.array([[1.0, 1.0, 1.0]], np.float32)
    m = np.array([[1, 1, 0]], np.float32)
    mlp = np.log(np.array([[0.25, 0.4, 0.1]], np.float32))
    per, met = P.papo_loss(lp, old, adv, m, masked_logp=mlp, gamma=0.1, eta_ori=0.05, eta_aug=0.02)
    d0 = math.log(0.25 / 0.5)
    kl0 = math.exp(d0) - d0 - 1.0  # 0.5 + log 2 - 1
    want0 = -1.0 - 0.1 * kl0 + 0.05 * -math.log(0.5) + 0.02 * -math.log(0.25)
    want1 = -1.0 - 0.0 + 0.05 * -math.log(0.4) + 0.02 * -math.log(0.4)
    np.testing.assert_allclose(np.asarray(per), [[want0, want1, 0.0]], rtol=1e-5)
    np.testing.assert_allclose(float(met["papo_kl"]), kl0 / 2, rtol=1e-5)
    # gradient of the KL term w.r.t. logp: -gamma d/dlp (e^(mlp - lp) - (mlp - lp) - 1) = -gamma (1 - e^delta)
    g = jax.grad(lambda x: jnp.sum(P.papo_loss(x, old, adv * 0, m, masked_logp=mlp, gamma=0.1)[0]))(jnp.asarray(lp))
    np.testing.assert_allclose(np.asarray(g)[0, :2], [-0.1 * (1 - 0.5), 0.0], atol=1e-6)
    # gamma = eta = 0: PPO's clip, value and gradient
    rng = np.random.default_rng(0)
    lp2 = np.log(rng.uniform(0.2, 0.9, (3, 4))).astype(np.float32)
    old2 = np.log(rng.uniform(0.2, 0.9, (3, 4))).astype(np.float32)
    a2 = rng.normal(size=(3, 4)).astype(np.float32)
    m2 = np.ones((3, 4), np.float32)
    f = lambda x: jnp.sum(P.papo_loss(x, old2, a2, m2, masked_logp=old2 - 1.0, gamma=0.0)[0])
    g2 = lambda x: jnp.sum(P.ppo_clip_loss(x, old2, a2, m2)[0])
    np.testing.assert_allclose(f(jnp.asarray(lp2)), g2(jnp.asarray(lp2)), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(f)(jnp.asarray(lp2)), jax.grad(g2)(jnp.asarray(lp2)), rtol=1e-6)
    with pytest.raises(ValueError, match="mask_prob"):
        P.papo_loss(lp, old, adv, m, masked_logp=mlp, mask_prob=0.0)


def test_epo_hand_values_gradient_and_ppo_identity():
    lp = np.log(np.array([[0.5, 0.5, 0.5]], np.float32))
    adv = np.zeros((1, 3), np.float32)
    m = np.array([[1, 1, 1]], np.float32)
    ent = np.array([[0.5, 1.0, 2.0]], np.float32)
    ref = np.array([[1.0, 1.0, 1.0]], np.float32)
    per, met = P.epo_loss(lp, lp, adv, m, entropy=ent, epo_entropy_ref=ref, epo_phase_weight=np.ones(1, np.float32),
                          entropy_coef=0.01, smooth_coef=1.0, penalty=0.1, band_low=0.8, band_high=1.2)
    # band [0.8, 1.2]: 0.5 is 0.3 below, 1.0 inside, 2.0 is 0.8 above (relative to h = 1)
    np.testing.assert_allclose(np.asarray(per), [[-0.005 + 0.1 * 0.3, -0.01, -0.02 + 0.1 * 0.8]], rtol=1e-5)
    np.testing.assert_allclose(float(met["epo_out_of_band"]), 2 / 3, rtol=1e-6)
    # the smoothing gradient pulls the entropy back into the band: d/dH = -0.01 - 0.1 below, -0.01 + 0.1 above
    g = jax.grad(lambda h: jnp.sum(P.epo_loss(lp, lp, adv, m, entropy=h, epo_entropy_ref=ref,
                                              epo_phase_weight=np.ones(1, np.float32), entropy_coef=0.01)[0]))(
        jnp.asarray(ent))
    np.testing.assert_allclose(np.asarray(g), [[-0.11, -0.01, 0.09]], rtol=1e-5)
    # no history yet (h = 0): no smoothing; the phase weight scales it
    none = P.epo_loss(lp, lp, adv, m, entropy=ent, epo_entropy_ref=np.zeros((1, 3), np.float32),
                      epo_phase_weight=np.ones(1, np.float32), entropy_coef=0.0)[0]
    np.testing.assert_allclose(np.asarray(none), 0.0, atol=1e-7)
    half = P.epo_loss(lp, lp, adv, m, entropy=ent, epo_entropy_ref=ref, epo_phase_weight=np.full(1, 0.5, np.float32),
                      entropy_coef=0.0)[0]
    np.testing.assert_allclose(np.asarray(half), [[0.015, 0.0, 0.04]], rtol=1e-5)
    # coefficients 0: PPO's clip
    rng = np.random.default_rng(2)
    lp2 = np.log(rng.uniform(0.2, 0.9, (3, 4))).astype(np.float32)
    old2 = np.log(rng.uniform(0.2, 0.9, (3, 4))).astype(np.float32)
    a2 = rng.normal(size=(3, 4)).astype(np.float32)
    m2 = np.ones((3, 4), np.float32)
    e2 = rng.uniform(0.1, 2, (3, 4)).astype(np.float32)
    np.testing.assert_allclose(P.epo_loss(lp2, old2, a2, m2, entropy=e2, epo_entropy_ref=e2 * 3,
                                          epo_phase_weight=np.ones(3, np.float32), entropy_coef=0.0,
                                          smooth_coef=0.0)[0], P.ppo_clip_loss(lp2, old2, a2, m2)[0], rtol=1e-6)
    # the phase weight: the authors' schedule (150 epochs)
    assert P.epo_phase_weight(0, 150) == 1.0
    assert P.epo_phase_weight(75, 150) == pytest.approx(1 - 0.2 * (1 - np.exp(-2)))
    assert P.epo_phase_weight(150, 150) == pytest.approx(0.8 * np.exp(-3))
    with pytest.raises(ValueError, match="band_high"):
        P.epo_loss(lp, lp, adv, m, entropy=ent, epo_entropy_ref=ref, epo_phase_weight=np.ones(1, np.float32),
                   band_low=1.5, band_high=1.0)


def test_nash_md_hand_values():
    lp = np.log(np.array([[0.5, 0.25]], np.float32))
    ref = np.log(np.array([[0.25, 0.25]], np.float32))
    m = np.ones((1, 2), np.float32)
    adv = np.full((1, 2), 0.2, np.float32)  # P = 0.7
    per, met = P.nash_md_loss(lp, lp, adv, m, ref_logp=ref, beta=0.1)
    l0, l1 = np.log(0.5), np.log(0.25)
    np.testing.assert_allclose(np.asarray(per), [[-0.2 * l0 + 0.1 * np.log(2) * l0, -0.2 * l1]], rtol=1e-6)
    np.testing.assert_allclose(float(met["nash_kl"]), np.log(2), rtol=1e-6)
    # the gradient: -A + beta sg(log ratio) per token
    g = jax.grad(lambda x: jnp.sum(P.nash_md_loss(x, x, adv, m, ref_logp=ref, beta=0.1)[0]))(jnp.asarray(lp))
    np.testing.assert_allclose(np.asarray(g), [[-0.2 + 0.1 * np.log(2), -0.2]], rtol=1e-6)
    np.testing.assert_allclose(P.nash_md_preference(np.array([1.0, 0.0], np.float32), np.zeros(2, np.float32),
                                                    temperature=2.0), [1 / (1 + np.exp(-0.5)), 0.5], rtol=1e-6)


def test_aligndistil_teacher_hand_values():
    zd = np.array([[2.0, 0.0, 0.0]], np.float32)
    zr = np.array([[0.0, 0.0, 0.0]], np.float32)
    pd = np.exp(zd) / np.exp(zd).sum()
    tv = np.abs(pd - 1 / 3).sum()
    w = 15.0 * tv + 1e-3
    zs = zd + w * (zd - zr)
    want = zs - np.log(np.exp(zs).sum())
    lt, ww = P.aligndistil_teacher(zd, zr, np.array([1]), beta2=15.0)
    np.testing.assert_allclose(np.asarray(ww), [w], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(lt), [want[0, 1]], rtol=1e-5)
    # equal models: w = eps, the teacher is the DPO model
    lt2, w2 = P.aligndistil_teacher(zd, zd, np.array([0]))
    np.testing.assert_allclose(np.asarray(lt2), [np.log(pd[0, 0])], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(w2), [1e-3], rtol=1e-6)


def test_aligndistil_loss_is_the_score_function_form_of_the_reverse_kl():
    """Summing the per-token loss's gradient over every token, weighted by the policy's
    probability, gives the gradient of (beta / w) KL(pi || pi*) with respect to the logits."""
    rng = np.random.default_rng(3)
    z = jnp.asarray(rng.normal(size=5).astype(np.float32))
    t = jax.nn.log_softmax(jnp.asarray(rng.normal(size=5).astype(np.float32)))
    w, beta = 2.5, 0.1

    def expected(zz):
        lp = jax.nn.log_softmax(zz)
        per, _ = P.aligndistil_loss(lp[:, None], jax.lax.stop_gradient(lp)[:, None], jnp.zeros((5, 1)), jnp.ones((5, 1)),
                                    teacher_logp=t[:, None], teacher_weight=jnp.full((5, 1), w), beta=beta)
        return jnp.sum(jax.lax.stop_gradient(jnp.exp(lp)) * per[:, 0])

    def kl(zz):
        lp = jax.nn.log_softmax(zz)
        return beta / w * jnp.sum(jnp.exp(lp) * (lp - t))

    np.testing.assert_allclose(jax.grad(expected)(z), jax.grad(kl)(z), rtol=1e-5, atol=1e-7)


def test_entropy_balanced_hand_values_gradient_and_identity():
    """AEPO (agentic): the advantage scaled by 1 + 0.2 z(entropy); the clip above 1 + eps keeps
    the gradient (1 + eps) A; both parts off is PPO's clip."""
    lp = np.zeros((1, 3), np.float32)
    m = np.ones((1, 3), np.float32)
    a = np.ones((1, 3), np.float32)
    ent = np.array([[1.0, 2.0, 3.0]], np.float32)  # mean 2, std (n - 1) 1: z = -1, 0, 1
    per, met = P.entropy_balanced_loss(lp, lp, a, m, entropy=ent)
    np.testing.assert_allclose(np.asarray(per), [[-0.8, -1.0, -1.2]], rtol=1e-6)
    np.testing.assert_allclose(float(met["aepo_entropy_z_abs"]), 2 / 3, rtol=1e-6)
    # the clip: ratio e^0.5 > 1.2 with A > 0: value (1.2) A as PPO, gradient -(1.2) A instead of 0
    lp2, old2 = np.array([[0.5, 0.0, -0.5]], np.float32), np.zeros((1, 3), np.float32)
    a2 = np.array([[1.0, 1.0, -1.0]], np.float32)
    flat = np.ones((1, 3), np.float32)  # equal entropies: z = 0
    f = lambda x, bc: jnp.sum(P.entropy_balanced_loss(x, old2, a2, m, entropy=flat, balanced_clip=bc)[0])  # noqa: E731
    np.testing.assert_allclose(float(f(lp2, True)), float(f(lp2, False)), rtol=1e-6)
    np.testing.assert_allclose(float(f(lp2, True)), -1.2 - 1.0 + 0.8, rtol=1e-5)  # clipped high, inside, clipped low
    g_on, g_off = np.asarray(jax.grad(f)(lp2, True)), np.asarray(jax.grad(f)(lp2, False))
    np.testing.assert_allclose(g_on[0, 0], -1.2, rtol=1e-5)
    assert g_off[0, 0] == 0.0
    np.testing.assert_allclose(g_on[0, 1:], g_off[0, 1:], rtol=1e-6)  # inside the range / below it: as PPO
    # identity: both parts off is PPO's clip with its dual clip
    lp3, o3, a3, m3 = _inputs(3)
    e3 = np.abs(np.random.default_rng(3).normal(size=lp3.shape)).astype(np.float32)
    got = P.entropy_balanced_loss(lp3, o3, a3, m3, entropy=e3, balanced_clip=False, balanced_advantage=False)[0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(P.ppo_clip_loss(lp3, o3, a3, m3)[0]), rtol=1e-6, atol=1e-7)


def test_critique_grpo_loss_hand_values_gradient_and_identity():
    lp = np.log(np.array([[0.5, 0.25], [0.5, 0.9]], np.float32))
    old = np.log(np.array([[0.25, 0.25], [0.1, 0.1]], np.float32))
    a = np.array([[1.0, 1.0], [2.0, 2.0]], np.float32)
    m = np.ones((2, 2), np.float32)
    hinted = np.array([0.0, 1.0], np.float32)
    per, met = P.critique_grpo_loss(lp, old, a, m, hinted)
    # own row: -A rho, unclipped (rho 2 and 1); refinement row: -A p / (p + 0.1), no ratio
    np.testing.assert_allclose(np.asarray(per), [[-2.0, -1.0], [-2 * 0.5 / 0.6, -2 * 0.9 / 1.0]], rtol=1e-6)
    np.testing.assert_allclose(float(met["critique_refined_prob"]), 0.7, rtol=1e-6)
    # the refinement's gradient in logp: -A gamma p / (p + gamma)^2
    g = np.asarray(jax.grad(lambda x: jnp.sum(P.critique_grpo_loss(x, old, a, m, hinted)[0]))(lp))
    np.testing.assert_allclose(g[1], [-2 * 0.1 * 0.5 / 0.36, -2 * 0.1 * 0.9 / 1.0], rtol=1e-5)
    # with clip: the own row is PPO's clip (rho 2 -> 1.2); no refinement rows and clip is PPO without a dual clip
    per_c, _ = P.critique_grpo_loss(lp, old, a, m, hinted, clip=True)
    np.testing.assert_allclose(np.asarray(per_c)[0], [-1.2, -1.0], rtol=1e-6)
    lp3, o3, a3, m3 = _inputs(4)
    got = P.critique_grpo_loss(lp3, o3, a3, m3, np.zeros(B, np.float32), clip=True)[0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(P.ppo_clip_loss(lp3, o3, a3, m3, dual_clip=None)[0]),
                               rtol=1e-6, atol=1e-7)


def test_rover_hand_values_bellman_target_and_identity():
    # one row, 3 response tokens (the 4th position is padding)
    lp = np.array([[-1.0, -2.0, -0.5, -3.0]], np.float32)
    old = np.array([[-1.2, -1.5, -0.5, -3.0]], np.float32)
    adv = np.array([[0.5, 0.5, 0.5, 0.0]], np.float32)
    m = np.array([[1, 1, 1, 0]], bool)
    cur = np.array([[-4.0, -3.0, -5.0, -9.0]], np.float32)
    prev = np.array([[-4.5, -3.5, -4.0, -1.0]], np.float32)
    per, met = P.rover_loss(lp, old, adv, m, mean_logp=cur, old_mean_logp=prev, rho=2.0)
    # Q = 2 (lp - old) = 0.4, -1.0, 0; next value V_{t+1} = 2 (cur - prev)[t+1] m[t+1] = 1.0, -2.0, 0
    # target = 0.5 + (1.0, -2.0, 0) = 1.5, -1.5, 0.5; loss = (Q - target)^2
    want = np.array([[(0.4 - 1.5) ** 2, (-1.0 + 1.5) ** 2, (0.0 - 0.5) ** 2, 0.0]])
    np.testing.assert_allclose(per, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(met["rover_target"], (1.5 - 1.5 + 0.5) / 3, rtol=1e-5)
    # gradient: d/d lp_t of (Q - target)^2 = 2 (Q - target) rho; the target carries none
    g = jax.grad(lambda x: jnp.sum(P.rover_loss(x, old, adv, m, mean_logp=cur, old_mean_logp=prev, rho=2.0)[0]))(lp)
    np.testing.assert_allclose(g, 2 * 2.0 * np.array([[0.4 - 1.5, -1.0 + 1.5, -0.5, 0.0]]), rtol=1e-5, atol=1e-6)
    # identity: no next value -> the squared error of rho x the log-ratio against the advantage
    per0, _ = P.rover_loss(lp, old, adv, m, mean_logp=cur, old_mean_logp=prev, next_scale=0.0)
    np.testing.assert_allclose(per0, np.where(m, ((lp - old) - adv) ** 2, 0.0), rtol=1e-5, atol=1e-6)


def test_rover_clip_replaces_q_beyond_the_bound_towards_the_target():
    lp = np.log(np.array([[1.5, 0.5, 1.5, 1.1]], np.float32))  # ratios against old = 1
    old = np.zeros((1, 4), np.float32)
    m = np.ones((1, 4), bool)
    adv = np.array([[2.0, -2.0, -2.0, 2.0]], np.float32)
    z = np.zeros((1, 4), np.float32)
    per, met = P.rover_loss(lp, old, adv, m, mean_logp=z, old_mean_logp=z, clip_ratio=0.2)
    q = np.log(np.array([1.2, 0.8, 1.5, 1.1]))  # token 0: above 1.2 with a higher target; 1: below 0.8, lower
    np.testing.assert_allclose(per, [(q - adv[0]) ** 2], rtol=1e-5)
    assert float(met["clip_frac"]) == pytest.approx(0.5)
    # a clipped token gets no gradient
    g = jax.grad(lambda x: jnp.sum(P.rover_loss(x, old, adv, m, mean_logp=z, old_mean_logp=z, clip_ratio=0.2)[0]))(lp)
    assert float(g[0, 0]) == 0.0 and float(g[0, 1]) == 0.0 and float(g[0, 2]) != 0.0
    with pytest.raises(ValueError, match="rho"):
        P.rover_loss(lp, old, adv, m, mean_logp=z, old_mean_logp=z, rho=0.0)
    with pytest.raises(ValueError, match="clip_ratio"):
        P.rover_loss(lp, old, adv, m, mean_logp=z, old_mean_logp=z, clip_ratio=1.5)


def test_critique_grpo_dual_clip_caps_a_negative_advantage_on_own_rows_only():
    lp = np.log(np.array([[5.0, 0.5], [5.0, 0.5]], np.float32))  # ratios 5 and 0.5 against old = 1
    old = np.zeros((2, 2), np.float32)
    adv = np.full((2, 2), -1.0, np.float32)
    m = np.ones((2, 2), bool)
    hinted = np.array([0.0, 1.0], np.float32)
    per, _ = P.critique_grpo_loss(lp, old, adv, m, hinted, clip=True, dual_clip=3.0)
    # own row: max(-A r, -A clip(r)) = 5 and 0.8, then min with -A c = 3 -> 3 and 0.8
    np.testing.assert_allclose(per[0], [3.0, 0.8], rtol=1e-6)
    # the guided row: -A p / (p + 0.1) with p = exp(logp), no clip of any kind
    p = np.array([5.0, 0.5])
    np.testing.assert_allclose(per[1], p / (p + 0.1), rtol=1e-6)
    with pytest.raises(ValueError, match="dual_clip"):
        P.critique_grpo_loss(lp, old, adv, m, hinted, clip=False, dual_clip=3.0)

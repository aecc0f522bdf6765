"""Batch-coupled and paper surrogates (jaxrl_llm.core.batch_losses): hand values (the worked
examples of the methods' sources, recomputed here), the papers' identities and limits, gradients
that the methods promise, masked garbage ignored. (jit, vmap, bf16, all-masked: test_battery.py;
micro-batch exactness of the coupled step: tests/training/test_coupled_step.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.core as C


def close(a, b, tol=2e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, rtol=tol)


def ragged(rows, width, fill=0.0):
    x = np.full((len(rows), width), fill, np.float32)
    m = np.zeros((len(rows), width), np.float32)
    for i, r in enumerate(rows):
        x[i, :len(r)] = r
        m[i, :len(r)] = 1
    return x, m


# ------------------------------------------------------------------------------------------------- BAPO
# one group, GRPO advantages [1.5, -.5, -.5, -.5], token ratios below (old_logp = 0)
RATIOS = [[1.6, 1.3], [0.5, 1.0, 1.1, 0.7, 1.3], [0.95, 1.0, 0.55], [0.6, 0.85, 1.0, 1.2]]
ADV_ROW = [1.5, -0.5, -0.5, -0.5]


def bapo_batch():
    r, m = ragged(RATIOS, 5, 1.0)
    adv = np.array(ADV_ROW, np.float32)[:, None] * m
    return np.log(r) * m, np.zeros_like(m), adv, m


def test_bapo_search_paper_and_code_settings():
    lp, old, adv, m = bapo_batch()
    # at (0.6, 1.2): P = 2 x 1.2 x 1.5 = 3.6, N = 0.5 (4.7 + 2.55 + 3.65) = 5.45 -> share 0.3978 < 0.4;
    # upper bound first: c_high 1.25 -> P = 3.75, share 3.75 / 9.2 = 0.4076 >= 0.4
    lo, hi, share = C.bapo_bounds(lp, old, adv, m)
    close([lo, hi, share], [0.6, 1.25, 3.75 / 9.2])
    loss, met = C.bapo_loss(lp, old, adv, m)
    per = np.array([-1.875, -1.875, .3, .5, .55, .35, .65, .475, .5, .3, .3, .425, .5, .6])
    close(loss, per.mean())
    assert float(met["bapo_c_high"]) == pytest.approx(1.25)
    # the released YAML: lower bound first, ratio target 1; c_low to 0.8 lowers P/N, c_high to 2.0: never met
    code = dict(target=1.0, target_kind="ratio", order="low_first", low_max=0.8, low_step=0.05, high_max=2.0,
                high_step=0.05)
    close(C.bapo_bounds(lp, old, adv, m, **code)[:2], [0.8, 2.0])
    close(C.bapo_loss(lp, old, adv, m, **code)[0], 0.10357142857)
    # counting only gradient-carrying tokens: both positive tokens clipped at 1.2, the upper bound climbs to 1.65
    close(C.bapo_bounds(lp, old, adv, m, count="grad")[:2], [0.6, 1.65])


def test_bapo_without_room_is_ppo_and_monotone_share():
    lp, old, adv, m = bapo_batch()
    fixed = dict(low_start=0.7, low_max=0.7, high_start=1.3, high_max=1.3)
    loss, _ = C.bapo_loss(lp, old, adv, m, dual_clip=3.0, **fixed)
    per, _ = C.ppo_clip_loss(lp, old, adv, m, clip_low=0.3, clip_high=0.3, dual_clip=3.0)
    close(loss, C.aggregate(per, m, "token-mean"))
    # on-policy (ratio 1) the bounds do not matter: the loss is -token-mean(A)
    close(C.bapo_loss(np.zeros_like(lp), old, adv, m)[0], -np.sum(adv) / np.sum(m))
    with pytest.raises(ValueError, match="low_max < 1 < high_start"):
        C.bapo_bounds(lp, old, adv, m, low_max=1.1)


# ------------------------------------------------------------------------------------------------- DisCO / DRPO
DL = [[-.2, -.5, -.1], [-1, -.3, -.6, -.2, -.4], [-.9, -.7], [-.3, -.1, -.4, -.2]]
DD = [[.02, -.01, 0], [.03, 0, .01, -.02, 0], [.05, .01], [0, .01, .02, -.01]]  # old_logp - logp
SC = np.array([1, 0, 0, 1], np.float32)
G0 = np.zeros(4, np.int32)


def disco_batch():
    lp, m = ragged(DL, 5)
    d, _ = ragged(DD, 5)
    return lp, lp + d, np.zeros_like(m), m


def test_disco_hand_values():
    lp, old, adv, m = disco_batch()
    s = np.array([-0.8 / 3, -0.5, -0.8, -0.25])
    neg = 10 * np.log(np.mean(np.exp(s[[1, 2]] / 10)))
    j = s[[0, 3]].mean() - neg                                    # 0.390542
    kappa = 0.11 / 14
    loss, met = C.disco_loss(lp, old, adv, m, scores=SC, group_ids=G0)
    close(loss, -j + 0.5 * 1e3 * (kappa - 1e-4) ** 2)            # -0.360455
    close(met["disco_objective"], j)
    close(met["disco_kl"], kappa)
    close(C.disco_loss(lp, old, adv, m, scores=SC, group_ids=G0, objective="disco_b", beta=0.0)[0],
          -(s[[0, 3]].mean() - s[[1, 2]].mean()))                # -0.391667
    ratio_s = np.array([np.mean(np.exp(-np.array(d))) for d in DD])
    j_r = ratio_s[[0, 3]].mean() - np.log(np.mean(np.exp(ratio_s[[1, 2]])))
    close(C.disco_loss(lp, old, adv, m, scores=SC, group_ids=G0, score="Lratio", beta=0.0)[0], -j_r)  # -0.012441


def test_disco_gradient_weights_and_limits():
    lp, old, adv, m = disco_batch()
    g = jax.grad(lambda x: C.disco_loss(x, old, adv, m, scores=SC, group_ids=G0, beta=0.0)[0])(jnp.asarray(lp))
    g = np.asarray(g)
    # positives: -1/2 per row spread over its tokens; negatives: softmax weights (s_j / tau) spread likewise
    s = np.array([-0.8 / 3, -0.5, -0.8, -0.25])
    w = np.exp(s[[1, 2]] / 10) / np.exp(s[[1, 2]] / 10).sum()
    close(g[0, :3], -0.5 / 3)
    close(g[3, :4], -0.5 / 4)
    close([g[1, 0] * 5, g[2, 0] * 2], w)                          # [0.507499, 0.492501]
    assert np.all(g[m == 0] == 0)
    # tau -> infinity: DisCO-b
    close(C.disco_loss(lp, old, adv, m, scores=SC, group_ids=G0, tau=100.0, beta=0.0)[0],
          C.disco_loss(lp, old, adv, m, scores=SC, group_ids=G0, objective="disco_b", beta=0.0)[0], 1e-3)
    # all-right / all-wrong groups count in Q but contribute nothing; scores other than 0/1 are ignored
    lp2 = np.concatenate([lp, lp])
    both = C.disco_loss(lp2, np.concatenate([old, old]), np.zeros_like(lp2), np.concatenate([m, m]),
                        scores=np.concatenate([SC, np.zeros(4, np.float32)]),
                        group_ids=np.repeat([0, 1], 4).astype(np.int32), beta=0.0)[0]
    close(both, C.disco_loss(lp, old, adv, m, scores=SC, group_ids=G0, beta=0.0)[0] / 2)
    with pytest.raises(ValueError, match="importance weights"):
        C.disco_loss(lp, old, adv, m, scores=SC, group_ids=G0, is_weights=np.ones_like(m))


def test_drpo_hand_values_and_properties():
    s_rows, lens = [-.5, -1., -.8, -.3], [3, 5, 2, 4]
    lp = np.zeros((4, 8), np.float32)
    m = np.zeros((4, 8), np.float32)
    for i, (v, n) in enumerate(zip(s_rows, lens)):
        lp[i, :n], m[i, :n] = v, 1
    loss, met = C.drpo_loss(lp, lp, np.zeros_like(m), m, scores=SC, group_ids=G0)
    w = np.exp((1 - np.array([3, 4]) / 8) / 0.1)
    neg = 10 * np.log(np.mean(np.exp(np.array([-1.0, -0.8]) / 10)))
    want = np.sum(w / w.sum() * (np.array([-0.5, -0.3]) - neg))   # 0.44404
    close(loss, -want)
    # every correct row is pushed up, the shorter one more; lam -> inf is DisCO-logL
    g = np.asarray(jax.grad(lambda x: C.drpo_loss(x, lp, np.zeros_like(m), m, scores=SC, group_ids=G0)[0])(
        jnp.asarray(lp)))
    assert g[0, 0] < 0 and g[3, 0] < 0 and abs(g[0, :3].sum()) > abs(g[3, :4].sum())
    close(C.drpo_loss(lp, lp, np.zeros_like(m), m, scores=SC, group_ids=G0, lam=1e9)[0],
          C.disco_loss(lp, lp, np.zeros_like(m), m, scores=SC, group_ids=G0)[0], 1e-5)
    # a tiny lam (exp(1 / lam) overflows float32): all the weight on the shortest correct answer, finite
    tiny = C.drpo_loss(lp, lp, np.zeros_like(m), m, scores=SC, group_ids=G0, lam=0.001)[0]
    close(tiny, -(-0.5 - neg))
    # the response width is the batch's: columns from the first response position (after a prompt of 2)
    pad = np.concatenate([np.zeros((4, 2), np.float32), m], 1)
    close(C.drpo_loss(np.concatenate([np.zeros((4, 2), np.float32), lp], 1),
                      np.concatenate([np.zeros((4, 2), np.float32), lp], 1), np.zeros_like(pad), pad, scores=SC,
                      group_ids=G0)[0], loss)


# ------------------------------------------------------------------------------------------------- Thinkless


def test_thinkless_hand_values():
    a_row = [1.125, 0.625, -0.875, -0.875]                          # Dr.GRPO of r = [1, .5, -1, -1]
    _, m = ragged([[0] * n for n in (3, 5, 2, 4)], 5)
    adv = np.array(a_row, np.float32)[:, None] * m
    f = lambda lp: C.thinkless_loss(lp, jnp.zeros_like(lp), adv, m)[0]  # noqa: E731
    close(f(jnp.zeros((4, 5))), -(1.125 * 2 + 0.625 * 4 - 0.875 * 1 - 0.875 * 3) / 10)
    g = np.asarray(jax.grad(f)(jnp.zeros((4, 5))))
    close(g[:, 0], -1e-3 * np.array(a_row) / 4)                    # control tokens: alpha x mean over rows
    close(g[1, 1:5], -0.625 / 10)                                   # response tokens: token mean over 10
    # alpha = 1 and one token per row: a plain mean over rows
    m1 = np.zeros((4, 5), np.float32)
    m1[:, 0] = 1
    close(C.thinkless_loss(np.zeros((4, 5)), np.zeros((4, 5)), adv * m1, m1, alpha=1.0)[0], -np.mean(a_row))


# ------------------------------------------------------------------------------------------------- P3O


def test_p3o_hand_values_and_identities():
    lp = np.array([[0.3, 0.0], [-0.1, 0.0]], np.float32)
    m, old, r, g = np.ones((2, 2), np.float32), np.zeros((2, 2), np.float32), np.array([1., 0.]), np.array([0, 0])
    close(C.p3o_loss(lp, old, np.zeros_like(m), m, scores=r, group_ids=g)[0], -0.6 + 0.5 * np.exp(-0.1))
    close(C.p3o_loss(lp, old, np.zeros_like(m), m, scores=r, group_ids=g, variant="joint")[0], -0.6)
    # shift invariance, and at theta_old both variants give the pairwise policy gradient -Delta/2 (grad l_1 - grad l_2)
    for v in ("separate", "joint"):
        close(C.p3o_loss(lp, old, np.zeros_like(m), m, scores=r + 3.0, group_ids=g, variant=v)[0],
              C.p3o_loss(lp, old, np.zeros_like(m), m, scores=r, group_ids=g, variant=v)[0])
        gr = np.asarray(jax.grad(lambda x: C.p3o_loss(x, old, np.zeros_like(m), m, scores=r, group_ids=g,
                                                       variant=v)[0])(jnp.zeros((2, 2))))
        close(gr, [[-0.5, -0.5], [0.5, 0.5]])
    # three samples: the mean over the three pairs
    lp3, m3 = np.zeros((3, 2), np.float32), np.ones((3, 2), np.float32)
    r3 = np.array([1., 0., 0.5])
    g3 = np.asarray(jax.grad(lambda x: C.p3o_loss(x, lp3, lp3, m3, scores=r3, group_ids=np.zeros(3, np.int32))[0])(
        jnp.asarray(lp3)))
    want = -np.array([0.5 + 0.25, -0.5 - 0.25, -0.25 + 0.25]) / 3   # sum of +-Delta/2 over each row's pairs / 3
    close(g3[:, 0], want)


# ------------------------------------------------------------------------------------------------- HAPO, MDPO
H = np.array([[.01, .05, .1, .2, .5, 1.0, 2.0, .02, .3, 1.5]], np.float32)


def test_hapo_entropy_hat_hand_values():
    hat = np.asarray(C.hapo_entropy_hat(H, np.ones_like(H)))
    close(hat, [[-1, -.6506, -.4997, -.3493, -.1506, 0, 1, -.8494, -.2608, .5850]], 2e-3)
    close(C.hapo_entropy_hat(H, np.ones_like(H), sign="code"), np.abs(hat), 1e-6)  # the released sign


def test_hapo_loss_hand_values():
    rho = np.array([[1, 1.2, .85, 1.05, .95, 1, 1.2, .85, 1.05, .95]], np.float32)
    m = np.ones_like(rho)
    hat = np.asarray(C.hapo_entropy_hat(H, m))[0]
    eps_lo = np.where(hat <= 0, 0.2 * (1 - hat), 0.2)
    eps_hi = np.where(hat > 0, 0.2 * (1 + hat), 0.2)
    inside = (rho[0] > 1 - eps_lo / 2) & (rho[0] < 1 + eps_hi / 2)
    a_e = 1 + hat
    a = np.where(hat > 0, np.where(inside, 1, a_e), np.where(inside, a_e, 1))
    close(a[6], 2.0)                                              # token 7: high entropy, outside the band
    per = np.maximum(-a * rho[0], -a * np.clip(rho[0], 1 - eps_lo, 1 + eps_hi))
    loss, _ = C.hapo_loss(np.log(rho), np.zeros_like(rho), m, m, old_entropy=H)
    close(loss, per.mean(), 1e-5)
    close(per[6], -2.4)


def test_mdpo_hand_values_and_kl_gradient_zero_on_policy():
    lp = np.array([[0.1, -0.2, 0.0]], np.float32)
    per, met = C.mdpo_loss(lp, np.zeros_like(lp), np.array([[1., -1., .5]]), np.ones_like(lp), t=0.5)
    r = np.exp(lp[0])
    close(per[0], -np.array([1., -1., .5]) * r + (r * lp[0] - r + 1) / 0.5)
    close(np.mean(per), -0.246901)
    g = jax.grad(lambda x: jnp.sum(C.mdpo_loss(x, jnp.zeros((1, 3)), jnp.zeros((1, 3)), jnp.ones((1, 3)))[0]))(
        jnp.zeros((1, 3)))
    assert np.all(np.asarray(g) == 0)


# ------------------------------------------------------------------------------------------------- shared


CASES = {
    "bapo": lambda lp, old, a, m: C.bapo_loss(lp, old, a, m)[0],
    "disco": lambda lp, old, a, m: C.disco_loss(lp, old, a, m, scores=SC, group_ids=G0)[0],
    "drpo": lambda lp, old, a, m: C.drpo_loss(lp, old, a, m, scores=SC, group_ids=G0)[0],
    "thinkless": lambda lp, old, a, m: C.thinkless_loss(lp, old, a, m)[0],
    "p3o": lambda lp, old, a, m: C.p3o_loss(lp, old, a, m, scores=SC, group_ids=G0, variant="joint")[0],
    "hapo": lambda lp, old, a, m: C.hapo_loss(lp, old, a, m, old_entropy=jnp.abs(jnp.nan_to_num(old)) + 0.1)[0],
    "mdpo": lambda lp, old, a, m: jnp.sum(C.mdpo_loss(lp, old, a, m)[0]),
    "etr": lambda lp, old, a, m: C.etr_loss(lp, old, a, m, scores=SC, group_ids=G0, alpha=0.3, beta=1.0)[0],
    "vppo": lambda lp, old, a, m: C.vppo_loss(lp, old, a, m, masked_logp=jnp.nan_to_num(old) - 0.5)[0],
    "r2vpo": lambda lp, old, a, m: C.r2vpo_loss(lp, old, a, m, r2vpo_lambda=np.full(4, 2.0, np.float32),
                                                delta=0.01)[0],
}


@pytest.mark.parametrize("name", list(CASES))
def test_garbage_outside_the_mask_changes_nothing_and_gets_no_gradient(name):
    lp, old, _, m = disco_batch()
    adv = np.array([1.0, -0.5, 0.3, 0.8], np.float32)[:, None] * m
    f = CASES[name]
    bad = np.where(m > 0, lp, np.nan).astype(np.float32)
    bad_old = np.where(m > 0, old, 1e9).astype(np.float32)
    close(f(bad, bad_old, np.where(m > 0, adv, np.inf), m), f(lp, old, adv, m))
    g = np.asarray(jax.grad(lambda x: f(x, bad_old, np.where(m > 0, adv, np.inf), m))(jnp.asarray(bad)))
    assert np.all(np.isfinite(g)) and np.all(g[m == 0] == 0) and np.any(g != 0)


# ------------------------------------------------------------------------------------------------- HDPO


def test_hdpo_channels_and_loss_hand_values():
    g = np.zeros(4, np.int32)
    a_acc, a_tool = C.hdpo_advantages(np.array([1, 1, 1, 0.]), np.ones(4), np.array([0, 2, 1, 3.]), g, 1)
    close(a_acc, [0.5, 0.5, 0.5, -1.5], 1e-5)                   # GRPO of 0.9 ans + 0.1 fmt = [1, 1, 1, .1]
    r_tool = np.array([1, 1 / 3, 1 / 2])                         # 1 / (T + 1) on the correct rows only
    close(a_tool, np.append((r_tool - r_tool.mean()) / (r_tool.std(ddof=1) + 1e-6), 0.0), 1e-5)
    _, m = ragged([[0] * n for n in (3, 5, 2, 4)], 5)
    loss, met = C.hdpo_loss(np.zeros((4, 5)), np.zeros((4, 5)), np.asarray(a_acc)[:, None] * m, m,
                            tool_advantages=a_tool)
    acc = -(0.5 * 3 + 0.5 * 5 + 0.5 * 2 - 1.5 * 4) / 14
    tool = -np.sum(np.asarray(a_tool)[:3] * [3, 5, 2]) / 10      # the tool term over its own rows' tokens
    close(loss, acc + 0.15 * tool)
    close(loss, 0.09064, 1e-4)
    close(met["hdpo_tool_rows"], 3)
    # one correct row: no tool signal; w_tool = 0: the accuracy term alone
    _, t1 = C.hdpo_advantages(np.array([1, 0, 0, 0.]), np.ones(4), np.array([2, 0, 0, 0.]), g, 1)
    close(t1, np.zeros(4))
    close(C.hdpo_loss(np.zeros((4, 5)), np.zeros((4, 5)), np.asarray(a_acc)[:, None] * m, m, tool_advantages=a_tool,
                      w_tool=0.0)[0], acc)


# ------------------------------------------------------------------------------------------------- ETR
# two groups of two rows: group 0 pass rate 1/2 (4p(1-p) = 1), group 1 pass rate 1 (0); old_logp = 0
ETR_RATIOS = [[1.5, 0.7], [0.6, 1.1, 1.35], [1.3], [0.8, 1.45]]


def etr_batch():
    r, m = ragged(ETR_RATIOS, 3, 1.0)
    adv = np.array([1.0, -1.0, 2.0, 0.5], np.float32)[:, None] * m
    return np.log(r) * m, np.zeros_like(m), adv, m, np.array([1, 0, 1, 1], np.float32), np.array([0, 0, 1, 1],
                                                                                                    np.int32)


def test_etr_hand_values():
    lp, old, adv, m, sc, gid = etr_batch()
    kw = dict(scores=sc, group_ids=gid, alpha=0.5, beta=1.0, dual_clip=None)
    # eps = 0.2 (1 + 0.5 min(|A|, 3)) (1 + 4 p (1 - p)):
    # row 0: 0.2 * 1.5 * 2 = 0.6 -> ratios 1.5, 0.7 unclipped for A = +1: losses -1.5, -0.7
    # row 1: 0.6 as well (|A| = 1): 0.6 stays, 1.1, 1.35 -> clip(1.35) = 1.35 (< 1.6); A = -1: 0.6, 1.1, 1.35
    # row 2: 0.2 * 2 * 1 = 0.4 (group 1 has no variance): ratio 1.3 < 1.4 -> -2 * 1.3 = -2.6
    # row 3: 0.2 * 1.25 = 0.25: 0.8 (>= 0.75) -> -0.4; 1.45 -> clipped 1.25 -> -0.625
    rows = [np.mean([-1.5, -0.7]), np.mean([0.6, 1.1, 1.35]), -2.6, np.mean([-0.4, -0.625])]
    loss, met = C.etr_loss(lp, old, adv, m, **kw)
    close(loss, np.mean(rows))
    close(met["etr_pass_var_mean"], 0.5)
    close(met["clip_frac"], 1 / 8)
    # the same batch under plain PPO clips row 0's 1.5, row 1's 0.6 and 1.35, row 2's 1.3 and row 3's 1.45
    ppo_rows = [np.mean([-1.2, -0.7]), np.mean([0.8, 1.1, 1.35]), -2.4, np.mean([-0.4, -0.6])]
    close(C.etr_loss(lp, old, adv, m, **{**kw, "alpha": 0.0, "beta": 0.0})[0], np.mean(ppo_rows))
    # max_clip caps the elastic bound: row 0 at 0.3 clips 1.5 to 1.3
    capped = C.etr_loss(lp, old, adv, m, **{**kw, "max_clip": 0.3})[0]
    assert float(capped) > float(loss)


def test_etr_with_zero_elasticity_is_ppo_clip():
    rng = np.random.default_rng(0)
    lp = np.log(rng.uniform(0.3, 0.95, (6, 5))).astype(np.float32)
    old = np.log(rng.uniform(0.3, 0.95, (6, 5))).astype(np.float32)
    adv = rng.normal(size=(6, 5)).astype(np.float32)
    m = (np.arange(5)[None] < rng.integers(1, 6, 6)[:, None]).astype(np.float32)
    gid = np.array([0, 0, 1, 1, 2, 2], np.int32)
    sc = rng.integers(0, 2, 6).astype(np.float32)
    for agg in ("token-mean", "seq-mean-token-mean"):
        per, _ = C.ppo_clip_loss(lp, old, adv, m, clip_low=0.2, clip_high=0.28)
        f = lambda x: C.etr_loss(x, old, adv, m, scores=sc, group_ids=gid, alpha=0.0, beta=0.0, clip_low=0.2,
                                 clip_high=0.28, agg=agg)[0]
        g = lambda x: C.aggregate(C.ppo_clip_loss(x, old, adv, m, clip_low=0.2, clip_high=0.28)[0], m, agg)
        close(f(lp), g(lp))
        close(jax.grad(f)(jnp.asarray(lp)), jax.grad(g)(jnp.asarray(lp)))


def test_etr_macro_factor_widens_only_mixed_groups():
    lp, old, adv, m, sc, gid = etr_batch()
    base = C.etr_loss(lp, old, adv, m, scores=sc, group_ids=gid, alpha=0.0, beta=0.0)[1]
    wide = C.etr_loss(lp, old, adv, m, scores=sc, group_ids=gid, alpha=0.0, beta=2.0)[1]
    # group 0 (p = 1/2) gets eps 0.2 * 3 = 0.6 on its 5 tokens, group 1 (p = 1) keeps 0.2 on 3
    close(wide["etr_eps_low_mean"], (5 * 0.6 + 3 * 0.2) / 8)
    close(base["etr_eps_low_mean"], 0.2)
    with pytest.raises(ValueError, match="max_clip"):
        C.etr_loss(lp, old, adv, m, scores=sc, group_ids=gid, alpha=0.0, beta=0.0, max_clip=1.5)
    with pytest.raises(ValueError, match="alpha"):
        C.etr_loss(lp, old, adv, m, scores=sc, group_ids=gid, alpha=-1.0, beta=0.0)


# ------------------------------------------------------------------------------------------------- R2VPO


def test_r2vpo_hand_values_and_gradient():
    r, m = ragged([[1.2, 0.9], [0.5, 1.4, 1.0]], 3, 1.0)
    lp, old = np.log(r) * m, np.zeros_like(m)
    adv = np.array([1.0, -2.0], np.float32)[:, None] * m
    lam = np.full(2, 3.0, np.float32)
    loss, met = C.r2vpo_loss(lp, old, adv, m, r2vpo_lambda=lam, delta=0.05)
    rho = np.array([1.2, 0.9, 0.5, 1.4, 1.0])
    a = np.array([1, 1, -2, -2, -2.0])
    var = np.mean((rho - rho.mean()) ** 2)
    close(met["r2vpo_ratio_var"], var)
    close(loss, np.mean(-a * rho) + 3.0 * (var - 0.05))
    # gradient wrt logp_t: rho_t (-A_t / n + lam * 2 (rho_t - mean) / n) (the mean's own term sums to zero)
    g = np.asarray(jax.grad(lambda x: C.r2vpo_loss(x, old, adv, m, r2vpo_lambda=lam, delta=0.05)[0])(
        jnp.asarray(lp)))
    want = rho * (-a / 5 + 3.0 * 2 * (rho - rho.mean()) / 5)
    close(g[m > 0], want, tol=1e-5)


def test_r2vpo_identities_and_dual_step():
    rng = np.random.default_rng(1)
    lp = np.log(rng.uniform(0.3, 0.95, (4, 6))).astype(np.float32)
    adv = rng.normal(size=(4, 6)).astype(np.float32)
    m = (np.arange(6)[None] < np.array([[6], [3], [5], [1]])).astype(np.float32)
    # on-policy: rho = 1, no variance: the penalty is -lam delta, a constant; the gradient is REINFORCE's
    f = lambda x: C.r2vpo_loss(x, jax.lax.stop_gradient(x), adv, m, r2vpo_lambda=np.full(4, 5.0, np.float32),
                               delta=0.1)[0]
    close(f(jnp.asarray(lp)), C.aggregate(-adv, m, "token-mean") - 0.5)
    close(jax.grad(f)(jnp.asarray(lp)), jax.grad(lambda x: C.aggregate(-adv * x, m, "token-mean"))(jnp.asarray(lp)))
    # lambda = 0: the unclipped importance-weighted advantage
    old = np.log(rng.uniform(0.3, 0.95, (4, 6))).astype(np.float32)
    close(C.r2vpo_loss(lp, old, adv, m, r2vpo_lambda=np.zeros(4, np.float32), delta=0.1)[0],
          C.aggregate(-adv * np.exp(lp - old), m, "token-mean"))
    # projected dual ascent
    assert C.r2vpo_dual_step(1.0, 0.3, delta=0.1, lambda_lr=2.0) == pytest.approx(1.4)
    assert C.r2vpo_dual_step(0.1, 0.0, delta=0.1, lambda_lr=2.0) == 0.0
    with pytest.raises(ValueError, match="delta"):
        C.r2vpo_loss(lp, old, adv, m, r2vpo_lambda=np.zeros(4, np.float32), delta=-1.0)



# ------------------------------------------------------------------------------------------------- VPPO


def test_vppo_shaping_filtering_and_ppo_identity():
    import math

    # row 0 does not depend on its prompt (masked = old), row 1 does on its first token only
    old = np.log(np.array([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]], np.float32))
    masked = old.copy()
    masked[1, 0] = np.log(0.25)
    m = np.ones((2, 3), np.float32)
    adv = np.array([[1.0] * 3, [1.0] * 3], np.float32)
    d = math.log(0.5)
    s1 = (math.exp(d) - d - 1) / 3  # row 1's mean dependency; row 0's is 0
    loss, met = C.vppo_loss(old, old, adv, m, masked_logp=masked, beta_min=0.9, top_frac=0.34)
    # n = [0, 1], mu = 0.5, beta_max = 1.1: alpha = [0.9, 1.1]; ceil(0.34 * 3) = 2 tokens kept per row:
    # row 1 keeps its dependent token and the first of its ties, row 0 its first two (ties: order)
    np.testing.assert_allclose(float(met["vppo_alpha_max"]), 1.1, rtol=1e-6)
    np.testing.assert_allclose(float(met["vppo_kept_frac"]), 4 / 6, rtol=1e-6)
    np.testing.assert_allclose(float(loss), (2 * -0.9 + 2 * -1.1) / 6, rtol=1e-6)
    np.testing.assert_allclose(float(met["vppo_dependency_mean"]), s1 / 2, rtol=1e-5)
    # beta_min = 1 and every token kept: PPO's clip (no dual clip), token-mean
    rng = np.random.default_rng(4)
    lp = np.log(rng.uniform(0.2, 0.9, (3, 4))).astype(np.float32)
    o2 = np.log(rng.uniform(0.2, 0.9, (3, 4))).astype(np.float32)
    a2 = rng.normal(size=(3, 4)).astype(np.float32)
    m2 = (np.arange(4)[None] < np.array([[4], [2], [3]])).astype(np.float32)
    f = lambda x: C.vppo_loss(x, o2, a2, m2, masked_logp=o2 - rng.uniform(0, 1, (3, 4)).astype(np.float32),
                              beta_min=1.0, top_frac=1.0)[0]
    g = lambda x: C.aggregate(C.ppo_clip_loss(x, o2, a2, m2, clip_low=0.2, clip_high=0.28, dual_clip=None)[0], m2,
                              "token-mean")
    close(f(jnp.asarray(lp)), g(jnp.asarray(lp)))
    close(jax.grad(f)(jnp.asarray(lp)), jax.grad(g)(jnp.asarray(lp)))
    with pytest.raises(ValueError, match="top_frac"):
        C.vppo_loss(old, old, adv, m, masked_logp=masked, top_frac=0.0)

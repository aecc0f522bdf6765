"""Numerical parity with verl 0.9.1 (``verl.trainer.ppo.core_algos`` and rollout correction).

One oracle subprocess computes every reference case in float64 torch; we compute the same
cases in float32 JAX and compare values and gradients (w.r.t. the current logprobs) to 1e-5.
Inputs: ragged masks (length-1 rows, a row with holes, an all-masked row where verl allows
it), groups in shuffled order, a singleton group, a group with all-equal rewards.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.core import advantages as A
from jaxrl_llm.core import aggregation as G
from jaxrl_llm.core import entropy as E
from jaxrl_llm.core import group_advantages as GA
from jaxrl_llm.core import kl as K
from jaxrl_llm.core import policy_losses as P
from jaxrl_llm.core import shaping as S
from jaxrl_llm.core import value as V
from peer import run_oracle

pytestmark = pytest.mark.conformance

TOL = dict(atol=1e-5, rtol=1e-5)
B, T, GS = 12, 9, 3
AGG = G.AGG_MODES


def _batch(seed: int, holes: bool = False, empty_row: bool = False):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, B)
    lengths[0], lengths[1] = 1, T
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    if holes:
        mask[2, 1] = 0.0  # an observation token inside the response (multi-turn)
    if empty_row:
        mask[3] = 0.0
    n_groups = B // GS
    gid = rng.permutation(np.repeat(np.arange(n_groups), GS)).astype(np.int32)
    gid[-1] = n_groups  # a singleton group
    scores = rng.integers(0, 2, B).astype(np.float32)
    scores[gid == gid[0]] = 1.0  # one group with all-equal rewards
    cont = rng.normal(size=B).astype(np.float32)
    cont[gid == gid[0]] = 0.5  # the same group is all-equal for continuous rewards too
    logp = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(np.float32)
    old = np.clip(logp + rng.normal(0, 0.3, (B, T)), -12, -1e-3).astype(np.float32)
    adv = rng.normal(size=(B, T)).astype(np.float32)
    return dict(mask=mask, gid=gid, ng=n_groups + 1, scores=scores, cont=cont, logp=logp, old=old,
                adv=adv, lengths=lengths, rng=rng)


def _token_rewards(scores, mask):
    tr = np.zeros(mask.shape, np.float32)
    last = np.maximum(mask.sum(1).astype(int) - 1, 0)
    tr[np.arange(len(scores)), last] = scores
    return tr


CASES: list[dict] = []
OURS: dict[str, callable] = {}


def case(cid, ours, **c):
    c["id"] = cid
    CASES.append(c)
    OURS[cid] = ours


# ---------------------------------------------------------------- advantages
for seed, kind in itertools.product([0, 1], ["binary", "cont"]):
    d = _batch(seed, empty_row=seed == 1)  # seed 1: row 3 has no response token at all
    s = d["scores"] if kind == "binary" else d["cont"]
    m, gid, ng = d["mask"], d["gid"], d["ng"]
    tr = _token_rewards(s, m)
    base = dict(kind="adv", tensors={"token_level_rewards": tr, "response_mask": m}, index=gid)
    for std in (True, False):
        for fn in ("compute_grpo_outcome_advantage", "compute_grpo_vectorized_outcome_advantage"):
            case(f"{fn}-{seed}-{kind}-{std}",
                 lambda s=s, m=m, gid=gid, ng=ng, std=std: A.grpo_advantages(s, m, gid, ng, scale_by_std=std),
                 fn=fn, kwargs={"norm_adv_by_std_in_grpo": std}, **base)
    case(f"rloo-{seed}-{kind}", lambda s=s, m=m, gid=gid, ng=ng: A.rloo_advantages(s, m, gid, ng),
         fn="compute_rloo_outcome_advantage", **base)
    case(f"rloo_vec-{seed}-{kind}",
         lambda s=s, m=m, gid=gid, ng=ng: A.rloo_advantages(s, m, gid, ng, singleton="zero"),
         fn="compute_rloo_vectorized_outcome_advantage", **base)
    case(f"opo-{seed}-{kind}", lambda s=s, m=m, gid=gid, ng=ng: A.opo_advantages(s, m, gid, ng),
         fn="compute_opo_outcome_advantage", **base)
    case(f"rppb-{seed}-{kind}",
         lambda s=s, m=m, gid=gid, ng=ng: A.reinforce_pp_baseline_advantages(s, m, gid, ng),
         fn="compute_reinforce_plus_plus_baseline_outcome_advantage", **base)
    case(f"gpg-{seed}-{kind}", lambda s=s, m=m, gid=gid, ng=ng: A.gpg_advantages(s, m, gid, ng),
         fn="compute_gpg_outcome_advantage", **base)
    # pass@k needs >= 2 samples per group in verl: merge the singleton into group 0
    gid2 = np.where(gid == ng - 1, 0, gid).astype(np.int32)
    for std in (True, False):
        case(f"passk-{seed}-{kind}-{std}",
             lambda s=s, m=m, g=gid2, ng=ng, std=std: A.grpo_passk_advantages(s, m, g, ng - 1, scale_by_std=std),
             fn="compute_grpo_passk_outcome_advantage", kind="adv",
             tensors={"token_level_rewards": tr, "response_mask": m}, index=gid2,
             config={"norm_adv_by_std_in_grpo": std})
    comps = np.stack([s, d["rng"].integers(0, 3, B).astype(np.float32)], 1)
    w = [1.0, 0.5]
    case(f"gdpo-{seed}-{kind}",
         lambda c=comps, m=m, gid=gid, ng=ng, w=w: A.gdpo_advantages(c, m, gid, ng, weights=jnp.array(w)),
         fn="compute_gdpo_outcome_advantage", kind="adv",
         tensors={"token_level_rewards": tr, "response_mask": m}, index=gid, gdpo_scores=comps, gdpo_weights=w)
    rand_tr = (d["rng"].normal(size=(B, T)) * m).astype(np.float32)
    for gamma in (1.0, 0.9):
        dh = _batch(seed, holes=True, empty_row=seed == 1)
        mh = dh["mask"]
        trh = (d["rng"].normal(size=(B, T)) * mh).astype(np.float32)
        case(f"rpp-{seed}-{kind}-{gamma}", lambda r=trh, m=mh, g=gamma: A.reinforce_pp_advantages(r, m, g),
             fn="compute_reinforce_plus_plus_outcome_advantage", kind="adv",
             tensors={"token_level_rewards": trh, "response_mask": mh}, config={"gamma": gamma})
        vals = d["rng"].normal(size=(B, T)).astype(np.float32)
        for lam in (1.0, 0.95):
            case(f"gae-{seed}-{kind}-{gamma}-{lam}",
                 lambda r=trh, v=vals, m=mh, g=gamma, l=lam: A.gae_advantages(r, v, m, g, l),
                 fn="compute_gae_advantage_return", kind="adv",
                 tensors={"token_level_rewards": trh, "values": vals, "response_mask": mh},
                 kwargs={"gamma": gamma, "lam": lam})
    bl = d["rng"].normal(size=B).astype(np.float32)
    case(f"remax-{seed}-{kind}", lambda r=rand_tr, b=bl, m=m: A.remax_advantages(r, b, m),
         fn="compute_remax_outcome_advantage", kind="adv",
         tensors={"token_level_rewards": rand_tr, "reward_baselines": bl, "response_mask": m})


# CANON's identity against verl's Dr.GRPO estimator (GRPO without the std): with mu = 1/2, alpha = 1,
# beta = 0 and groups of even size, the mean of the two halves' conditional advantages is r - mean_g r
# whatever the split metric. Groups of 4 and 2 in shuffled order, ties in the metric, a group with
# all-equal rewards.
for seed, variant in itertools.product((0, 1), ("length", "entropy")):
    d = _batch(seed)
    rng = np.random.default_rng(100 + seed)
    gid_even = rng.permutation(np.repeat(np.arange(4), [4, 4, 2, 2])).astype(np.int32)
    s = d["cont"] if seed else d["scores"]
    s = np.where(gid_even == gid_even[0], 0.25, s).astype(np.float32)
    metric = (d["lengths"] if variant == "length" else rng.integers(0, 3, B)).astype(np.float32)
    m = d["mask"]
    case(f"canon-half-{seed}-{variant}",
         lambda s=s, x=metric, m=m, g=gid_even, v=variant: GA.canon_advantages(s, x, m, g, 4, mu=0.5, variant=v),
         fn="compute_grpo_outcome_advantage", kind="adv",
         tensors={"token_level_rewards": _token_rewards(s, m), "response_mask": m}, index=gid_even,
         kwargs={"norm_adv_by_std_in_grpo": False})


# Optimal Token Baseline: both verl variants, on a batch built so that every branch fires: a
# group whose longest response is unique (zero tail), one with a tie for the longest, a
# singleton group, masks with holes, an all-masked row (seed 1), truncated IS weights.
def _otb_batch(seed: int):
    rng = np.random.default_rng(100 + seed)
    gid = np.array([0, 1, 2, 0, 1, 2, 0, 3, 2, 1, 3, 4], np.int32)  # shuffled groups, group 4 singleton
    lengths = np.array([9, 4, 2, 5, 4, 7, 3, 1, 6, 2, 8, 5])  # g0: unique max 9; g1: tie at 4
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    mask[2, 1] = 0.0  # holes (tool / observation tokens)
    mask[5, 3:5] = 0.0
    if seed == 1:
        mask[3] = 0.0  # a row with no response token
    logits = rng.normal(0, 2, (B, T, 11)).astype(np.float32)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    tok = np.array([[rng.choice(11, p=p[i, j]) for j in range(T)] for i in range(B)])
    old = np.log(np.take_along_axis(p, tok[..., None], -1)[..., 0]).astype(np.float32)
    sps = (p ** 2).sum(-1).astype(np.float32)
    dense = (rng.normal(size=(B, T)) * mask).astype(np.float32)
    outcome = _token_rewards(rng.integers(0, 2, B).astype(np.float32), mask)
    isw = rng.uniform(0.5, 2.0, (B, T)).astype(np.float32)
    return dict(mask=mask, gid=gid, ng=5, old=old, sps=sps, dense=dense, outcome=outcome, isw=isw, logits=logits)


OTB = {s: _otb_batch(s) for s in (0, 1)}
OTB_FNS = {"position": "compute_optimal_token_baseline_advantage",
           "response": "compute_multi_turn_optimal_token_baseline_advantage"}
for seed, align, rew, tail, use_is in itertools.product((0, 1), OTB_FNS, ("dense", "outcome"), (True, False),
                                                         (False, True)):
    o = OTB[seed]
    tensors = {"token_level_rewards": o[rew], "response_mask": o["mask"], "old_log_probs": o["old"],
               "sum_pi_squared": o["sps"]}
    if use_is:
        tensors["rollout_is_weights"] = o["isw"]
    case(f"otb-{seed}-{align}-{rew}-tail{tail}-is{use_is}",
         lambda o=o, r=o[rew], a=align, tl=tail, w=o["isw"] if use_is else None: A.optimal_token_baseline_advantages(
             r, o["old"], o["sps"], o["mask"], o["gid"], o["ng"], is_weights=w, align=a, handle_zero_tail=tl),
         fn=OTB_FNS[align], kind="adv", tensors=tensors, index=o["gid"], kwargs={"handle_zero_tail": tail})

# The one documented difference: a group with one non-empty response and one empty one, without
# the zero-tail rule. verl's "position" variant counts the empty row, so the response's own
# return becomes its baseline (advantage ~0); we (and verl's "response" variant) see a group of one.
OTB_DIFF = dict(OTB[1], gid=np.array([0, 1, 2, 0, 1, 2, 0, 3, 2, 1, 3, 4], np.int32))
OTB_DIFF["gid"][3], OTB_DIFF["gid"][6] = 5, 5  # group 5 = {row 6, row 3 (empty)}
OTB_DIFF["ng"] = 6
case("otb-diff-position", None, fn=OTB_FNS["position"], kind="adv",
     tensors={"token_level_rewards": OTB_DIFF["dense"], "response_mask": OTB_DIFF["mask"],
              "old_log_probs": OTB_DIFF["old"], "sum_pi_squared": OTB_DIFF["sps"]},
     index=OTB_DIFF["gid"], kwargs={"handle_zero_tail": False})
OURS.pop("otb-diff-position")


@pytest.fixture(scope="module")
def oracle():
    return run_oracle("verl_oracle.py", CASES + POLICY_CASES)


ADV_IDS = [c["id"] for c in CASES if c["id"] in OURS]


@pytest.mark.parametrize("cid", ADV_IDS)
def test_advantage_matches_verl(oracle, cid):
    ref = oracle[cid]
    assert "error" not in ref, ref.get("error")
    c = next(x for x in CASES if x["id"] == cid)
    m = c["tensors"]["response_mask"]
    out = OURS[cid]()
    if isinstance(out, tuple):
        adv, ret = out
        np.testing.assert_allclose(np.asarray(ret) * m, ref["ret"] * m, **TOL)
    else:
        adv = out
    np.testing.assert_allclose(np.asarray(adv) * m, ref["adv"] * m, **TOL)


def test_otb_cases_exercise_every_branch(oracle):
    """Guard against vacuous parity: the zero tail and the IS weights change the result."""
    def adv(cid):
        return oracle[cid]["adv"]
    for align in OTB_FNS:
        base = f"otb-0-{align}-dense"
        assert np.abs(adv(f"{base}-tailTrue-isFalse") - adv(f"{base}-tailFalse-isFalse")).max() > 1e-2
        assert np.abs(adv(f"{base}-tailTrue-isTrue") - adv(f"{base}-tailTrue-isFalse")).max() > 1e-2
    # holes: the two alignments differ on the batch with holes
    assert np.abs(adv("otb-0-position-dense-tailTrue-isFalse") - adv("otb-0-response-dense-tailTrue-isFalse")).max() > 1e-2


def test_otb_empty_row_difference_from_verl_is_exactly_the_documented_one(oracle):
    o = OTB_DIFF
    ref = oracle["otb-diff-position"]
    assert "error" not in ref, ref.get("error")
    adv, ret = A.optimal_token_baseline_advantages(o["dense"], o["old"], o["sps"], o["mask"], o["gid"], o["ng"],
                                                   handle_zero_tail=False)
    adv, m = np.asarray(adv), o["mask"]
    np.testing.assert_allclose(adv[6], np.asarray(ret)[6], **TOL)  # ours: a group of one, A = G
    assert np.abs(ref["adv"][6] * m[6]).max() < 1e-4  # verl: baseline = own return, A = G eps / (W + eps)
    assert np.abs(adv[6]).max() > 0.1  # so the difference is material
    rest = np.arange(B) != 6
    np.testing.assert_allclose(adv[rest] * m[rest], ref["adv"][rest] * m[rest], **TOL)


# ---------------------------------------------------------------- policy losses
POLICY_CASES: list[dict] = []
POLICY_OURS: dict[str, callable] = {}

LOSSES = {
    # verl loss_mode: (our fn, our kwargs, verl actor kwargs, verl policy_loss kwargs, modes)
    "vanilla": (P.ppo_clip_loss, dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0),
                dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0), {}, AGG),
    "dppo_tv": (P.dppo_tv_loss, dict(clip_low=0.15, clip_high=0.25, clip_ratio_c=2.0),
                dict(clip_ratio=0.2, clip_ratio_low=0.15, clip_ratio_high=0.25, clip_ratio_c=2.0), {}, AGG),
    "dppo_kl": (P.dppo_kl_loss, dict(clip_low=0.05, clip_high=0.08, clip_ratio_c=2.0),
                dict(clip_ratio=0.2, clip_ratio_low=0.05, clip_ratio_high=0.08, clip_ratio_c=2.0), {}, AGG),
    "gspo": (P.gspo_loss, dict(clip_low=0.03, clip_high=0.04),
             dict(clip_ratio=0.2, clip_ratio_low=0.03, clip_ratio_high=0.04), {}, AGG),
    "sapo": (P.sapo_loss, dict(tau_pos=1.0, tau_neg=1.05), dict(tau_pos=1.0, tau_neg=1.05), {},
             ("seq-mean-token-mean",)),
    "gpg": (P.gpg_loss, {}, {}, {}, AGG),
    "clip_cov": (None, {}, dict(clip_ratio=0.2), dict(clip_cov_ratio=1.0, clip_cov_lb=0.3, clip_cov_ub=5.0), AGG),
    "kl_cov": (P.kl_cov_loss, dict(kl_cov_ratio=0.1, ppo_kl_coef=0.5), {},
               dict(kl_cov_ratio=0.1, ppo_kl_coef=0.5), AGG),
    "geo_mean": (P.gmpo_loss, dict(clip_low=0.1, clip_high=0.15),
                 dict(clip_ratio=0.4, clip_ratio_low=0.1, clip_ratio_high=0.15), {}, ("seq-mean-token-mean",)),
    "dro": (P.dro_loss, dict(beta=0.7), {}, dict(dro_beta=0.7), AGG),
    "cispo": (P.cispo_loss, dict(clip_low=0.2, clip_high=0.25),
              dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.25), {}, AGG),
}


def _our_clip_cov(lp, old, adv, m):
    # clip_cov_ratio = 1 drops every candidate, so verl's random choice is deterministic
    return P.clip_cov_loss(lp, old, adv, m, key=jax.random.key(0), clip_low=0.2, clip_high=0.2,
                           clip_cov_ratio=1.0, clip_cov_lb=0.3, clip_cov_ub=5.0)


for seed, (mode_name, (fn, kw, actor, plk, modes)) in itertools.product([0, 1], LOSSES.items()):
    empty = mode_name != "geo_mean"  # verl's geo_mean averages over all rows, see gmpo_loss doc
    d = _batch(10 + seed, holes=True, empty_row=empty)
    use_w = seed == 1 and mode_name not in ("geo_mean",)
    wts = d["rng"].uniform(0.5, 1.5, (B, T)).astype(np.float32) if use_w else None
    if mode_name == "geo_mean":  # verl's GMPO assumes sequence-level advantages
        d["adv"] = np.repeat(d["adv"][:, :1], T, 1)
    for mode in modes:
        cid = f"pl-{mode_name}-{seed}-{mode}"
        POLICY_CASES.append(dict(id=cid, kind="policy_loss", loss_mode=mode_name, agg=mode,
                                 log_prob=d["logp"], old_log_prob=d["old"], advantages=d["adv"],
                                 response_mask=d["mask"], rollout_is_weights=wts,
                                 actor=actor, policy_loss=plk))
        f = _our_clip_cov if mode_name == "clip_cov" else (lambda *a, fn=fn, kw=kw, **k: fn(*a, **kw, **k))

        def ours(lp, d=d, f=f, mode=mode, wts=wts, name=mode_name):
            kwargs = {} if wts is None or name == "clip_cov" else {"is_weights": wts}
            if name == "clip_cov" and wts is not None:
                loss, _ = P.clip_cov_loss(lp, d["old"], d["adv"], d["mask"], key=jax.random.key(0),
                                          clip_low=0.2, clip_cov_ratio=1.0, clip_cov_lb=0.3,
                                          clip_cov_ub=5.0, is_weights=wts)
            else:
                loss, _ = f(lp, d["old"], d["adv"], d["mask"], **kwargs)
            return G.aggregate(loss, d["mask"], mode)

        POLICY_OURS[cid] = (ours, d["logp"])

# REINFORCE and bypass mode (rollout correction composed from our pieces)
for seed in (0, 1):
    d = _batch(20 + seed, holes=True, empty_row=seed == 1)
    wts = d["rng"].uniform(0.5, 1.5, (B, T)).astype(np.float32)
    for mode in AGG:
        cid = f"reinforce-{seed}-{mode}"
        POLICY_CASES.append(dict(id=cid, kind="reinforce", agg=mode, log_prob=d["logp"], old_log_prob=d["old"],
                                 advantages=d["adv"], response_mask=d["mask"], rollout_is_weights=wts))
        POLICY_OURS[cid] = (lambda lp, d=d, mode=mode, w=wts: G.aggregate(
            P.reinforce_loss(lp, d["adv"], d["mask"], is_weights=w)[0], d["mask"], mode), d["logp"])
    for loss_type, (lvl, thr), rs in itertools.product(
            ("reinforce", "ppo_clip"), [("token", 2.0), ("sequence", 1.5), ("token", "0.7_1.3")],
            [None, ("token_k1", 1.4), ("seq_mean_k3", 0.02)]):
        cid = f"bypass-{seed}-{loss_type}-{lvl}-{thr}-{rs}"
        rcfg = dict(loss_type=loss_type, rollout_is=lvl, rollout_is_threshold=thr,
                    rollout_rs=None if rs is None else rs[0], rollout_rs_threshold=None if rs is None else rs[1])
        POLICY_CASES.append(dict(id=cid, kind="bypass", agg="token-mean", log_prob=d["logp"],
                                 old_log_prob=d["old"], advantages=d["adv"], response_mask=d["mask"],
                                 actor=dict(clip_ratio=0.2), policy_loss=dict(rollout_correction=rcfg)))

        def ours(lp, d=d, loss_type=loss_type, lvl=lvl, thr=thr, rs=rs):
            m = jnp.asarray(d["mask"])
            if rs is not None:
                m, _ = P.rollout_rejection_mask(lp, d["old"], m, mode=rs[0], upper=rs[1])
            if loss_type == "ppo_clip":
                loss, _ = P.ppo_clip_loss(lp, d["old"], d["adv"], m, clip_low=0.2)
            else:
                lo, up = (None, thr) if not isinstance(thr, str) else map(float, thr.split("_"))
                w, _ = P.rollout_is_weights(lp, d["old"], d["mask"], level=lvl, upper=up, lower=lo)
                loss, _ = P.reinforce_loss(lp, d["adv"], m, is_weights=w)
            return G.aggregate(loss, m, "token-mean")

        POLICY_OURS[cid] = (ours, d["logp"])

# KL estimators (with values beyond the clamps), aggregation, value loss, entropy
d = _batch(30)
x_ref = (d["logp"] + d["rng"].normal(0, 8, (B, T))).astype(np.float32)
kl_w = d["rng"].uniform(0, 1, (B, T)).astype(np.float32)
for kind in ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k1+", "k3+", "low_var_kl+", "abs+"):
    cid = f"kl-{kind}"
    POLICY_CASES.append(dict(id=cid, kind="kl", logprob=d["logp"], ref_logprob=x_ref, penalty=kind, weights=kl_w))
    POLICY_OURS[cid] = (lambda lp, kind=kind: jnp.sum(K.kl_penalty(lp, x_ref, kind) * kl_w), d["logp"])

dm = _batch(31, holes=True, empty_row=True)
loss_mat = dm["rng"].normal(size=(B, T)).astype(np.float32)
for mode in AGG:
    for lsf in (None, 32):
        cid = f"agg-{mode}-{lsf}"
        kw = {} if lsf is None else {"loss_scale_factor": lsf}
        POLICY_CASES.append(dict(id=cid, kind="agg", loss_mat=loss_mat, mask=dm["mask"], mode=mode, kwargs=kw))
        POLICY_OURS[cid] = (lambda x, mode=mode, lsf=lsf: G.aggregate(x, dm["mask"], mode, horizon=lsf), loss_mat)

vals_old = dm["rng"].normal(size=(B, T)).astype(np.float32)
rets = dm["rng"].normal(size=(B, T)).astype(np.float32)
vpred = (vals_old + dm["rng"].normal(0, 0.5, (B, T))).astype(np.float32)
for mode in ("token-mean", "seq-mean-token-mean"):
    cid = f"value-{mode}"
    POLICY_CASES.append(dict(id=cid, kind="value", vpreds=vpred, returns=rets, values=vals_old, mask=dm["mask"],
                             cliprange_value=0.3, agg=mode))
    POLICY_OURS[cid] = (lambda v, mode=mode: G.aggregate(
        V.clipped_value_loss(v, vals_old, rets, dm["mask"], clip_range=0.3)[0], dm["mask"], mode), vpred)


@pytest.mark.parametrize("cid", list(POLICY_OURS))
def test_loss_value_and_grad_match_verl(oracle, cid):
    ref = oracle[cid]
    assert "error" not in ref, ref.get("error")
    fn, x = POLICY_OURS[cid]
    val, grad = jax.value_and_grad(fn)(jnp.asarray(x))
    ref_val = ref["value"] if "value" in ref else ref["loss"]
    np.testing.assert_allclose(float(val), float(ref_val), **TOL)
    np.testing.assert_allclose(np.asarray(grad), ref["grad"], **TOL)


def test_value_loss_clip_fraction_matches_verl(oracle):
    _, met = V.clipped_value_loss(vpred, vals_old, rets, dm["mask"], clip_range=0.3)
    np.testing.assert_allclose(float(met["vf_clip_frac"]), float(oracle["value-token-mean"]["frac"]), **TOL)


def test_ppo_metrics_match_verl(oracle):
    for seed in (0, 1):
        ref = oracle[f"pl-vanilla-{seed}-token-mean"]
        cid = f"pl-vanilla-{seed}-token-mean"
        c = next(x for x in POLICY_CASES if x["id"] == cid)
        _, met = P.ppo_clip_loss(c["log_prob"], c["old_log_prob"], c["advantages"], c["response_mask"],
                                 clip_low=0.2, clip_high=0.28)
        np.testing.assert_allclose(float(met["clip_frac"]), ref["m:actor/pg_clipfrac"], **TOL)
        np.testing.assert_allclose(float(met["clip_frac_lower"]), ref["m:actor/pg_clipfrac_lower"], **TOL)
        np.testing.assert_allclose(float(met["approx_kl"]), ref["m:actor/ppo_kl"], **TOL)


# ---------------------------------------------------------------- entropy, rollout correction, KL controller
ENT_LOGITS = np.random.default_rng(40).normal(0, 3, (3, 7, 11)).astype(np.float32)
RC = _batch(41, holes=True, empty_row=True)
RC_LR = (RC["logp"] - RC["old"]).astype(np.float32)
ENT_MASK = (np.arange(7)[None] < np.array([7, 1, 0])[:, None]).astype(np.float32)  # full, length 1, empty
KL_D = _batch(42, holes=True, empty_row=True)
PF_SCORES = np.array([0.0, 1.0, -2.0, 1.0, 0.5, -2.0], np.float32)
OVERLONG_LENGTHS = [1, 10, 11, 15, 16, 20]
EXTRA = [dict(id="entropy", kind="entropy", logits=ENT_LOGITS),
         *[dict(id=f"entropy_loss-{mode}", kind="entropy_loss", logits=ENT_LOGITS, mask=ENT_MASK, agg=mode)
           for mode in AGG],
         dict(id="compute_rewards", kind="compute_rewards", scores=KL_D["adv"] * KL_D["mask"], old=KL_D["old"],
              ref=KL_D["logp"], coef=0.05),
         *[dict(id=f"pf_ppo-{meth}", kind="pf_ppo", token_scores=np.stack([PF_SCORES, 0 * PF_SCORES], 1),
                method=meth, power=1.5) for meth in ("pow", "max_min", "max_random")],
         dict(id="dapo_overlong", kind="dapo_overlong", lengths=OVERLONG_LENGTHS, max_len=20, buffer=8, factor=0.7),
         dict(id="sum_pi_sq", kind="sum_pi_sq", logits=ENT_LOGITS, temperature=0.7),
         dict(id="kl_ctrl", kind="kl_ctrl", init=0.2, target=0.05, horizon=100.0,
              kls=[0.01, 0.2, 0.05, 0.07, 0.0], ns=[32, 32, 64, 16, 8])]
for lvl, thr, norm in itertools.product(("token", "sequence"), (2.0, "0.8_1.25"), (False, True)):
    EXTRA.append(dict(id=f"ris-{lvl}-{thr}-{norm}", kind="rollout_is", log_ratio=RC_LR, mask=RC["mask"],
                      level=lvl, threshold=thr, normalize=norm))
RS = [("token_k1", 1.3), ("token_k1", "0.8_1.4"), ("token_k2", 0.02), ("token_k3", 0.02), ("seq_sum_k1", 1.5),
      ("seq_sum_k2", 0.05), ("seq_sum_k3", 0.05), ("seq_mean_k1", "0.9_1.2"), ("seq_mean_k2", 0.01),
      ("seq_mean_k3", 0.01), ("seq_max_k2", 0.05), ("seq_max_k3", 0.05)]
for mode, thr in RS:
    EXTRA.append(dict(id=f"rs-{mode}-{thr}", kind="rollout_rs", log_ratio=RC_LR, mask=RC["mask"], mode=mode,
                      threshold=thr))


@pytest.fixture(scope="module")
def oracle_extra():
    return run_oracle("verl_oracle.py", EXTRA)


def test_entropy_matches_verl(oracle_extra):
    ours = E.chunked_entropy(jnp.asarray(ENT_LOGITS), chunk_size=3)
    np.testing.assert_allclose(np.asarray(ours), oracle_extra["entropy"]["value"], **TOL)


def test_sum_pi_squared_matches_verl(oracle_extra):
    ours = E.chunked_sum_pi_squared(jnp.asarray(ENT_LOGITS), chunk_size=3, temperature=0.7)
    np.testing.assert_allclose(np.asarray(ours), oracle_extra["sum_pi_sq"]["value"], **TOL)


@pytest.mark.parametrize("mode", AGG)
def test_entropy_loss_matches_verl(oracle_extra, mode):
    ours = G.aggregate(E.chunked_entropy(jnp.asarray(ENT_LOGITS), 2), ENT_MASK, mode)
    np.testing.assert_allclose(float(ours), oracle_extra[f"entropy_loss-{mode}"]["value"], **TOL)


def test_kl_in_reward_matches_verl_compute_rewards(oracle_extra):
    d = KL_D
    r, _ = K.kl_in_reward(d["adv"] * d["mask"], d["old"], d["logp"], d["mask"], 0.05, kind="k1")
    m = d["mask"]
    np.testing.assert_allclose(np.asarray(r) * m, oracle_extra["compute_rewards"]["value"] * m, **TOL)


@pytest.mark.parametrize("method", ["pow", "max_min", "max_random"])
def test_pf_ppo_weights_match_verl(oracle_extra, method):
    ours = S.pf_ppo_weights(PF_SCORES, method, 1.5)
    np.testing.assert_allclose(np.asarray(ours), oracle_extra[f"pf_ppo-{method}"]["weights"], **TOL)


def test_overlong_penalty_matches_verl_dapo_reward_manager(oracle_extra):
    ours = S.overlong_penalty(np.array(OVERLONG_LENGTHS), max_length=20, buffer_length=8, penalty_factor=0.7)
    ref = oracle_extra["dapo_overlong"]["value"]
    np.testing.assert_allclose(np.asarray(ours), ref, **TOL)
    assert (ref == 0).sum() >= 2 and (ref < 0).sum() >= 3  # both regimes exercised


def test_adaptive_kl_controller_matches_verl(oracle_extra):
    c = next(x for x in EXTRA if x["id"] == "kl_ctrl")
    ctl = K.adaptive_kl_controller(c["init"], c["target"], c["horizon"])
    st = ctl.init()
    got = []
    for kl, n in zip(c["kls"], c["ns"]):
        st = jax.jit(ctl.update)(st, kl, n)
        got.append(float(st.coef))
    np.testing.assert_allclose(got, oracle_extra["kl_ctrl"]["coefs"], **TOL)


@pytest.mark.parametrize("cid", [c["id"] for c in EXTRA if c["kind"] == "rollout_is"])
def test_rollout_is_weights_match_verl(oracle_extra, cid):
    c = next(x for x in EXTRA if x["id"] == cid)
    thr = c["threshold"]
    lo, up = (None, thr) if not isinstance(thr, str) else map(float, thr.split("_"))
    w, _ = P.rollout_is_weights(RC["logp"], RC["old"], c["mask"], level=c["level"], upper=up, lower=lo,
                                batch_normalize=c["normalize"])
    np.testing.assert_allclose(np.asarray(w), oracle_extra[cid]["weights"], **TOL)


@pytest.mark.parametrize("cid", [c["id"] for c in EXTRA if c["kind"] == "rollout_rs"])
def test_rollout_rejection_mask_matches_verl(oracle_extra, cid):
    c = next(x for x in EXTRA if x["id"] == cid)
    thr = c["threshold"]
    lo, up = (None, thr) if not isinstance(thr, str) else map(float, thr.split("_"))
    m, _ = P.rollout_rejection_mask(RC["logp"], RC["old"], c["mask"], mode=c["mode"], upper=up, lower=lo)
    np.testing.assert_array_equal(np.asarray(m), oracle_extra[cid]["mask"])

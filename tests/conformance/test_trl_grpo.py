"""Numerical parity of our GRPO-family losses with TRL 1.16's ``GRPOTrainer._compute_loss``.

One oracle subprocess (``trl_grpo_oracle.py`` under the peer interpreter) calls TRL's own loss
method in float64 on the same float32 inputs, with the model replaced by the given per-token
log-probs; we compose the same loss from ``jaxrl_llm.core`` in float32 and compare the scalar
loss and its gradient w.r.t. the per-token log-probs to ``atol = rtol = 1e-5`` (and, for the
PPO-clip loss types, TRL's logged ``clip_ratio/region_mean`` and ``kl`` metrics).

Mapping (TRL ``loss_type`` -> our aggregation; ``epsilon``/``epsilon_high`` -> ``clip_low``/
``clip_high``):

* ``grpo`` -> ``seq-mean-token-mean``; ``bnpo`` -> ``token-mean``; ``dapo`` -> ``token-mean``
  (TRL's global normaliser ``num_items_in_batch`` is the local token count in one process with
  one accumulation step); ``dr_grpo`` -> ``seq-mean-token-sum-norm`` with ``horizon =
  max_completion_length`` (TRL divides by all ``B`` rows; no row here is fully masked);
  ``luspo`` -> ``seq-mean-token-sum``. Policy term: ``ppo_clip_loss(dual_clip=None)`` (TRL's
  default ``delta=None``; note our default is ``dual_clip=3.0``), or ``dual_clip=delta`` for
  TRL's two-sided clipping ``delta``. These agree for ``delta >= 1 + epsilon_high`` (TRL's
  recommendation; tested at 1.3 and 1.45 with ``epsilon_high = 0.28``). Below that they differ:
  TRL clamps the ratio at ``delta`` before the PPO ``min``, which then caps positive-advantage
  ratios at ``delta`` and never binds for negative advantages, while our dual clip caps the
  negative-advantage loss at ``-delta A`` and leaves positive advantages alone. With
  ``importance_sampling_level="sequence"`` (GSPO, LUSPO): ``gspo_loss(variant="sequence")``.
* ``cispo`` -> ``cispo_loss(clip_low=1.0, clip_high=epsilon_high - 1)`` + ``token-mean``: TRL's
  ``epsilon_high`` is the absolute cap of the ratio (``clamp(ratio, max=epsilon_high)``, no
  lower bound), so it needs ``epsilon_high >= 1``.
* ``sapo`` -> ``sapo_loss(tau_pos, tau_neg)`` + ``seq-mean-token-mean``.
* KL (``beta > 0``): ``beta * kl_penalty(logp, ref, "k3")`` added per token before aggregation;
  with ``use_bias_correction_kl=True`` (TRL's default) the KL term is multiplied by
  ``kl_importance_weight(logp, old, mask, level)`` (the differentiable ratio ``exp(logp - old)``;
  sequence level: ``exp`` of its masked mean). Our ``k3`` clamps ``ref - logp`` to
  ``[-20, 20]`` and the value to ``[-10, 10]`` (verl); the inputs keep ``|ref - logp| <= 2``
  (value <= e^2 - 3 = 4.4), inside the unclamped range, where TRL's unclamped estimator is the
  same.
* vLLM importance-sampling correction (``importance_sampling_ratio`` in the batch) ->
  ``is_weights``. TRL computes the ratio inline in ``_generate_and_score_completions``; the
  test builds it with our ``rollout_is_weights`` and hands the same array to both sides, so
  only its use in the loss is compared.
* Off-policy sequence masking (``off_policy_mask_threshold``, TRL's ``get_off_policy_mask``) ->
  ``rollout_rejection_mask(mode="seq_mean_k1", upper=exp(threshold))`` kept where ``A >= 0``,
  passed as ``is_weights`` (TRL multiplies the policy term, not the KL, and keeps the
  normaliser).
* ``trl.experimental.gmpo.GMPOTrainer`` -> ``gmpo_loss`` + ``seq-mean-token-mean``.

Inputs: ``B = 12``, ``T = 9``, ragged prefix masks with a length-1 and a full row, a row with
TRL ``tool_mask`` holes (seed 1), one zero advantage, old log-probs = log-probs + N(0, 0.3)
noise (about 10-20% of the tokens are clipped), on-policy batches (no ``old_per_token_logps``:
TRL uses ``logp.detach()``), ``(B,)`` and ``(B, T)`` advantages. A fully masked row (TRL's
``mask_truncated_completions``) is tested separately: TRL's ``grpo``/``sapo``/``dr_grpo``/
``luspo`` divide by all ``B`` rows, ours by the rows with a token, so they differ by exactly
that factor.

Not covered: ``vespo`` (no equivalent in the library), ``delta`` with
``importance_sampling_level="sequence"`` (``gspo_loss`` has no dual clip), ``cispo``/``sapo``
with sequence-level ratios, ``top_entropy_quantile < 1`` and the entropy bonus (functions of
the entropies, not of the log-probs), TRL's advantages (computed inline in
``_generate_and_score_completions``, not callable on their own).
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.core import aggregation as G
from jaxrl_llm.core import kl as K
from jaxrl_llm.core import policy_losses as P
from jaxrl_llm.core.stats import masked_mean
from peer import run_oracle

pytestmark = pytest.mark.conformance

TOL = dict(atol=1e-5, rtol=1e-5)
B, T = 12, 9
MAX_LEN = 16  # TRL's max_completion_length (dr_grpo's constant divisor), > T on purpose
AGG_OF = {"grpo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean", "bnpo": "token-mean",
          "dapo": "token-mean", "cispo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm",
          "luspo": "seq-mean-token-sum"}
PPO_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
F32 = np.float32


def _batch(seed: int, holes: bool):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, B)
    lengths[0], lengths[1] = 1, T
    cmask = (np.arange(T)[None] < lengths[:, None]).astype(np.int64)
    tool = None
    if holes:  # tool-output tokens inside a completion (TRL's ``tool_mask``)
        tool = np.ones((B, T), np.int64)
        tool[1, 3:5] = 0
    logp = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(F32)
    old = np.clip(logp + rng.normal(0, 0.3, (B, T)), -12, -1e-3).astype(F32)
    ref = (logp + np.clip(rng.normal(0, 0.3, (B, T)), -2.0, 2.0)).astype(F32)  # k3 stays unclamped
    sampling = (old + rng.normal(0, 0.2, (B, T))).astype(F32)
    adv = rng.normal(size=B).astype(F32)
    adv[2] = 0.0  # a group with equal rewards
    adv_tok = rng.normal(size=(B, T)).astype(F32)
    return dict(logp=logp, old=old, ref=ref, sampling=sampling, advantages=adv, adv_tok=adv_tok,
                completion_mask=cmask, tool_mask=tool)


DATA = {seed: _batch(seed, holes=seed == 1) for seed in (0, 1)}
DATA["empty"] = dict(DATA[0], completion_mask=DATA[0]["completion_mask"] * (np.arange(B) != 3)[:, None])
for _d in DATA.values():
    assert np.abs(_d["ref"] - _d["logp"]).max() <= 2.0 + 1e-6


def _mask(c):
    m = c["completion_mask"] if c["tool_mask"] is None else c["completion_mask"] * c["tool_mask"]
    return jnp.asarray(m, jnp.float32)


CASES: list[dict] = []


def case(cid, seed, *, trainer="grpo", beta=0.0, eps=(0.2, 0.2), on_policy=False, adv_tok=False, **kw):
    d = DATA[seed]
    c = dict(id=cid, trainer=trainer, beta=beta, eps_low=eps[0], eps_high=eps[1],
             max_completion_length=MAX_LEN, logp=d["logp"], completion_mask=d["completion_mask"],
             tool_mask=d["tool_mask"], old=None if on_policy else d["old"],
             ref=d["ref"] if beta else None, advantages=d["adv_tok"] if adv_tok else d["advantages"],
             adv_seq=d["advantages"], sampling=d["sampling"], **kw)
    CASES.append(c)


BETAS = [(0.0, False), (0.04, False), (0.04, True)]  # (beta, use_bias_correction_kl)
for seed in (0, 1):
    for lt, eps, (beta, bias) in itertools.product(PPO_TYPES, [(0.2, 0.2), (0.2, 0.28)], BETAS):
        case(f"{lt}-{seed}-eps{eps[1]}-b{beta}-bias{bias}", seed, loss_type=lt, eps=eps, beta=beta, bias_kl=bias)
    for lt, delta, (beta, bias) in itertools.product(("grpo", "dapo"), (1.3, 1.45), [BETAS[0], BETAS[2]]):
        case(f"{lt}-{seed}-delta{delta}-b{beta}", seed, loss_type=lt, eps=(0.2, 0.28), delta=delta, beta=beta,
             bias_kl=bias)
    for lt, (beta, bias) in itertools.product(("grpo", "dapo"), BETAS):
        case(f"{lt}-{seed}-onpolicy-b{beta}-bias{bias}", seed, loss_type=lt, on_policy=True, beta=beta,
             bias_kl=bias)
    for lt, (beta, bias) in itertools.product(("grpo", "dapo", "dr_grpo"), [BETAS[0], BETAS[2]]):
        case(f"{lt}-{seed}-tokadv-b{beta}", seed, loss_type=lt, adv_tok=True, beta=beta, bias_kl=bias)
    # GSPO / LUSPO: sequence-level importance ratio
    for lt, eps, (beta, bias) in itertools.product(PPO_TYPES, [(3e-4, 4e-4), (0.05, 0.08)], [BETAS[0], BETAS[2]]):
        case(f"seq-{lt}-{seed}-eps{eps[1]}-b{beta}", seed, loss_type=lt, level="sequence", eps=eps, beta=beta,
             bias_kl=bias)
    for eh, (beta, bias) in itertools.product((1.2, 5.0), BETAS):
        case(f"cispo-{seed}-eh{eh}-b{beta}-bias{bias}", seed, loss_type="cispo", eps=(0.2, eh), beta=beta,
             bias_kl=bias)
    for taus, (beta, bias) in itertools.product([(1.0, 1.05), (0.5, 2.0)], BETAS):
        case(f"sapo-{seed}-tau{taus}-b{beta}-bias{bias}", seed, loss_type="sapo", tau_pos=taus[0],
             tau_neg=taus[1], beta=beta, bias_kl=bias)
    for lt in ("grpo", "dapo"):
        case(f"opsm-{lt}-{seed}", seed, loss_type=lt, opsm=0.02, beta=0.04, bias_kl=True)
    # vLLM importance-sampling correction: (loss_type, level, TRL vllm_importance_sampling_mode)
    for lt, level, (is_level, lo, up) in [
            ("grpo", "token", ("token", None, 1.2)),         # token_truncate
            ("dapo", "token", ("token", 0.8, 1.25)),         # token_mask
            ("cispo", "token", ("sequence", None, 1.5)),     # sequence_truncate
            ("sapo", "token", ("sequence", 0.5, 2.0)),       # sequence_mask
            ("luspo", "sequence", ("token", None, 1.2)),
            ("grpo", "sequence", ("sequence", 0.5, 2.0))]:
        d = DATA[seed]
        w, _ = P.rollout_is_weights(d["old"], d["sampling"], _mask(d), level=is_level, upper=up, lower=lo)
        w = np.asarray(w, F32)
        is_ratio = w[:, :1] if is_level == "sequence" else w  # TRL's (B, 1) / (B, T) shapes
        case(f"vllm_is-{lt}-{level}-{is_level}-{lo}-{up}-{seed}", seed, loss_type=lt, level=level,
             eps=(0.2, 1.5) if lt == "cispo" else (0.2, 0.28), is_ratio=is_ratio, beta=0.04, bias_kl=True)
    for eps, beta in itertools.product([(0.4, 0.4), (0.1, 0.15)], (0.0, 0.04)):
        case(f"gmpo-{seed}-eps{eps}-b{beta}", seed, trainer="gmpo", eps=eps, beta=beta)


# A fully masked row (e.g. TRL's mask_truncated_completions): TRL's per-sequence means divide by
# all B rows, ours by the rows with a token (documented in aggregation.py for dr_grpo).
EMPTY_CASES = []
for lt in ("grpo", "sapo", "dr_grpo", "luspo", "bnpo", "dapo", "cispo"):
    case(f"empty-{lt}", "empty", loss_type=lt, eps=(0.2, 1.28 if lt == "cispo" else 0.28), beta=0.04, bias_kl=True)
    EMPTY_CASES.append(CASES.pop())


def ours(c, lp):
    """Our composition of the case's TRL loss; returns ``(loss, aux metrics)``."""
    m = _mask(c)
    old = lp if c["old"] is None else jnp.asarray(c["old"])  # on-policy: TRL uses logp.detach()
    adv = jnp.asarray(c["advantages"])
    if adv.ndim == 1:
        adv = jnp.broadcast_to(adv[:, None], lp.shape)
    level = c.get("level", "token")
    el, eh = c["eps_low"], c["eps_high"]
    w = None
    if c.get("is_ratio") is not None:
        w = jnp.broadcast_to(jnp.asarray(c["is_ratio"]), lp.shape)
    if c.get("opsm") is not None:
        keep, _ = P.rollout_rejection_mask(lp, old, m, mode="seq_mean_k1", upper=math.exp(c["opsm"]), lower=1e-30)
        keep = jnp.where(jnp.asarray(c["adv_seq"])[:, None] >= 0, 1.0, keep)
        w = keep if w is None else w * keep
    lt = c.get("loss_type")
    if c["trainer"] == "gmpo":
        pg, met = P.gmpo_loss(lp, old, adv, m, clip_low=el, clip_high=eh)
        lt = "grpo"  # GMPO averages per-sequence losses: seq-mean-token-mean
    elif lt == "cispo":
        pg, met = P.cispo_loss(lp, old, adv, m, clip_low=1.0, clip_high=eh - 1.0, is_weights=w)
    elif lt == "sapo":
        pg, met = P.sapo_loss(lp, old, adv, m, tau_pos=c.get("tau_pos", 1.0),
                               tau_neg=c.get("tau_neg", 1.05), is_weights=w)
    elif level == "sequence":
        pg, met = P.gspo_loss(lp, old, adv, m, clip_low=el, clip_high=eh, variant="sequence", is_weights=w)
    else:
        pg, met = P.ppo_clip_loss(lp, old, adv, m, clip_low=el, clip_high=eh, dual_clip=c.get("delta"),
                                  is_weights=w)
    total, aux = pg, {"clip_frac": met["clip_frac"]}
    if c["beta"]:
        kl = K.kl_penalty(lp, c["ref"], "k3")
        if c.get("bias_kl") and c["trainer"] == "grpo":  # TRL's use_bias_correction_kl: KL * ratio
            kl = kl * K.kl_importance_weight(lp, old, m, level=level)
        total = pg + c["beta"] * kl
        aux["kl"] = masked_mean(kl, m)
    horizon = c["max_completion_length"] if lt == "dr_grpo" else None
    return G.aggregate(total, m, AGG_OF[lt], horizon=horizon), aux


@pytest.fixture(scope="module")
def oracle():
    return run_oracle("trl_grpo_oracle.py", CASES + EMPTY_CASES)


@pytest.mark.parametrize("c", CASES, ids=[c["id"] for c in CASES])
def test_loss_and_grad_match_trl(oracle, c):
    ref = oracle[c["id"]]
    assert "error" not in ref, ref.get("error")
    (val, aux), grad = jax.value_and_grad(lambda lp: ours(c, lp), has_aux=True)(jnp.asarray(c["logp"]))
    np.testing.assert_allclose(float(val), ref["loss"], **TOL)
    np.testing.assert_allclose(np.asarray(grad), ref["grad"], **TOL)
    if c["trainer"] == "grpo" and c.get("loss_type") in PPO_TYPES and c.get("level", "token") == "token":
        np.testing.assert_allclose(float(aux["clip_frac"]), ref["metrics"]["clip_ratio/region_mean"], **TOL)
    if c["beta"]:
        np.testing.assert_allclose(float(aux["kl"]), ref["metrics"]["kl"], **TOL)


def test_cases_exercise_clipping_and_masking():
    """Guard against vacuous parity: clipping, the dual clip and OPSM must actually fire, and no
    sequence KL sits so close to the OPSM threshold that float32 could flip the decision."""
    def frac(c):
        return float(ours(c, jnp.asarray(c["logp"]))[1]["clip_frac"])
    by_id = {c["id"]: c for c in CASES}
    assert all(frac(by_id[f"grpo-{s}-eps0.28-b0.0-biasFalse"]) > 0.1 for s in (0, 1))
    for s in (0, 1):  # ratios beyond delta with negative advantages exist
        d = DATA[s]
        r = np.exp(d["logp"] - d["old"]) * np.asarray(_mask(d))
        assert ((r > 1.45) & (d["advantages"][:, None] < 0)).sum() >= 2
        c = by_id[f"opsm-grpo-{s}"]
        keep, _ = P.rollout_rejection_mask(c["logp"], c["old"], _mask(c), mode="seq_mean_k1",
                                           upper=math.exp(c["opsm"]), lower=1e-30)
        dropped = (np.asarray(keep).sum(-1) == 0) & (d["advantages"] < 0)
        assert dropped.sum() >= 1
        m = np.asarray(_mask(d), np.float64)
        seq_kl = ((d["old"] - d["logp"]) * m).sum(-1) / m.sum(-1)
        assert np.abs(seq_kl - c["opsm"]).min() > 1e-4
        assert ((seq_kl > c["opsm"]) & (d["advantages"] >= 0)).any()  # kept only by the A >= 0 gate


@pytest.mark.parametrize("c", EMPTY_CASES, ids=[c["id"] for c in EMPTY_CASES])
def test_all_masked_row_differs_only_by_row_count(oracle, c):
    """TRL's grpo/sapo/dr_grpo/luspo = ours * (rows with a token) / B; token-mean types agree."""
    ref = oracle[c["id"]]
    assert "error" not in ref, ref.get("error")
    (val, _), grad = jax.value_and_grad(lambda lp: ours(c, lp), has_aux=True)(jnp.asarray(c["logp"]))
    rows = float((c["completion_mask"].sum(-1) > 0).sum())
    scale = rows / B if AGG_OF[c["loss_type"]].startswith("seq-mean") else 1.0
    assert rows == B - 1
    np.testing.assert_allclose(float(val) * scale, ref["loss"], **TOL)
    np.testing.assert_allclose(np.asarray(grad) * scale, ref["grad"], **TOL)

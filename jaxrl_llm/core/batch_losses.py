"""Batch-coupled policy losses: objectives that are not sums of per-token terms.

Each loss maps a whole (mini-)batch to one scalar to *minimise*, ``(loss, metrics)``: DisCO's
and DRPO's log-sum-exp over a group's negatives and their batch-level KL constraint, BAPO's
batch-level search for clip bounds, Thinkless's two separately normalised terms, P3O's pairs,
HAPO's batch-normalised token entropy. They take the policy-loss arguments ``logp``,
``old_logp``, ``advantages``, ``mask`` (``[B, T]``; ``logp`` carries the gradient) and, where the
method needs them, ``scores [B]`` and ``group_ids [B]`` (dense ids ``< B``: the rows of one
prompt) or ``old_entropy [B, T]``.

The train step runs such a loss exactly for any micro-batch split (two passes: the log-probs of
every row, then the loss's gradient with respect to them, applied per micro-batch;
:class:`~jaxrl_llm.training.PolicyObjective` with ``coupled=True``), and the loop keeps the
groups of a prompt whole within each mini-batch. The aggregation is the method's own (each
docstring says which); the recipe's aggregation mode applies to its KL and entropy terms.

Values outside the mask never matter (inputs are selected to 0 there) and get zero gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks
from jaxrl_llm.core.aggregation import AGG_MODES, aggregate
from jaxrl_llm.core.policy_losses import _check_clip, _clipped_surrogate, _prep, ratio_metrics
from jaxrl_llm.core.stats import masked_mean, safe_divide

__all__ = [
    "bapo_bounds",
    "bapo_loss",
    "disco_loss",
    "drpo_loss",
    "thinkless_loss",
    "p3o_loss",
    "hapo_entropy_hat",
    "hapo_loss",
    "mdpo_loss",
    "hdpo_advantages",
    "hdpo_loss",
    "etr_loss",
    "r2vpo_loss",
    "r2vpo_dual_step",
    "vppo_loss",
]

sg = jax.lax.stop_gradient
_CLAMP = 20.0


def _ratio(lp, olp):
    return jnp.exp(jnp.clip(lp - olp, -_CLAMP, _CLAMP))


def _rows(m):
    return jnp.any(m > 0, axis=1)


def _no_is_weights(name, is_weights):
    if is_weights is not None:
        raise ValueError(f"{name}: per-token importance weights (recipe.is_weights) do not apply to a sequence-level "
                         f"objective; use recipe.rejection to drop mismatched tokens instead")


def _check_groups(group_ids, b):
    _checks.check_rank("group_ids", group_ids, 1)
    _checks.check_int("group_ids", group_ids)
    if _checks._shape(group_ids)[0] != b:
        raise ValueError(f"argument 'group_ids' must have shape ({b},), got {_checks._shape(group_ids)}")
    return jnp.clip(jnp.asarray(group_ids, jnp.int32), 0, b - 1)


# ----------------------------------------------------------------------------------------- BAPO


def _bapo_stats(ratio, adv, m, c_low, c_high, count):
    """``(P, N)``: the summed positive and negative contributions at bounds ``(c_low, c_high)``."""
    if count == "value":
        e = jnp.where(adv >= 0, adv * jnp.minimum(ratio, c_high), adv * jnp.maximum(ratio, c_low))
        return jnp.sum(m * jnp.maximum(e, 0.0)), jnp.sum(m * jnp.maximum(-e, 0.0))
    # count == "grad": only tokens whose gradient is not clipped away
    pos = (adv > 0) & (ratio < c_high)
    neg = (adv < 0) & (ratio > c_low)
    return jnp.sum(m * jnp.where(pos, ratio * adv, 0.0)), jnp.sum(m * jnp.where(neg, -ratio * adv, 0.0))


def bapo_bounds(logp, old_logp, advantages, mask, *, target: float = 0.4, target_kind: str = "share",
                low_start: float = 0.6, low_max: float = 0.9, low_step: float = 0.02, high_start: float = 1.2,
                high_max: float = 3.0, high_step: float = 0.05, order: str = "high_first", count: str = "value"
                ) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """BAPO's batch-level search for the ratio bounds ``(c_low, c_high)``.

    The contribution of a token at bounds ``(c_l, c_h)`` is ``e = A min(rho, c_h)`` for ``A >= 0``
    and ``A max(rho, c_l)`` for ``A < 0`` (the paper's Eq. 8 terms); ``P`` and ``N`` sum its
    positive and negative parts over the batch. Starting from ``(low_start, high_start)`` the
    bounds move in steps until the positive share ``P / (P + N)`` reaches ``target``
    (``target_kind="ratio"``: ``P / N``, the authors' code) or no step is left:
    ``order="high_first"`` (the paper's Algorithm 1: raise ``c_high`` by ``high_step`` up to
    ``high_max``, then ``c_low`` by ``low_step`` up to ``low_max``; the loop runs while a
    ``c_low`` step is left) or ``"low_first"`` (the released code). ``count="grad"`` counts only
    tokens whose gradient survives the clip (the paper's stated intent: admit low-probability
    positive tokens, filter low-probability negative ones); ``"value"`` counts clipped tokens at
    their clipped value (Eq. 8 as printed and the code), under which raising ``c_low`` can only
    lower the share.

    Paper: "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy
    Optimization with Adaptive Clipping" (Xi et al.), arXiv:2510.18927: Eq. 8, Algorithm 1 and
    §5 (``rho_0 = 0.4``, ``c_low`` in ``[0.6, 0.9]`` by 0.02, ``c_high`` in ``[1.2, 3.0]`` by 0.05: the
    defaults here). The released code (``WooooDyy/BAPO`` @7287044) raises ``c_low`` first toward
    a ratio target (its YAML: ratio 1, ``c_low`` 0.6 -> 0.8 by 0.05, ``c_high`` 1.2 -> 2.0 by 0.05).
    Steps are counted in integers, so ``0.6 + 15 * 0.02`` reaches 0.9 exactly.

    Returns:
      ``(c_low, c_high, share)`` float32 scalars (``share``: the final ``P / (P + N)``; 1 when the
      batch has no contribution), without gradient.
    """
    _checks.check_choice("target_kind", target_kind, ("share", "ratio"))
    _checks.check_choice("order", order, ("high_first", "low_first"))
    _checks.check_choice("count", count, ("value", "grad"))
    for name, lo, hi, step in (("low", low_start, low_max, low_step), ("high", high_start, high_max, high_step)):
        if not (hi >= lo and step > 0):
            raise ValueError(f"BAPO: {name}_max must be >= {name}_start and {name}_step > 0, got "
                             f"start={lo!r}, max={hi!r}, step={step!r}")
    if not low_max < 1.0 < high_start:
        raise ValueError(f"BAPO needs low_max < 1 < high_start (the bounds must bracket ratio 1), got "
                         f"low_max={low_max!r}, high_start={high_start!r}")
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask)
    ratio = sg(_ratio(lp, olp))
    n_low = int(round((low_max - low_start) / low_step))
    n_high = int(round((high_max - high_start) / high_step))

    def bounds(kl, kh):
        return (low_start + kl.astype(jnp.float32) * low_step, high_start + kh.astype(jnp.float32) * high_step)

    def met(kl, kh):
        p, n = _bapo_stats(ratio, adv, m, *bounds(kl, kh), count)
        if target_kind == "share":
            return jnp.where(p + n > 0, p / jnp.where(p + n > 0, p + n, 1.0), 1.0) >= target
        return jnp.where(n > 0, p / jnp.where(n > 0, n, 1.0), jnp.inf) >= target

    zero = jnp.zeros((), jnp.int32)
    if order == "high_first":
        def cond(c):
            kl, kh = c
            return (~met(kl, kh)) & (kl + 1 <= n_low)

        def body(c):
            kl, kh = c
            up = kh + 1 <= n_high
            return jnp.where(up, kl, kl + 1), jnp.where(up, kh + 1, kh)

        kl, kh = jax.lax.while_loop(cond, body, (zero, zero))
    else:
        kl = jax.lax.while_loop(lambda k: (~met(k, zero)) & (k < n_low), lambda k: k + 1, zero)
        kh = jax.lax.while_loop(lambda k: (~met(kl, k)) & (k < n_high), lambda k: k + 1, zero)
    c_low, c_high = bounds(kl, kh)
    p, n = _bapo_stats(ratio, adv, m, c_low, c_high, count)
    share = jnp.where(p + n > 0, safe_divide(p, p + n), 1.0)
    return sg(c_low), sg(c_high), sg(share)


def bapo_loss(logp, old_logp, advantages, mask, *, target: float = 0.4, target_kind: str = "share",
              low_start: float = 0.6, low_max: float = 0.9, low_step: float = 0.02, high_start: float = 1.2,
              high_max: float = 3.0, high_step: float = 0.05, order: str = "high_first", count: str = "value",
              dual_clip: float | None = None, is_weights=None):
    """BAPO: PPO's clipped surrogate with bounds searched per batch (:func:`bapo_bounds`).

    ``L = token-mean over the batch of max(-A rho, -A clip(rho, c_low, c_high))`` with the
    searched ``(c_low, c_high)`` held constant (no gradient through the search); ``dual_clip``
    caps negative-advantage tokens as in :func:`~jaxrl_llm.core.ppo_clip_loss` (the paper's
    objective has none; the released code uses 3.0). Token-mean aggregation (the code's). With no
    room to move (``low_start = low_max``, ``high_start = high_max``) this is PPO with
    ``clip_low = 1 - low_start``, ``clip_high = high_start - 1``.

    Paper: "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy
    Optimization with Adaptive Clipping" (Xi et al.), arXiv:2510.18927.

    Returns:
      ``(loss scalar, metrics)`` with ``bapo_c_low``, ``bapo_c_high``, ``bapo_pos_share`` and the
      common ratio metrics.
    """
    if dual_clip is not None:
        _check_clip(0.0, 0.0, dual_clip)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    c_low, c_high, share = bapo_bounds(lp, olp, adv, m, target=target, target_kind=target_kind,
                                       low_start=low_start, low_max=low_max, low_step=low_step, high_start=high_start,
                                       high_max=high_max, high_step=high_step, order=order, count=count)
    ratio = _ratio(lp, olp)
    per, met = _clipped_surrogate(ratio, jnp.clip(ratio, c_low, c_high), adv, m, 1.0 - c_low, c_high - 1.0,
                                  dual_clip)
    if is_weights is not None:
        per = per * sg(_checks.zero_outside(_checks.as_float(is_weights), m))
    loss = safe_divide(jnp.sum(jnp.where(m > 0, per, 0.0)), jnp.sum(m))
    return loss, {**met, **ratio_metrics(lp - olp, m), "bapo_c_low": c_low, "bapo_c_high": c_high,
                  "bapo_pos_share": share}


# ----------------------------------------------------------------------------------------- DisCO / DRPO


def _kl_constraint(lp, olp, m, kind, beta, delta):
    """``((beta / 2) max(kappa - delta, 0)^2, kappa)``: kappa the token mean over the batch of
    ``old - logp`` (``"kl"``) or ``rho - 1 - log rho`` (``"low_var_kl"``)."""
    if kind == "kl":
        k = olp - lp
    else:
        d = jnp.clip(lp - olp, -_CLAMP, _CLAMP)
        k = jnp.exp(d) - 1.0 - d
    kappa = safe_divide(jnp.sum(k * m), jnp.sum(m))
    return 0.5 * beta * jnp.square(jnp.maximum(kappa - delta, 0.0)), kappa


def _disco_scores(lp, olp, m, score):
    length = jnp.sum(m, axis=1)
    x = lp if score == "logL" else _ratio(lp, olp)
    return safe_divide(jnp.sum(x * m, axis=1), length), length


def _discriminative(s, scores, valid, gid, b, tau, kind, pos_weight=None):
    """Per-group ``J_q`` and the number of groups: ``mean_pos s - tau log mean_neg exp(s / tau)``
    (``kind="disco"``) or ``mean_pos s - mean_neg s`` (``"disco_b"``); positives optionally
    weighted (DRPO). Groups without both a positive and a negative give 0."""
    pos = valid & (scores == 1.0)
    neg = valid & (scores == 0.0)
    fp, fn = pos.astype(jnp.float32), neg.astype(jnp.float32)
    n_pos = jax.ops.segment_sum(fp, gid, b)
    n_neg = jax.ops.segment_sum(fn, gid, b)
    if kind == "disco":
        z = jnp.where(neg, s / tau, -jnp.inf)
        mx = jax.ops.segment_max(z, gid, b)
        mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
        se = jax.ops.segment_sum(jnp.where(neg, jnp.exp(z - mx[gid]), 0.0), gid, b)
        neg_term = tau * (jnp.log(jnp.where(se > 0, se, 1.0)) + mx - jnp.log(jnp.maximum(n_neg, 1.0)))
    else:
        neg_term = safe_divide(jax.ops.segment_sum(s * fn, gid, b), n_neg)
    w = fp if pos_weight is None else jnp.where(pos, pos_weight, 0.0)
    w_sum = jax.ops.segment_sum(w, gid, b)
    pos_term = safe_divide(jax.ops.segment_sum(w * s, gid, b), w_sum)
    live = (n_pos > 0) & (n_neg > 0)
    j = jnp.where(live, pos_term - neg_term, 0.0)
    n_groups = jnp.sum((jax.ops.segment_sum(valid.astype(jnp.float32), gid, b) > 0).astype(jnp.float32))
    return j, live, n_groups


def disco_loss(logp, old_logp, advantages, mask, *, scores, group_ids, score: str = "logL",
               objective: str = "disco", tau: float | None = None, beta: float = 1e3, delta: float = 1e-4,
               kl: str = "kl", is_weights=None):
    """DisCO: a discriminative objective per prompt with a squared-hinge KL constraint, no clipping.

    Per prompt group with at least one positive (``score == 1``) and one negative (``score == 0``)
    response, with ``s_i`` the length-normalised log-likelihood (``score="logL"``) or ratio
    (``"Lratio"``: ``mean_t exp(logp - old_logp)``)::

        J_q = mean_{i in pos} s_i - tau log mean_{j in neg} exp(s_j / tau)     (objective="disco")
        J_q = mean_{i in pos} s_i - mean_{j in neg} s_j                         (objective="disco_b")
        loss = -(1/Q) sum_q J_q + (beta / 2) max(kappa - delta, 0)^2

    ``Q`` counts every group of the batch (groups that are all right or all wrong contribute 0 but
    count, as the code divides by the number of distinct prompts); ``kappa`` is the token mean of
    ``old_logp - logp`` over the batch (``kl="kl"``; ``"low_var_kl"``: ``rho - 1 - log rho``). Each
    question's gradient has total positive weight 1 and negative weight 1 whatever its accuracy:
    GRPO's difficulty bias (``sqrt(p (1 - p))``) is gone. The advantages are not used.

    Paper: "DisCO: Reinforcing Large Reasoning Models with Discriminative Constrained Optimization"
    (Li et al.), arXiv:2505.12366; the authors' code (``Optimization-AI/DisCO`` @bd2b078,
    ``compute_policy_loss_disco_logL``) optimises a stop-gradient surrogate with the same gradient
    (its value differs by a constant); the constraint term there is ``sg(beta max(kappa - delta,
    0)) kappa``, whose gradient is that of ``(beta / 2) max(kappa - delta, 0)^2`` used here.
    Defaults: the scripts' ``delta = 1e-4``, ``beta = 1e3``, ``kl="kl"``; ``tau`` is 10 for
    ``logL`` and 1 for ``Lratio``. Scores other than 0 and 1 are neither positive nor negative
    (map +-1 rewards first). Limits: ``tau -> inf`` gives DisCO-b.

    Args:
      logp, old_logp, advantages, mask: ``[B, T]`` (advantages unused). scores: ``[B]`` binary
        rewards. group_ids: ``[B]`` dense prompt ids ``< B``.
      score: ``"logL"`` or ``"Lratio"``. objective: ``"disco"`` or ``"disco_b"``. tau: the
        temperature (``None``: 10 for logL, 1 for Lratio). beta, delta: the constraint.
      kl: ``"kl"`` or ``"low_var_kl"``. is_weights: optional ``[B, T]`` per-token weights.

    Returns:
      ``(loss scalar, metrics)``: ``disco_objective`` (mean ``J_q``), ``disco_kl`` (kappa),
      ``disco_groups`` (groups with both signs), and the ratio metrics.
    """
    _no_is_weights("disco", is_weights)
    _checks.check_choice("score", score, ("logL", "Lratio"))
    _checks.check_choice("objective", objective, ("disco", "disco_b"))
    _checks.check_choice("kl", kl, ("kl", "low_var_kl"))
    tau = (10.0 if score == "logL" else 1.0) if tau is None else tau
    _checks.check_positive("tau", tau)
    lp, olp, _, m = _prep(logp, old_logp, advantages, mask, is_weights)
    b = lp.shape[0]
    gid = _check_groups(group_ids, b)
    _checks.check_seq_args(b, scores=scores)
    s, _ = _disco_scores(lp, olp, m, score)
    valid = _rows(m)
    r = sg(_checks.as_float(scores))
    j, live, n_groups = _discriminative(s, r, valid, gid, b, tau, objective)
    penalty, kappa = _kl_constraint(lp, olp, m, kl, beta, delta)
    loss = -safe_divide(jnp.sum(j), n_groups) + penalty
    return loss, {"disco_objective": sg(safe_divide(jnp.sum(j), jnp.sum(live.astype(jnp.float32)))),
                  "disco_kl": sg(kappa), "disco_groups": jnp.sum(live.astype(jnp.float32)),
                  **ratio_metrics(lp - olp, m), "clip_frac": jnp.zeros(()), "clip_frac_lower": jnp.zeros(())}


def _response_width(m):
    """The response width of target-aligned rows: columns from the first response position of
    the batch (every response starts right after the bucketed prompt) to the end."""
    t = m.shape[1]
    first = jnp.where(jnp.any(m > 0, axis=1), jnp.argmax(m > 0, axis=1), t)
    return (t - jnp.min(first)).astype(jnp.float32)


def drpo_loss(logp, old_logp, advantages, mask, *, scores, group_ids, lam: float = 0.1, tau: float = 10.0,
              beta: float = 1e3, delta: float = 1e-4, kl: str = "kl", max_length: float | None = None,
              is_weights=None):
    """DRPO: DisCO-logL with length weights among the correct responses only.

    ``w_i = exp((1 - L_i / L_max) / lam)`` for positives, normalised within the group's positives::

        J_q = sum_{i in pos} w_i (s_i - tau log mean_{j in neg} exp(s_j / tau)) / sum_{i in pos} w_i
        loss = -(1/Q) sum_q J_q + (beta / 2) max(kappa - delta, 0)^2

    with ``s_i`` the mean token log-prob and the rest as :func:`disco_loss`. A correct response is
    never pushed down, whatever its length (its gradient weight ``w_i / sum w`` is positive);
    shorter correct responses get more of the push up. ``lam -> inf`` gives DisCO-logL.

    Paper: "DRPO: Efficient Reasoning via Decoupled Reward Policy Optimization", arXiv:2510.04474;
    the authors' code (``Optimization-AI/DRPO`` @405f702, ``compute_policy_loss_drpo``) and script:
    ``lam = 0.1``, ``tau = 10``, ``delta = 1e-4``, ``beta = 1e3``, ``L_max`` the padded response width
    (``max_length=None``: the batch's response width, i.e. the sampler's ``max_new_tokens`` in the
    loop's layout where every response starts after the bucketed prompt).

    Returns:
      ``(loss scalar, metrics)`` as :func:`disco_loss` (``drpo_*`` names).
    """
    _no_is_weights("drpo", is_weights)
    _checks.check_choice("kl", kl, ("kl", "low_var_kl"))
    _checks.check_positive("lam", lam)
    _checks.check_positive("tau", tau)
    lp, olp, _, m = _prep(logp, old_logp, advantages, mask, is_weights)
    b = lp.shape[0]
    gid = _check_groups(group_ids, b)
    _checks.check_seq_args(b, scores=scores)
    s, length = _disco_scores(lp, olp, m, "logL")
    width = _response_width(m) if max_length is None else jnp.asarray(max_length, jnp.float32)
    valid = _rows(m)
    # the weights are normalised within each group's positives: subtract the group's largest
    # exponent first (exp((1 - L / L_max) / lam) overflows float32 for lam below ~0.011)
    z = (1.0 - length / jnp.maximum(width, 1.0)) / lam
    pos = valid & (sg(_checks.as_float(scores)) == 1.0)
    zmax = jax.ops.segment_max(jnp.where(pos, z, -jnp.inf), gid, b)
    w = sg(jnp.where(pos, jnp.exp(z - jnp.where(jnp.isfinite(zmax), zmax, 0.0)[gid]), 0.0))
    j, live, n_groups = _discriminative(s, sg(_checks.as_float(scores)), valid, gid, b, tau, "disco", pos_weight=w)
    penalty, kappa = _kl_constraint(lp, olp, m, kl, beta, delta)
    loss = -safe_divide(jnp.sum(j), n_groups) + penalty
    return loss, {"drpo_objective": sg(safe_divide(jnp.sum(j), jnp.sum(live.astype(jnp.float32)))),
                  "drpo_kl": sg(kappa), "drpo_groups": jnp.sum(live.astype(jnp.float32)),
                  **ratio_metrics(lp - olp, m), "clip_frac": jnp.zeros(()), "clip_frac_lower": jnp.zeros(())}


# ----------------------------------------------------------------------------------------- Thinkless


def thinkless_loss(logp, old_logp, advantages, mask, *, alpha: float = 1e-3, clip_low: float = 0.2,
                   clip_high: float | None = None, dual_clip: float | None = None, is_weights=None):
    """Thinkless / DeGRPO: the mode-control token and the response trained with separate weights.

    With ``l`` the per-token clipped PPO loss, the first response token of each row (the control
    token ``<short>`` / ``<think>``) and the rest are averaged separately over the batch::

        L = alpha * mean_{rows} l_{i,0} + (sum_{i, t >= 1} l_{i,t}) / (number of tokens t >= 1)

    so the one-token mode decision is not drowned by (or does not dominate) long responses.

    Paper: "Thinkless: LLM Learns When to Think" (Fang et al.), arXiv:2505.13379; the authors'
    code (``VainF/Thinkless`` @aa225d2, ``compute_policy_loss``): ``alpha = 0.001`` (1/1000), clip
    0.2, no dual clip (verl's default then). The reward table (short-correct 1, think-correct 0.5,
    wrong -1) is the ``thinkless`` reward shaping, the advantages Dr.GRPO's (the script's
    ``std_normalizer=False``).

    Returns:
      ``(loss scalar, metrics)``: ``thinkless_control_loss``, ``thinkless_response_loss`` and the
      clip and ratio metrics.
    """
    _checks.check_positive("alpha", alpha, allow_zero=True)
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high, dual_clip)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    ratio = _ratio(lp, olp)
    per, met = _clipped_surrogate(ratio, jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high), adv, m, clip_low,
                                  clip_high, dual_clip)
    if is_weights is not None:
        per = per * sg(_checks.zero_outside(_checks.as_float(is_weights), m))
    per = jnp.where(m > 0, per, 0.0)
    t = m.shape[1]
    first = jnp.argmax(m > 0, axis=1)
    ctrl = ((jnp.arange(t)[None] == first[:, None]) & (m > 0)).astype(jnp.float32)
    resp = m * (1.0 - ctrl)
    control = safe_divide(jnp.sum(per * ctrl), jnp.sum(ctrl))
    response = safe_divide(jnp.sum(per * resp), jnp.sum(resp))
    return alpha * control + response, {**met, **ratio_metrics(lp - olp, m), "thinkless_control_loss": sg(control),
                                        "thinkless_response_loss": sg(response)}


# ----------------------------------------------------------------------------------------- P3O


def p3o_loss(logp, old_logp, advantages, mask, *, scores, group_ids, clip: float = 0.2, variant: str = "separate",
             is_weights=None):
    """P3O: pairwise PPO on trajectory-level ratios and reward differences.

    For every unordered pair ``(i, j)`` of responses to one prompt, ``Delta = r_i - r_j`` and the
    trajectory ratios ``rho_i = exp(sum_t (logp - old_logp))``::

        separate:  L_ij = max(-Delta/2 rho_i, -Delta/2 clip(rho_i)) + max(Delta/2 rho_j, Delta/2 clip(rho_j))
        joint:     L_ij = max(-Delta/2 rho_ij, -Delta/2 clip(rho_ij)),   rho_ij = rho_i / rho_j

    (``clip(x) = clip(x, 1 - clip, 1 + clip)``), averaged over the pairs of the batch. Only reward
    differences enter: the loss is invariant to a per-prompt shift of the rewards. At
    ``theta = theta_old`` both variants have the gradient ``-Delta/2 grad(log pi(y_i) - log pi(y_j))``,
    the paper's pairwise policy gradient (with two samples, RLOO's gradient).

    Paper: "Pairwise Proximal Policy Optimization: Harnessing Relative Feedback for LLM Alignment"
    (Wu et al.), arXiv:2310.00212. No code was released; the pairwise gradient is the paper's, the
    two clipped forms (per-response and joint ratio) are our reading of its V1 / V2 description
    (check §4 of the paper before relying on the clipped regime). The KL control of the paper is
    the recipe's KL term. Pairs are formed within ``group_ids``; groups of one give no pair.

    Returns:
      ``(loss scalar, metrics)``: ``p3o_pairs``, ``p3o_clip_frac`` and the ratio metrics.
    """
    _no_is_weights("p3o", is_weights)
    _checks.check_choice("variant", variant, ("separate", "joint"))
    _checks.check_positive("clip", clip)
    lp, olp, _, m = _prep(logp, old_logp, advantages, mask, is_weights)
    b = lp.shape[0]
    gid = _check_groups(group_ids, b)
    _checks.check_seq_args(b, scores=scores)
    r = sg(_checks.as_float(scores))
    valid = _rows(m)
    log_rho = jnp.clip(jnp.sum((lp - olp) * m, axis=1), -_CLAMP, _CLAMP)    # [B] trajectory log-ratios
    pair = (gid[:, None] == gid[None]) & valid[:, None] & valid[None] & (jnp.arange(b)[:, None] < jnp.arange(b)[None])
    half = 0.5 * (r[:, None] - r[None])                                     # Delta / 2 for (i, j)
    lo, hi = 1.0 - clip, 1.0 + clip

    def clipped(a, x):  # max(-a x, -a clip(x))
        return jnp.maximum(-a * x, -a * jnp.clip(x, lo, hi))

    if variant == "separate":
        rho = jnp.exp(log_rho)
        term = clipped(half, rho[:, None]) + clipped(-half, rho[None])
        clipped_frac = (jnp.clip(rho[:, None], lo, hi) != rho[:, None]) | (jnp.clip(rho[None], lo, hi) != rho[None])
    else:
        rho_ij = jnp.exp(jnp.clip(log_rho[:, None] - log_rho[None], -_CLAMP, _CLAMP))
        term = clipped(half, rho_ij)
        clipped_frac = jnp.clip(rho_ij, lo, hi) != rho_ij
    fp = pair.astype(jnp.float32)
    n_pairs = jnp.sum(fp)
    loss = safe_divide(jnp.sum(jnp.where(pair, term, 0.0)), n_pairs)
    return loss, {"p3o_pairs": n_pairs, "p3o_clip_frac": safe_divide(jnp.sum(fp * clipped_frac), n_pairs),
                  **ratio_metrics(lp - olp, m), "clip_frac": jnp.zeros(()), "clip_frac_lower": jnp.zeros(())}


# ----------------------------------------------------------------------------------------- HAPO


def hapo_entropy_hat(old_entropy, mask, *, pivot: float = 0.8, sign: str = "paper"):
    """HAPO's normalised token entropy ``ĥ`` over the batch's response tokens.

    ``l = log max(H, 1e-8)``; ``h = l - Q_pivot(l)`` (the ``pivot``-quantile of ``l`` over the
    masked tokens, "nearest" rank ``round(pivot (n - 1))``); ``h /= sqrt(max(mean h^2, 1e-8))``
    (an RMS about the pivot); then ``ĥ = h / max(h)`` where ``h > 0`` and ``h / |min(h)|`` where
    ``h <= 0``, so ``ĥ in [-1, 1]``, negative for low-entropy tokens (``sign="paper"``). The
    authors' code divides the non-positive side by ``min(h)`` itself, giving ``ĥ >= 0`` everywhere
    (``sign="code"`` reproduces it).

    Paper: "From Uniform to Heterogeneous: Tailoring Policy Optimization to Every Token's Nature"
    (HAPO), arXiv:2509.16591; code ``starriver030515/HAPO`` @7671dde (``compute_entropy_h``):
    pivot 0.8 (its recipe). Returns ``[B, T]`` float32, 0 outside the mask, no gradient.
    """
    _checks.check_token_args(old_entropy=old_entropy, mask=mask)
    _checks.check_choice("sign", sign, ("paper", "code"))
    m = _checks.as_mask(mask)
    ell = jnp.log(jnp.maximum(_checks.zero_outside(_checks.as_float(old_entropy), m, 1.0), 1e-8))
    n = jnp.sum(m)
    flat = jnp.where(m > 0, ell, jnp.inf).reshape(-1)
    srt = jnp.sort(flat)
    k = jnp.clip(jnp.round(pivot * (n - 1.0)).astype(jnp.int32), 0, flat.shape[0] - 1)
    med = jnp.where(n > 0, srt[k], 0.0)
    h = jnp.where(m > 0, ell - med, 0.0)
    h = h / jnp.sqrt(jnp.maximum(safe_divide(jnp.sum(h * h * m), n), 1e-8))
    p = jnp.maximum(jnp.max(jnp.where(m > 0, h, 0.0)), 1e-8)
    q = jnp.minimum(jnp.min(jnp.where(m > 0, h, 0.0)), -1e-8)
    hat = jnp.where(h > 0, h / p, h / (jnp.abs(q) if sign == "paper" else q))
    return sg(jnp.where(m > 0, hat, 0.0))


def hapo_loss(logp, old_logp, advantages, mask, *, old_entropy, pivot: float = 0.8, clip_low: float = 0.2,
              clip_high: float = 0.2, clip_alpha: float = 1.0, adv_beta: float = 1.0, dual_clip: float | None = 10.0,
              sign: str = "paper", is_weights=None):
    """HAPO's entropy-adaptive clipping and differential advantage redistribution.

    With ``ĥ`` from :func:`hapo_entropy_hat` (over the batch's response tokens):

    - **asymmetric adaptive clipping**: ``eps_low,t = clip_low (1 - clip_alpha ĥ)`` where
      ``ĥ <= 0`` (low-entropy tokens may fall further), ``eps_high,t = clip_high (1 + clip_alpha
      ĥ)`` where ``ĥ > 0`` (high-entropy tokens may rise further), the base bounds elsewhere;
    - **advantage redistribution**: ``A^e = A (1 + adv_beta ĥ)``; a high-entropy token
      (``ĥ > 0``) uses ``A`` inside the neutral band ``1 - eps_low,t / 2 < rho < 1 + eps_high,t / 2``
      and ``A^e`` outside it, a low-entropy token the reverse;

    then the dual-clipped PPO surrogate with those per-token bounds, token-mean over the batch.

    Paper: "From Uniform to Heterogeneous: Tailoring Policy Optimization to Every Token's Nature"
    (HAPO), arXiv:2509.16591; code ``starriver030515/HAPO`` @7671dde (``ada_clip``,
    ``ada_advantage``, ``compute_policy_loss``) and its recipe: ``clip_alpha = adv_beta = 1``,
    ``clip_low = clip_high = 0.2``, dual clip 10, pivot 0.8, token-mean. The code computes ``ĥ``
    per micro-batch from the current policy's entropy with the sign issue of
    :func:`hapo_entropy_hat`; we use the sampling policy's entropy over the whole mini-batch and
    the paper's sign (``sign="code"`` for the released behaviour). The token-level group average
    advantages are the ``hapo`` estimator.

    Returns:
      ``(loss scalar, metrics)``: clip and ratio metrics, ``hapo_entropy_hat_mean``.
    """
    if dual_clip is not None:
        _check_clip(0.0, 0.0, dual_clip)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    hat = hapo_entropy_hat(old_entropy, m, pivot=pivot, sign=sign)
    eps_lo = jnp.where(hat <= 0, clip_low * (1.0 - clip_alpha * hat), clip_low)
    eps_hi = jnp.where(hat > 0, clip_high * (1.0 + clip_alpha * hat), clip_high)
    ratio = _ratio(lp, olp)
    r0 = sg(ratio)
    inside = (r0 > 1.0 - eps_lo / 2.0) & (r0 < 1.0 + eps_hi / 2.0)
    a_e = adv * (1.0 + adv_beta * hat)
    a = jnp.where(hat > 0, jnp.where(inside, adv, a_e), jnp.where(inside, a_e, adv))
    per, met = _clipped_surrogate(ratio, jnp.clip(ratio, 1.0 - eps_lo, 1.0 + eps_hi), sg(a), m, clip_low, clip_high,
                                  dual_clip)
    if is_weights is not None:
        per = per * sg(_checks.zero_outside(_checks.as_float(is_weights), m))
    loss = safe_divide(jnp.sum(jnp.where(m > 0, per, 0.0)), jnp.sum(m))
    return loss, {**met, **ratio_metrics(lp - olp, m), "hapo_entropy_hat_mean": masked_mean(hat, m)}


# ----------------------------------------------------------------------------------------- MDPO (per token)


def mdpo_loss(logp, old_logp, advantages, mask, *, t: float = 1.0, is_weights=None):
    """MDPO: the importance-weighted advantage with a mirror-descent KL to the sampling policy.

    ``L_t = -rho_t A_t + (1 / t) (rho_t log rho_t - rho_t + 1)``, per token, no clipping: the second
    term is a non-negative, low-variance sample estimate of ``KL(pi_theta || pi_old)`` (the
    mirror-descent direction, ``E_old[rho log rho]``, minus the zero-mean ``rho - 1``). ``t`` is the
    step size ``t_k``; the paper anneals it ``t_k = 1 - k / K`` over training (pass the scheduled
    value; the loop keeps it fixed), and several SGD steps run on each batch
    (``recipe.epochs``). At ``theta = theta_old`` the KL term and its gradient are 0.

    Paper: "Mirror Descent Policy Optimization" (Tomar, Shani, Efroni and Ghavamzadeh),
    arXiv:2005.09814; code ``manantomar/Mirror-Descent-Policy-Optimization`` @c9bd3ba
    (``mdpo_on``, ``KL(pi_theta || pi_old)``). The paper is on continuous control; the per-token
    estimator is our port to token-level policies (the code uses the exact Gaussian KL).

    Returns:
      ``(per_token [B, T], metrics)`` (aggregate with the recipe's mode), ``mdpo_kl`` the mean KL
      estimate.
    """
    _checks.check_positive("t", t)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    d = jnp.clip(lp - olp, -_CLAMP, _CLAMP)
    ratio = jnp.exp(d)
    kl = ratio * d - ratio + 1.0
    per = -adv * ratio + kl / t
    if is_weights is not None:
        per = per * sg(_checks.zero_outside(_checks.as_float(is_weights), m))
    return jnp.where(m > 0, per, 0.0), {**ratio_metrics(lp - olp, m), "clip_frac": jnp.zeros(()),
                                        "clip_frac_lower": jnp.zeros(()), "mdpo_kl": sg(masked_mean(kl, m))}


# ----------------------------------------------------------------------------------------- HDPO (Metis)


def hdpo_advantages(answer: jnp.ndarray, fmt: jnp.ndarray, calls: jnp.ndarray, group_ids: jnp.ndarray,
                    num_groups: int, *, answer_weight: float = 0.9, correct_threshold: float = 1.0,
                    epsilon: float = 1e-6, valid: jnp.ndarray | None = None) -> tuple[jnp.ndarray, jnp.ndarray]:
    """HDPO's two advantage channels: accuracy, and tool efficiency among the correct only.

    ``r_acc = answer_weight r_ans + (1 - answer_weight) r_fmt`` and ``A_acc = GRPO(r_acc)``;
    ``r_tool = 1 / (T + 1)`` for a correct answer (``r_ans >= correct_threshold``, ``T`` its tool
    calls), 0 otherwise, and ``A_tool`` is GRPO's normalisation of ``r_tool`` *within the group's
    correct rows only* (unbiased std; fewer than two correct rows, or rows outside them: 0). The
    efficiency signal never competes with correctness: a wrong answer gets no tool credit.

    Paper: "Act Wisely: Cultivating Meta-Cognitive Tool Use in Agentic Multimodal Models" (Metis,
    HDPO), arXiv:2604.08545; the authors' code (``Accio-Lab/Metis`` @84fd45e,
    ``reward_manager/metis.py``, ``compute_hdpo_advantage``): 0.9 / 0.1, ``1 / (T + 1)``.

    Returns:
      ``(A_acc [B], A_tool [B])`` float32, no gradient.
    """
    b = _checks._shape(answer)[0]
    _checks.check_seq_args(b, answer=answer, fmt=fmt, calls=calls)
    _checks.check_groups(group_ids, num_groups, b)
    v = jnp.ones((b,), jnp.float32) if valid is None else _checks.as_mask(valid)
    from jaxrl_llm.core.stats import group_stats

    ans = _checks.as_float(answer)
    r_acc = answer_weight * ans + (1.0 - answer_weight) * _checks.as_float(fmt)
    st = group_stats(jnp.where(v > 0, r_acc, 0.0), group_ids, num_groups, v)
    single = st.count <= 1
    a_acc = safe_divide(r_acc - jnp.where(single, 0.0, st.mean), jnp.where(single, 1.0, st.std) + epsilon)
    ok = (ans >= correct_threshold) & (v > 0)
    r_tool = jnp.where(ok, 1.0 / (jnp.maximum(_checks.as_float(calls), 0.0) + 1.0), 0.0)
    sq = group_stats(r_tool, group_ids, num_groups, ok.astype(jnp.float32))
    a_tool = jnp.where(ok & (sq.count >= 2), safe_divide(r_tool - sq.mean, sq.std + epsilon), 0.0)
    return sg(jnp.where(v > 0, a_acc, 0.0)), sg(a_tool)


def hdpo_loss(logp, old_logp, advantages, mask, *, tool_advantages, w_acc: float = 1.0, w_tool: float = 0.15,
              clip_low: float = 0.2, clip_high: float | None = None, dual_clip: float | None = 3.0,
              is_weights=None):
    """HDPO: two clipped surrogates, one per advantage channel, each with its own token mean.

    ``L = w_acc mean_{tokens} l(A_acc) + w_tool mean_{tokens of rows with A_tool != 0} l(A_tool)``
    with ``l`` the (dual-)clipped PPO loss (``advantages`` are ``A_acc`` per token,
    ``tool_advantages [B]`` per row, :func:`hdpo_advantages`). The tool term is normalised only over
    the rows it concerns, so it does not shrink as fewer answers are correct.

    Paper: "Act Wisely: Cultivating Meta-Cognitive Tool Use in Agentic Multimodal Models" (HDPO),
    arXiv:2604.08545; code ``Accio-Lab/Metis`` @84fd45e (``hdpo_actor.py``, ``train_metis.sh``):
    ``w_acc = 1``, ``w_tool = 0.15``, clip 0.2, verl's dual clip 3, token-mean.

    Returns:
      ``(loss scalar, metrics)``: ``hdpo_acc_loss``, ``hdpo_tool_loss``, ``hdpo_tool_rows`` and the
      ratio metrics.
    """
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high, dual_clip)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    b = lp.shape[0]
    _checks.check_seq_args(b, tool_advantages=tool_advantages)
    ratio = _ratio(lp, olp)
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    w = None if is_weights is None else sg(_checks.zero_outside(_checks.as_float(is_weights), m))

    def term(a, mm):
        per, met = _clipped_surrogate(ratio, clipped, a, mm, clip_low, clip_high, dual_clip)
        if w is not None:
            per = per * w
        return safe_divide(jnp.sum(jnp.where(mm > 0, per, 0.0)), jnp.sum(mm)), met

    acc, met = term(adv, m)
    at = sg(_checks.as_float(tool_advantages))
    rows = (at != 0).astype(m.dtype)
    tool, _ = term(at[:, None] * m, m * rows[:, None])
    return w_acc * acc + w_tool * tool, {**met, **ratio_metrics(lp - olp, m), "hdpo_acc_loss": sg(acc),
                                         "hdpo_tool_loss": sg(tool), "hdpo_tool_rows": jnp.sum(rows)}


# ----------------------------------------------------------------------------------------- ETR


def etr_loss(logp, old_logp, advantages, mask, *, scores, group_ids, alpha: float, beta: float,
             clip_low: float = 0.2, clip_high: float | None = None, adv_cap: float = 3.0, max_clip: float = 0.9,
             dual_clip: float | None = 3.0, agg: str = "seq-mean-token-mean", is_weights=None):
    """ETR: PPO's clip range made elastic per sample, by its advantage and its group's pass rate.

    For row ``i`` of prompt group ``g`` with pass rate ``p_g`` (the mean of the group's scores,
    clipped to ``[0, 1]``, over its rows with a response) and token advantage ``A_t``:

    ``s_t = (1 + alpha min(|A_t|, adv_cap)) (1 + beta 4 p_g (1 - p_g))``,
    ``eps_low,t = min(clip_low s_t, max_clip)``, ``eps_high,t = min(clip_high s_t, max_clip)``,

    then the (dual-)clipped PPO surrogate with those bounds, aggregated with ``agg``. The
    *micro* factor widens the trust region of high-confidence (large ``|A|``) samples; the
    *macro* factor gives prompts in the "optimal learning zone" (``p`` near 1/2, where the
    Bernoulli variance ``p (1 - p)`` peaks, normalised to 1 by the factor 4) a larger update
    budget, and none extra to prompts the policy always or never solves.

    Paper: Zhang et al., "ETR: Outcome-Guided Elastic Trust Regions for Policy Optimization",
    arXiv:2601.03723. Only the abstract was available to us (no code released): the two
    elasticities (clip bounds scaled by advantage magnitude; by group variance) are the paper's;
    the multiplicative form, the cap of ``|A|`` at ``adv_cap``, the normalisation ``4 p (1 - p)``
    and ``max_clip`` are this library's reading, and ``alpha`` / ``beta`` have no default (the
    paper's values were not found). Identity: ``alpha = beta = 0`` is PPO's clipped surrogate
    (GRPO's with ``agg="seq-mean-token-mean"``).

    Returns:
      ``(loss scalar, metrics)``: clip and ratio metrics, ``etr_eps_low_mean``,
      ``etr_eps_high_mean``, ``etr_pass_var_mean`` (mean ``4 p (1 - p)`` over rows).
    """
    for name, v in (("alpha", alpha), ("beta", beta), ("adv_cap", adv_cap)):
        _checks.check_positive(name, v, allow_zero=True)
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high, dual_clip)
    if not 0.0 < float(max_clip) <= 1.0:
        raise ValueError(f"argument 'max_clip' must be in (0, 1] (1 - eps_low must stay >= 0), got {max_clip!r}")
    if agg not in AGG_MODES:
        raise ValueError(f"argument 'agg' must be one of {AGG_MODES}, got {agg!r}")
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    b = lp.shape[0]
    gid = _check_groups(group_ids, b)
    rows = _rows(m).astype(jnp.float32)
    s = jnp.clip(_checks.as_float(scores), 0.0, 1.0) * rows
    n_g = jax.ops.segment_sum(rows, gid, num_segments=b)
    p = safe_divide(jax.ops.segment_sum(s, gid, num_segments=b), n_g)[gid]
    var = 4.0 * p * (1.0 - p)
    scale = (1.0 + alpha * jnp.minimum(jnp.abs(adv), adv_cap)) * (1.0 + beta * var)[:, None]
    eps_lo = jnp.minimum(clip_low * scale, max_clip)
    eps_hi = jnp.minimum(clip_high * scale, max_clip)
    ratio = _ratio(lp, olp)
    per, met = _clipped_surrogate(ratio, jnp.clip(ratio, 1.0 - eps_lo, 1.0 + eps_hi), adv, m, clip_low, clip_high,
                                  dual_clip)
    if is_weights is not None:
        per = per * sg(_checks.zero_outside(_checks.as_float(is_weights), m))
    loss = aggregate(jnp.where(m > 0, per, 0.0), m, agg)
    return loss, {**met, **ratio_metrics(lp - olp, m), "etr_eps_low_mean": sg(masked_mean(eps_lo, m)),
                  "etr_eps_high_mean": sg(masked_mean(eps_hi, m)),
                  "etr_pass_var_mean": sg(safe_divide(jnp.sum(var * rows), jnp.sum(rows)))}


# ----------------------------------------------------------------------------------------- R2VPO


def r2vpo_loss(logp, old_logp, advantages, mask, *, r2vpo_lambda, delta: float, lambda_init: float = 1.0,
               lambda_lr: float = 1.0, agg: str = "token-mean", is_weights=None):
    """R²VPO: the unclipped importance-weighted advantage with a primal-dual penalty on the
    variance of the importance ratio, in place of PPO's clip.

    ``L = -agg(rho_t A_t) + lambda (Var(rho) - delta)``, ``rho_t = pi_theta / pi_old`` per token,
    ``Var(rho) = mean_t (rho_t - mean_t rho_t)^2`` over the mini-batch's response tokens (the
    second central moment), the gradient flowing through both moments. ``lambda >= 0`` is the
    dual variable of the constraint ``Var(rho) <= delta``; it is not a parameter of the loss but
    the batch column ``r2vpo_lambda [B]`` (every row the same value), kept by the loop part
    :class:`jaxrl_llm.training.parts.r2vpo.RatioVarianceDual` and moved once per step by dual
    ascent, ``lambda <- max(0, lambda + lambda_lr (Var(rho) - delta))`` with the step's measured
    variance (:func:`r2vpo_dual_step`), starting at ``lambda_init``. ``lambda_init`` and
    ``lambda_lr`` are arguments here only so that one config block holds the method's settings.

    Unlike the clip, a token far from the trust region keeps its gradient: the penalty pulls
    the whole ratio distribution in (a "soft brake"), and stale rows are down-weighted rather
    than cut off.

    Paper: Luo et al., "Ratio-Variance Regularized Policy Optimization for Efficient LLM
    Fine-tuning", arXiv:2601.03320 (also arXiv:2605.26784). The abstract states the constraint
    on the ratio's variance and its primal-dual treatment; the Lagrangian above and the projected
    dual-ascent update are the standard form of that (METHODS.md section 2.2); ``delta`` has no
    default (the paper's value was not found). Identity: ``lambda = 0`` is the unclipped
    policy gradient ``-rho A`` (MDPO with infinite step size), whose gradient at ``rho = 1`` is
    REINFORCE's; on-policy (``rho = 1``) the penalty and its gradient are 0.

    Returns:
      ``(loss scalar, metrics)``: ratio metrics, ``r2vpo_ratio_var`` (what the dual step reads),
      ``r2vpo_lambda``.
    """
    _checks.check_positive("delta", delta, allow_zero=True)
    _checks.check_positive("lambda_init", lambda_init, allow_zero=True)
    _checks.check_positive("lambda_lr", lambda_lr, allow_zero=True)
    if agg not in AGG_MODES:
        raise ValueError(f"argument 'agg' must be one of {AGG_MODES}, got {agg!r}")
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    lam = jnp.max(jnp.maximum(_checks.as_float(r2vpo_lambda), 0.0))
    ratio = _ratio(lp, olp)
    per = -adv * ratio
    if is_weights is not None:
        per = per * sg(_checks.zero_outside(_checks.as_float(is_weights), m))
    pg = aggregate(jnp.where(m > 0, per, 0.0), m, agg)
    mean = masked_mean(ratio, m)
    var = masked_mean(jnp.square(ratio - mean), m)
    loss = pg + sg(lam) * (var - delta)
    return loss, {**ratio_metrics(lp - olp, m), "clip_frac": jnp.zeros(()), "clip_frac_lower": jnp.zeros(()),
                  "r2vpo_ratio_var": sg(var), "r2vpo_lambda": sg(lam), "r2vpo_pg_loss": sg(pg)}


def r2vpo_dual_step(lam: float, ratio_var: float, *, delta: float, lambda_lr: float = 1.0) -> float:
    """One projected dual-ascent step of R²VPO's multiplier:
    ``max(0, lam + lambda_lr (ratio_var - delta))`` (host floats)."""
    return max(0.0, float(lam) + float(lambda_lr) * (float(ratio_var) - float(delta)))


# ----------------------------------------------------------------------------------------- VPPO


def vppo_loss(logp, old_logp, advantages, mask, *, masked_logp, beta_min: float = 0.9, top_frac: float = 0.4,
              mask_prob: float = 0.5, clip_low: float = 0.2, clip_high: float = 0.28, dual_clip: float | None = None,
              entropy_penalty: float = 0.0, is_weights=None):
    """VPPO: the clipped surrogate with advantages re-weighted by how much each response depends
    on its input, and the gradient kept on the tokens that depend on it most.

    Token dependency ``S_t = clamp(exp(d) - d - 1, 0, 10)``, ``d = clamp(log pi_old(o_t | masked
    input) - log pi_old(o_t | input), +-20)`` (the k3 estimate of ``KL(pi(.|input) || pi(.|masked
    input))`` on the sampled token, both before the update); ``S_i`` its mean over response ``i``.

    - *trajectory-level advantage shaping*: ``n_i = clip((S_i - min S) / (max S - min S), 0, 1)``
      over the mini-batch's responses, ``mu`` = their mean, ``beta_max = beta_min + (1 - beta_min) /
      mu``, ``alpha_i = beta_min + n_i (beta_max - beta_min)`` (mean 1 over the batch; all equal
      ``S``: 1), ``A'_i = alpha_i A_i``;
    - *token-level gradient filtering*: in each response only its ``ceil(top_frac L_i)`` tokens of
      highest ``S_t`` keep their loss; the mean still divides by all its valid tokens' count
      (token-mean over the batch).

    Then PPO's clip with ``clip_low`` / ``clip_high`` (DAPO's 0.2 / 0.28, the authors' base), plus
    ``entropy_penalty`` times the mean ``-logp`` (the authors' scripts: 0.06; 0 here by default).

    Paper: "Spotlight on Token Perception for Multimodal Reinforcement Learning" (VPPO),
    arXiv:2510.09285; code ``huaixuheqing/VPPO-RL`` @a23c54b (``dp_actor.py``: beta_min 0.9, top
    0.4, image patches blacked out with p 0.5, the min / max over the per-device mini-batch and
    the mean over the micro-batch; here both over the mini-batch). The image becomes the prompt:
    ``masked_logp`` comes from the loop's masked-prompt pass (each prompt token replaced by the pad
    token with probability ``mask_prob``), as for PAPO. Identity: ``beta_min = 1, top_frac = 1``
    is PPO's clip (token-mean).

    Returns:
      ``(loss scalar, metrics)``: clip and ratio metrics, ``vppo_dependency_mean``,
      ``vppo_alpha_max``, ``vppo_kept_frac``.
    """
    if not 0.0 <= float(beta_min) <= 1.0:
        raise ValueError(f"argument 'beta_min' must be in [0, 1], got {beta_min!r}")
    if not 0.0 < float(top_frac) <= 1.0:
        raise ValueError(f"argument 'top_frac' must be in (0, 1], got {top_frac!r}")
    if not 0.0 < float(mask_prob) <= 1.0:
        raise ValueError(f"argument 'mask_prob' must be in (0, 1], got {mask_prob!r}")
    _checks.check_positive("entropy_penalty", entropy_penalty, allow_zero=True)
    _check_clip(clip_low, clip_high, dual_clip)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    _checks.check_token_args(logp=logp, masked_logp=masked_logp)
    mlp = sg(_checks.zero_outside(_checks.as_float(masked_logp), m))
    d = jnp.clip(mlp - olp, -_CLAMP, _CLAMP)
    dep = jnp.where(m > 0, jnp.clip(jnp.exp(d) - d - 1.0, 0.0, 10.0), 0.0)
    rows = _rows(m)
    length = jnp.sum(m, axis=1)
    s_row = safe_divide(jnp.sum(dep, axis=1), length)
    lo = jnp.min(jnp.where(rows, s_row, jnp.inf))
    hi = jnp.max(jnp.where(rows, s_row, -jnp.inf))
    spread = hi - lo
    n = jnp.clip(safe_divide(s_row - lo, jnp.where(spread > 1e-6, spread, 1.0)), 0.0, 1.0)
    mu = safe_divide(jnp.sum(jnp.where(rows, n, 0.0)), jnp.sum(rows.astype(jnp.float32)))
    beta_max = beta_min + (1.0 - beta_min) / jnp.maximum(mu, 1e-6)
    alpha = jnp.where(spread > 1e-6, beta_min + n * (beta_max - beta_min), 1.0)
    a2 = adv * sg(alpha)[:, None]
    k = jnp.ceil(top_frac * length)
    order = jnp.argsort(-jnp.where(m > 0, dep, -1.0), axis=1, stable=True)
    rank = jnp.argsort(order, axis=1)
    keep = (rank < k[:, None]) & (m > 0)
    ratio = _ratio(lp, olp)
    per, met = _clipped_surrogate(ratio, jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high), a2, m, clip_low, clip_high,
                                  dual_clip)
    if is_weights is not None:
        per = per * sg(_checks.zero_outside(_checks.as_float(is_weights), m))
    per = jnp.where(keep, per, 0.0) + entropy_penalty * jnp.where(m > 0, -lp, 0.0)
    loss = safe_divide(jnp.sum(per), jnp.sum(m))
    return loss, {**met, **ratio_metrics(lp - olp, m), "vppo_dependency_mean": sg(masked_mean(dep, m)),
                  "vppo_alpha_max": sg(jnp.max(jnp.where(rows, alpha, 0.0))),
                  "vppo_kept_frac": sg(safe_divide(jnp.sum(keep.astype(jnp.float32)), jnp.sum(m)))}

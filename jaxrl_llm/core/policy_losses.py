"""Policy losses: per-token surrogate losses for policy-gradient updates.

Every function takes ``[B, T]`` float arrays ``logp`` (current policy, carries the
gradient), ``old_logp`` (behaviour policy), ``advantages`` and a ``mask``, and returns
``(loss [B, T], metrics)``: the per-token loss to *minimise* (zero outside the mask) and a
flat dict of scalar diagnostics. Every loss reports at least :data:`COMMON_METRICS`
(``clip_frac``, ``clip_frac_lower`` -- 0 for losses without that clip --, approx KL
``E[old - logp]``, its low-variance form, ratio mean/max/min), so swapping the loss never
changes which diagnostics a trainer logs; some add their own (``seq_ratio_mean``, ...).
Reduce the loss with :func:`jaxrl_llm.core.aggregation.aggregate` (or its ``(sum, weight)``
form for exact micro-batching); each docstring names the aggregation its paper uses.

Parity: for every policy loss verl 0.9.1 registers (vanilla, dppo_tv, dppo_kl, gspo, sapo,
gpg, clip_cov, kl_cov, geo_mean, dro, cispo, bypass_mode = ppo/reinforce with rollout
correction) the aggregated value and its gradient with respect to ``logp`` equal verl's;
``tests/conformance/test_verl_conformance.py`` checks this on random ragged inputs.

Values under the mask never matter: inputs are selected (``jnp.where``) to 0 outside the
mask on entry, so padding garbage, +-inf or NaN there changes no output and receives an
exactly zero gradient (tested for every function in ``tests/core/test_battery.py``).

``is_weights`` (optional ``[B, T]``, no gradient) multiplies the per-token loss: use it for
truncated importance sampling / IcePop against sampler-trainer mismatch
(:func:`rollout_is_weights`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks
from jaxrl_llm.core.stats import masked_mean, masked_sum, safe_divide

__all__ = [
    "COMMON_METRICS",
    "ppo_clip_loss",
    "gppo_loss",
    "critique_grpo_loss",
    "entropy_balanced_loss",
    "gspo_loss",
    "cispo_loss",
    "papo_loss",
    "rover_loss",
    "epo_loss",
    "nash_md_loss",
    "aligndistil_teacher",
    "aligndistil_loss",
    "nash_md_preference",
    "epo_phase_weight",
    "sapo_loss",
    "gpg_loss",
    "reinforce_loss",
    "clip_cov_loss",
    "kl_cov_loss",
    "gmpo_loss",
    "dro_loss",
    "dppo_tv_loss",
    "dppo_kl_loss",
    "guide_loss",
    "masked_row_quantile",
    "rollout_is_weights",
    "rollout_rejection_mask",
    "ratio_metrics",
]

sg = jax.lax.stop_gradient
_LOG_RATIO_CLAMP = 20.0
COMMON_METRICS = ("clip_frac", "clip_frac_lower", "approx_kl", "approx_kl_k3", "ratio_mean", "ratio_max",
                  "ratio_min")


def _no_clip(dtype) -> dict[str, jnp.ndarray]:
    return {"clip_frac": jnp.zeros((), dtype), "clip_frac_lower": jnp.zeros((), dtype)}


def _prep(logp, old_logp, advantages, mask, is_weights=None):
    _checks.check_token_args(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask,
                             is_weights=is_weights)
    m = _checks.as_mask(mask, _checks.as_float(logp).dtype)
    lp, olp, adv = (_checks.zero_outside(_checks.as_float(x), m) for x in (logp, old_logp, advantages))
    return lp, sg(olp), sg(adv), m


def _clean_weights(is_weights, m):
    return sg(_checks.zero_outside(_checks.as_float(is_weights), m))


def _finish(loss, m, is_weights):
    if is_weights is not None:
        loss = loss * _clean_weights(is_weights, m)
    return jnp.where(m > 0, loss, 0.0)


def ratio_metrics(log_ratio: jnp.ndarray, mask: jnp.ndarray) -> dict[str, jnp.ndarray]:
    """Diagnostics of ``log_ratio = logp - old_logp``: approx KL ``E[-log_ratio]`` (verl's
    ``ppo_kl``), low-variance KL ``E[r - 1 - log r]``, ratio mean / max / min over the mask.

    The two KL estimators are k1 and k3 of Schulman, "Approximating KL Divergence" (2020,
    blog post; no arXiv id). Returns a dict of float32 scalars.
    """
    _checks.check_token_args(log_ratio=log_ratio, mask=mask)
    m = _checks.as_mask(mask)
    lr = sg(_checks.zero_outside(_checks.as_float(log_ratio), m))
    lr_c = jnp.clip(lr, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    r = jnp.exp(lr_c)
    big = jnp.finfo(r.dtype).max
    return {
        "approx_kl": masked_mean(-lr, m),
        "approx_kl_k3": masked_mean(r - 1.0 - lr_c, m),
        "ratio_mean": masked_mean(r, m),
        "ratio_max": jnp.where(jnp.sum(m) > 0, jnp.max(jnp.where(m > 0, r, -big)), 1.0),
        "ratio_min": jnp.where(jnp.sum(m) > 0, jnp.min(jnp.where(m > 0, r, big)), 1.0),
    }


def _clipped_surrogate(ratio, ratio_for_clip, adv, m, clip_low, clip_high, dual_clip):
    pl1 = -adv * ratio
    pl2 = -adv * ratio_for_clip
    clip1 = jnp.maximum(pl1, pl2)
    metrics = {"clip_frac": masked_mean((pl2 > pl1).astype(ratio.dtype), m)}
    if dual_clip is not None:
        pl3 = -adv * dual_clip
        clip2 = jnp.minimum(pl3, clip1)
        metrics["clip_frac_lower"] = masked_mean(((clip1 > pl3) & (adv < 0)).astype(ratio.dtype), m)
        loss = jnp.where(adv < 0, clip2, clip1)
    else:
        metrics["clip_frac_lower"] = jnp.zeros((), ratio.dtype)
        loss = clip1
    return loss, metrics


def _check_clip(clip_low, clip_high, dual_clip=None):
    _checks.check_positive("clip_low", clip_low, allow_zero=True)
    _checks.check_positive("clip_high", clip_high, allow_zero=True)
    if dual_clip is not None and not float(dual_clip) > 1.0:
        raise ValueError(f"argument 'dual_clip' must be > 1, or None for no dual clip (a bound c <= 1 would cap "
                         f"every negative-advantage token at a constant loss), got {dual_clip!r}")


def ppo_clip_loss(logp, old_logp, advantages, mask, *, clip_low: float = 0.2,
                  clip_high: float | None = None, dual_clip: float | None = 3.0,
                  is_weights=None):
    """PPO clipped surrogate with asymmetric ranges (clip-higher) and dual clip.

    ``rho = exp(clamp(logp - old_logp, -20, 20))``;
    ``L = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))``; for ``A < 0`` the dual clip
    caps it: ``L = min(L, -c A)``.

    Papers: Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347;
    dual clip: Ye et al., "Mastering Complex Control in MOBA Games with Deep RL",
    arXiv:1912.09729; clip-higher (eps_low 0.2, eps_high 0.28): Yu et al., "DAPO",
    arXiv:2503.14476. verl ``vanilla`` (the log-ratio clamp at +-20 is verl's).
    TRL 1.16: ``epsilon``/``epsilon_high`` are ``clip_low``/``clip_high``; TRL has no dual clip
    by default (pass ``dual_clip=None``); its ``delta`` equals ``dual_clip=delta`` when
    ``delta >= 1 + clip_high`` (TRL's recommendation) -- below that TRL caps the ratio of
    positive-advantage tokens at ``delta`` instead.

    Args:
      logp, old_logp, advantages, mask: ``[B, T]``.
      clip_low / clip_high: eps_low / eps_high (``clip_high`` defaults to ``clip_low``).
      dual_clip: c > 1 (verl default 3.0), or None to disable.
      is_weights: optional ``[B, T]`` rollout-correction weights.

    Returns:
      ``(loss [B, T], metrics)`` with ``clip_frac``, ``clip_frac_lower``, ``approx_kl`` and
      ratio statistics. GRPO aggregates with ``seq-mean-token-mean``, DAPO with
      ``token-mean``.
    """
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high, dual_clip)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    log_ratio = jnp.clip(lp - olp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss, met = _clipped_surrogate(ratio, clipped, adv, m, clip_low, clip_high, dual_clip)
    met.update(ratio_metrics(lp - olp, m))
    return _finish(loss, m, is_weights), met


def gppo_loss(logp, old_logp, advantages, mask, *, clip_low: float = 0.2,
              clip_high: float = 0.28, dual_clip: float | None = 3.0, beta1: float = 1.0,
              beta2: float = 1.0, is_weights=None):
    """GPPO (Klear-Reasoner): gradient-preserving clipping.

    The clipped ratio is ``clip(rho) = rho * sg(clip(rho) / rho)``: its *value* equals PPO's
    clip, so the loss value is that of clip-higher PPO, but a clipped token back-propagates a
    bounded gradient ``-A (1 +- eps) grad(logp)`` instead of zero. The paper's general form
    scales that gradient by ``beta1`` on the low side (``rho < 1 - eps_low``, ``A < 0``) and
    ``beta2`` on the high side (``rho > 1 + eps_high``, ``A > 0``): the clipped term becomes
    ``clip(rho) (beta rho / sg(rho) + 1 - beta)``, whose value is still ``clip(rho)``.

    Paper: Su et al., "Klear-Reasoner: Advancing Reasoning Capability via Gradient-Preserving
    Clipping Policy Optimization", arXiv:2508.07629: eps_low 0.2, eps_high 0.28, ``token-mean``,
    beta1 = beta2 = 1 ("empirically we set"; the authors' CE-GPPO follow-up, arXiv:2509.20712,
    uses beta1 < 1). The paper's objective has no dual clip: pass ``dual_clip=None`` for it.
    The default 3.0 is the authors' code's default (verl's ``clip_ratio_c``; their released
    scripts use 10); a dual clip ``c <= 1`` is rejected because it would remove the gradient
    of every negative-advantage token above ratio 1, the signal GPPO exists to keep.
    """
    _check_clip(clip_low, clip_high, dual_clip)
    _checks.check_positive("beta1", beta1)
    _checks.check_positive("beta2", beta2)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    log_ratio = jnp.clip(lp - olp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    clipped_val = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    if float(beta1) == 1.0 and float(beta2) == 1.0:
        clipped = ratio * sg(clipped_val / ratio)
    else:
        # only tokens outside the range are clipped; inside it beta = 1 keeps the PPO gradient
        beta = jnp.where(ratio < 1.0 - clip_low, beta1, jnp.where(ratio > 1.0 + clip_high, beta2, 1.0))
        clipped = sg(clipped_val) * (beta * (ratio / sg(ratio)) + (1.0 - beta))
    loss, met = _clipped_surrogate(ratio, clipped, adv, m, clip_low, clip_high, dual_clip)
    met.update(ratio_metrics(lp - olp, m))
    return _finish(loss, m, is_weights), met


def entropy_balanced_loss(logp, old_logp, advantages, mask, *, entropy, entropy_weight: float = 0.2,
                          clip_low: float = 0.2, clip_high: float | None = None, dual_clip: float | None = 3.0,
                          balanced_clip: bool = True, balanced_advantage: bool = True, is_weights=None):
    """AEPO (agentic): entropy-balanced policy optimisation's loss -- an entropy-aware advantage
    and a gradient-preserving upper clip.

    - advantage: ``A_t (1 + w sg(z_t))`` with ``z_t = (H_t - mean H) / std H`` the token entropy
      standardised over the valid tokens of the batch the loss sees (a micro-batch, as the code's;
      ``std`` with ``n - 1``, 1 where it is 0), ``w = entropy_weight``: high-entropy tokens weigh
      more, low-entropy ones less, and a token more than ``1 / w`` standard deviations below the
      mean (5 with 0.2) has its advantage's sign flipped, as in the code;
    - clip: ``L = max(-A rho, -A clip(rho))`` where above ``1 + eps_high`` the clipped ratio is
      ``(1 + eps_high) rho / sg(rho)``: its value is PPO's, but the token keeps the gradient
      ``-(1 + eps_high) A grad log pi`` instead of none; below ``1 - eps_low`` the ordinary clip;
      then the dual clip for ``A < 0`` (``c = dual_clip``).

    Paper: Dong et al., "Agentic Entropy-Balanced Policy Optimization" (AEPO), arXiv:2510.14545;
    code ``RUC-NLPIR/ARPO`` @81e3a5d (``AEPO/verl_aepo_entropy/verl/trainer/ppo/core_algos.py``,
    ``compute_policy_loss_entropy_balanced_clipping``): the weight 0.2, the standardisation over
    a micro-batch's valid tokens (torch's ``std``), eps 0.2 / 0.2, ``c`` 3. The code's log-ratio is
    not clamped; ours is clamped at +-20 as everywhere. Its released scripts turn both parts on
    but leave the entropy uncomputed (``entropy_coeff = 0``), so the advantage term is inactive
    there; here ``entropy`` is the current policy's token entropy, detached. Identity:
    ``balanced_clip = balanced_advantage = False`` (or ``entropy_weight = 0`` with the plain clip)
    is PPO's clip; the loss *value* does not depend on ``balanced_clip``.

    Args:
      logp, old_logp, advantages, mask, entropy: ``[B, T]``.

    Returns:
      ``(loss [B, T], metrics)``: PPO's metrics and ``aepo_entropy_z_abs`` (mean ``|z_t|``).
    """
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high, dual_clip)
    _checks.check_positive("entropy_weight", entropy_weight, allow_zero=True)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    _checks.check_token_args(logp=logp, entropy=entropy)
    h = sg(_checks.zero_outside(_checks.as_float(entropy), m))
    n = jnp.sum(m)
    mean = jnp.sum(h * m) / jnp.maximum(n, 1.0)
    var = jnp.sum(jnp.square(h - mean) * m) / jnp.maximum(n - 1.0, 1.0)
    std = jnp.sqrt(var)
    std = jnp.where((std == 0) | (n < 2), 1.0, std)  # one token: torch's std is nan (ours: 1)
    z = jnp.where(m > 0, (h - mean) / std, 0.0)
    if balanced_advantage:
        adv = adv * (1.0 + entropy_weight * z)
    log_ratio = jnp.clip(lp - olp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    if balanced_clip:
        clipped = jnp.where(ratio > 1.0 + clip_high, (1.0 + clip_high) * ratio / sg(ratio), clipped)
    loss, met = _clipped_surrogate(ratio, clipped, adv, m, clip_low, clip_high, dual_clip)
    met.update(ratio_metrics(lp - olp, m))
    met["aepo_entropy_z_abs"] = sg(masked_mean(jnp.abs(z), m))
    return _finish(loss, m, is_weights), met


def gspo_loss(logp, old_logp, advantages, mask, *, clip_low: float = 3e-4,
              clip_high: float = 4e-4, variant: str = "token", is_weights=None):
    """GSPO: clipping of the sequence-level (length-normalised) importance ratio.

    ``s_i = exp( (1/|o_i|) sum_t (logp - old_logp) )``. ``variant="token"`` (GSPO-token,
    verl's ``gspo``) uses the token ratio ``s_{i,t} = sg(s_i) * exp(logp - sg(logp))``
    (log clamped at 10), which lets token-level advantages through; ``variant="sequence"``
    uses ``s_i`` itself (the gradient flows through the sequence mean). With sequence
    advantages and ``seq-mean-token-mean`` aggregation (the paper's) both give the same
    value and gradient. ``L = max(-A s, -A clip(s, 1 - eps_low, 1 + eps_high))``.

    Paper: Zheng et al., "Group Sequence Policy Optimization", arXiv:2507.18071 (eps 3e-4 /
    4e-4).
    """
    _checks.check_choice("variant", variant, ("token", "sequence"))
    _check_clip(clip_low, clip_high)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    n = jnp.maximum(jnp.sum(m, -1), 1.0)
    seq_lr = jnp.sum((lp - olp) * m, -1) / n  # [B]
    if variant == "token":
        log_s = jnp.minimum(lp - sg(lp) + sg(seq_lr)[:, None], 10.0)
    else:
        log_s = jnp.broadcast_to(jnp.minimum(seq_lr, 10.0)[:, None], lp.shape)
    s = jnp.exp(log_s)
    pl1 = -adv * s
    pl2 = -adv * jnp.clip(s, 1.0 - clip_low, 1.0 + clip_high)
    loss = jnp.maximum(pl1, pl2)
    met = {"clip_frac": masked_mean((pl2 > pl1).astype(lp.dtype), m),
           "clip_frac_lower": jnp.zeros((), lp.dtype)}
    met.update(ratio_metrics(lp - olp, m))
    met["seq_ratio_mean"] = safe_divide(jnp.sum(jnp.exp(sg(seq_lr)) * (jnp.sum(m, -1) > 0)),
                                        jnp.sum(jnp.sum(m, -1) > 0))
    return _finish(loss, m, is_weights), met


def papo_loss(logp, old_logp, advantages, mask, *, masked_logp, gamma: float = 0.01, eta_ori: float = 0.0,
              eta_aug: float = 0.0, mask_prob: float = 0.6, clip_low: float = 0.2, clip_high: float | None = None,
              dual_clip: float | None = 3.0, is_weights=None):
    """PAPO: the PPO / GRPO surrogate plus the *implicit perception loss*, which rewards the
    policy for depending on its input, and the *double entropy* penalty against hacking it.

    Per token, with ``delta_t = clamp(log pi_m(o_t) - log pi_theta(o_t), +-20)`` where
    ``log pi_m`` (``masked_logp``, no gradient) is the log-prob of the same sampled token under
    the policy given a *masked* input, computed once before the update:

    ``kl_t = clamp(exp(delta_t) - delta_t - 1, +-10)`` (the k3 estimator of
    ``KL(pi_theta(. | input) || pi(. | masked input))`` on tokens sampled from the policy),

    ``L_t = ppo_t - gamma kl_t + eta_ori (-log pi_theta(o_t)) + eta_aug (-log pi_m(o_t))``.

    Maximising the KL (its minus sign) pushes the policy's output away from what it would say
    without the input; the entropy terms (sampled-token estimates) penalise the trivial way to
    raise it, a flat output distribution. ``eta_aug``'s term carries no gradient here (the
    masked log-probs are precomputed, as in the authors' default); it is kept in the value.
    ``mask_prob`` is the share of input tokens masked, read by the loop's ``masked_logp``
    provider (not by this function).

    Paper: Wang et al., "Perception-Aware Policy Optimization for Multimodal Reasoning" (PAPO),
    arXiv:2507.06448; code ``MikeWangWZHL/PAPO`` @fb63bf4 (``dp_actor.py``, ``core_algos.py``
    ``compute_kl`` with ``low_var_kl``): gamma 0.01 (config default; 0.02 in the GRPO scripts),
    eta 0.03-0.05 when on (off by default), image patches of 14 px blacked out with p = 0.6.
    The paper masks image patches; on text the library masks prompt tokens (the provider
    replaces each prompt token by the pad token with probability ``mask_prob``) -- the text
    analogue. Identity: ``gamma = eta_ori = eta_aug = 0`` is PPO's clipped surrogate.

    Returns:
      ``(per_token [B, T], metrics)`` with PPO's metrics and ``papo_kl`` (mean ``kl_t``),
      ``papo_masked_entropy`` (mean ``-log pi_m``).
    """
    for name, v in (("gamma", gamma), ("eta_ori", eta_ori), ("eta_aug", eta_aug)):
        _checks.check_positive(name, v, allow_zero=True)
    if not 0.0 < float(mask_prob) <= 1.0:
        raise ValueError(f"argument 'mask_prob' must be in (0, 1], got {mask_prob!r}")
    per, met = ppo_clip_loss(logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                             dual_clip=dual_clip)
    _checks.check_token_args(logp=logp, masked_logp=masked_logp)
    m = _checks.as_mask(mask, _checks.as_float(logp).dtype)
    lp = _checks.zero_outside(_checks.as_float(logp), m)
    mlp = sg(_checks.zero_outside(_checks.as_float(masked_logp), m))
    delta = jnp.clip(mlp - lp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    kl = jnp.clip(jnp.exp(delta) - delta - 1.0, -10.0, 10.0)
    per = per - gamma * kl + eta_ori * (-lp) + eta_aug * (-mlp)
    met.update({"papo_kl": sg(masked_mean(kl, m)), "papo_masked_entropy": sg(masked_mean(-mlp, m))})
    return _finish(per, m, is_weights), met


def rover_loss(logp, old_logp, advantages, mask, *, mean_logp, old_mean_logp, rho: float = 1.0,
               next_scale: float = 1.0, clip_ratio: float | None = None, is_weights=None):
    """ROVER: regress the policy's log-ratio, read as the Q-value of a *uniform random* policy,
    onto the advantage plus the next state's uniform-policy value (a one-step Bellman target).

    Per response token ``t`` (positions in the target-aligned layout, ``m`` the mask):

    ``Q_t = rho (log pi(a_t | s_t) - log pi_old(a_t | s_t))``,

    ``V_{t+1} = rho (mean_v log pi(v | s_{t+1}) - mean_v log pi_old(v | s_{t+1})) m_{t+1}`` (0 after
    the last token; ``mean_logp`` / ``old_mean_logp``: the vocabulary-mean log-probs of each position
    under the current and the sampling policy, no gradient),

    ``y_t = sg(A_t + next_scale V_{t+1})``, ``L_t = (Q_t - y_t)^2``.

    ``clip_ratio`` (the code's ``use_rover_clip``, off in its scripts): ``Q_t`` above ``log(1 + eps)``
    while the target is higher, or below ``log(1 - eps)`` while it is lower, is replaced by that
    bound (no gradient). The policy this parameterises is ``pi ∝ pi_old exp(Q / rho)``: the paper's
    softmax over the uniform policy's Q-values, relative to the policy that sampled.

    Paper: He et al., "Random Policy Valuation is Enough for LLM Reasoning with Verifiable Rewards"
    (ROVER), arXiv:2505.17618; code ``yuxiaooye/ROVER`` @ea5ce63 (``Math/verl/workers/actor/
    dp_actor.py`` ``DataParallelROVERActor.update_policy``, ``compute_rover_loss``,
    ``verl/utils/torch_functional.py`` ``sum_log_softmax``): ``rover_t`` = rho = 1,
    ``next_q_scale_factor`` 1, the GRPO advantage (std-normalised), token-mean.
    Identity: ``next_scale = 0`` and no clip is the squared error of ``rho`` times the log-ratio
    against the advantage.

    Returns:
      ``(per_token [B, T], metrics)`` with ``clip_frac`` (bound-replaced tokens), the ratio
      metrics, ``rover_next_value`` and ``rover_target`` (masked means).
    """
    if not float(rho) > 0:
        raise ValueError(f"argument 'rho' must be > 0, got {rho!r}")
    if clip_ratio is not None and not 0.0 < float(clip_ratio) < 1.0:
        raise ValueError(f"argument 'clip_ratio' must be in (0, 1) or None, got {clip_ratio!r}")
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    _checks.check_token_args(logp=logp, mean_logp=mean_logp, old_mean_logp=old_mean_logp)
    cur = sg(_checks.zero_outside(_checks.as_float(mean_logp), m))
    old = sg(_checks.zero_outside(_checks.as_float(old_mean_logp), m))
    nxt = rho * (cur - old)
    nxt = jnp.concatenate([nxt[..., 1:] * m[..., 1:], jnp.zeros_like(nxt[..., :1])], axis=-1)
    target = sg(adv + next_scale * nxt)
    q = rho * (lp - olp)
    clipped = jnp.zeros_like(q, dtype=bool)
    if clip_ratio is not None:
        hi, lo = math.log1p(clip_ratio), math.log1p(-clip_ratio)
        up, down = (target > q) & (q > hi), (target < q) & (q < lo)
        clipped = up | down
        q = jnp.where(up, hi, jnp.where(down, lo, q))
    per = jnp.square(q - target)
    met = {"clip_frac": masked_mean(clipped.astype(per.dtype), m), "clip_frac_lower": jnp.zeros((), per.dtype),
           **ratio_metrics(lp - olp, m), "rover_next_value": sg(masked_mean(nxt, m)),
           "rover_target": sg(masked_mean(target, m))}
    return _finish(per, m, is_weights), met


def epo_loss(logp, old_logp, advantages, mask, *, entropy, epo_entropy_ref, epo_phase_weight,
             entropy_coef: float = 0.001, smooth_coef: float = 1.0, penalty: float = 0.1, band_low: float = 0.8,
             band_high: float = 1.2, clip_low: float = 0.2, clip_high: float | None = None,
             dual_clip: float | None = 3.0, smooth: str = "hinge", is_weights=None):
    """EPO: PPO / GRPO with an entropy bonus and an entropy *smoothing* penalty that keeps each
    token's entropy within a band around its turn's historical average.

    ``L_t = ppo_t - entropy_coef H_t + smooth_coef w penalty s_t`` with ``H_t`` the current
    policy's token entropy (``entropy``, with its gradient), ``h_t`` the historical mean entropy
    of the token's turn (``epo_entropy_ref``: the mean over the run's steps so far of the batch's
    mean entropy at that turn index, kept by the loop part of ``recipe.loss=epo``), ``w`` the
    phase weight (``epo_phase_weight``, :func:`epo_phase_weight`) and

    ``s_t = (relu(band_low h_t - H_t) + relu(H_t - band_high h_t)) / h_t``,

    the relative distance of ``H_t`` outside ``[band_low h_t, band_high h_t]`` (0 inside it, and
    where there is no history yet, ``h_t = 0``).

    Paper: Xu et al., "EPO: Entropy-regularized Policy Optimization for LLM Agents Reinforcement
    Learning", arXiv:2509.22576; code ``WujiangXu/EPO`` @5b6fa98 (``dp_actor.py``): entropy
    coefficient 0.001, smoothing coefficient 1.0, out-of-band penalty 0.1, band 0.8 / 1.2 (the
    yaml; the README runs use 0 / 2.0), the per-turn history and the phase weight. Our decision:
    the released penalty is the constant ``penalty`` outside the band, built with a comparison,
    so it has no gradient and the smoothing regulariser does not act on the policy; the paper
    describes a regulariser that bounds the entropy near its history, so here it is the hinge
    above, scaled by ``penalty``, whose gradient pulls ``H_t`` back into the band.
    ``smooth="released"`` is the code's form instead: ``L_t = ppo_t - entropy_coef (H_t -
    smooth_coef w penalty 1[H_t outside (band_low h_t, band_high h_t)])`` (strict bounds, the
    penalty inside the entropy term, so scaled by ``entropy_coef``; a constant where it acts), for
    comparison with the authors' runs; their gate that turns it on only from step ``max_step // 2``
    is not reproduced (``phase_steps`` gives the phase weight). Identity: ``entropy_coef =
    smooth_coef = 0`` is PPO's clip.

    Returns:
      ``(per_token [B, T], metrics)``: PPO's metrics, ``epo_entropy`` (mean ``H_t``),
      ``epo_out_of_band`` (share of tokens outside the band), ``epo_smooth`` (mean ``s_t``).
    """
    for name, v in (("entropy_coef", entropy_coef), ("smooth_coef", smooth_coef), ("penalty", penalty),
                    ("band_low", band_low)):
        _checks.check_positive(name, v, allow_zero=True)
    if not float(band_high) >= float(band_low):
        raise ValueError(f"argument 'band_high' must be >= band_low ({band_low}), got {band_high!r}")
    per, met = ppo_clip_loss(logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                             dual_clip=dual_clip)
    _checks.check_token_args(logp=logp, entropy=entropy, epo_entropy_ref=epo_entropy_ref)
    m = _checks.as_mask(mask, _checks.as_float(logp).dtype)
    h = _checks.zero_outside(_checks.as_float(entropy), m)
    ref = sg(jnp.maximum(_checks.zero_outside(_checks.as_float(epo_entropy_ref), m), 0.0))
    w = sg(jnp.max(_checks.as_float(epo_phase_weight)))
    _checks.check_choice("smooth", smooth, ("hinge", "released"))
    if smooth == "released":
        outside = sg(((h <= band_low * ref) | (h >= band_high * ref)) & (ref > 0)).astype(h.dtype)
        per = per - entropy_coef * (h - smooth_coef * w * penalty * outside)
        met.update({"epo_entropy": sg(masked_mean(h, m)), "epo_smooth": sg(masked_mean(outside, m)),
                    "epo_out_of_band": sg(masked_mean(outside, m))})
        return _finish(per, m, is_weights), met
    out = jax.nn.relu(band_low * ref - h) + jax.nn.relu(h - band_high * ref)
    smooth_t = jnp.where(ref > 0, out / jnp.where(ref > 0, ref, 1.0), 0.0)
    per = per - entropy_coef * h + smooth_coef * w * penalty * smooth_t
    met.update({"epo_entropy": sg(masked_mean(h, m)), "epo_smooth": sg(masked_mean(smooth_t, m)),
                "epo_out_of_band": sg(masked_mean(((smooth_t > 0) & (ref > 0)).astype(h.dtype), m))})
    return _finish(per, m, is_weights), met


def epo_phase_weight(step: int, total_steps: int) -> float:
    """EPO's phase weight of the smoothing term at training step ``step`` of ``total_steps``
    (the authors' code, with its epochs as steps and ``total_steps`` for its hard-coded 150):
    ``1 - 0.2 (1 - exp(-2 e / (T/2)))`` in the first half, then ``0.8 exp(-3 (e - T/2) / (T/2))``
    (host float)."""
    if not (isinstance(total_steps, int) and total_steps >= 2):
        raise ValueError(f"argument 'total_steps' must be an int >= 2, got {total_steps!r}")
    half = total_steps / 2.0
    e = float(step)
    if e <= half:
        return 1.0 - 0.2 * (1.0 - math.exp(-2.0 * e / half))
    return 0.8 * math.exp(-3.0 * (e - half) / half)


def nash_md_preference(scores, mixture_scores, *, temperature: float = 1.0):
    """Nash-MD's preference of each policy sample over its mixture opponent from reward scores:
    ``P = sigmoid((r(y) - r(y')) / temperature)`` (TRL's NashMDTrainer with a reward model:
    ``sigmoid(model_scores - mixture_scores)``, temperature 1). ``[B]`` float32, no gradient."""
    _checks.check_positive("temperature", temperature)
    r, r2 = _checks.as_float(scores), _checks.as_float(mixture_scores)
    if r.shape != r2.shape or r.ndim != 1:
        raise ValueError(f"arguments 'scores' and 'mixture_scores' must be [B] of one shape, got {r.shape}, {r2.shape}")
    return sg(jax.nn.sigmoid((r - r2) / temperature))


def nash_md_loss(logp, old_logp, advantages, mask, *, ref_logp, beta: float = 0.1, is_weights=None):
    """Nash-MD's policy loss: REINFORCE on the preference over the mixture's sample, with the KL
    to the reference by REINFORCE too.

    Per token ``L_t = -A_t logp_t + beta sg(logp_t - ref_logp_t) logp_t``, with ``A`` the
    sequence's ``P(y > y') - 1/2`` (``recipe.advantage=nash_md``; 1/2 is the control variate);
    summed over the response and averaged over rows (``seq-mean-token-sum``) this is TRL's
    ``_compute_losses``: ``beta sum_t sg(log_ratio_t) logp_t - (P - 0.5) sum_t logp_t``, whose
    gradient's KL part is the score-function gradient of ``KL(pi || pi_ref)``. ``old_logp`` is not
    used (the method is on-policy, one update per batch), except in the ratio metrics.

    Paper: Munos et al., "Nash Learning from Human Feedback", arXiv:2312.00886 (Nash-MD); code
    TRL ``trl/experimental/nash_md/nash_md_trainer.py`` @054a0dab (``_compute_losses``): beta 0.1.

    Returns:
      ``(per_token [B, T], metrics)`` with ``nash_kl`` (mean summed log-ratio per row) and the ratio
      metrics.
    """
    _checks.check_positive("beta", beta, allow_zero=True)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    _checks.check_token_args(logp=logp, ref_logp=ref_logp)
    ref = sg(_checks.zero_outside(_checks.as_float(ref_logp), m))
    log_ratio = sg(lp - ref)
    per = -adv * lp + beta * log_ratio * lp
    rows = jnp.any(m > 0, axis=1).astype(lp.dtype)
    kl = safe_divide(jnp.sum(jnp.sum(log_ratio * m, axis=1) * rows), jnp.sum(rows))
    met = {**ratio_metrics(lp - olp, m), "clip_frac": jnp.zeros(()), "clip_frac_lower": jnp.zeros(()),
           "nash_kl": sg(kl)}
    return _finish(per, m, is_weights), met


def aligndistil_teacher(dpo_logits, reverse_logits, tokens, *, beta2: float = 15.0, eps: float = 1e-3):
    """AlignDistil's teacher at each position: ``(log pi*(token), w)``.

    ``z* = z_dpo + w (z_dpo - z_rdpo)`` with ``w = beta2 TV + eps``, ``TV = sum_v |pi_dpo(v) -
    pi_rdpo(v)|`` (no 1/2, in ``[0, 2]``): a token where the DPO model and the reverse-DPO model
    (trained on swapped preferences) disagree gets a teacher extrapolated further from the
    reverse model. ``pi* = softmax(z*)``.

    Paper: Zhang et al., "AlignDistil: Token-Level Language Model Alignment as Adaptive Policy
    Distillation", arXiv:2503.02832; code ``songmzhang/AlignDistil`` @f80ca4e
    (``aligndistil_trainer.py``: the teacher and ``w``; beta2 15 on-policy, 10 off-policy).

    Args:
      dpo_logits, reverse_logits: ``[..., V]``. tokens: ``[...]`` int, the tokens to score.

    Returns:
      ``(teacher_logp [...], w [...])`` float32, no gradient.
    """
    _checks.check_positive("beta2", beta2, allow_zero=True)
    _checks.check_positive("eps", eps)
    zd, zr = _checks.as_float(dpo_logits), _checks.as_float(reverse_logits)
    tv = jnp.sum(jnp.abs(jax.nn.softmax(zd, axis=-1) - jax.nn.softmax(zr, axis=-1)), axis=-1)
    w = beta2 * tv + eps
    lt = jax.nn.log_softmax(zd + w[..., None] * (zd - zr), axis=-1)
    tok = jnp.take_along_axis(lt, jnp.asarray(tokens, jnp.int32)[..., None], axis=-1)[..., 0]
    return sg(tok), sg(w)


def aligndistil_loss(logp, old_logp, advantages, mask, *, teacher_logp, teacher_weight, beta: float = 0.1,
                     is_weights=None):
    """AlignDistil's on-policy distillation to its adaptive teacher, per sampled token.

    ``L_t = (beta / w_t) sg(logp_t - log pi*_t) logp_t`` (aggregate ``seq-mean-token-mean``, the
    authors' per-sequence token mean). On tokens sampled from the policy this is the
    score-function estimate of the authors' per-position reverse KL ``(beta / w_t) KL(pi_theta ||
    pi*)``: its expectation over the sampled token is the exact KL's gradient at every position
    (tested by enumerating the vocabulary). The authors sum over the full vocabulary at each
    position instead; the sampled form needs only the teacher's log-prob of the sampled token and
    ``w_t`` (:func:`aligndistil_teacher`, computed by the loop from the DPO model,
    ``model.aux_params``, and the reverse-DPO model in the reference slot), and has more
    variance: our decision. ``advantages`` are not used (the method has no reward), and
    ``old_logp`` only in the ratio metrics.

    Returns:
      ``(per_token [B, T], metrics)`` with ``aligndistil_kl`` (mean ``logp - log pi*``) and
      ``aligndistil_w`` (mean ``w``).
    """
    _checks.check_positive("beta", beta)
    lp, olp, _, m = _prep(logp, old_logp, advantages, mask, is_weights)
    _checks.check_token_args(logp=logp, teacher_logp=teacher_logp, teacher_weight=teacher_weight)
    t = sg(_checks.zero_outside(_checks.as_float(teacher_logp), m))
    w = sg(jnp.where(m > 0, _checks.as_float(teacher_weight), 1.0))
    d = sg(lp - t)
    per = (beta / jnp.maximum(w, 1e-6)) * d * lp
    met = {**ratio_metrics(lp - olp, m), "clip_frac": jnp.zeros(()), "clip_frac_lower": jnp.zeros(()),
           "aligndistil_kl": masked_mean(d, m), "aligndistil_w": masked_mean(w, m)}
    return _finish(per, m, is_weights), met


def cispo_loss(logp, old_logp, advantages, mask, *, clip_low: float = 0.2,
               clip_high: float = 0.2, is_weights=None):
    """CISPO: REINFORCE with clipped, stop-gradient importance weights.

    ``L = -sg(clip(rho, 1 - eps_low, 1 + eps_high)) * A * logp``: every token keeps a gradient
    (none is dropped by clipping). ``rho`` uses the +-20 log clamp.

    Paper: MiniMax, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention", arXiv:2506.13585. The paper effectively disables the lower bound (pass a
    large ``clip_low``, e.g. 1.0); defaults are verl's config defaults. ``token-mean``.
    """
    _check_clip(clip_low, clip_high)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    ratio = jnp.exp(jnp.clip(lp - olp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    cr = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = -sg(cr) * adv * lp
    met = {"clip_frac": masked_mean((ratio != cr).astype(lp.dtype), m),
           "clip_frac_lower": jnp.zeros((), lp.dtype)}
    met.update(ratio_metrics(lp - olp, m))
    return _finish(loss, m, is_weights), met


def sapo_loss(logp, old_logp, advantages, mask, *, tau_pos: float = 1.0, tau_neg: float = 1.05,
              is_weights=None):
    """SAPO: soft adaptive policy optimisation with a smooth sigmoid gate instead of a clip.

    ``f(rho) = sigmoid(tau (rho - 1)) * 4 / tau`` with ``tau = tau_pos`` if ``A > 0`` else
    ``tau_neg``; ``L = -f(rho) A``. At ``rho = 1`` the gradient equals the plain policy
    gradient and it decays smoothly off-policy (faster for negative advantages).

    Paper: "Soft Adaptive Policy Optimization", arXiv:2511.20347 (verl defaults tau_pos 1.0,
    tau_neg 1.05). verl always aggregates SAPO with ``seq-mean-token-mean``.
    """
    _checks.check_positive("tau_pos", tau_pos)
    _checks.check_positive("tau_neg", tau_neg)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    ratio = jnp.exp(jnp.clip(lp - olp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    tau = jnp.where(adv > 0, tau_pos, tau_neg)
    gate = jax.nn.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    met = _no_clip(lp.dtype) | ratio_metrics(lp - olp, m)
    return _finish(-gate * adv, m, is_weights), met


def reinforce_loss(logp, advantages, mask, *, old_logp=None, is_weights=None):
    """Plain REINFORCE: ``L = -A * logp`` (optionally times stop-gradient IS weights).

    Williams, "Simple statistical gradient-following algorithms for connectionist
    reinforcement learning" (1992). verl's ``compute_policy_loss_reinforce`` (bypass mode,
    default aggregation ``seq-mean-token-sum``). ``old_logp`` only feeds the approx-KL metric.
    """
    old = logp if old_logp is None else old_logp
    lp, olp, adv, m = _prep(logp, old, advantages, mask, is_weights)
    met = _no_clip(lp.dtype) | ratio_metrics(lp - olp, m)
    return _finish(-adv * lp, m, is_weights), met


def gpg_loss(logp, old_logp, advantages, mask, *, is_weights=None):
    """GPG policy loss: ``L = -A * logp`` (no ratio, no clip), verl's ``gpg``.

    Paper: Chu et al., "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv:2504.02546. Pair with :func:`~jaxrl_llm.core.advantages.gpg_advantages`.
    """
    return reinforce_loss(logp, advantages, mask, old_logp=old_logp, is_weights=is_weights)


def _rank_desc(x: jnp.ndarray) -> jnp.ndarray:
    """Rank of every entry of a flat array in descending order (0 = largest); stable."""
    order = jnp.argsort(-x, stable=True)
    return jnp.zeros_like(order).at[order].set(jnp.arange(x.shape[0]))


def clip_cov_loss(logp, old_logp, advantages, mask, *, key: jax.Array, clip_low: float = 0.2,
                  clip_high: float | None = None, clip_cov_ratio: float = 2e-4,
                  clip_cov_lb: float = 1.0, clip_cov_ub: float = 5.0, is_weights=None):
    """Clip-Cov: detach a few random high-covariance tokens from the gradient.

    ``cov_t = (A_t - mean A)(logp_t - mean logp)`` over the masked tokens. Among the tokens
    that PPO does not clip and with ``lb < cov_t < ub``, ``max(1, floor(r N))`` (``N`` =
    masked tokens, ``r = clip_cov_ratio``) are drawn uniformly at random (``key``) and get
    zero loss; the rest use the PPO clipped surrogate (no dual clip, as in verl).
    Difference from verl: the log-ratio is clamped to +-20 as in every other loss here (verl
    leaves it unclamped, so a token with ``|logp - old_logp| > 88`` overflows to inf there).

    Paper: Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models", arXiv:2505.22617 (defaults r = 2e-4, lb = 1, ub = 5).

    The means in ``cov`` and the count ``N`` are statistics of the arrays passed in (one
    micro-batch, as in verl), so unlike the sequence-local losses this one is not invariant
    to how a batch is split into micro-batches.
    """
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high)
    _checks.check_positive("clip_cov_ratio", clip_cov_ratio)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    ratio = jnp.exp(jnp.clip(lp - olp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    pl1 = -adv * ratio
    pl2 = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = (pl2 > pl1) & (m > 0)
    lps = sg(lp)
    cov = (adv - masked_mean(adv, m)) * (lps - masked_mean(lps, m))
    cand = (m > 0) & (~clipped) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    n_tok = jnp.sum(m)
    k = jnp.maximum(jnp.floor(clip_cov_ratio * n_tok), 1.0)
    u = jax.random.uniform(key, lp.shape)
    prio = jnp.where(cand, u, -1.0).reshape(-1)
    rank = _rank_desc(prio).reshape(lp.shape)
    drop = cand & (rank < k)
    corr = jnp.where(drop, 0.0, 1.0)
    loss = jnp.maximum(pl1, pl2) * corr
    met = {"clip_frac": masked_mean(drop.astype(lp.dtype), m),
           "clip_frac_lower": jnp.zeros((), lp.dtype)}
    met.update(ratio_metrics(lp - olp, m))
    return _finish(loss, m, is_weights), met


def kl_cov_loss(logp, old_logp, advantages, mask, *, kl_cov_ratio: float = 2e-4,
                ppo_kl_coef: float = 1.0, is_weights=None):
    """KL-Cov: a KL penalty on the tokens of highest covariance.

    ``L_t = -A_t rho_t``; for the top ``max(1, floor(r N))`` masked tokens by
    ``cov_t = (A_t - mean A)(logp_t - mean logp)``, ``L_t = -A_t rho_t + k |logp_t - old_t|``.
    No clipping. Ties in covariance are broken by position (verl's ``topk`` order is
    unspecified). Difference from verl: ``rho`` uses the +-20 log clamp of the other losses
    (verl's is unclamped; equal whenever ``|logp - old_logp| <= 20``).

    Paper: Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models", arXiv:2505.22617 (r = 2e-4). ``ppo_kl_coef`` default 1 as the
    function docs of verl (its config default is 0.1). Like :func:`clip_cov_loss`, the
    covariance and top-k use the statistics of the arrays passed in (per micro-batch).
    """
    _checks.check_positive("kl_cov_ratio", kl_cov_ratio)
    _checks.check_positive("ppo_kl_coef", ppo_kl_coef, allow_zero=True)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    lr = lp - olp
    ratio = jnp.exp(jnp.clip(lr, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    pl = -adv * ratio
    pl_kl = pl + ppo_kl_coef * jnp.abs(lr)
    lps = sg(lp)
    cov = (adv - masked_mean(adv, m)) * (lps - masked_mean(lps, m))
    n_tok = jnp.sum(m)
    k = jnp.where(n_tok > 0, jnp.maximum(jnp.floor(n_tok * kl_cov_ratio), 1.0), 0.0)
    prio = jnp.where(m > 0, cov, -jnp.inf).reshape(-1)
    rank = _rank_desc(prio).reshape(lp.shape)
    sel = (m > 0) & (rank < k)
    loss = jnp.where(sel, pl_kl, pl)
    met = _no_clip(lp.dtype) | {"kl_cov_frac": masked_mean(sel.astype(lp.dtype), m)}
    met.update(ratio_metrics(lr, m))
    met["approx_kl_abs"] = masked_mean(jnp.abs(sg(lr)), m)
    return _finish(loss, m, is_weights), met


def gmpo_loss(logp, old_logp, advantages, mask, *, clip_low: float = 0.4,
              clip_high: float = 0.4, is_weights=None):
    """GMPO: maximise the geometric mean of token ratios, clipped per token in log space.

    With ``d_t = logp - old_logp`` clipped to ``[-eps_low, eps_high]`` on the side the
    advantage sign pushes (``sign(A) min(sign(A) d, sign(A) clip(d))``), the sequence ratio is
    ``R_i = exp(mean_t d~_t)`` and the sequence loss ``-A_i R_i`` with ``A_i`` the token-mean
    advantage. It is returned broadcast to the response tokens; aggregate with
    ``seq-mean-token-mean`` to get the mean over sequences. ``is_weights`` are reduced to a
    per-sequence geometric mean (verl). GMPO is a sequence-level method: pass sequence-level
    advantages (constant over each response). With token-level advantages the clip side
    follows each token's sign while the sequence is weighted by their mean, as in verl's
    ``geo_mean``, which is rarely what you want.

    Paper: Zhao et al., "Geometric-Mean Policy Optimization", arXiv:2507.20673 (clip range
    (e^-0.4, e^0.4)). Difference from verl's ``geo_mean``: verl averages over all ``B`` rows
    including fully masked ones; ``seq-mean-token-mean`` averages over rows with a token.
    """
    _check_clip(clip_low, clip_high)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    d = lp - olp
    sgn = jnp.sign(adv)
    dc = jnp.clip(d, -clip_low, clip_high)
    dmin = sgn * jnp.minimum(sgn * d, sgn * dc)
    n = jnp.sum(m, -1)
    ratio = jnp.exp(jnp.sum(dmin * m, -1) / (n + 1e-8))
    a_seq = jnp.sum(adv * m, -1) / (n + 1e-8)
    seq_loss = -a_seq * ratio
    if is_weights is not None:
        w = _clean_weights(is_weights, m)
        seq_loss = seq_loss * jnp.exp(jnp.sum(jnp.log(w + 1e-10) * m, -1) / (n + 1e-8))
    loss = jnp.broadcast_to(seq_loss[:, None], lp.shape)
    clipped = (d != dc).astype(lp.dtype)
    met = {"clip_frac": masked_mean(clipped * (adv > 0), m),
           "clip_frac_lower": masked_mean(clipped * (adv < 0), m)}
    met.update(ratio_metrics(d, m))
    return jnp.where(m > 0, loss, 0.0), met


def dro_loss(logp, old_logp, advantages, mask, *, beta: float, is_weights=None):
    """verl's ``dro`` policy loss: REINFORCE with a quadratic log-ratio penalty.

    Per token ``L = -(A logp - (beta/2) (logp - old_logp)^2)``, as verl's registered ``dro``
    loss (``compute_policy_loss_dro``, whose docstring cites no paper); ``beta`` is verl's
    ``dro_beta``.

    Inspired by Direct Reward Optimisation -- Richemond et al., "Offline Regularised
    Reinforcement Learning for Large Language Models Alignment", arXiv:2405.19107 -- but NOT
    that paper's objective, ``L(pi, V) = 1/2 E_{x, y~mu}[(r(x,y) - V(x)
    - tau log(pi(y|x)/pi_ref(y|x)))^2]`` with a jointly learned value ``V``. Differences:

    (a) the anchor is the sampling policy ``old_logp`` (pi_old), not a fixed ``pi_ref``:
        a proximal term, not a reference regulariser;
    (b) it squares per-token log-ratios, where the paper squares the sequence log-ratio;
    (c) ``A`` is whatever advantage the caller passes, not ``r - V(x)`` with a learned
        ``V``, and there is no value loss;
    (d) on-policy (``logp == old_logp``) the penalty has zero gradient, so the update is
        exactly REINFORCE (``-A`` per token); away from it the penalty adds
        ``beta (logp - old_logp)`` to the per-token gradient.
    """
    _checks.check_positive("beta", beta)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    lr = lp - olp
    loss = -(lp * adv - 0.5 * beta * jnp.square(lr))
    return _finish(loss, m, is_weights), _no_clip(lp.dtype) | ratio_metrics(lr, m)


def _dppo(lp, olp, adv, m, valid, clip_ratio_c, is_weights):
    lr = jnp.clip(lp - olp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = jnp.exp(lr)
    tr = sg(jnp.minimum(ratio, clip_ratio_c))
    valid = sg(valid.astype(lp.dtype))
    loss = -adv * tr * lp * valid
    met = {"clip_frac": masked_mean(1.0 - valid, m),
           "clip_frac_lower": masked_mean((ratio > clip_ratio_c).astype(lp.dtype) * valid, m)}
    met.update(ratio_metrics(lp - olp, m))
    return _finish(loss, m, is_weights), met


def dppo_tv_loss(logp, old_logp, advantages, mask, *, clip_low: float = 0.2,
                 clip_high: float | None = None, clip_ratio_c: float = 20.0, is_weights=None):
    """DPPO-Binary-TV: trust region on the probability change of the sampled token.

    Tokens whose probability moved too far in the advantage's direction are masked:
    valid if ``p - p_old <= delta_high`` (``A > 0``) or ``p - p_old >= -delta_low``
    (``A <= 0``). ``L = -A sg(min(rho, c)) logp * valid`` (truncated IS, ``c = 20``).

    Paper: Qi et al., "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv:2602.04879 (Divergence PPO; verl's ``dppo_tv``; ``clip_low/high`` are the TV
    thresholds).
    """
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high)
    _checks.check_positive("clip_ratio_c", clip_ratio_c)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    dp = jnp.exp(lp) - jnp.exp(olp)
    valid = jnp.where(adv > 0, dp <= clip_high, dp >= -clip_low)
    return _dppo(lp, olp, adv, m, valid, clip_ratio_c, is_weights)


def dppo_kl_loss(logp, old_logp, advantages, mask, *, clip_low: float = 0.2,
                 clip_high: float | None = None, clip_ratio_c: float = 20.0, is_weights=None):
    """DPPO-Binary-KL: like :func:`dppo_tv_loss` with the binary KL of the sampled token.

    ``KL_bin = p_old log(p_old/p) + (1 - p_old) log((1 - p_old + 1e-8)/(1 - p + 1e-8))``;
    valid if ``KL_bin <= delta_high or p <= p_old`` (``A > 0``), ``KL_bin <= delta_low or
    p >= p_old`` (``A <= 0``).

    Paper: Qi et al., "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv:2602.04879 (verl's ``dppo_kl``).
    """
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high)
    _checks.check_positive("clip_ratio_c", clip_ratio_c)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    p, po = jnp.exp(lp), jnp.exp(olp)
    kl = po * (olp - lp) + (1.0 - po) * jnp.log((1.0 - po + 1e-8) / (1.0 - p + 1e-8))
    valid = jnp.where(adv > 0, (kl <= clip_high) | (p <= po), (kl <= clip_low) | (p >= po))
    return _dppo(lp, olp, adv, m, valid, clip_ratio_c, is_weights)


def masked_row_quantile(values, mask, q: float):
    """Per row of ``values [B, T]``, the ``q``-quantile of the entries under ``mask`` with
    linear interpolation between order statistics (``numpy.quantile``'s and
    ``torch.quantile``'s default); ``1.0`` for a row with no entry. No gradient."""
    _checks.check_token_args(values=values, mask=mask)
    if not 0.0 <= float(q) <= 1.0:
        raise ValueError(f"argument 'q' must be in [0, 1], got {q!r}")
    m = _checks.as_mask(mask) > 0
    v = sg(_checks.as_float(values))
    srt = jnp.sort(jnp.where(m, v, jnp.inf), axis=-1)  # the row's entries first, in order
    n = jnp.sum(m, axis=-1)
    pos = float(q) * jnp.maximum(n - 1, 0).astype(v.dtype)
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
    v_lo = jnp.take_along_axis(srt, lo[:, None], axis=-1)[:, 0]
    v_hi = jnp.take_along_axis(srt, hi[:, None], axis=-1)[:, 0]
    out = v_lo + (pos - lo.astype(v.dtype)) * (v_hi - v_lo)
    return jnp.where(n > 0, out, 1.0)


def critique_grpo_loss(logp, old_logp, advantages, mask, hinted, *, gamma: float = 0.1, clip: bool = False,
                       clip_low: float = 0.2, clip_high: float | None = None, dual_clip: float | None = None,
                       is_weights=None):
    """Critique-GRPO's loss: the policy's own responses by the importance ratio, a refinement
    (a response sampled after a critique, trained after the original question) by its shaped
    probability.

    ``L_t = -A rho_t`` on the own rows (``rho = pi_theta / pi_old``; with ``clip`` PPO's
    ``max(-A rho, -A clip(rho))``) and ``L_t = -A f(pi_theta(y_t))``, ``f(p) = p / (p + gamma)``,
    on the refinement rows (``hinted``): no ratio (the refinement was sampled in another context)
    and no clip; ``f`` is concave, so its gradient ``gamma / (p + gamma)^2`` weighs unlikely tokens
    of the refinement more than likely ones (the policy shaping of LUFFY, which Critique-GRPO
    uses).

    Paper: Zhang et al., "Critique-GRPO: Advancing LLM Reasoning with Natural Language and
    Numerical Feedback", arXiv:2506.03106; code ``zhangxy-2019/critique-GRPO`` @e8f03a2
    (``verl/verl/critique_grpo/critique_core_algos.py``, ``compute_token_on_off_policy_loss``:
    ``off_policy_reshape="p_div_p_0.1"`` and, in its scripts, ``loss_remove_clip=True``, hence
    ``clip=False`` by default; the scripts' aggregation, a sum over tokens divided by the maximum
    response length, is ``recipe.agg``'s choice here). Identity: without refinement rows and
    with ``clip`` this is PPO's clip (with ``dual_clip`` on the own rows, the dual clip: ICPO's
    loss, ``recipe.loss=icpo``).

    Args:
      logp, old_logp, advantages, mask: ``[B, T]``. hinted: ``[B]`` (1: a refinement row).
      dual_clip: with ``clip``, verl's dual clip ``c`` of the own rows (a negative advantage's loss
        at most ``-A c``); None: none.

    Returns:
      ``(loss [B, T], metrics)``: ratio metrics, ``clip_frac``, ``critique_refined_prob`` (mean
      ``pi_theta`` on the refinement tokens).
    """
    _checks.check_positive("gamma", gamma)
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high)
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    _checks.check_rank("hinted", hinted, 1)
    _checks.check_seq_args(lp.shape[0], hinted=hinted)
    h = sg(_checks.as_float(hinted))[:, None] > 0
    ratio = jnp.exp(jnp.clip(lp - olp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    on = -adv * ratio
    if dual_clip is not None and not (clip and float(dual_clip) > 1.0):
        raise ValueError(f"argument 'dual_clip' needs clip=True and a value > 1, got clip={clip!r}, "
                         f"dual_clip={dual_clip!r}")
    if clip:
        clipped = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
        clip_frac = masked_mean((clipped > on).astype(ratio.dtype), m * (~h))
        on = jnp.maximum(on, clipped)
        if dual_clip is not None:  # a negative advantage's loss capped at -A c
            on = jnp.where(adv < 0, jnp.minimum(on, -adv * dual_clip), on)
    else:
        clip_frac = jnp.zeros((), ratio.dtype)
    p = jnp.exp(lp)
    off = -adv * p / (p + gamma)
    loss = jnp.where(h, off, on)
    met = ratio_metrics(jnp.where(h, 0.0, lp - olp), m * (~h))
    met.update({"clip_frac": clip_frac, "critique_refined_prob": sg(masked_mean(p, m * h))})
    return _finish(loss, m, is_weights), met


def guide_loss(logp, old_logp, advantages, mask, hinted, *, clip_low: float = 0.2,
               clip_high: float | None = None, dual_clip: float | None = None,
               gamma_strategy: str = "percentile", gamma: float = 0.9, is_weights=None):
    """Guide-GRPO's loss: PPO's clipped surrogate on the plain rows, an unclipped, reshaped
    importance ratio on the rows sampled with a hint.

    A hinted row was sampled from ``pi_old(o | q, h)`` (the prompt with guidance) and is trained
    in the plain context ``pi_theta(o | q)``: its ``old_logp`` are the sampler's log-probs in the
    hinted context, so ``r = pi_theta(o_t | q, o_<t) / pi_old(o_t | q, h, o_<t)`` is an
    importance ratio between the two contexts. Guide reshapes it as ``r / (r + gamma)`` and does
    not clip it: ``L = -A r / (r + gamma)`` (gradient ``-A gamma r / (r + gamma)^2 grad logp``,
    bounded for any ``r``). ``gamma_strategy``:

    * ``"percentile"`` (the paper's runs): ``gamma = max(quantile_gamma(r), 1e-4)``, no gradient,
      over the row's own response tokens (``gamma`` is the quantile level, 0.9);
    * ``"constant"``: ``gamma`` itself;
    * ``"power"``: ``r ** gamma`` instead of ``r / (r + gamma)``.

    Paper: Nath et al., "Adaptive Guidance Accelerates Reinforcement Learning of Reasoning
    Models" (Guide), arXiv:2506.13923. The rules are the authors' code's
    (``vaskar-open-source-research/guide_rl`` @2f27715, ``core_algos.compute_policy_loss``):
    symmetric clip 0.2, no dual clip, the 0.9 percentile. One deliberate difference: the code
    takes the percentile over every position of the hinted rows of a micro-batch, padding
    included (its paper runs use micro-batches of one sequence); here it is the row's masked
    response tokens, which is the same row-by-row scope without the padding and does not depend
    on how a batch is split into micro-batches.

    Args:
      logp, old_logp, advantages, mask: ``[B, T]``.
      hinted: ``[B]``, nonzero on the rows sampled with a hint.
      clip_low / clip_high / dual_clip: PPO's clip on the plain rows (:func:`ppo_clip_loss`).

    Returns:
      ``(loss [B, T], metrics)``: the common metrics (the clip fractions count plain tokens;
      the ratio statistics are of the raw ratio ``r``), ``hinted_frac`` (of the tokens),
      ``hinted_gamma_mean`` and ``hinted_shaped_ratio_mean`` over the hinted tokens.
    """
    clip_high = clip_low if clip_high is None else clip_high
    _check_clip(clip_low, clip_high, dual_clip)
    if gamma_strategy not in ("percentile", "constant", "power"):
        raise ValueError(f"argument 'gamma_strategy' must be 'percentile', 'constant' or 'power', got "
                         f"{gamma_strategy!r}")
    if gamma_strategy == "percentile" and not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"argument 'gamma' is the percentile's level with gamma_strategy='percentile': it must be "
                         f"in [0, 1], got {gamma!r}")
    if gamma_strategy == "constant" and not float(gamma) > 0.0:
        raise ValueError(f"argument 'gamma' must be > 0 with gamma_strategy='constant', got {gamma!r}")
    lp, olp, adv, m = _prep(logp, old_logp, advantages, mask, is_weights)
    hinted = jnp.asarray(hinted)
    if hinted.ndim != 1 or hinted.shape[0] != lp.shape[0]:
        raise ValueError(f"argument 'hinted' must have shape [{lp.shape[0]}] (one flag per row), got {hinted.shape}")
    h = (hinted != 0)[:, None]
    ratio = jnp.exp(jnp.clip(lp - olp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    if gamma_strategy == "power":
        g = jnp.full(lp.shape[:1], float(gamma), lp.dtype)
        shaped = ratio ** float(gamma)
    else:
        g = (jnp.maximum(masked_row_quantile(ratio, m, gamma), 1e-4) if gamma_strategy == "percentile"
             else jnp.full(lp.shape[:1], float(gamma), lp.dtype))
        shaped = ratio / (ratio + sg(g)[:, None])
    plain_m = m * (~h).astype(m.dtype)
    hint_m = m * h.astype(m.dtype)
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    plain_loss, met = _clipped_surrogate(ratio, clipped, adv, plain_m, clip_low, clip_high, dual_clip)
    loss = jnp.where(h, -adv * shaped, plain_loss)
    met.update(ratio_metrics(lp - olp, m))
    hm = jnp.sum(hint_m)
    met["hinted_frac"] = safe_divide(hm, jnp.sum(m))
    met["hinted_gamma_mean"] = jnp.where(hm > 0, masked_mean(jnp.broadcast_to(sg(g)[:, None], lp.shape), hint_m), 0.0)
    met["hinted_shaped_ratio_mean"] = jnp.where(hm > 0, masked_mean(sg(shaped), hint_m), 0.0)
    return _finish(loss, m, is_weights), met


def rollout_is_weights(logp, rollout_logp, mask, *, level: str = "token", upper: float = 2.0,
                       lower: float | None = None, batch_normalize: bool = False):
    """Importance weights ``pi_train / pi_rollout`` against sampler-trainer mismatch.

    ``level="token"``: ``w_t = exp(logp_t - rollout_t)``; ``"sequence"``: the product over
    the response, ``exp(sum_t ...)``, broadcast (log clamped to +-20). With only ``upper``:
    truncated IS (TIS), ``w <- min(w, upper)``. With ``lower`` too: IcePop, ``w <- w`` inside
    ``[lower, upper]`` and 0 outside (the token gets no gradient). Optionally normalised to
    mean 1 over the batch. Weights carry no gradient and are 0 outside the mask.

    Papers: Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training" (TIS, 2025 blog); Ling Team, "Every Step Evolves: Scaling RL for Trillion-Scale
    Thinking Model" (IcePop, arXiv:2510.18855). verl ``compute_rollout_correction_weights``.

    Returns:
      ``(weights [B, T], metrics)``.
    """
    _checks.check_choice("level", level, ("token", "sequence"))
    _checks.check_positive("upper", upper)
    if lower is not None:
        _checks.check_positive("lower", lower)
        if lower > upper:
            raise ValueError(f"argument 'lower' ({lower}) must be <= 'upper' ({upper})")
    _checks.check_token_args(logp=logp, rollout_logp=rollout_logp, mask=mask)
    m = _checks.as_mask(mask)
    lp, rl = (sg(_checks.zero_outside(_checks.as_float(x), m)) for x in (logp, rollout_logp))
    lr = lp - rl
    if level == "token":
        raw = jnp.exp(jnp.clip(lr, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    else:
        s = masked_sum(lr, m, axis=-1)
        raw = jnp.broadcast_to(jnp.exp(jnp.clip(s, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))[:, None], lr.shape)
    raw = raw * m
    if lower is None:
        w = jnp.minimum(raw, upper)
        oob = raw > upper
    else:
        keep = (raw >= lower) & (raw <= upper)
        w = jnp.where(keep, raw, 0.0)
        oob = ~keep
    met = {"is_weight_mean": masked_mean(w, m),
           "is_out_of_bounds_frac": masked_mean(oob.astype(lp.dtype), m)}
    if batch_normalize:
        if level == "token":
            mean = masked_mean(w, m)
        else:
            has = (jnp.sum(m, -1) > 0).astype(lp.dtype)
            mean = safe_divide(jnp.sum(masked_mean(w, m, axis=-1) * has), jnp.maximum(jnp.sum(has), 1e-8))
        w = jnp.where(mean > 1e-8, w / jnp.where(mean > 1e-8, mean, 1.0), w)
    return sg(w), met


_RS_MODES = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
             "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def rollout_rejection_mask(logp, rollout_logp, mask, *, mode: str = "token_k1",
                           upper: float, lower: float | None = None):
    """Hard trust region against sampler-trainer mismatch: mask tokens or whole sequences.

    With ``x = logp - rollout_logp`` (clamped to +-20) the divergence estimators are
    ``k1 = -x``, ``k2 = x^2/2``, ``k3 = e^x - 1 - x``. ``token_*`` tests each token;
    ``seq_sum_* / seq_mean_* / seq_max_*`` test the sum / mean / max over the response and
    reject the whole sequence. k1 modes keep ``log(lower) <= stat <= log(upper)``
    (``lower`` defaults to ``1/upper``), the others keep ``stat <= upper``. Combine several
    criteria by multiplying the masks. Semantics follow verl's
    ``compute_rollout_rejection_mask`` (verl's rollout-correction "RS" modes; the estimators are
    Schulman's k1/k2/k3, and the sequence-level masking is the idea of Ling Team, "Every Step
    Evolves: Scaling RL for Trillion-Scale Thinking Model", arXiv:2510.18855 (IcePop), applied
    to whole responses).

    Returns:
      ``(new_mask [B, T] float, metrics)``.
    """
    _checks.check_choice("mode", mode, _RS_MODES)
    _checks.check_positive("upper", upper)
    if lower is not None:
        _checks.check_positive("lower", lower)
        if lower > upper:
            raise ValueError(f"argument 'lower' ({lower}) must be <= 'upper' ({upper})")
    _checks.check_token_args(logp=logp, rollout_logp=rollout_logp, mask=mask)
    m = _checks.as_mask(mask)
    lp, rl = (sg(_checks.zero_outside(_checks.as_float(x), m)) for x in (logp, rollout_logp))
    x = jnp.clip(lp - rl, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    est = mode[-2:]
    stat = {"k1": -x, "k2": 0.5 * x * x, "k3": jnp.exp(x) - 1.0 - x}[est]
    if mode.startswith("seq_sum"):
        stat = jnp.broadcast_to(masked_sum(stat, m, axis=-1)[:, None], x.shape)
    elif mode.startswith("seq_mean"):
        stat = jnp.broadcast_to(masked_mean(stat, m, axis=-1)[:, None], x.shape)
    elif mode.startswith("seq_max"):
        mx = jnp.max(jnp.where(m > 0, stat, -jnp.inf), axis=-1)
        stat = jnp.broadcast_to(jnp.where(jnp.isfinite(mx), mx, 0.0)[:, None], x.shape)
    if est == "k1":
        lo = 1.0 / upper if lower is None else lower
        keep = (stat >= jnp.log(lo)) & (stat <= jnp.log(upper))
    else:
        if lower is not None:
            raise ValueError(f"argument 'lower' applies only to k1 modes, got mode={mode!r}")
        keep = stat <= upper
    new_mask = m * keep.astype(lp.dtype)
    met = {"rejected_token_frac": masked_mean(1.0 - keep.astype(lp.dtype), m)}
    return new_mask, met

"""Advantage estimators: pure functions from rewards (and values) to ``[B, T]`` advantages.

Conventions: ``scores: [B]`` are sequence rewards, ``mask: [B, T]``
the response mask, ``group_ids: [B]`` int in ``[0, num_groups)`` marks the samples of one
prompt (any order), ``num_groups`` is a static Python int. ``valid: [B]`` (optional)
excludes padding rows from every statistic; their advantages are 0. Outcome advantages are
broadcast over the response tokens (``A[i, t] = A_i * mask[i, t]``). Inputs in bf16 are
computed in float32; outputs are float32. Nothing here carries a gradient (rewards are data).

Parity: each estimator that verl 0.9.1 registers (``verl.trainer.ppo.core_algos``) computes
the same numbers; ``tests/conformance`` checks it. Deliberate differences are listed in each
docstring (mostly: verl raises on degenerate inputs where we return a defined value, and
verl leaves whitened values at masked positions where we return zeros).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.stats as jstats
import numpy as np

from jaxrl_llm.core import _checks
from jaxrl_llm.core.stats import group_stats, group_sum, masked_whiten, safe_divide, _check_concrete_ids

__all__ = [
    "gae_advantages",
    "egae_advantages",
    "rto_token_rewards",
    "gated_distillation_advantages",
    "grpo_advantages",
    "dr_grpo_advantages",
    "rloo_advantages",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "remax_advantages",
    "opo_advantages",
    "grpo_passk_advantages",
    "gdpo_advantages",
    "gpg_advantages",
    "lite_ppo_advantages",
    "bnpo_advantages",
    "ngrpo_advantages",
    "optimal_token_baseline_advantages",
]


def _prep_outcome(scores, mask, group_ids=None, num_groups=None, valid=None):
    b, _ = _checks.check_token_args(mask=mask)
    _checks.check_seq_args(b, scores=scores, valid=valid)
    _checks.check_float("scores", scores)
    if group_ids is not None:
        _checks.check_groups(group_ids, num_groups, b)
        _check_concrete_ids(group_ids, num_groups)
    s = _checks.as_float(scores)
    m = _checks.as_mask(mask, s.dtype)
    v = jnp.ones_like(s) if valid is None else _checks.as_mask(valid, s.dtype)
    return _checks.zero_outside(s, v), m, v


def _broadcast(adv_seq, mask, valid):
    return jax.lax.stop_gradient(jnp.where(valid > 0, adv_seq, 0.0)[:, None] * mask)


def _reward_to_go(r, m):
    """Undiscounted ``G_t = sum_{s >= t} r_s m_s`` (``[B, T]``), at every position."""
    return jnp.flip(jnp.cumsum(jnp.flip(r * m, -1), -1), -1)


def _reverse_masked_scan(step, init, xs):
    """Scan over the time axis from the end; xs are ``[B, T]`` arrays."""
    xs_t = jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1)[::-1], xs)
    carry, ys = jax.lax.scan(step, init, xs_t)
    return jnp.swapaxes(ys[::-1], 0, 1)


def _gae_step(gamma, lam):
    """GAE's backward step over ``(r_t, V_t, m_t)``: ``delta = r + gamma V_next - V``,
    ``A = delta + gamma lam A_next``; masked positions pass the running value and advantage on."""
    def step(carry, x):
        next_v, last_gae = carry
        r_t, v_t, m_t = x
        delta = r_t + gamma * next_v - v_t
        gae = delta + gamma * lam * last_gae
        next_v = v_t * m_t + (1.0 - m_t) * next_v
        last_gae = gae * m_t + (1.0 - m_t) * last_gae
        return (next_v, last_gae), last_gae
    return step


def _check_discount(name: str, value) -> None:
    """A discount or GAE lambda: a static float in [0, 1] (traced values are not checked)."""
    if isinstance(value, jax.core.Tracer):
        return
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"argument {name!r} must be in [0, 1], got {value!r}")


def gae_advantages(token_rewards: jnp.ndarray, values: jnp.ndarray, mask: jnp.ndarray,
                   gamma: float = 1.0, lam: float = 1.0, whiten: bool = True
                   ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Generalised Advantage Estimation with returns (PPO critic targets).

    ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``, computed
    backwards; positions with ``mask = 0`` (e.g. observation tokens of a multi-turn episode)
    are skipped: they neither produce a TD error nor break the recursion, exactly as in
    verl's ``compute_gae_advantage_return``. ``returns = A + V`` (before whitening); the
    advantages are then whitened over the masked tokens of the batch (unbiased variance).

    Paper: Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", arXiv:1506.02438.

    Args:
      token_rewards: ``[B, T]`` per-token rewards (outcome reward on the last token, KL-in-
        reward terms elsewhere).
      values: ``[B, T]`` critic values of the old policy.
      mask: ``[B, T]`` response mask.
      gamma, lam: discount and GAE lambda (verl defaults 1.0, 1.0).
      whiten: whiten advantages over the batch (verl always does).

    Returns:
      ``(advantages [B, T], returns [B, T])``, zero outside the mask (verl leaves whitened
      values there; they are never used).
    """
    _checks.check_token_args(token_rewards=token_rewards, values=values, mask=mask)
    _check_discount("gamma", gamma)
    _check_discount("lam", lam)
    m = _checks.as_mask(mask)
    r = _checks.zero_outside(_checks.as_float(token_rewards), m)
    v = _checks.zero_outside(_checks.as_float(values), m)

    zeros = jnp.zeros(r.shape[0], r.dtype)
    adv = _reverse_masked_scan(_gae_step(gamma, lam), (zeros, zeros), (r, v, m))
    returns = adv + v
    if whiten:
        adv = masked_whiten(adv, m)
    return jax.lax.stop_gradient(adv * m), jax.lax.stop_gradient(returns * m)


def egae_advantages(token_rewards: jnp.ndarray, values: jnp.ndarray, mask: jnp.ndarray, truncated: jnp.ndarray,
                    gamma: float = 1.0, lam: float = 1.0, whiten: bool = True
                    ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """T-PPO's Extended GAE: GAE that bootstraps responses which did not finish.

    For a finished response this is :func:`gae_advantages` (its reward on the last token, value
    0 after it). For a *truncated* one (cut by the length budget or a generation window before
    its end) the outcome is not known yet: the caller leaves it out of ``token_rewards`` (per-token
    terms such as a KL penalty stay; the ``egae`` estimator does this) and the value after the
    last generated token is taken to equal the value at it, ``V(s_l) := V(s_{l-1})``, so with no
    per-token reward ``delta_{l-1} = (gamma - 1) V(s_{l-1})`` and ``A_t = sum_k (gamma lam)^k
    delta_{t+k}`` over the generated part; with ``gamma = lam = 1``, ``A_t = V(s_{l-1}) - V(s_t)``.
    Returns ``A + V``: for a truncated row a bootstrapped (TD) target; the paper trains its value
    function on completed responses only, the library's critic trains on both.

    Paper: "Truncated Proximal Policy Optimization" (T-PPO), arXiv:2506.15050: the EGAE
    assumption ``V(s_l) = V(s_{l-1})`` as the paper's reviews quote it (no code was released). The
    paper's successive batched sampling (finished responses replaced by new prompts between
    generation windows) is a loop feature not implemented here; in this library's loop a
    response cut at ``max_new_tokens`` is the truncated case. No truncation: plain GAE (tested).

    Args:
      token_rewards: ``[B, T]``. values: ``[B, T]``. mask: ``[B, T]``. truncated: ``[B]`` bool.
      gamma, lam: discount and GAE lambda. whiten: whiten over the batch's tokens.

    Returns:
      ``(advantages [B, T], returns [B, T])``, zero outside the mask.
    """
    b, _ = _checks.check_token_args(token_rewards=token_rewards, values=values, mask=mask)
    _checks.check_seq_args(b, truncated=truncated)
    _check_discount("gamma", gamma)
    _check_discount("lam", lam)
    m = _checks.as_mask(mask)
    tr = jnp.asarray(truncated).astype(bool)
    r = _checks.zero_outside(_checks.as_float(token_rewards), m)
    v = _checks.zero_outside(_checks.as_float(values), m)
    t = m.shape[1]
    last = t - 1 - jnp.argmax(m[:, ::-1] > 0, axis=1)
    v_last = jnp.take_along_axis(v, last[:, None], axis=1)[:, 0]
    boot = jnp.where(tr & jnp.any(m > 0, axis=1), v_last, 0.0)    # the value after the last generated token

    adv = _reverse_masked_scan(_gae_step(gamma, lam), (boot, jnp.zeros(b, r.dtype)), (r, v, m))
    returns = adv + v
    if whiten:
        adv = masked_whiten(adv, m)
    return jax.lax.stop_gradient(adv * m), jax.lax.stop_gradient(returns * m)


def rto_token_rewards(dpo_logp: jnp.ndarray, ref_logp: jnp.ndarray, mask: jnp.ndarray, *, scale: float = 0.05,
                      clip: float = 0.05) -> jnp.ndarray:
    """RTO's dense token rewards from a DPO-trained policy.

    ``d_t = clip(scale (log pi_dpo(y_t) - log pi_ref(y_t)), -clip, clip)`` per response token: the
    DPO model's token-level implicit reward (DPO's reward is ``beta log pi / pi_ref`` summed over
    tokens), scaled and clipped; RTO adds it to the sparse reward-model score on the last token
    and the per-token KL penalty, and optimises with PPO.

    Paper: "DPO Meets PPO: Reinforced Token Optimization for RLHF" (Zhong et al.),
    arXiv:2404.18922; the authors' code (``zkshan2002/RTO`` @f2c1294, ``_compute_dpo_rewards``)
    and script: ``scale = 0.05`` (``dpo_reward_scale``), ``clip = 0.05`` (``dpo_reward_clip``; 0 is
    no clip, as in the code). ``scale = 0`` gives plain PPO-RLHF.

    Args:
      dpo_logp: ``[B, T]`` log-probs of the sampled tokens under the DPO model. ref_logp: ``[B, T]``
        under the reference (the DPO model's starting point). mask: ``[B, T]``.

    Returns:
      ``[B, T]`` float32, zero outside the mask; no gradient.
    """
    _checks.check_token_args(dpo_logp=dpo_logp, ref_logp=ref_logp, mask=mask)
    _checks.check_positive("clip", clip, allow_zero=True)
    m = _checks.as_mask(mask)
    d = scale * (_checks.zero_outside(_checks.as_float(dpo_logp), m) - _checks.zero_outside(_checks.as_float(ref_logp),
                                                                                            m))
    if clip > 0:
        d = jnp.clip(d, -clip, clip)
    return jax.lax.stop_gradient(d * m)


def gated_distillation_advantages(advantages: jnp.ndarray, old_logp: jnp.ndarray, teacher_logp: jnp.ndarray,
                                  mask: jnp.ndarray, gate: jnp.ndarray, *, coef: float) -> jnp.ndarray:
    """KEPO's quality-gated on-policy distillation as an advantage term: the RL advantage plus,
    on the gated responses only, the teacher's per-token reverse-KL reward.

    ``A'_t = A_t + coef g_i (log pi_T(y_t) - log pi_old(y_t))`` where ``g_i`` is 1 for a
    high-quality response (``gate``; the run's choice: a correct one) and 0 otherwise. The added
    term is on-policy distillation's dense reward, the negative of the single-sample reverse KL
    ``log pi(y_t) - log pi_T(y_t)`` at the sampled token: its policy gradient lowers the reverse
    KL to the teacher. Low-quality responses, whose later tokens follow an early error, get no
    teacher signal (the paper's argument).

    Paper: "KEPO: Knowledge-Enhanced Preference Optimization for Reinforcement Learning with
    Reasoning", arXiv:2602.00400 (the gate and the dense teacher term from the abstract; no code
    or equations were available to us, so the per-token reverse-KL reward, its addition to the
    advantage and the gate by correctness are our reading, and ``coef`` has no default).
    Identity: ``coef = 0``, or no gated response, returns ``advantages``.

    Args:
      advantages, old_logp, teacher_logp, mask: ``[B, T]``. gate: ``[B]`` bool.
      coef: the teacher term's weight (>= 0).

    Returns:
      ``[B, T]`` float32, zero outside the mask; no gradient.
    """
    _checks.check_token_args(advantages=advantages, old_logp=old_logp, teacher_logp=teacher_logp, mask=mask)
    _checks.check_rank("gate", gate, 1)
    _checks.check_seq_args(np.shape(advantages)[0], gate=gate)
    _checks.check_positive("coef", coef, allow_zero=True)
    m = _checks.as_mask(mask)
    z = lambda x: _checks.zero_outside(_checks.as_float(x), m)  # noqa: E731
    g = jnp.asarray(gate, bool)[:, None].astype(jnp.float32)
    return jax.lax.stop_gradient((z(advantages) + coef * g * (z(teacher_logp) - z(old_logp))) * m)


def grpo_advantages(scores: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray,
                    num_groups: int, *, scale_by_std: bool = True, epsilon: float = 1e-6,
                    unbiased_std: bool = True, valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """GRPO group-normalised outcome advantage.

    ``A_i = (r_i - mean_g r) / (std_g r + epsilon)``; without ``scale_by_std`` it is
    ``r_i - mean_g r`` (Dr.GRPO). ``std`` is unbiased (``torch.std``) as in verl; TRL uses the
    same. A group with one sample gets mean 0 and std 1 (verl's convention), i.e. its raw score.

    Paper: Shao et al., "DeepSeekMath", arXiv:2402.03300 (GRPO); Liu et al., "Understanding
    R1-Zero-Like Training", arXiv:2503.20783 (Dr.GRPO).

    Args:
      scores: ``[B]`` sequence rewards. mask: ``[B, T]``. group_ids: ``[B]`` int.
      num_groups: static bound on group ids. epsilon: verl default 1e-6.
      valid: optional ``[B]`` row mask (padding rows excluded, advantage 0).

    Returns:
      ``[B, T]`` advantages.
    """
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    st = group_stats(s, group_ids, num_groups, v, unbiased=unbiased_std)
    single = st.count <= 1
    mean = jnp.where(single, 0.0, st.mean)
    std = jnp.where(single, 1.0, st.std)
    # safe_divide: with epsilon = 0 an all-equal group has 0 / 0; it gets 0 (verl: NaN)
    adv = safe_divide(s - mean, std + epsilon) if scale_by_std else s - mean
    return _broadcast(adv, m, v)


def dr_grpo_advantages(scores, mask, group_ids, num_groups, *, valid=None) -> jnp.ndarray:
    """Dr.GRPO advantage ``A_i = r_i - mean_g r`` (no std division).

    Paper: Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective",
    arXiv:2503.20783.

    Use it with ``seq-mean-token-sum-norm`` aggregation and a constant horizon.
    """
    return grpo_advantages(scores, mask, group_ids, num_groups, scale_by_std=False, valid=valid)


def rloo_advantages(scores, mask, group_ids, num_groups, *, valid=None,
                    singleton: str = "score") -> jnp.ndarray:
    """REINFORCE Leave-One-Out: ``A_i = r_i - mean_{j != i, j in g} r_j = G/(G-1) (r_i - mean_g r)``.

    Paper: Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs", arXiv:2402.14740.

    ``singleton`` sets the advantage of a one-sample group, where no baseline exists:
    ``"score"`` keeps the raw score (verl's ``rloo``), ``"zero"`` gives 0 (verl's
    ``rloo_vectorized``); the two verl implementations disagree here.
    """
    _checks.check_choice("singleton", singleton, ("score", "zero"))
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    st = group_stats(s, group_ids, num_groups, v)
    c = st.count
    loo = safe_divide(c * s - c * st.mean, c - 1.0)
    single_val = s if singleton == "score" else jnp.zeros_like(s)
    adv = jnp.where(c > 1, loo, single_val)
    return _broadcast(adv, m, v)


def reinforce_pp_advantages(token_rewards: jnp.ndarray, mask: jnp.ndarray, gamma: float = 1.0
                            ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """REINFORCE++: discounted token returns, whitened over the batch (global normalisation).

    ``G_t = r_t + gamma G_{t+1}`` over response tokens (masked positions carry the running
    return through unchanged), ``A = whiten(G)`` over all masked tokens of the batch.

    Paper: Hu, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
    Models", arXiv:2501.03262. KL is usually folded into ``token_rewards``
    (see :func:`jaxrl_llm.core.kl.kl_in_reward`).

    Returns:
      ``(advantages [B, T], returns [B, T])``.
    """
    _checks.check_token_args(token_rewards=token_rewards, mask=mask)
    _check_discount("gamma", gamma)
    m = _checks.as_mask(mask)
    r = _checks.zero_outside(_checks.as_float(token_rewards), m)

    def step(run, x):
        r_t, m_t = x
        new = r_t + gamma * run
        out = new * m_t
        run = new * m_t + run * (1.0 - m_t)
        return run, out

    returns = _reverse_masked_scan(step, jnp.zeros(r.shape[0], r.dtype), (r, m))
    adv = masked_whiten(returns, m) * m
    return jax.lax.stop_gradient(adv), jax.lax.stop_gradient(returns)


def reinforce_pp_baseline_advantages(scores, mask, group_ids, num_groups, *, valid=None
                                     ) -> jnp.ndarray:
    """REINFORCE++-baseline: subtract the group mean, then whiten over all batch tokens.

    ``A_i = r_i - mean_g r`` broadcast to tokens, then ``whiten`` over the masked tokens of
    the batch (unbiased variance, eps 1e-8 inside the root). Singleton groups keep the raw
    score before whitening (verl).

    Paper: Hu, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models", arXiv:2501.03262.
    """
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    st = group_stats(s, group_ids, num_groups, v)
    adv = jnp.where(st.count > 1, s - st.mean, s)
    tok = _broadcast(adv, m, v)
    mm = m * v[:, None]
    return jax.lax.stop_gradient(masked_whiten(tok, mm) * mm)


def remax_advantages(token_rewards: jnp.ndarray, baseline_scores: jnp.ndarray, mask: jnp.ndarray
                     ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """ReMax: reward-to-go minus the reward of the greedy response.

    ``G_t = sum_{t' >= t} m r_{t'}``, ``A_t = G_t - b``, with ``b`` the reward of the greedy
    (argmax-decoded) response to the same prompt. No critic and no group needed.

    Paper: Li et al., "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method
    for Aligning Large Language Models", arXiv:2310.10505.

    Args:
      token_rewards: ``[B, T]``. baseline_scores: ``[B]`` greedy rewards. mask: ``[B, T]``.

    Returns:
      ``(advantages, returns)``, ``[B, T]`` each, zero outside the mask.
    """
    b, _ = _checks.check_token_args(token_rewards=token_rewards, mask=mask)
    _checks.check_seq_args(b, baseline_scores=baseline_scores)
    m = _checks.as_mask(mask)
    r = _checks.zero_outside(_checks.as_float(token_rewards), m)
    base = _checks.as_float(baseline_scores)
    returns = _reward_to_go(r, m)
    adv = (returns - base[:, None]) * m
    return jax.lax.stop_gradient(adv), jax.lax.stop_gradient(returns * m)


def opo_advantages(scores, mask, group_ids, num_groups, *, valid=None) -> jnp.ndarray:
    """OPO: on-policy RL with the optimal (length-weighted) group baseline.

    ``b_g = sum_{i in g} |o_i| r_i / sum_{i in g} |o_i|``, ``A_i = r_i - b_g``; singleton
    groups get baseline 0 (verl).

    Paper: Hao et al., "On-Policy RL with Optimal Reward Baseline", arXiv:2505.23585.
    """
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    lens = jnp.sum(m, -1) * v
    cnt = group_sum(v, group_ids, num_groups)
    bsl = safe_divide(group_sum(lens * s, group_ids, num_groups), group_sum(lens, group_ids, num_groups))
    bsl = jnp.where(cnt > 1, bsl, 0.0)[group_ids]
    return _broadcast(s - bsl, m, v)


def grpo_passk_advantages(scores, mask, group_ids, num_groups, *, scale_by_std: bool = True,
                          epsilon: float = 1e-6, valid=None) -> jnp.ndarray:
    """Pass@k advantage: only the best sample of a group learns, by ``r_max - r_second``.

    ``A_{argmax} = (r_max - r_2nd) / (std_g r + epsilon)`` (or without the std), every other
    sample 0. Ties at the top give 0 (whichever sample is chosen). Groups of one sample get 0
    (verl raises instead).

    Paper: Tang, Zheng, Synnaeve and Munos, "Optimizing Language Models for Inference Time
    Objectives using Reinforcement Learning", arXiv:2503.19595 (the paper verl's
    ``grpo_passk`` cites; formula from verl).
    """
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    b = s.shape[0]
    neg = jnp.full_like(s, -jnp.inf)
    vs = jnp.where(v > 0, s, neg)
    gmax = jax.ops.segment_max(vs, group_ids, num_segments=num_groups)
    is_max = (v > 0) & (s == gmax[group_ids])
    idx = jnp.arange(b)
    first = jax.ops.segment_min(jnp.where(is_max, idx, b), group_ids, num_segments=num_groups)
    chosen = idx == first[group_ids]
    second = jax.ops.segment_max(jnp.where(chosen, neg, vs), group_ids, num_segments=num_groups)
    gap = jnp.where(jnp.isfinite(second), gmax - second, 0.0)[group_ids]
    if scale_by_std:
        st = group_stats(s, group_ids, num_groups, v)
        gap = safe_divide(gap, st.std + epsilon)
    return _broadcast(jnp.where(chosen, gap, 0.0), m, v)


def gdpo_advantages(component_scores: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray,
                    num_groups: int, *, weights: jnp.ndarray | None = None,
                    scale_by_std: bool = True, epsilon: float = 1e-6, valid=None) -> jnp.ndarray:
    """GDPO: group-normalise each reward component separately, sum with weights, whiten.

    ``A = whiten_batch( sum_k w_k GRPO(r_k) )`` over the masked tokens. Decoupling stops one
    dominant reward (e.g. accuracy) from drowning a weaker one (e.g. format).

    Paper: "GDPO: Group reward-Decoupled Normalization Policy Optimization",
    arXiv:2601.05242 (as in verl's ``gdpo``).

    Args:
      component_scores: ``[B, K]`` per-component rewards. weights: ``[K]`` (default ones).
    """
    _checks.check_rank("component_scores", component_scores, 2)
    b, t = _checks.check_token_args(mask=mask)
    if component_scores.shape[0] != b:
        raise ValueError(f"argument 'component_scores' must have shape ({b}, K), got {component_scores.shape}")
    k = component_scores.shape[1]
    w = jnp.ones((k,), jnp.float32) if weights is None else _checks.as_float(weights)
    if w.shape != (k,):
        raise ValueError(f"argument 'weights' must have shape ({k},), got {w.shape}")
    cs = _checks.as_float(component_scores)
    total = jnp.zeros((b, t), jnp.float32)
    for j in range(k):
        total = total + w[j] * grpo_advantages(cs[:, j], mask, group_ids, num_groups,
                                               scale_by_std=scale_by_std, epsilon=epsilon, valid=valid)
    m = _checks.as_mask(mask) * (1.0 if valid is None else _checks.as_mask(valid)[:, None])
    return jax.lax.stop_gradient(masked_whiten(total, m) * m)


def gpg_advantages(scores, mask, group_ids, num_groups, *, f_norm: float = 1.0, valid=None
                   ) -> jnp.ndarray:
    """GPG advantage: group-mean baseline rescaled by the batch's share of nonzero rewards.

    ``A_i = alpha (r_i - mean_g r) / F_norm`` with ``alpha = B / max(#{i: r_i != 0}, 1)``
    (the count is over valid rows). Paper: Chu et al., "GPG: A Simple and Strong
    Reinforcement Learning Baseline for Model Reasoning", arXiv:2504.02546. verl's ``gpg``.
    """
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    n = jnp.sum(v)
    nz = jnp.sum(jnp.where((s != 0) & (v > 0), 1.0, 0.0))
    alpha = n / jnp.maximum(nz, 1.0)
    st = group_stats(s, group_ids, num_groups, v)
    mean = jnp.where(st.count > 1, st.mean, 0.0)
    return _broadcast(alpha * (s - mean) / f_norm, m, v)


def lite_ppo_advantages(scores, mask, group_ids, num_groups, *, epsilon: float = 1e-6,
                        unbiased_std: bool = True, valid=None) -> jnp.ndarray:
    """Lite PPO: group-level mean, batch-level standard deviation.

    ``A_i = (r_i - mean_g r) / (std_batch r + epsilon)``. Use with ``token-mean``
    aggregation and plain PPO clipping (the paper's recipe).

    Paper: Liu et al., "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning",
    arXiv:2508.08221. Our choice where the paper is silent: the batch std is taken over the
    raw scores of the valid rows, unbiased by default.
    """
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    st = group_stats(s, group_ids, num_groups, v)
    n = jnp.sum(v)
    mu = safe_divide(jnp.sum(s * v), n)
    den = jnp.maximum(n - 1.0, 1.0) if unbiased_std else jnp.maximum(n, 1.0)
    std = jnp.sqrt(jnp.sum(jnp.square(s - mu) * v) / den)
    return _broadcast(safe_divide(s - st.mean, std + epsilon), m, v)


def _bnpo_single(r, group_ids, num_groups, v, r_min, r_max, alpha, beta, max_weight):
    rt = (r - r_min) / (r_max - r_min)
    cnt = group_sum(v, group_ids, num_groups)
    p_g = safe_divide(group_sum(rt * v, group_ids, num_groups), cnt)
    p_g = jnp.where(cnt > 1, p_g, 0.0)
    present = (cnt > 1).astype(r.dtype)  # a one-sample group has no success rate to fit
    nq = jnp.sum(present)
    mu = safe_divide(jnp.sum(p_g * present), nq)
    var = safe_divide(jnp.sum(jnp.square(p_g - mu) * present), jnp.maximum(nq - 1.0, 0.0))
    ok = (var > 0) & (nq > 1)
    k = jnp.where(ok, mu * (1.0 - mu) / jnp.where(ok, var, 1.0) - 1.0, 0.0)
    a_fit = jnp.maximum(1.0, 1.0 + k * mu / 3.0)
    b_fit = jnp.maximum(1.0, 1.0 + k * (1.0 - mu) / 3.0)
    a = a_fit if alpha is None else jnp.asarray(alpha, r.dtype)
    b = b_fit if beta is None else jnp.asarray(beta, r.dtype)
    p = p_g[group_ids]
    pdf = jstats.beta.pdf(p, a, b)
    weight = jnp.minimum(max_weight, 1.0 / jnp.maximum(pdf, 1.0 / max_weight))
    # a one-sample group has no success-rate estimate (p_q would be 0, where the Beta pdf is 0
    # and the weight max_weight): it gets advantage 0
    return jnp.where(cnt[group_ids] > 1, (rt - p) * weight, 0.0), a, b


def bnpo_advantages(scores, mask, group_ids, num_groups, *, r_min=0.0, r_max=1.0,
                    alpha: float | None = None, beta: float | None = None,
                    max_weight: float = 1e6, valid=None) -> jnp.ndarray:
    """BNPO: Beta-normalised advantage with adaptive (alpha, beta) and reward decomposition.

    Rewards are mapped to ``[0, 1]``: ``r~ = (r - r_min)/(r_max - r_min)``; ``p_q`` is the
    group mean of ``r~`` (0 for a one-sample group). Over the prompts of the batch,
    ``mu, sigma^2`` (unbiased) of ``p_q`` give a method-of-moments Beta fit
    ``a = (mu(1-mu)/sigma^2 - 1) mu``, ``b = (mu(1-mu)/sigma^2 - 1)(1 - mu)``;
    ``alpha = max(1, 1 + a/3)``, ``beta = max(1, 1 + b/3)``. Then
    ``A_i = (r~_i - p_q) * min(max_weight, 1 / BetaPDF(p_q; alpha, beta))``.
    With ``scores: [B, K]`` the K reward components are normalised separately and their
    advantages averaged ("advantage decomposition").

    Identities (tested): alpha = beta = 1 is REINFORCE with a group-mean baseline;
    alpha = beta = 3/2 gives ``(pi/8) (r - p)/sqrt(p(1-p))``, GRPO with population std up to
    the constant pi/8, for binary rewards.

    Paper: Xiao et al., "BNPO: Beta Normalization Policy Optimization", arXiv:2506.02864
    (formula from the authors' code). Our choices: if the batch variance of ``p_q`` is 0 or
    there is one prompt, the fit falls back to alpha = beta = 1; one-sample groups get
    advantage 0 and take no part in the fit; ``alpha``/``beta`` may be fixed by the caller.
    """
    if not isinstance(r_min, jax.core.Tracer) and not isinstance(r_max, jax.core.Tracer):
        if not np.all(np.asarray(r_max, np.float64) > np.asarray(r_min, np.float64)):
            raise ValueError(f"argument 'r_max' ({r_max}) must be > 'r_min' ({r_min}) for every component")
    r = _checks.as_float(scores)
    if r.ndim == 2:
        b = r.shape[0]
        _checks.check_token_args(mask=mask)
        comps = [r[:, j] for j in range(r.shape[1])]
    else:
        comps = [r]
    s0, m, v = _prep_outcome(comps[0], mask, group_ids, num_groups, valid)
    k = len(comps)
    r_min = jnp.broadcast_to(jnp.asarray(r_min, jnp.float32), (k,))
    r_max = jnp.broadcast_to(jnp.asarray(r_max, jnp.float32), (k,))
    adv = jnp.zeros_like(s0)
    for j, c in enumerate(comps):
        a_j, _, _ = _bnpo_single(c, group_ids, num_groups, v, r_min[j], r_max[j], alpha, beta, max_weight)
        adv = adv + a_j / k
    return _broadcast(adv, m, v)


def ngrpo_advantages(scores, mask, group_ids, num_groups, *, r_max: float = 1.0,
                     epsilon: float = 1e-6, valid=None) -> jnp.ndarray:
    """NGRPO: GRPO statistics with one virtual maximum-reward sample per group.

    For a group of ``G >= 2`` (valid) samples, one virtual sample with reward ``r_max`` is
    added: ``mu' = mean(r_1..r_G, r_max)``, ``sigma' = std_unbiased(r_1..r_G, r_max)``
    (``torch.std`` over the ``G + 1`` values), ``A_i = (r_i - mu') / (sigma' + epsilon)``.
    An all-wrong group (binary rewards) gets ``-1/sqrt(G+1)`` instead of 0; an all-correct
    group has ``sigma' = 0`` and gets ``0 / epsilon = 0``.

    A group with a single valid sample (``G = 1``, counting only ``valid`` rows) gets no
    virtual sample: mean 0 and std 1, i.e. ``A = r / (1 + epsilon)`` (``r = 0`` gives 0,
    ``r = r_max = 1`` gives ``1 / (1 + epsilon)``). This follows the authors' code, which
    keeps verl's GRPO single-sample convention; it is not the ``G >= 2`` rule applied to
    ``G = 1`` (which would give about ``-1/sqrt(2)`` for every ``r < r_max``).

    Paper: "NGRPO: Negative-enhanced Group Relative Policy Optimization", arXiv:2509.18851
    (from the authors' ``compute_ngrpo_outcome_advantage``). Pair it with asymmetric clipping
    (eps_low 0.16, eps_high 0.24) and ``token-mean`` as in the paper's script.
    """
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    n_real = group_sum(v, group_ids, num_groups)
    cnt = n_real + 1.0
    mean = (group_sum(s * v, group_ids, num_groups) + r_max) / cnt
    dev = jnp.where(v > 0, s - mean[group_ids], 0.0)
    ss = group_sum(jnp.square(dev), group_ids, num_groups) + jnp.square(r_max - mean)
    std = jnp.sqrt(ss / jnp.maximum(cnt - 1.0, 1.0))
    # one valid sample: the authors' code (as verl's GRPO) uses mean 0, std 1, no virtual sample
    single = n_real <= 1.0
    mean = jnp.where(single, 0.0, mean)
    std = jnp.where(single, 1.0, std)
    return _broadcast((s - mean[group_ids]) / (std[group_ids] + epsilon), m, v)


def _compact_responses(mask: jnp.ndarray, *xs: jnp.ndarray):
    """Move each row's response tokens to the front: slot ``k`` holds the ``k``-th token with
    ``mask > 0``. Returns ``(compact mask, compact xs, slot index [B, T])`` where the slot index
    maps every original position back to its slot (clipped; only meaningful under the mask)."""
    b, t = mask.shape
    slot = jnp.cumsum((mask > 0).astype(jnp.int32), axis=1) - 1
    target = jnp.where(mask > 0, slot, t)  # out of range: dropped
    rows = jnp.arange(b)[:, None]
    compact = [jnp.zeros_like(x).at[rows, target].set(x, mode="drop") for x in xs]
    n = jnp.sum(mask > 0, axis=1)
    cmask = (jnp.arange(t)[None] < n[:, None]).astype(mask.dtype)
    return cmask, compact, jnp.clip(slot, 0, t - 1)


def optimal_token_baseline_advantages(token_rewards: jnp.ndarray, old_logp: jnp.ndarray,
                                      sum_pi_squared: jnp.ndarray, mask: jnp.ndarray,
                                      group_ids: jnp.ndarray, num_groups: int, *,
                                      is_weights: jnp.ndarray | None = None, align: str = "position",
                                      handle_zero_tail: bool = True, epsilon: float = 1e-8,
                                      valid: jnp.ndarray | None = None
                                      ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Optimal Token Baseline (OTB): a per-token group baseline weighted by path variance.

    With returns ``G_t = sum_{s >= t} r_s`` (undiscounted reward-to-go over response tokens)
    and the logit-gradient proxy of the squared score norm of token ``t``,
    ``w_t = ||e_{y_t} - pi_t||^2 = 1 - 2 pi(y_t) + sum_v pi(v)^2`` (times ``rho_t^2`` when
    truncated importance weights ``is_weights`` are given), the cumulative path variance is
    ``W_t = sum_{j <= t} w_j`` and the baseline of step ``t`` in group ``g`` is
    ``B_t = sum_{i in g} G_{i,t} W_{i,t} / (sum_{i in g} W_{i,t} + epsilon)``;
    ``A_{i,t} = G_{i,t} - B_t``. A group with one (non-empty) response gets ``B = 0``.
    ``handle_zero_tail``: when a single response of a group is strictly the longest, its
    baseline is 0 from the second-longest length on (no other sample estimates it there).

    ``align`` says which tokens share a baseline: ``"position"`` (verl's
    ``optimal_token_baseline``) compares tokens at the same index ``t`` of the ``[B, T]``
    layout; ``"response"`` (verl's ``tir_optimal_token_baseline``, for multi-turn / tool-
    integrated episodes whose masks have holes) compares the ``k``-th *response* token of
    each sample, skipping masked positions. They coincide for prefix masks.

    Paper: Li et al., "The Optimal Token Baseline: Variance Reduction for Long-Horizon
    LLM-RL", arXiv:2602.07078 (formula and defaults from verl 0.9.1, which the authors
    contributed; ``sum_pi_squared`` from :func:`jaxrl_llm.core.entropy.chunked_sum_pi_squared`
    of the temperature-scaled logits of the policy that sampled).

    Difference from verl (deliberate, documented): rows with no response token (or with
    ``valid = 0``) are not members of their group. verl's ``"position"`` variant counts them,
    which only matters with ``handle_zero_tail=False`` for a group with exactly one non-empty
    response: verl uses that response's own return as its baseline (advantage ~0), we treat it
    as a one-sample group (advantage = return), as verl's ``"response"`` variant does.

    Args:
      token_rewards: ``[B, T]`` per-token rewards (outcome reward on the last token).
      old_logp: ``[B, T]`` log-probs of the sampled tokens under the sampling policy.
      sum_pi_squared: ``[B, T]`` ``sum_v pi(v)^2`` of that policy at each position.
      mask: ``[B, T]`` response mask. group_ids: ``[B]`` int; num_groups: static.
      is_weights: optional ``[B, T]`` truncated IS weights ``rho``; ``W`` uses ``rho^2``.
      align: ``"position"`` or ``"response"``. handle_zero_tail: see above (verl default True).
      epsilon: added to the denominator (verl 1e-8). valid: optional ``[B]`` row mask.

    Returns:
      ``(advantages [B, T], returns [B, T])``, zero outside the mask; no gradient.
    """
    _checks.check_choice("align", align, ("position", "response"))
    b, t = _checks.check_token_args(token_rewards=token_rewards, old_logp=old_logp,
                                     sum_pi_squared=sum_pi_squared, mask=mask)
    if is_weights is not None:
        _checks.check_token_args(mask=mask, is_weights=is_weights)
    _checks.check_seq_args(b, valid=valid)
    _checks.check_groups(group_ids, num_groups, b)
    _check_concrete_ids(group_ids, num_groups)
    m = _checks.as_mask(mask)
    r, lp, sp = (_checks.zero_outside(_checks.as_float(x), m) for x in (token_rewards, old_logp, sum_pi_squared))
    w = 1.0 - 2.0 * jnp.exp(lp) + sp
    if is_weights is not None:
        w = w * jnp.square(_checks.zero_outside(_checks.as_float(is_weights), m))
    v = jnp.ones((b,), r.dtype) if valid is None else _checks.as_mask(valid, r.dtype)
    orig_m = m
    if align == "response":
        m, (r, w), slot = _compact_responses(m, r, w)
    ret = _reward_to_go(r, m)
    cum_w = jnp.cumsum(w * m, axis=1)
    n = jnp.sum(m, axis=1)
    member = (v > 0) & (n > 0)
    mw = cum_w * m * member[:, None]
    num = jax.ops.segment_sum(ret * mw, group_ids, num_segments=num_groups)  # [NG, T]
    den = jax.ops.segment_sum(mw, group_ids, num_segments=num_groups) + epsilon
    cnt = group_sum(member.astype(r.dtype), group_ids, num_groups)[group_ids]
    base = jnp.where((cnt > 1)[:, None], (num / den)[group_ids], 0.0)
    if handle_zero_tail:
        n_m = jnp.where(member, n, -1.0)
        longest = jax.ops.segment_max(n_m, group_ids, num_segments=num_groups)[group_ids]
        is_max = member & (n == longest)
        n_at_max = group_sum(is_max.astype(r.dtype), group_ids, num_groups)[group_ids]
        second = jax.ops.segment_max(jnp.where(member & ~is_max, n, 0.0), group_ids,
                                     num_segments=num_groups)[group_ids]
        tail_row = is_max & (n_at_max == 1) & (cnt > 1)
        tail = tail_row[:, None] & (jnp.arange(t)[None] >= second[:, None])
        base = jnp.where(tail, 0.0, base)
    adv = ret - base
    if align == "response":
        back = lambda x: jnp.take_along_axis(x, slot, axis=1)  # noqa: E731
        adv, ret = back(adv), back(ret)
    keep = orig_m * v[:, None]
    return jax.lax.stop_gradient(adv * keep), jax.lax.stop_gradient(ret * keep)

"""Curricula and prompt priorities: the arithmetic of the loop-level selectors.

Pure array functions (jit- and vmap-able); the host-side drawing of prompts is in
:mod:`jaxrl_llm.algorithms.selection`.

* SEC (Self-Evolving Curriculum, arXiv:2505.14970): one arm per problem category, its value
  moved by TD(0) towards the mean absolute advantage of the category's problems in the last
  step; categories drawn from a Boltzmann distribution over the values.
* VAS (Variance-Aware Sampling, MMR1, arXiv:2509.21268): a variance promotion score per prompt,
  ``w_o p (1 - p) + w_d diversity``.
* SPO (Single-stream Policy Optimization, arXiv:2509.13232): a per-prompt Beta tracker of the
  success probability with KL-adaptive forgetting, globally normalised advantages against it,
  and prioritised sampling with weights ``sqrt(p (1 - p)) + eps``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks

__all__ = ["td_update", "boltzmann_probs", "variance_promotion_score", "uncertainty_priority", "kl_adaptive_forgetting",
           "mean_abs_logp_change", "beta_tracker_update", "single_stream_advantages"]


def td_update(values: jnp.ndarray, rewards: jnp.ndarray, observed: jnp.ndarray, alpha: float) -> jnp.ndarray:
    """SEC's TD(0) value update of each arm: ``Q <- Q + alpha (r - Q) = alpha r + (1 - alpha) Q``
    where the arm was observed this step, ``Q`` unchanged elsewhere.

    Args:
      values: ``[K]`` current arm values. rewards: ``[K]`` this step's reward per arm (SEC: the
        mean absolute advantage of the arm's problems). observed: ``[K]`` bool, arms with
        problems in the step. alpha: the learning rate in ``[0, 1]``.

    Returns:
      ``[K]`` float32.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"td_update: alpha must be in [0, 1], got {alpha}")
    _checks.check_same_shape("values", values, rewards=rewards, observed=observed)
    q = jnp.asarray(values, jnp.float32)
    r = jnp.where(observed, jnp.asarray(rewards, jnp.float32), q)
    return q + alpha * (r - q)


def boltzmann_probs(values: jnp.ndarray, available: jnp.ndarray, temperature: float) -> jnp.ndarray:
    """``softmax(Q / tau)`` over the available arms (0 for the others; all zeros if none is).

    Args:
      values: ``[K]``. available: ``[K]`` bool. temperature: ``tau > 0``.

    Returns:
      ``[K]`` float32 probabilities.
    """
    if temperature <= 0:
        raise ValueError(f"boltzmann_probs: temperature must be > 0, got {temperature}")
    _checks.check_same_shape("values", values, available=available)
    logits = jnp.where(available, jnp.asarray(values, jnp.float32) / temperature, -jnp.inf)
    p = jax.nn.softmax(jnp.where(jnp.any(available), logits, 0.0))
    return jnp.where(available, p, 0.0)


def variance_promotion_score(pass_rate: jnp.ndarray, diversity: jnp.ndarray | None = None, *,
                             outcome_weight: float = 1.0, diversity_weight: float = 0.0) -> jnp.ndarray:
    """VAS's variance promotion score ``w_o p (1 - p) + w_d d``: outcome variance of a Bernoulli
    reward with pass rate ``p`` (largest at ``p = 1/2``) plus trajectory diversity ``d``.

    Args:
      pass_rate: ``[C]`` in ``[0, 1]``. diversity: ``[C]`` or ``None`` (no diversity term).
      outcome_weight, diversity_weight: ``w_o``, ``w_d`` (the paper's example: 0.8 / 0.2).

    Returns:
      ``[C]`` float32.
    """
    _checks.check_same_shape("pass_rate", pass_rate, diversity=diversity)
    p = jnp.clip(jnp.asarray(pass_rate, jnp.float32), 0.0, 1.0)
    score = outcome_weight * p * (1.0 - p)
    if diversity is not None:
        score = score + diversity_weight * jnp.asarray(diversity, jnp.float32)
    return score


def uncertainty_priority(pass_rate: jnp.ndarray, *, epsilon: float = 0.05) -> jnp.ndarray:
    """SPO's sampling weight ``sqrt(p (1 - p)) + eps``: prompts whose outcome is most uncertain
    first, every prompt with weight at least ``eps``.

    Args:
      pass_rate: ``[C]`` the tracked success probability. epsilon: the floor.

    Returns:
      ``[C]`` float32 (unnormalised).
    """
    if epsilon < 0:
        raise ValueError(f"uncertainty_priority: epsilon must be >= 0, got {epsilon}")
    p = jnp.clip(jnp.asarray(pass_rate, jnp.float32), 0.0, 1.0)
    return jnp.sqrt(p * (1.0 - p)) + epsilon


# ----------------------------------------------------------------------------------------- SPO tracker


def kl_adaptive_forgetting(divergence: jnp.ndarray, *, half_life: float = 0.06, rho_min: float = 0.875,
                           rho_max: float = 0.96) -> jnp.ndarray:
    """SPO's forgetting factor ``rho = clip(2^(-D / D_half), rho_min, rho_max)``: the more the
    policy moved on a prompt since its last visit (``D``), the faster its old evidence decays.

    Args:
      divergence: ``[K]`` ``D`` per prompt, the token mean of ``|log pi_stored - log pi_now|`` on
        the prompt's last stored response (:func:`mean_abs_logp_change`; 0 on a first visit).
      half_life: ``D_half``, the divergence that halves the evidence (before clipping).
      rho_min, rho_max: the clip range (the authors' 0.875 and 0.96).

    Returns:
      ``[K]`` float32.
    """
    if not 0.0 < rho_min <= rho_max <= 1.0:
        raise ValueError(f"kl_adaptive_forgetting: need 0 < rho_min <= rho_max <= 1, got {rho_min}, {rho_max}")
    if half_life <= 0:
        raise ValueError(f"kl_adaptive_forgetting: half_life must be > 0, got {half_life}")
    d = jnp.maximum(jnp.asarray(divergence, jnp.float32), 0.0)
    return jnp.clip(jnp.exp2(-d / half_life), rho_min, rho_max)


def mean_abs_logp_change(stored_logp: jnp.ndarray, current_logp: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """``[K]`` the token mean of ``|stored - current|`` log-probabilities over each row's masked
    tokens (0 for a row without tokens): SPO's divergence ``D``."""
    _checks.check_token_args(stored_logp=stored_logp, current_logp=current_logp, mask=mask)
    m = jnp.asarray(mask).astype(jnp.float32)
    diff = jnp.where(m > 0, jnp.abs(jnp.asarray(stored_logp, jnp.float32) - jnp.asarray(current_logp, jnp.float32)),
                     0.0)
    return jnp.sum(diff, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)


def beta_tracker_update(alpha: jnp.ndarray, beta: jnp.ndarray, reward: jnp.ndarray, rho: jnp.ndarray
                        ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """SPO's discounted Beta posterior of a prompt's success probability:
    ``alpha <- rho alpha + r``, ``beta <- rho beta + (1 - r)`` for a reward ``r`` in ``[0, 1]``;
    the estimate is ``alpha / (alpha + beta)``."""
    _checks.check_same_shape("alpha", alpha, beta=beta)
    a, b = jnp.asarray(alpha, jnp.float32), jnp.asarray(beta, jnp.float32)
    r, rho = jnp.asarray(reward, jnp.float32), jnp.asarray(rho, jnp.float32)
    return rho * a + r, rho * b + (1.0 - r)


def single_stream_advantages(scores: jnp.ndarray, baseline: jnp.ndarray, mask: jnp.ndarray,
                             valid: jnp.ndarray | None = None, *, epsilon: float = 1e-8) -> jnp.ndarray:
    """SPO's advantages: ``A_i = r_i - b_i`` with ``b_i`` the tracked success probability of the
    row's prompt (from before this step), normalised over the whole batch,
    ``(A - mean A) / (std A + eps)`` with the unbiased standard deviation over the valid rows
    (the authors' code), broadcast over each row's response tokens.

    Paper: "Single-stream Policy Optimization", arXiv:2509.13232; formulas from the authors'
    code (``verl`` recipe ``spo/spo_ray_trainer.py``).

    Args:
      scores: ``[N]`` rewards. baseline: ``[N]`` the tracker's ``alpha / (alpha + beta)``.
      mask: ``[N, T]`` response tokens. valid: ``[N]`` rows that count (default all).
      epsilon: added to the standard deviation.

    Returns:
      ``[N, T]`` float32, zero outside the mask and on invalid rows.
    """
    n, _ = _checks.check_token_args(mask=mask)
    _checks.check_seq_args(n, scores=scores, baseline=baseline, valid=valid)
    s = jnp.asarray(scores, jnp.float32)
    v = jnp.ones(s.shape, bool) if valid is None else jnp.asarray(valid).astype(bool)
    a = jnp.where(v, s - jnp.asarray(baseline, jnp.float32), 0.0)
    n = jnp.sum(v.astype(jnp.float32))
    mean = jnp.sum(a) / jnp.maximum(n, 1.0)
    var = jnp.sum(jnp.where(v, (a - mean) ** 2, 0.0)) / jnp.maximum(n - 1.0, 1.0)
    adv = jnp.where(v, (a - mean) / (jnp.sqrt(var) + epsilon), 0.0)
    m = jnp.asarray(mask).astype(bool) & v[:, None]
    return jnp.where(m, adv[:, None], 0.0)

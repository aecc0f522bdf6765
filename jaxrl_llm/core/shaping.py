"""Reward shaping (length and overlong rewards) and batch filters (dynamic sampling, PF-PPO).

All functions are pure and jit-able; filters return masks or weights rather than changing
shapes, so the train step keeps static shapes (use the masks as ``valid`` rows).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks
from jaxrl_llm.core.stats import _check_concrete_ids, group_stats

__all__ = [
    "overlong_penalty",
    "kimi_length_reward",
    "dynamic_sampling_mask",
    "pf_ppo_weights",
    "pf_ppo_resample",
]


def overlong_penalty(lengths: jnp.ndarray, max_length: int, buffer_length: int,
                     penalty_factor: float = 1.0) -> jnp.ndarray:
    """DAPO soft overlong punishment (in tokens), added to the task reward.

    With ``L_exp = max_length - buffer_length``:
    ``R_len(L) = min(0, -(L - L_exp) / buffer_length * penalty_factor)``, i.e. 0 up to
    ``L_exp``, falling linearly to ``-penalty_factor`` at ``max_length`` (and below beyond).

    Paper: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
    arXiv:2503.14476 (e.g. max 20480, buffer 4096). verl's DAPO reward manager.

    Args:
      lengths: ``[B]`` response lengths in tokens (int or float).
    Returns:
      ``[B]`` float32 penalties (<= 0).
    """
    _checks.check_rank("lengths", lengths, 1)
    _checks.check_positive("buffer_length", buffer_length)
    _checks.check_positive("penalty_factor", penalty_factor, allow_zero=True)
    if not 0 < buffer_length <= max_length:
        raise ValueError(f"argument 'buffer_length' must be in (0, max_length={max_length}], got {buffer_length}")
    exceed = jnp.asarray(lengths, jnp.float32) - (max_length - buffer_length)
    return jnp.minimum(-exceed / buffer_length * penalty_factor, 0.0)


def kimi_length_reward(lengths: jnp.ndarray, correct: jnp.ndarray, group_ids: jnp.ndarray,
                       num_groups: int, valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """Kimi k1.5 group length reward.

    Within a prompt's group, ``lambda = 0.5 - (L - L_min) / (L_max - L_min)``; a correct
    response gets ``lambda``, an incorrect one ``min(0, lambda)``. Add it, weighted, to the
    task reward. Our choice where the paper is silent: a group whose lengths are all equal
    gets 0.

    Paper: Kimi Team, "Kimi k1.5: Scaling Reinforcement Learning with LLMs", arXiv:2501.12599.

    Returns:
      ``[B]`` float32.
    """
    _checks.check_rank("lengths", lengths, 1)
    b = lengths.shape[0]
    _checks.check_seq_args(b, correct=correct, valid=valid)
    _checks.check_groups(group_ids, num_groups, b)
    _check_concrete_ids(group_ids, num_groups)
    ln = jnp.asarray(lengths, jnp.float32)
    v = jnp.ones((b,), bool) if valid is None else jnp.asarray(valid).astype(bool)
    lmax = jax.ops.segment_max(jnp.where(v, ln, -jnp.inf), group_ids, num_segments=num_groups)[group_ids]
    lmin = jax.ops.segment_min(jnp.where(v, ln, jnp.inf), group_ids, num_segments=num_groups)[group_ids]
    span = lmax - lmin
    lam = jnp.where(span > 0, 0.5 - (ln - lmin) / jnp.where(span > 0, span, 1.0), 0.0)
    ok = jnp.asarray(correct).astype(bool)
    out = jnp.where(ok, lam, jnp.minimum(0.0, lam))
    return jnp.where(v, out, 0.0)


def dynamic_sampling_mask(scores: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int,
                          valid: jnp.ndarray | None = None, keep_singletons: bool = True
                          ) -> jnp.ndarray:
    """DAPO dynamic sampling: keep only groups whose rewards are not all equal.

    A group whose rewards have zero spread (all correct or all wrong) gives GRPO-style
    estimators zero advantage and wastes the batch; DAPO over-samples and drops such groups.
    Returns a ``[B]`` bool mask of rows to keep (use it as ``valid``); the training loop
    keeps sampling until enough rows are kept. verl's DAPO recipe keeps one-sample groups;
    set ``keep_singletons=False`` to drop them.

    Paper: Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
    arXiv:2503.14476.
    """
    _checks.check_rank("scores", scores, 1)
    b = scores.shape[0]
    _checks.check_seq_args(b, valid=valid)
    s = jnp.asarray(scores, jnp.float32)
    v = jnp.ones((b,), jnp.float32) if valid is None else _checks.as_mask(valid)
    st = group_stats(s, group_ids, num_groups, v)
    smax = jax.ops.segment_max(jnp.where(v > 0, s, -jnp.inf), group_ids, num_segments=num_groups)[group_ids]
    smin = jax.ops.segment_min(jnp.where(v > 0, s, jnp.inf), group_ids, num_segments=num_groups)[group_ids]
    keep = smax > smin
    if keep_singletons:
        keep = keep | (st.count == 1)
    return keep & (v > 0)


def pf_ppo_weights(scores: jnp.ndarray, method: str = "pow", power: float = 2.0) -> jnp.ndarray:
    """PF-PPO sampling weights over a rollout batch (policy filtration).

    ``"pow"``: ``|r|^k``; ``"max_min"``: 1 for the batch's max and min reward, else 0;
    ``"max_random"``: 0.4 for the max, 0.1 otherwise. Then ``max(w + 1e-8, 1e-8)`` (verl).

    Paper: Zhang et al., "Policy Filtration in RLHF to Fine-Tune LLM for Code Generation",
    arXiv:2409.06957. verl ``compute_pf_ppo_reweight_data``.
    """
    _checks.check_rank("scores", scores, 1)
    _checks.check_choice("method", method, ("pow", "max_min", "max_random"))
    _checks.check_positive("power", power, allow_zero=True)
    s = jnp.asarray(scores, jnp.float32)
    if method == "pow":
        w = jnp.power(jnp.abs(s), power)
    elif method == "max_min":
        w = jnp.where((s == jnp.max(s)) | (s == jnp.min(s)), 1.0, 0.0)
    else:
        w = jnp.where(s == jnp.max(s), 0.4, 0.1)
    return jnp.maximum(w + 1e-8, 1e-8)


def pf_ppo_resample(key: jax.Array, scores: jnp.ndarray, method: str = "pow",
                    power: float = 2.0) -> jnp.ndarray:
    """Indices ``[B]`` of a with-replacement resample of the batch proportional to
    :func:`pf_ppo_weights` (gather every batch array with them).

    Paper: Zhang et al., "Policy Filtration in RLHF to Fine-Tune LLM for Code Generation",
    arXiv:2409.06957 (verl ``compute_pf_ppo_reweight_data`` resamples the same way with
    torch's global RNG; here the key is explicit).
    """
    w = pf_ppo_weights(scores, method, power)
    return jax.random.choice(key, w.shape[0], shape=(w.shape[0],), replace=True, p=w / jnp.sum(w))


"""Critic (value function) losses."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks
from jaxrl_llm.core.stats import masked_mean

__all__ = ["clipped_value_loss"]


def clipped_value_loss(values: jnp.ndarray, old_values: jnp.ndarray, returns: jnp.ndarray,
                       mask: jnp.ndarray, *, clip_range: float | None = 0.5
                       ) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """PPO clipped value loss, per token.

    ``V_c = old + clip(V - old, -eps_v, eps_v)``,
    ``L = 0.5 * max((V - R)^2, (V_c - R)^2)``; with ``clip_range=None`` it is
    ``0.5 (V - R)^2``. The 0.5 is included in the per-token value (verl multiplies the
    aggregate by 0.5; the result is the same).

    Paper: Schulman et al., arXiv:1707.06347; verl ``compute_value_loss`` (default
    ``cliprange_value`` 0.5).

    Args:
      values: ``[B, T]`` current critic predictions (gradient flows here).
      old_values: ``[B, T]`` critic values at rollout time. returns: ``[B, T]`` targets.
      mask: ``[B, T]``.

    Returns:
      ``(loss [B, T], {"vf_clip_frac", "vf_explained_var"})``.
    """
    _checks.check_token_args(values=values, old_values=old_values, returns=returns, mask=mask)
    m = _checks.as_mask(mask)
    v, old, ret = (_checks.zero_outside(_checks.as_float(x), m) for x in (values, old_values, returns))
    old, ret = jax.lax.stop_gradient(old), jax.lax.stop_gradient(ret)
    l1 = jnp.square(v - ret)
    if clip_range is None:
        loss, frac = l1, jnp.zeros((), v.dtype)
    else:
        _checks.check_positive("clip_range", clip_range)
        vc = jnp.clip(v, old - clip_range, old + clip_range)
        l2 = jnp.square(vc - ret)
        loss = jnp.maximum(l1, l2)
        frac = masked_mean((l2 > l1).astype(v.dtype), m)
    resid_var = masked_mean(jnp.square(jax.lax.stop_gradient(v) - ret - masked_mean(jax.lax.stop_gradient(v) - ret, m)), m)
    ret_var = masked_mean(jnp.square(ret - masked_mean(ret, m)), m)
    ev = jnp.where(ret_var > 0, 1.0 - resid_var / jnp.where(ret_var > 0, ret_var, 1.0), 0.0)
    return jnp.where(m > 0, 0.5 * loss, 0.0), {"vf_clip_frac": frac, "vf_explained_var": ev}

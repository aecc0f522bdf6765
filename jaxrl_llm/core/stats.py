"""Masked and grouped statistics: the reusable building blocks of the estimators.

Shapes: ``B`` batch (responses), ``T`` response length, ``G`` samples per prompt. Groups are
given by ``group_ids: [B]`` int in ``[0, num_groups)`` with ``num_groups`` a static Python
int, so any ordering of the batch works (use :func:`dense_group_ids` to map arbitrary
prompt uids to that range on the host). No paper: these are the shared statistics of the
estimators; ``masked_var``/``masked_whiten`` follow verl's ``verl.utils.torch_functional``
(unbiased variance), the group statistics its GRPO (``torch.std``, unbiased).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.core import _checks

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "GroupStats",
    "group_stats",
    "group_sum",
    "dense_group_ids",
    "safe_divide",
]


def safe_divide(num: jnp.ndarray, den: jnp.ndarray) -> jnp.ndarray:
    """``num / den`` where ``den > 0``, else ``num`` (i.e. divide by 1).

    Used for every normaliser that can be zero (an all-masked batch): the result stays
    finite and, because ``num`` is then a masked sum of zeros, so is its gradient.
    """
    den = jnp.asarray(den)
    return num / jnp.where(den > 0, den, jnp.ones_like(den))


def masked_sum(values: jnp.ndarray, mask: jnp.ndarray, axis: Any = None) -> jnp.ndarray:
    """Sum of ``values`` where ``mask`` is nonzero. NaN/inf outside the mask are ignored.

    ``values`` and ``mask`` must have the same shape (no silent broadcasting).
    """
    _checks.check_same_shape("values", values, mask=mask)
    m = _checks.as_mask(mask)
    v = _checks.as_float(values)
    return jnp.sum(jnp.where(m > 0, v, 0.0) * m, axis=axis)


def masked_mean(values: jnp.ndarray, mask: jnp.ndarray, axis: Any = None) -> jnp.ndarray:
    """Mean over masked entries; 0 where nothing is selected (verl adds 1e-8 instead)."""
    return safe_divide(masked_sum(values, mask, axis), jnp.sum(_checks.as_mask(mask), axis=axis))


def masked_var(values: jnp.ndarray, mask: jnp.ndarray, unbiased: bool = True) -> jnp.ndarray:
    """Variance over all masked entries (scalar).

    ``var = sum(m (x - mean)^2) / (n - 1)`` when ``unbiased`` (Bessel, as verl's
    ``masked_var``), else ``/ n``. Where verl raises for ``n <= 1`` we return the biased
    value (0 for a single element), so the function stays total under jit.
    """
    m = _checks.as_mask(mask)
    v = _checks.zero_outside(_checks.as_float(values), m)
    mean = masked_mean(v, m)
    n = jnp.sum(m)
    var = masked_mean(jnp.square(v - mean), m)
    if unbiased:
        var = var * jnp.where(n > 1, n / jnp.maximum(n - 1, 1.0), 1.0)
    return var


def masked_whiten(values: jnp.ndarray, mask: jnp.ndarray, shift_mean: bool = True,
                  unbiased: bool = True, eps: float = 1e-8) -> jnp.ndarray:
    """Whiten with statistics over the masked entries: ``(x - mean) / sqrt(var + eps)``.

    Matches ``verl.utils.torch_functional.masked_whiten`` (unbiased variance, eps 1e-8
    inside the square root). With ``shift_mean=False`` the mean is added back.
    Entries outside the mask are transformed too (callers multiply by the mask).
    """
    v = _checks.zero_outside(_checks.as_float(values), _checks.as_mask(mask))
    mean = masked_mean(v, mask)
    var = masked_var(v, mask, unbiased=unbiased)
    out = (v - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out


class GroupStats(NamedTuple):
    """Per-sample broadcasts of group statistics (all ``[B]``)."""

    count: jnp.ndarray  # number of valid members of the sample's group
    mean: jnp.ndarray
    std: jnp.ndarray  # unbiased or population, as requested; 0 for singleton groups


def group_sum(x: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int) -> jnp.ndarray:
    """``[num_groups]`` sums of ``x: [B]`` by group (``group_ids`` in ``[0, num_groups)``)."""
    _checks.check_rank("x", x, 1)
    _checks.check_groups(group_ids, num_groups, np.shape(x)[0])
    _check_concrete_ids(group_ids, num_groups)
    return jax.ops.segment_sum(x, group_ids, num_segments=num_groups)


def _check_concrete_ids(group_ids: Any, num_groups: int) -> None:
    if isinstance(group_ids, jax.core.Tracer):
        return
    ids = np.asarray(group_ids)
    if ids.size and (ids.min() < 0 or ids.max() >= num_groups):
        raise ValueError(
            f"argument 'group_ids' must lie in [0, num_groups={num_groups}), got values in "
            f"[{ids.min()}, {ids.max()}]; map arbitrary uids with dense_group_ids()"
        )


def group_stats(x: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int,
                valid: jnp.ndarray | None = None, unbiased: bool = True) -> GroupStats:
    """Mean and standard deviation of ``x: [B]`` within each group, broadcast back to ``[B]``.

    Only samples with ``valid`` set take part (default: all). ``std`` is the unbiased
    (``torch.std``) estimate by default, 0 for a group of one.
    """
    _checks.check_rank("x", x, 1)
    _checks.check_groups(group_ids, num_groups, x.shape[0])
    _check_concrete_ids(group_ids, num_groups)
    x = _checks.as_float(x)
    w = jnp.ones_like(x) if valid is None else _checks.as_mask(valid, x.dtype)
    x = _checks.zero_outside(x, w)
    cnt = group_sum(w, group_ids, num_groups)
    mean_g = safe_divide(group_sum(x * w, group_ids, num_groups), cnt)
    dev = jnp.where(w > 0, x - mean_g[group_ids], 0.0)
    ss = group_sum(jnp.square(dev), group_ids, num_groups)
    denom = jnp.maximum(cnt - 1.0, 0.0) if unbiased else cnt
    var_g = safe_divide(ss, denom)
    # sqrt has an infinite derivative at 0 (singleton or all-equal groups): select around it
    std_g = jnp.where(var_g > 0, jnp.sqrt(jnp.where(var_g > 0, var_g, 1.0)), 0.0)
    return GroupStats(cnt[group_ids], mean_g[group_ids], std_g[group_ids])


def dense_group_ids(uids: Any) -> tuple[np.ndarray, int]:
    """Host-side helper: map arbitrary hashable prompt uids ``[B]`` to ``(ids, num_groups)``.

    Ids are assigned in order of first appearance, so contiguous groups map to
    ``0, 0, ..., 1, 1, ...``.
    """
    uids = list(uids)
    table: dict[Any, int] = {}
    ids = np.array([table.setdefault(u, len(table)) for u in uids], dtype=np.int32)
    return ids, max(len(table), 1)

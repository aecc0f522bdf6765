"""Trace-time input checks shared by the core functions.

Every check looks only at static properties (rank, shape, dtype, Python values), so it
costs nothing under ``jax.jit``. Each error names the offending argument.
"""

from __future__ import annotations

from typing import Any, Iterable

import jax.numpy as jnp
import numpy as np

__all__: list[str] = []  # private module

def _shape(x: Any) -> tuple[int, ...]:
    return tuple(np.shape(x))


def check_rank(name: str, x: Any, rank: int) -> None:
    """Raise ValueError naming ``name`` unless ``x`` has the given rank."""
    if x is None:
        raise ValueError(f"argument '{name}' is required but got None")
    if np.ndim(x) != rank:
        raise ValueError(
            f"argument '{name}' must have rank {rank} "
            f"({'[B]' if rank == 1 else '[B, T]' if rank == 2 else f'rank {rank}'}), "
            f"got shape {_shape(x)}"
        )


def check_float(name: str, x: Any) -> None:
    dt = jnp.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype
    if not jnp.issubdtype(dt, jnp.floating):
        raise TypeError(f"argument '{name}' must be a floating array, got dtype {dt}")


def check_int(name: str, x: Any) -> None:
    dt = x.dtype if hasattr(x, "dtype") else jnp.asarray(x).dtype
    if not jnp.issubdtype(dt, jnp.integer):
        raise TypeError(f"argument '{name}' must be an integer array, got dtype {dt}")


def check_same_shape(ref_name: str, ref: Any, **others: Any) -> None:
    """All ``others`` (skipping None) must have the shape of ``ref``."""
    rs = _shape(ref)
    for name, x in others.items():
        if x is None:
            continue
        if _shape(x) != rs:
            raise ValueError(
                f"argument '{name}' must have the shape of '{ref_name}' {rs}, got {_shape(x)}"
            )


def check_token_args(**arrays: Any) -> tuple[int, int]:
    """Check a family of ``[B, T]`` arrays (None entries are skipped).

    The first non-None argument defines the shape; the others must match it. Float arrays
    (everything but masks) must have a floating dtype. Returns ``(B, T)``.
    """
    ref_name, ref = None, None
    for name, x in arrays.items():
        if x is None:
            continue
        check_rank(name, x, 2)
        if ref is None:
            ref_name, ref = name, x
        elif _shape(x) != _shape(ref):
            raise ValueError(
                f"argument '{name}' must have the shape of '{ref_name}' {_shape(ref)}, got {_shape(x)}"
            )
        if "mask" not in name:
            check_float(name, x)
    if ref is None:
        raise ValueError("no [B, T] array given")
    b, t = _shape(ref)
    return b, t


def check_seq_args(batch: int, **arrays: Any) -> None:
    """Check ``[B]`` arrays against a batch size."""
    for name, x in arrays.items():
        if x is None:
            continue
        check_rank(name, x, 1)
        if _shape(x)[0] != batch:
            raise ValueError(f"argument '{name}' must have shape ({batch},) [B], got {_shape(x)}")


def check_groups(group_ids: Any, num_groups: Any, batch: int) -> None:
    """``group_ids`` is an int ``[B]`` array and ``num_groups`` a static positive int."""
    check_rank("group_ids", group_ids, 1)
    check_int("group_ids", group_ids)
    if _shape(group_ids)[0] != batch:
        raise ValueError(f"argument 'group_ids' must have shape ({batch},) [B], got {_shape(group_ids)}")
    if not isinstance(num_groups, (int, np.integer)) or isinstance(num_groups, bool) or num_groups < 1:
        raise ValueError(
            f"argument 'num_groups' must be a static positive Python int (an upper bound on the "
            f"number of distinct group ids), got {num_groups!r}"
        )


def check_static_int(name: str, value: Any, minimum: int = 1) -> None:
    """``value`` must be a Python (or numpy) int ``>= minimum`` (a static size)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"argument '{name}' must be a static Python int >= {minimum}, got {value!r}")


def check_scalar(name: str, value: Any) -> None:
    """``value`` must be a scalar (Python number or 0-d array, e.g. a controller's coefficient)."""
    if np.ndim(value) != 0:
        raise ValueError(f"argument '{name}' must be a scalar, got shape {_shape(value)}")


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"argument '{name}' must be one of {choices}, got {value!r}")


def check_positive(name: str, value: Any, *, allow_zero: bool = False) -> None:
    v = float(value)
    if not (v > 0 or (allow_zero and v == 0)) or not np.isfinite(v):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"argument '{name}' must be finite and {bound}, got {value!r}")


def as_float(x: Any) -> jnp.ndarray:
    """Promote to at least float32 (bf16 / f16 inputs are computed in float32)."""
    x = jnp.asarray(x)
    if x.dtype in (jnp.bfloat16, jnp.float16) or not jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(jnp.float32)
    return x


def zero_outside(x: jnp.ndarray, mask: jnp.ndarray, fill: float = 0.0) -> jnp.ndarray:
    """``x`` where ``mask`` is set, ``fill`` elsewhere, as a *select*.

    Every public function applies this to its inputs on entry, so that values under the mask
    (padding garbage, +-inf, NaN) reach neither the outputs nor the gradients: the VJP of a
    select is exactly zero on the unselected side, whereas ``x * mask`` turns ``inf * 0`` into
    NaN and lets ``d/dx`` of a later ``sqrt``/``exp`` leak through the multiplication.
    """
    return jnp.where(mask > 0, x, jnp.asarray(fill, x.dtype))


def as_mask(mask: Any, dtype=jnp.float32) -> jnp.ndarray:
    """Masks may be bool, int or float; they are used as {0, 1} floats."""
    m = jnp.asarray(mask)
    if m.dtype == jnp.bool_:
        return m.astype(dtype)
    return (m != 0).astype(dtype)

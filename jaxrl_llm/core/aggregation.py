"""Loss aggregation: turn per-token values into a scalar with an explicit, exact rule.

Every mode is expressed as a ``(sum, weight)`` pair whose parts are *additive* over
micro-batches and hosts; the loss is ``sum / weight`` (with ``weight == 0`` meaning "divide
by one"). Summing the pairs of 1, 4 or 64 micro-batches and dividing once gives exactly the
loss of the whole batch, which is what ``verl`` achieves with ``dp_size`` and
``batch_num_tokens`` arguments and TRL with its ``dapo`` loss type.

Modes (verl names, TRL equivalents in brackets):

==========================  ==========================================  ======================
mode                        sum                                         weight
==========================  ==========================================  ======================
``token-mean``              sum_{i,t} m L                               sum_{i,t} m  [dapo/bnpo]
``token-sum``               sum_{i,t} m L                               0 (no division)
``seq-mean-token-mean``     sum_i (sum_t m L / sum_t m)                 #sequences with a token [grpo]
``seq-mean-token-sum``      sum_i sum_t m L                             #sequences with a token
``seq-mean-token-sum-norm`` sum_i sum_t m L                             #sequences * horizon  [dr_grpo]
==========================  ==========================================  ======================

Where the modes come from: ``seq-mean-token-mean`` is GRPO's ``1/G sum_i 1/|o_i| sum_t``
(Shao et al., "DeepSeekMath", arXiv:2402.03300); ``token-mean`` is DAPO's token-level loss
(Yu et al., "DAPO", arXiv:2503.14476); ``seq-mean-token-sum-norm`` is Dr.GRPO's constant
normaliser (Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective",
arXiv:2503.20783); ``seq-mean-token-sum`` and ``token-sum`` are verl's remaining modes
(``seq-mean-token-sum`` is TRL's ``luspo``).

``horizon`` defaults to ``T`` (verl's default ``loss_scale_factor``); pass the maximum
response length as a constant to keep it fixed across batches (Dr.GRPO, arXiv:2503.20783).
Fully masked sequences count in no mode. TRL 1.16's ``luspo`` loss type is
``seq-mean-token-sum``. Differences: verl's ``seq-mean-token-mean`` divides by
``n_i + 1e-8`` (we divide by ``n_i``, relative difference < 1e-8); TRL's ``grpo``, ``sapo``,
``dr_grpo`` and ``luspo`` divide by all ``B`` rows, including rows whose mask is empty (e.g.
``mask_truncated_completions``), where we divide by the rows that have a token; with no empty
row they agree (``tests/conformance/test_trl_grpo.py`` pins both cases).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks
from jaxrl_llm.core.stats import safe_divide

__all__ = ["AGG_MODES", "AggMode", "aggregate_sum_weight", "aggregate", "finalize"]

AggMode = Literal[
    "token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def aggregate_sum_weight(values: jnp.ndarray, mask: jnp.ndarray, mode: str = "token-mean",
                         horizon: float | None = None) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Return the additive ``(sum, weight)`` pair of ``values`` under ``mode``.

    Args:
      values: ``[B, T]`` float per-token values (e.g. per-token policy loss).
      mask: ``[B, T]`` bool/int/float response mask.
      mode: one of :data:`AGG_MODES`.
      horizon: constant divisor of ``seq-mean-token-sum-norm`` (default ``T``).

    Returns:
      ``(sum, weight)`` float32 scalars. ``weight`` depends on the mask only (no gradient).
    """
    _checks.check_token_args(values=values, mask=mask)
    _checks.check_choice("mode", mode, AGG_MODES)
    v = _checks.as_float(values)
    m = _checks.as_mask(mask, v.dtype)
    tok_sum = jnp.sum(jnp.where(m > 0, v, 0.0), axis=-1)  # [B]
    n_tok = jnp.sum(m, axis=-1)  # [B]
    has_tok = (n_tok > 0).astype(v.dtype)
    if mode == "token-mean":
        return jnp.sum(tok_sum), jnp.sum(n_tok)
    if mode == "token-sum":
        return jnp.sum(tok_sum), jnp.zeros((), v.dtype)
    if mode == "seq-mean-token-mean":
        return jnp.sum(safe_divide(tok_sum, n_tok)), jnp.sum(has_tok)
    if mode == "seq-mean-token-sum":
        return jnp.sum(tok_sum), jnp.sum(has_tok)
    # seq-mean-token-sum-norm
    h = v.shape[-1] if horizon is None else horizon
    _checks.check_positive("horizon", h) if not isinstance(h, jax.Array) else None
    return jnp.sum(tok_sum), jnp.sum(has_tok) * jnp.asarray(h, v.dtype)


def finalize(total_sum: jnp.ndarray, total_weight: jnp.ndarray) -> jnp.ndarray:
    """``total_sum / total_weight``, dividing by 1 where the weight is 0 (token-sum, empty)."""
    return safe_divide(total_sum, jax.lax.stop_gradient(total_weight))


def aggregate(values: jnp.ndarray, mask: jnp.ndarray, mode: str = "token-mean",
              horizon: float | None = None) -> jnp.ndarray:
    """Scalar aggregate of ``values: [B, T]`` under ``mode`` (see the module table for the
    formula and the paper of each mode); ``finalize(*aggregate_sum_weight(...))``."""
    return finalize(*aggregate_sum_weight(values, mask, mode, horizon))

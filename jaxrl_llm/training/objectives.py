"""Objectives for :func:`~jaxrl_llm.training.make_train_step`, composed from the core.

Batch layout (dicts of arrays, rows = sequences): ``tokens [B, L]`` int32 and ``mask [B, L]``
(real tokens, left or right padding); per-token arrays are aligned with the *targets*
``tokens[:, 1:]``, i.e. have length ``L - 1``: ``loss_mask`` (the response tokens to train
on), ``old_logp``, ``advantages``, optionally ``ref_logp``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.core import aggregation, kl as kl_mod, stats
from jaxrl_llm.models.logprobs import token_logprobs

__all__ = ["PolicyObjective", "SFTObjective", "policy_logprobs"]


def policy_logprobs(model: Any, batch: dict, *, chunk_size: int = 128, temperature: float = 1.0,
                    with_entropy: bool = False) -> tuple[jax.Array, jax.Array | None]:
    """Teacher-forced ``[B, L - 1]`` log-probs (and entropies) of ``tokens[:, 1:]``."""
    hidden, _ = model(batch["tokens"], batch["mask"])
    return token_logprobs(hidden[:, :-1], model.unembedding(), batch["tokens"][:, 1:], chunk_size=chunk_size,
                          temperature=temperature, with_entropy=with_entropy)


@dataclasses.dataclass(frozen=True)
class PolicyObjective:
    """Policy-gradient loss: a core policy loss on ``(logp, old_logp, advantages)``, plus an
    optional KL penalty to a reference policy and an entropy bonus, all aggregated with the
    same mode (``token-mean``, ``seq-mean-token-mean``, ...).

    ``loss = agg(policy_loss) + kl_coef * agg(kl(logp, ref_logp)) - entropy_coef * agg(H)``.

    Attributes:
      policy_loss: ``(logp, old_logp, advantages, mask, **policy_kwargs) -> (per_token,
        metrics)``, e.g. :func:`jaxrl_llm.core.ppo_clip_loss`.
      policy_kwargs: keyword arguments for it, as a tuple of pairs (hashable).
      agg_mode, horizon: the aggregation (see :mod:`jaxrl_llm.core.aggregation`).
      kl_coef, kl_estimator: KL penalty in the loss (needs ``ref_logp`` in the batch).
      entropy_coef: entropy bonus (computed in chunks, never ``[B, T, V]`` at once).
      temperature: the sampler's temperature (log-probs of the sampling distribution).
      chunk_size: positions per logits slice.
      needs_key: pass ``key=`` to the policy loss (Clip-Cov's random selection).
    """

    policy_loss: Callable[..., Any]
    policy_kwargs: tuple[tuple[str, Any], ...] = ()
    agg_mode: str = "token-mean"
    horizon: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "low_var_kl"
    entropy_coef: float = 0.0
    temperature: float = 1.0
    chunk_size: int = 128
    needs_key: bool = False

    def __post_init__(self):
        if self.agg_mode not in aggregation.AGG_MODES:
            raise ValueError(f"PolicyObjective.agg_mode must be one of {aggregation.AGG_MODES}, got {self.agg_mode!r}")

    def weight(self, batch: dict) -> jax.Array:
        m = batch["loss_mask"]
        return aggregation.aggregate_sum_weight(jnp.zeros(m.shape, jnp.float32), m, self.agg_mode, self.horizon)[1]

    def metric_weight(self, batch: dict) -> jax.Array:
        return jnp.sum(batch["loss_mask"].astype(jnp.float32))  # metrics are token means

    def loss_sum(self, model: Any, batch: dict, key: jax.Array):
        m = batch["loss_mask"]
        logp, ent = policy_logprobs(model, batch, chunk_size=self.chunk_size, temperature=self.temperature,
                                    with_entropy=self.entropy_coef != 0.0)
        kw = dict(self.policy_kwargs)
        if self.needs_key:
            kw["key"] = key
        per_token, metrics = self.policy_loss(logp, batch["old_logp"], batch["advantages"], m, **kw)
        total = per_token
        metrics = {f"policy/{k}": v for k, v in metrics.items()}
        if self.kl_coef:
            kl = kl_mod.kl_penalty(logp, batch["ref_logp"], self.kl_estimator)
            total = total + self.kl_coef * kl
            metrics["policy/kl_ref"] = stats.masked_mean(kl, m)
        if self.entropy_coef:
            total = total - self.entropy_coef * ent
        if ent is not None:
            metrics["policy/entropy"] = stats.masked_mean(ent, m)
        metrics["policy/logp_mean"] = stats.masked_mean(jax.lax.stop_gradient(logp), m)
        s, _ = aggregation.aggregate_sum_weight(total, m, self.agg_mode, self.horizon)
        return s, metrics


@dataclasses.dataclass(frozen=True)
class SFTObjective:
    """Next-token cross-entropy on the ``loss_mask`` tokens (``token-mean`` by default;
    ``seq-mean-token-mean`` weighs every example equally)."""

    agg_mode: str = "token-mean"
    chunk_size: int = 128

    def weight(self, batch: dict) -> jax.Array:
        m = batch["loss_mask"]
        return aggregation.aggregate_sum_weight(jnp.zeros(m.shape, jnp.float32), m, self.agg_mode)[1]

    def metric_weight(self, batch: dict) -> jax.Array:
        return jnp.sum(batch["loss_mask"].astype(jnp.float32))

    def loss_sum(self, model: Any, batch: dict, key: jax.Array):
        m = batch["loss_mask"]
        logp, _ = policy_logprobs(model, batch, chunk_size=self.chunk_size)
        s, _ = aggregation.aggregate_sum_weight(-logp, m, self.agg_mode)
        return s, {"sft/nll": stats.masked_mean(-jax.lax.stop_gradient(logp), m)}

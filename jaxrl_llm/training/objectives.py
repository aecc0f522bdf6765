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
from jaxrl_llm.core.turns import spa_progress_loss
from jaxrl_llm.core.value import clipped_value_loss
from jaxrl_llm.models.logprobs import shared_prefix_logprobs, token_logprobs, token_mean_logprobs
from jaxrl_llm.models.transformer import load_balancing_loss, router_mismatch

__all__ = ["PolicyObjective", "ValueObjective", "ProgressObjective", "SFTObjective", "policy_logprobs", "packed_logprobs",
           "critic_values", "turn_contributions"]


def policy_logprobs(model: Any, batch: dict, *, chunk_size: int = 128, temperature: float = 1.0,
                    with_entropy: bool = False, rows_per_prompt: int = 0, routing_replay: bool = False
                    ) -> tuple[jax.Array, jax.Array | None]:
    """Teacher-forced ``[B, L - 1]`` log-probs (and entropies) of ``tokens[:, 1:]``.

    ``rows_per_prompt > 0``: blocks of that many consecutive rows share their prompt, whose
    mask the batch holds as ``prefix_mask [B, P]`` (its width is the prompt length); each prompt
    is encoded once (:func:`jaxrl_llm.models.logprobs.shared_prefix_logprobs`) and only the
    completion targets get log-probs (0 over the prompt's own targets).

    ``routing_replay``: a mixture of experts computes with the batch's ``routes [B, L, layers,
    k]`` (the sampler's experts) instead of its routers' choices.
    """
    return _policy_forward(model, batch, chunk_size, temperature, with_entropy, rows_per_prompt, routing_replay,
                           False)[:2]


def policy_mean_logprobs(model: Any, batch: dict, *, chunk_size: int = 128, temperature: float = 1.0,
                         routing_replay: bool = False) -> jax.Array:
    """``[B, L - 1]`` mean over the vocabulary of the policy's log-probs at each position (no
    gradient; :func:`jaxrl_llm.models.token_mean_logprobs`): ROVER's uniform-policy value."""
    return _policy_forward(model, batch, chunk_size, temperature, False, 0, routing_replay, False, True)[3]


def packed_logprobs(model: Any, batch: dict, *, chunk_size: int = 128, temperature: float = 1.0,
                    with_entropy: bool = False) -> tuple[jax.Array, jax.Array | None]:
    """Log-probs (and entropies) of a packed micro-batch (:mod:`jaxrl_llm.data.packing`) in its row
    layout ``[ways * slots, L - 1]``: one forward pass over the packed rows ``packed_tokens [W, S]``
    (segments attend within themselves, positions restart per segment), the chunked log-probs of
    every packed target, gathered by ``packed_index`` into each row's target columns (the gather's
    gradient scatters back). Equal to :func:`policy_logprobs` of the padded rows on every real
    target (0 in the columns outside a row's real targets)."""
    toks, seg = batch["packed_tokens"], batch["packed_segments"]
    hidden, _ = model(toks, seg > 0, positions=batch["packed_positions"], segment_ids=seg)
    lp, ent = token_logprobs(hidden[:, :-1], model.unembedding(), toks[:, 1:], chunk_size=chunk_size,
                             temperature=temperature, with_entropy=with_entropy, softcap=model.final_softcap)
    idx = batch["packed_index"]
    ways = toks.shape[0]
    real = idx >= 0  # -1: padding or an empty slot, 0 there

    def rows(x):  # [W, S - 1] -> [W * slots, L - 1]: each packed row's own slots, gathered on its device
        got = jax.vmap(lambda xb, ib: xb[ib])(x, jnp.maximum(idx, 0).reshape(ways, -1, idx.shape[-1]))
        return jnp.where(real, got.reshape(idx.shape), 0.0)

    return rows(lp), (rows(ent) if with_entropy else None)


def _policy_forward(model, batch, chunk_size, temperature, with_entropy, rows_per_prompt, routing_replay,
                    want_router, want_mean=False):
    """``(logp, entropy, router stats or None, mean log-prob or None)``; the stats when
    ``want_router`` (a mixture of experts), the mean over the vocabulary of each position's
    log-probs (no gradient) when ``want_mean`` (plain rows only)."""
    if want_mean and ("packed_tokens" in batch or rows_per_prompt):
        raise ValueError("the vocabulary-mean log-probs (ROVER) cannot be combined with a packed micro-batch "
                         "(train.max_tokens_per_microbatch) or shared prompts (train.shared_prefix)")
    internal = "policy_layer" in batch  # BuPO: the policy read after the first k layers (recipe.loop_part=bupo)
    if internal and ("packed_tokens" in batch or rows_per_prompt):
        raise ValueError("an internal layer's policy (policy_layer) cannot be combined with a packed micro-batch "
                         "(train.max_tokens_per_microbatch) or shared prompts (train.shared_prefix)")
    if "packed_tokens" in batch:  # a packed micro-batch: rows as segments of fixed-budget rows
        if rows_per_prompt or routing_replay or want_router:
            raise ValueError("a packed micro-batch (train.max_tokens_per_microbatch) cannot be combined with shared "
                             "prompts (train.shared_prefix), routing replay or a mixture of experts' router loss")
        return packed_logprobs(model, batch, chunk_size=chunk_size, temperature=temperature,
                               with_entropy=with_entropy) + (None, None)
    if routing_replay and rows_per_prompt:
        raise ValueError("routing replay (train.routing_replay) cannot be combined with shared prompts "
                         "(train.shared_prefix)")
    if rows_per_prompt:
        return shared_prefix_logprobs(model, batch["tokens"], batch["mask"], batch["prefix_mask"].shape[1],
                                      rows_per_prompt, chunk_size=chunk_size, temperature=temperature,
                                      with_entropy=with_entropy) + (None, None)
    kw = {"exit_layer": batch["policy_layer"][0]} if internal else {}
    if routing_replay:
        if "routes" not in batch:
            raise ValueError("routing replay: the batch has no 'routes' (the sampler's experts)")
        kw["routes"] = batch["routes"]
    router = None
    if want_router:
        hidden, _, router = model(batch["tokens"], batch["mask"], return_routing=True, **kw)
    else:
        hidden, _ = model(batch["tokens"], batch["mask"], **kw)
    mean = None
    if want_mean:
        mean = token_mean_logprobs(hidden[:, :-1], model.unembedding(), chunk_size=chunk_size, temperature=temperature,
                                   softcap=model.final_softcap)
    return token_logprobs(hidden[:, :-1], model.unembedding(), batch["tokens"][:, 1:], chunk_size=chunk_size,
                          temperature=temperature, with_entropy=with_entropy, softcap=model.final_softcap) + (
        router, mean)


@dataclasses.dataclass(frozen=True)
class PolicyObjective:
    """Policy-gradient loss composed of parts: a surrogate on ``(logp, old_logp, advantages)``
    (optionally weighted by importance weights), a KL penalty to a reference policy, an entropy
    bonus, all aggregated with one mode (``token-mean``, ``seq-mean-token-mean``, ...).

    ``loss = agg(w * surrogate) + kl_coef * agg(kl(logp, ref_logp)) - entropy_coef * agg(H)``.

    Attributes:
      policy_loss: ``(logp, old_logp, advantages, mask, **policy_kwargs) -> (per_token,
        metrics)``, e.g. :func:`jaxrl_llm.core.ppo_clip_loss` (the registered surrogates:
        :data:`jaxrl_llm.algorithms.SURROGATES`).
      policy_kwargs: keyword arguments for it, as a tuple of pairs (hashable).
      agg_mode, horizon: the aggregation (see :mod:`jaxrl_llm.core.aggregation`).
      kl_coef, kl_estimator: KL penalty in the loss (needs ``ref_logp`` in the batch); an
        explicit ``0.0`` is no penalty.
      kl_coef_from_batch: the coefficient is the batch's ``kl_coef [B]`` column instead (an
        adaptive controller's current value, supplied by the loop every iteration without a
        recompile; the rows of a batch hold the same value).
      entropy_coef: entropy bonus (computed in chunks, never ``[B, T, V]`` at once).
      temperature: the sampling temperature (log-probs of the sampling distribution). The RL
        trainer checks that it equals its sampler's: one source.
      chunk_size: positions per logits slice.
      needs_key: pass ``key=`` to the policy loss (Clip-Cov's random selection).
      use_is_weights: multiply the surrogate by the batch's ``is_weights [B, L - 1]``
        (truncated importance sampling / IcePop against the sampler-trainer mismatch).
      kl_bias_correction: ``"token"`` or ``"sequence"``: multiply the KL estimate by
        :func:`jaxrl_llm.core.kl_importance_weight` (``pi / pi_old``), which makes it unbiased
        for the current policy after the first mini-batch and gives ``k3`` the exact
        reverse-KL gradient (TRL's ``use_bias_correction_kl``, DeepSeek-V3.2); ``None``: off.
      loss_inputs: further batch columns the surrogate reads, passed to it as keyword arguments
        of the same name (``scores [B]``, ``group_ids [B]``, ``old_entropy [B, L - 1]``, ...:
        the surrogate's ``requires``).
      coupled: the surrogate is not a sum of per-token terms: it maps the whole (mini-)batch to
        one scalar, ``policy_loss(logp, old_logp, advantages, mask, **kw) -> (loss, metrics)``
        (DisCO's log-sum-exp over a group's negatives, BAPO's batch-level bound search, a
        ratio-variance penalty). The train step then runs two passes (:func:`coupled_context`):
        the log-probs of every row first (forward only), the loss and its gradient with respect
        to them on the whole batch, then per micro-batch the gradient-equivalent linear term
        ``sum(coef * logp)``. Exact for any micro-batch split; costs one extra forward pass.
      routing_replay: a mixture of experts computes every log-prob pass of the update with the
        sampler's experts (the batch's ``routes``, recorded at rollout) instead of its routers'
        current choices (Rollout Routing Replay, arXiv 2510.11370).
      router_mismatch: log ``moe/router_mismatch`` (needs the batch's ``routes``; always with
        ``routing_replay``): the fraction of (trained token, layer) pairs whose router, in this
        forward pass, picks another expert set than the sampler did.
      router_aux_coef: weight of the load-balancing loss
        (:func:`jaxrl_llm.models.transformer.load_balancing_loss`, HF's ``router_aux_loss_coef``)
        added to the loss of a mixture of experts (logged as ``moe/load_balancing_loss`` either way).
      rows_per_prompt: Prefix Grouper (``train.shared_prefix``): blocks of this many consecutive
        rows of every (micro-)batch share their prompt (mask in ``prefix_mask [B, P]``), encoded
        once per block in every log-prob pass; 0: each row encodes its own prompt. The same
        values and gradients up to float rounding (:func:`policy_logprobs`).
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
    kl_coef_from_batch: bool = False
    use_is_weights: bool = False
    kl_bias_correction: str | None = None
    loss_inputs: tuple[str, ...] = ()
    coupled: bool = False
    rows_per_prompt: int = 0
    routing_replay: bool = False
    router_mismatch: bool = False
    router_aux_coef: float = 0.0
    #: pass the current policy's token entropy (with its gradient) to the surrogate as ``entropy=``
    #: (a surrogate flagged ``entropy``: EPO's entropy regulariser)
    entropy_input: bool = False
    #: pass the current policy's vocabulary-mean log-prob at each position (no gradient) to the
    #: surrogate as ``mean_logp=`` (a surrogate flagged ``mean_logp``: ROVER's next-state value)
    mean_logp_input: bool = False

    def __post_init__(self):
        if self.mean_logp_input and (self.coupled or self.rows_per_prompt):
            raise ValueError("PolicyObjective.mean_logp_input is for per-token surrogates on plain rows (not coupled, "
                             "not shared prompts)")
        if self.entropy_input and self.coupled:
            raise ValueError("PolicyObjective.entropy_input is for per-token surrogates (a coupled surrogate sees log-probs "
                             "only)")
        if not self.router_aux_coef >= 0:
            raise ValueError(f"PolicyObjective.router_aux_coef must be >= 0, got {self.router_aux_coef!r}")
        if not (isinstance(self.rows_per_prompt, int) and self.rows_per_prompt >= 0):
            raise ValueError(f"PolicyObjective.rows_per_prompt must be an int >= 0, got {self.rows_per_prompt!r}")
        if self.agg_mode not in aggregation.AGG_MODES:
            raise ValueError(f"PolicyObjective.agg_mode must be one of {aggregation.AGG_MODES}, got {self.agg_mode!r}")
        base = self.kl_estimator[:-1] if self.kl_estimator.endswith("+") else self.kl_estimator
        if base not in kl_mod.KL_ESTIMATORS:
            raise ValueError(f"PolicyObjective.kl_estimator must be one of {kl_mod.KL_ESTIMATORS} (optionally with "
                             f"'+'), got {self.kl_estimator!r}")
        if not self.temperature > 0:
            raise ValueError(f"PolicyObjective.temperature must be > 0, got {self.temperature!r}")
        if self.kl_bias_correction not in (None, "token", "sequence"):
            raise ValueError(f"PolicyObjective.kl_bias_correction must be None, 'token' or 'sequence', got "
                             f"{self.kl_bias_correction!r}")

    @property
    def has_kl(self) -> bool:
        """Whether the loss holds a KL penalty (and the batch needs ``ref_logp``)."""
        return bool(self.kl_coef) or self.kl_coef_from_batch

    def batch_keys(self) -> tuple[str, ...]:
        """The batch arrays the objective reads."""
        keys = ("tokens", "mask", "loss_mask", "old_logp", "advantages")
        keys += ("ref_logp",) if self.has_kl else ()
        keys += ("kl_coef",) if self.kl_coef_from_batch else ()
        keys += tuple(k for k in self.loss_inputs if k not in keys)
        keys += ("prefix_mask",) if self.rows_per_prompt else ()
        keys += ("routes",) if self.routing_replay or self.router_mismatch else ()
        return keys + (("is_weights",) if self.use_is_weights else ())

    def _loss_kwargs(self, batch: dict, key: jax.Array | None) -> dict:
        kw = dict(self.policy_kwargs)
        if self.needs_key:
            kw["key"] = key
        if self.use_is_weights:
            kw["is_weights"] = batch["is_weights"]
        for name in self.loss_inputs:
            kw[name] = batch[name]
        return kw

    def forward_logp(self, model: Any, batch: dict) -> jax.Array:
        """``[B, L - 1]`` log-probs of the batch's tokens (the coupled surrogate's first pass)."""
        logp, _ = policy_logprobs(model, batch, chunk_size=self.chunk_size, temperature=self.temperature,
                                  rows_per_prompt=self.rows_per_prompt, routing_replay=self.routing_replay)
        return jax.lax.stop_gradient(logp)

    def coupled_context(self, logp: jax.Array, batch: dict, key: jax.Array) -> tuple[dict, dict]:
        """A coupled surrogate on the whole batch: ``({"coupled_coef": d loss / d logp [B, L - 1],
        "coupled_value": loss / B per row [B]}, metrics)``. The loss is the surrogate's value
        normalised by itself (it is a mean by construction); the step divides each micro-batch's
        sum by the aggregation weight, so :meth:`loss_sum` multiplies the coupled part by it
        (``batch["coupled_weight"]``)."""
        kw = self._loss_kwargs(batch, key)

        def f(lp):
            return self.policy_loss(lp, batch["old_logp"], batch["advantages"], batch["loss_mask"], **kw)

        (value, metrics), coef = jax.value_and_grad(f, has_aux=True)(logp)
        n = logp.shape[0]
        ctx = {"coupled_coef": jax.lax.stop_gradient(coef).astype(jnp.float32),
               "coupled_value": jnp.full((n,), jax.lax.stop_gradient(value) / n, jnp.float32)}
        return ctx, {f"policy/{k}": v for k, v in metrics.items()}

    def weight(self, batch: dict) -> jax.Array:
        m = batch["loss_mask"]
        return aggregation.aggregate_sum_weight(jnp.zeros(m.shape, jnp.float32), m, self.agg_mode, self.horizon)[1]

    def metric_weight(self, batch: dict) -> jax.Array:
        return jnp.sum(batch["loss_mask"].astype(jnp.float32))  # metrics are token means

    def loss_sum(self, model: Any, batch: dict, key: jax.Array):
        m = batch["loss_mask"]
        moe = bool(getattr(getattr(model, "cfg", None), "is_moe", False)) and not self.rows_per_prompt
        logp, ent, router, mean = _policy_forward(model, batch, self.chunk_size, self.temperature,
                                                  self.entropy_coef != 0.0 or self.entropy_input, self.rows_per_prompt,
                                                  self.routing_replay, moe, self.mean_logp_input)
        if self.coupled:
            # the gradient-equivalent term of the coupled surrogate (its value and metrics came from
            # the first pass): value = the batch's loss, gradient = sum(coef * d logp)
            lin = jnp.sum(batch["coupled_coef"] * logp)
            w = jnp.max(batch["coupled_weight"])  # every row holds the batch's weight (packed: empty slots 0)
            coupled = w * (lin - jax.lax.stop_gradient(lin) + jnp.sum(batch["coupled_value"]))
            total, metrics = jnp.zeros_like(logp), {}
        else:
            extra = {"entropy": ent} if self.entropy_input else {}
            if self.mean_logp_input:
                extra["mean_logp"] = mean
            per_token, metrics = self.policy_loss(logp, batch["old_logp"], batch["advantages"], m,
                                                  **self._loss_kwargs(batch, key), **extra)
            total, coupled = per_token, 0.0
            metrics = {f"policy/{k}": v for k, v in metrics.items()}
        if self.has_kl:
            kl = kl_mod.kl_penalty(logp, batch["ref_logp"], self.kl_estimator)
            if self.kl_bias_correction is not None:
                kl = kl * kl_mod.kl_importance_weight(logp, batch["old_logp"], m, self.kl_bias_correction)
            coef = batch["kl_coef"].astype(jnp.float32)[:, None] if self.kl_coef_from_batch else self.kl_coef
            total = total + coef * kl
            metrics["policy/kl_ref"] = stats.masked_mean(kl, m)
        if self.entropy_coef:
            total = total - self.entropy_coef * ent
        if ent is not None:
            metrics["policy/entropy"] = stats.masked_mean(ent, m)
        metrics["policy/logp_mean"] = stats.masked_mean(jax.lax.stop_gradient(logp), m)
        s, _ = aggregation.aggregate_sum_weight(total, m, self.agg_mode, self.horizon)
        if router is not None:
            lb = load_balancing_loss(router)
            metrics["moe/load_balancing_loss"] = jax.lax.stop_gradient(lb)
            if self.router_aux_coef:  # a per-(micro-)batch scalar, weighted like the batch's share of the loss
                s = s + self.router_aux_coef * lb * jax.lax.stop_gradient(self.weight(batch))
            if model.cfg.moe_capacity_factor is not None:  # assignments that found their expert full
                metrics["moe/dropped_fraction"] = stats.safe_divide(
                    jnp.sum(router.dropped), jnp.sum(router.tokens) * model.cfg.num_experts_per_tok)
            if self.routing_replay or self.router_mismatch:
                # over the trained tokens (whose count weights each micro-batch's metrics: the
                # step's average is then the whole batch's fraction)
                trained = jnp.concatenate([jnp.zeros_like(m[:, :1]), m], axis=1)
                metrics["moe/router_mismatch"] = router_mismatch(router, batch["routes"], trained)
        return (s + coupled if self.coupled else s), metrics


@dataclasses.dataclass(frozen=True)
class ValueObjective:
    """The critic's loss for :func:`~jaxrl_llm.training.make_train_step`: PPO's clipped value
    loss (:func:`jaxrl_llm.core.clipped_value_loss`) on the response tokens.

    Batch: ``tokens``, ``mask`` ``[B, L]``; target-aligned ``loss_mask``, ``old_values`` (the
    critic's values at rollout time) and ``returns`` (GAE targets), ``[B, L - 1]``. The value
    of completion token ``t`` is the critic's score of the position that predicts it (the
    same alignment as the policy's log-probs, :func:`critic_values`).

    Normalisation is exact across micro-batches like the policy's: ``weight`` is the
    mask-only aggregation weight of ``agg_mode`` (additive over rows), ``metric_weight`` the
    token count (the metrics are token means: ``vf_loss``, ``vf_clip_frac``, ``values_mean``;
    ``vf_explained_var`` is per micro-batch, averaged).

    Attributes:
      clip_range: value clipping around the old values (verl ``cliprange_value`` 0.5;
        ``None``: unclipped ``0.5 (V - R)^2``).
      agg_mode, horizon: aggregation (verl uses the actor's ``loss_agg_mode``, token-mean).
    """

    clip_range: float | None = 0.5
    agg_mode: str = "token-mean"
    horizon: float | None = None

    def __post_init__(self):
        if self.agg_mode not in aggregation.AGG_MODES:
            raise ValueError(f"ValueObjective.agg_mode must be one of {aggregation.AGG_MODES}, got {self.agg_mode!r}")
        if self.clip_range is not None and not self.clip_range > 0:
            raise ValueError(f"ValueObjective.clip_range must be > 0 or None, got {self.clip_range!r}")

    def batch_keys(self) -> tuple[str, ...]:
        return ("tokens", "mask", "loss_mask", "old_values", "returns")

    def weight(self, batch: dict) -> jax.Array:
        m = batch["loss_mask"]
        return aggregation.aggregate_sum_weight(jnp.zeros(m.shape, jnp.float32), m, self.agg_mode, self.horizon)[1]

    def metric_weight(self, batch: dict) -> jax.Array:
        return jnp.sum(batch["loss_mask"].astype(jnp.float32))

    def loss_sum(self, model: Any, batch: dict, key: jax.Array):
        m = batch["loss_mask"]
        values = critic_values(model, batch)
        per_token, vm = clipped_value_loss(values, batch["old_values"], batch["returns"], m,
                                           clip_range=self.clip_range)
        s, _ = aggregation.aggregate_sum_weight(per_token, m, self.agg_mode, self.horizon)
        metrics = {"vf_loss": stats.masked_mean(jax.lax.stop_gradient(per_token), m),
                   "values_mean": stats.masked_mean(jax.lax.stop_gradient(values), m), **vm}
        return s, metrics


def critic_values(model: Any, batch: dict) -> jax.Array:
    """``[B, L - 1]`` float32 values of a score-head model, target-aligned: entry ``j`` is the
    score of position ``j``, the state before token ``j + 1`` is generated (verl's
    ``values[:, -T - 1:-1]``)."""
    hidden, _ = model(batch["tokens"], batch["mask"])
    return model.scores(hidden[:, :-1])[..., 0]


def turn_contributions(model: Any, batch: dict) -> jax.Array:
    """``[B, K]`` float32 per-turn outputs of a score-head model: the score of the position of
    each turn's last policy token (``batch["turn_end"] [B, K]`` int32 positions into ``tokens``),
    0 where ``turn_mask`` is false. SPA-RL's progress estimator reads each step at its last
    token, after the action."""
    hidden, _ = model(batch["tokens"], batch["mask"])
    scores = model.scores(hidden)[..., 0].astype(jnp.float32)
    tm = batch["turn_mask"]
    pos = jnp.where(tm, batch["turn_end"], 0).astype(jnp.int32)
    return jnp.where(tm, jnp.take_along_axis(scores, pos, axis=1), 0.0)


@dataclasses.dataclass(frozen=True)
class ProgressObjective:
    """SPA-RL's progress-estimator loss for :func:`~jaxrl_llm.training.make_train_step`: the
    per-turn contributions of a score-head model (:func:`turn_contributions`) must sum to the
    episode's outcome, ``mean_i (sum_k c_{i,k} - R_i)^2``
    (:func:`jaxrl_llm.core.spa_progress_loss`).

    Batch: ``tokens``, ``mask`` ``[B, L]``; ``turn_end`` ``[B, K]`` int32 (each turn's last policy
    token), ``turn_mask`` ``[B, K]``, ``outcome`` ``[B]``. Rows without a turn weigh 0; the
    normalisation (episodes with a turn) is exact across micro-batches. Metrics:
    ``progress_loss`` and ``progress_sum_mean`` (the mean over episodes of ``sum_k c``).
    """

    def batch_keys(self) -> tuple[str, ...]:
        return ("tokens", "mask", "turn_end", "turn_mask", "outcome")

    def weight(self, batch: dict) -> jax.Array:
        return jnp.sum(jnp.any(batch["turn_mask"], axis=1).astype(jnp.float32))

    def loss_sum(self, model: Any, batch: dict, key: jax.Array):
        c = turn_contributions(model, batch)
        valid = jnp.any(batch["turn_mask"], axis=1)
        n = jnp.sum(valid.astype(jnp.float32))
        loss = spa_progress_loss(c, batch["turn_mask"], batch["outcome"], valid=valid)
        total = jax.lax.stop_gradient(jnp.where(valid, jnp.sum(c, axis=1), 0.0))
        metrics = {"progress_loss": jax.lax.stop_gradient(loss),
                   "progress_sum_mean": stats.safe_divide(jnp.sum(total), n)}
        return loss * n, metrics


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

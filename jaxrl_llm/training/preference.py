"""Offline preference training (DPO and its variants, IPO, SimPO, CPO, ORPO, KTO) and SFT on
the functional train step.

:class:`PreferenceObjective` turns a preference loss of :mod:`jaxrl_llm.core.preference` into
an objective for :func:`~jaxrl_llm.training.make_train_step`: one forward pass computes the
sequence log-likelihood sums ``sum_t log pi(y_t | x, y_<t)`` over each completion's
``loss_mask`` tokens, the core function turns them into per-pair losses, and the loss is
their mean over pairs. The step's normaliser (``weight``) is the number of pairs and
``loss_sum`` the sum of per-pair losses, so the update does not depend on how the batch is
split into micro-batches.

Batch layout (pair-major)
    ``tokens``/``mask`` ``[B, 2, L]`` (``[:, 0]`` prompt + chosen, ``[:, 1]`` prompt +
    rejected, right-padded), ``loss_mask [B, 2, L - 1]`` aligned with the targets
    ``tokens[..., 1:]`` (the completion tokens), ``ref_logps [B, 2]`` (sequence sums under the
    frozen reference; losses that need a reference only). :func:`preference_arrays` builds
    it from a :class:`~jaxrl_llm.data.PreferenceBatch` (whose rows are ``[2B, L]``, chosen
    then rejected). Why pair-major: ``make_train_step`` splits the *leading* axis into
    micro-batches (strided) and a mesh shards it in blocks; with pairs on the leading axis a
    micro-batch and a device always hold whole pairs, for any ``num_microbatches`` dividing
    ``B`` (with the ``[2B, L]`` layout a split keeps a chosen row with its rejected row only
    when ``num_microbatches`` divides ``B``, and a block sharding never does).

Unpaired KTO (``loss="kto"``) takes rows: ``tokens``/``mask`` ``[N, L]``, ``loss_mask [N, L -
1]``, ``desirable [N]`` bool, ``ref_logps [N]`` and ``kl_ref_point [N]`` (KTO's reference point
``z0``, the same value in every row, computed by the trainer over the whole batch from
mismatched completions as TRL does). :func:`preference_arrays` builds it from a
:class:`~jaxrl_llm.data.KTOBatch` (:func:`~jaxrl_llm.data.kto_dataset`).

The trainers (:class:`PreferenceTrainer`, :class:`SFTTrainer`) are small host loops on
:class:`~jaxrl_llm.training.host_loop.HostLoop`: data -> (reference log-probs) -> train step,
with evaluation, logging, checkpoints and exact resume. Presets with their papers'
hyper-parameters: :func:`preference_recipe`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxrl_llm.core as core
from jaxrl_llm.core import stats
from jaxrl_llm.algorithms.preference import PREFERENCE_LOSSES
from jaxrl_llm.algorithms.registry import Bound, RegistryError
from jaxrl_llm.data.pipeline import KTOBatch, PreferenceBatch, SFTBatch, pad_rows
from jaxrl_llm.training.host_loop import HostLoop
from jaxrl_llm.training.objectives import packed_logprobs, policy_logprobs

__all__ = ["PreferenceObjective", "preference_objective", "PreferenceRecipe", "PREFERENCE_RECIPES", "preference_recipe",
           "sequence_logps", "SequenceLogps", "preference_arrays", "sft_arrays", "kto_mismatched_rows",
           "PreferenceTrainer", "SFTTrainer", "PreferenceEvaluator"]

_METRIC_NAMES = {"chosen_rewards": "rewards/chosen", "rejected_rewards": "rewards/rejected",
                 "reward_accuracy": "rewards/accuracy", "reward_margin": "rewards/margin",
                 "chosen_logps": "logps/chosen", "rejected_logps": "logps/rejected"}


def sequence_logps(model: Any, tokens: jax.Array, mask: jax.Array, loss_mask: jax.Array, *,
                   chunk_size: int = 128) -> tuple[jax.Array, jax.Array]:
    """``(sums [N], counts [N])``: teacher-forced log-likelihood of each row's ``loss_mask``
    tokens (``tokens``/``mask`` ``[N, L]``, ``loss_mask [N, L - 1]`` target-aligned) and
    how many tokens that is."""
    logp, _ = policy_logprobs(model, {"tokens": tokens, "mask": mask}, chunk_size=chunk_size)
    m = loss_mask.astype(bool)
    return jnp.sum(jnp.where(m, logp, 0.0), axis=-1), jnp.sum(m.astype(jnp.float32), axis=-1)


@dataclasses.dataclass(frozen=True)
class PreferenceObjective:
    """A preference loss as a train-step objective.

    ``loss = mean over pairs of (per-pair loss + sft_coef * nll_chosen)`` where ``nll_chosen`` is
    the chosen completion's per-token mean negative log-likelihood.

    Attributes:
      loss: ``loss(logps, counts, batch) -> PreferenceOutput`` on the completions' summed
        log-likelihoods and token counts (pair-major ``[B, 2]``, or ``[N]`` rows when not
        ``paired``) and the batch's extra arrays; a part of
        :data:`jaxrl_llm.algorithms.PREFERENCE_LOSSES` bound to its arguments
        (:func:`preference_objective` looks one up by name), or any callable of that form.
      needs_reference: the batch holds ``ref_logps`` (the frozen reference's sums).
      paired: pairs ``[B, 2, L]`` (chosen, rejected) or unpaired rows ``[N, L]`` with
        ``desirable`` and ``kl_ref_point`` (KTO).
      sft_coef: weight of ``nll_chosen`` (RPO's ``alpha``, CPO's NLL term, ORPO's SFT term,
        all 1.0 in their papers). It is a per-pair token mean averaged over pairs (the papers'
        per-example form; TRL's ``rpo_alpha``/``cpo_alpha``/ORPO NLL is a token mean over the
        whole batch: equal when the chosen completions have equal lengths). Not for unpaired rows.
      chunk_size: positions per logits slice of the log-prob computation.
      name: the loss's name in messages.
      token_weighted: the sequence log-likelihoods are token-weighted sums with the batch's
        ``token_weights [B, 2, L - 1]`` (TGDPO: the trainer computes them from an auxiliary
        model, and weights the reference sums the same way).

    Metrics (means over pairs): ``rewards/chosen``, ``rewards/rejected``, ``rewards/accuracy``,
    ``rewards/margin``, ``logps/chosen``, ``logps/rejected`` (what the core returns: sums for
    the DPO family, averages for SimPO / ORPO), ``pref/loss`` (the preference part),
    ``pref/nll`` (with ``sft_coef``) and the loss's own metrics as ``pref/<name>``.

    Exactness across micro-batches holds for every loss whose per-pair loss depends on the
    pair only: all except ``kto_paired`` without a fixed ``kl_ref_point`` (its in-batch
    reference points are means over the micro-batch, as TRL's former ``kto_pair`` used the
    device batch). For unpaired ``kto`` the loss is exact; its per-class metrics are
    micro-batch means weighted by rows (exact with one micro-batch).

    ``coupled``: the loss runs once on the whole batch's sequence sums (a first, forward-only
    pass), and each micro-batch contributes the linear term with their gradient (the train
    step's coupled protocol, as :class:`~jaxrl_llm.training.PolicyObjective`): exact for every
    loss and metric whatever the micro-batches, for one more forward pass. The packed step
    (``make_packed_train_step``) takes a preference objective this way, since a packed
    micro-batch's slots are not whole pairs' batches.
    """

    loss: Callable[..., Any]
    needs_reference: bool = True
    paired: bool = True
    sft_coef: float = 0.0
    chunk_size: int = 128
    name: str = ""
    token_weighted: bool = False
    coupled: bool = False
    #: further per-pair columns the loss reads (its part's ``requires``: C3PO's ``scope [B]``)
    extra_keys: tuple[str, ...] = ()
    #: rows per pair: 2, or 3 with a rationale row (``[B, 3, L]``; the loss sees ``logps [B, 3]``)
    slots: int = 2

    def __post_init__(self):
        if not self.name:
            object.__setattr__(self, "name", getattr(self.loss, "name", getattr(self.loss, "__name__", "loss")))
        if not (np.isfinite(self.sft_coef) and self.sft_coef >= 0):
            raise ValueError(f"PreferenceObjective.sft_coef must be finite and >= 0, got {self.sft_coef!r}")
        if self.sft_coef and not self.paired:
            raise ValueError(f"PreferenceObjective.sft_coef is not supported with unpaired loss {self.name!r} (its "
                             f"rows have no chosen completion); use a paired loss or an SFT phase")
        if self.chunk_size < 1:
            raise ValueError(f"PreferenceObjective.chunk_size must be >= 1, got {self.chunk_size}")
        # run the loss once on a dummy pair: bad hyper-parameters fail here
        if self.slots not in (2, 3) or (self.slots == 3 and not self.paired):
            raise ValueError(f"PreferenceObjective.slots must be 2 or 3 (paired losses), got {self.slots!r}")
        one = jnp.ones((1, self.slots), jnp.float32)
        dummy = {"ref_logps": -one, "desirable": jnp.ones((1,), bool), "kl_ref_point": jnp.zeros((1,), jnp.float32),
                 **{k: jnp.zeros((1,), jnp.int32) for k in self.extra_keys}}
        try:
            if self.paired:
                self.loss(-one, one, dummy)
            else:
                dummy["ref_logps"] = -one[:, 0]
                self.loss(-one[:, 0], one[:, 0], dummy)
        except (TypeError, ValueError) as e:
            raise ValueError(f"PreferenceObjective.loss {self.name!r} {dict(getattr(self.loss, 'kwargs', ()))}: "
                             f"{e}") from e

    def batch_keys(self) -> tuple[str, ...]:
        """The arrays the batch must hold (see the module docstring for their shapes)."""
        keys = ("tokens", "mask", "loss_mask") + (("ref_logps",) if self.needs_reference else ())
        keys += ("token_weights",) if self.token_weighted else ()
        keys += tuple(k for k in self.extra_keys if k not in keys)
        return keys + (() if self.paired else ("desirable", "kl_ref_point"))

    # ------------------------------------------------------------------ the objective protocol

    def weight(self, batch: dict) -> jax.Array:
        """Pairs (rows for unpaired KTO) in ``batch``: the loss is a mean over them."""
        return jnp.asarray(batch["loss_mask"].shape[0], jnp.float32)

    def metric_weight(self, batch: dict) -> jax.Array:
        return self.weight(batch)

    def sequence_logps(self, model: Any, batch: dict) -> tuple[jax.Array, jax.Array]:
        """``(sums, counts)`` of the batch's completions, ``[B, 2]`` (pairs) or ``[N]`` (KTO); of a
        packed micro-batch's row slots (:mod:`jaxrl_llm.data.packing`) when it is one."""
        if "packed_tokens" in batch:
            logp, _ = packed_logprobs(model, batch, chunk_size=self.chunk_size)  # like the loss mask
            m = batch["loss_mask"].astype(bool)
            w = batch["token_weights"].astype(jnp.float32) if self.token_weighted else 1.0
            return (jnp.sum(jnp.where(m, w * logp, 0.0), axis=-1),
                    jnp.sum(m.astype(jnp.float32), axis=-1))
        tokens = batch["tokens"]
        want = 3 if self.paired else 2
        if tokens.ndim != want or (self.paired and tokens.shape[1] != self.slots):
            layout = (f"pair-major tokens [B, {self.slots}, L] (see preference_arrays)" if self.paired
                      else "rows tokens [N, L]")
            raise ValueError(f"PreferenceObjective(loss={self.name!r}) needs {layout}; got tokens of shape "
                             f"{tuple(tokens.shape)}")
        lead, n = tokens.shape[:-1], tokens.shape[-1]
        flat = lambda x, k: x.reshape((-1, k))  # noqa: E731
        if self.token_weighted:
            logp, _ = policy_logprobs(model, {"tokens": flat(tokens, n), "mask": flat(batch["mask"], n)},
                                      chunk_size=self.chunk_size)
            m = flat(batch["loss_mask"], n - 1).astype(bool)
            w = flat(batch["token_weights"], n - 1).astype(jnp.float32)
            s = jnp.sum(jnp.where(m, w * logp, 0.0), axis=-1)
            c = jnp.sum(m.astype(jnp.float32), axis=-1)
            return s.reshape(lead), c.reshape(lead)
        s, c = sequence_logps(model, flat(tokens, n), flat(batch["mask"], n), flat(batch["loss_mask"], n - 1),
                              chunk_size=self.chunk_size)
        return s.reshape(lead), c.reshape(lead)

    def losses(self, logps: jax.Array, counts: jax.Array, batch: dict) -> tuple[jax.Array, dict]:
        """Per-pair (per-row for KTO) losses from sequence sums and counts, and the metrics."""
        out = self.loss(logps, counts, batch)
        losses = out.losses
        metrics = {_METRIC_NAMES.get(k, f"pref/{k}"): v for k, v in out.metrics.items()}
        metrics["pref/loss"] = jax.lax.stop_gradient(jnp.mean(losses))
        if self.sft_coef:
            nll = -logps[:, 0] / jnp.maximum(counts[:, 0], 1.0)
            losses = losses + self.sft_coef * nll
            metrics["pref/nll"] = jax.lax.stop_gradient(jnp.mean(nll))
        return losses, metrics

    def loss_sum(self, model: Any, batch: dict, key: jax.Array):
        packed = "packed_tokens" in batch
        for name in self.batch_keys():  # before the forward pass: a missing key fails at once
            if not (packed and name in ("tokens", "mask")):
                _required(batch, name, self.name)
        logps, counts = self.sequence_logps(model, batch)
        if self.coupled:  # the gradient-equivalent linear term (value and metrics: the first pass's)
            lin = jnp.sum(batch["coupled_coef"] * logps)
            w = jnp.max(batch["coupled_weight"])  # every row holds the batch's weight (packed: empty slots 0)
            return w * (lin - jax.lax.stop_gradient(lin) + jnp.sum(batch["coupled_value"])), {}
        if packed:
            raise ValueError(f"PreferenceObjective(loss={self.name!r}) takes a packed micro-batch only as a coupled "
                             "objective (make_packed_train_step builds it so)")
        losses, metrics = self.losses(logps, counts, batch)
        return jnp.sum(losses), metrics

    def forward_logp(self, model: Any, batch: dict) -> jax.Array:
        """The completions' sequence sums (no gradient): the coupled objective's first pass."""
        return jax.lax.stop_gradient(self.sequence_logps(model, batch)[0])

    def coupled_context(self, logps: jax.Array, batch: dict, key: jax.Array) -> tuple[dict, dict]:
        """The loss on the whole batch's sequence sums: ``({"coupled_coef": d mean loss / d logps,
        "coupled_value": mean loss / B per row}, metrics)``."""
        counts = jnp.sum(batch["loss_mask"].astype(jnp.float32), axis=-1)

        def f(lp):
            losses, metrics = self.losses(lp, counts, batch)
            return jnp.mean(losses), metrics

        (value, metrics), coef = jax.value_and_grad(f, has_aux=True)(logps)
        n = logps.shape[0]
        return ({"coupled_coef": jax.lax.stop_gradient(coef).astype(jnp.float32),
                 "coupled_value": jnp.full((n,), jax.lax.stop_gradient(value) / n, jnp.float32)}, metrics)


def _required(batch: dict, name: str, loss: str) -> jax.Array:
    if name not in batch:
        raise KeyError(f"loss {loss!r} needs batch[{name!r}] (the trainer adds it; see "
                       f"jaxrl_llm.training.preference's module docstring); the batch has {sorted(batch)}")
    return batch[name]


# ---------------------------------------------------------------------------------- recipes


@dataclasses.dataclass(frozen=True)
class PreferenceRecipe:
    """A preset: the loss, its paper's hyper-parameters, the NLL weight and the paper."""

    name: str
    loss: str
    loss_kwargs: tuple[tuple[str, Any], ...]
    sft_coef: float
    paper: str
    note: str = ""


PREFERENCE_RECIPES: dict[str, PreferenceRecipe] = {r.name: r for r in (
    PreferenceRecipe("dpo", "dpo", (("beta", 0.1),), 0.0,
                     "Rafailov et al., Direct Preference Optimization, arXiv:2305.18290",
                     "beta 0.1: the paper's value for its dialogue/summarisation runs and TRL's default"),
    PreferenceRecipe("rpo", "dpo", (("beta", 0.1),), 1.0,
                     "Pang et al., Iterative Reasoning Preference Optimization, arXiv:2404.19733",
                     "DPO + alpha = 1 times the chosen NLL"),
    PreferenceRecipe("ipo", "ipo", (("beta", 0.1),), 0.0,
                     "Azar et al., A General Theoretical Paradigm to Understand Learning from Human "
                     "Preferences, arXiv:2310.12036",
                     "beta is the paper's tau (TRL's default 0.1); log-ratios averaged per token as in TRL 1.16"),
    PreferenceRecipe("simpo", "simpo", (("beta", 2.0), ("gamma", 1.0)), 0.0,
                     "Meng, Xia and Chen, SimPO, arXiv:2405.14734",
                     "beta 2.0 and gamma / beta = 0.5 (the authors' Llama-3-Base config; TRL's simpo_gamma "
                     "default is 0.5)"),
    PreferenceRecipe("cpo", "cpo", (("beta", 0.1),), 1.0,
                     "Xu et al., Contrastive Preference Optimization, arXiv:2401.08417",
                     "beta 0.1 and NLL weight 1 (TRL's cpo_alpha)"),
    PreferenceRecipe("orpo", "orpo", (("beta", 0.1),), 1.0,
                     "Hong, Lee and Thorne, ORPO: Monolithic Preference Optimization without Reference Model, "
                     "arXiv:2403.07691",
                     "lambda = 0.1 on the odds-ratio term, SFT term weight 1"),
    PreferenceRecipe("kto_paired", "kto_paired", (("beta", 0.1),), 0.0,
                     "Ethayarajh et al., KTO: Model Alignment as Prospect Theoretic Optimization, arXiv:2402.01306",
                     "beta 0.1, lambda_D = lambda_U = 1, in-batch reference points"),
    PreferenceRecipe("spin", "spin", (("beta", 0.1),), 0.0,
                     "Chen et al., Self-Play Fine-Tuning Converts Weak Language Models to Strong Language Models "
                     "(SPIN), arXiv:2401.01335",
                     "beta 0.1 (the authors' configs); with pairs.source=spin: chosen = the reference answer, "
                     "rejected = the current policy's sample, reference = the previous iterate"),
    PreferenceRecipe("tgdpo", "tgdpo", (("beta", 0.1), ("alpha", 0.5)), 0.0,
                     "Zhu et al., TGDPO: Harnessing Token-Level Reward Guidance for Enhancing Direct Preference "
                     "Optimization, arXiv:2506.14574",
                     "beta 0.1, alpha 0.5 (the authors' config); the token-reward model is model.aux_params"),
    PreferenceRecipe("rdpo", "rdpo", (("beta", 0.1), ("gamma", 0.1)), 0.0,
                     "Just et al., Data-Centric Human Preference Optimization with Rationales, arXiv:2407.14477",
                     "beta 0.1, gamma 0.1 (the authors' config; their README's run: 0.001); each pair's rationale "
                     "from pairs.rationale_field"),
    PreferenceRecipe("kto", "kto", (("beta", 0.1),), 0.0,
                     "Ethayarajh et al., KTO: Model Alignment as Prospect Theoretic Optimization, arXiv:2402.01306",
                     "beta 0.1, lambda_D = lambda_U = 1 (keep lambda_D n_D / (lambda_U n_U) in [1, 4/3]); "
                     "reference point from mismatched completions"),
)}

#: batch columns the objective handles itself (the others in a loss's ``requires`` are per-pair data columns)
_KNOWN_COLUMNS = frozenset({"ref_logps", "token_weights", "desirable", "kl_ref_point"})


def preference_objective(loss: str, *, sft_coef: float = 0.0, chunk_size: int = 128, **loss_kwargs: Any
                         ) -> PreferenceObjective:
    """The :class:`PreferenceObjective` of the registered loss ``loss``
    (:data:`jaxrl_llm.algorithms.PREFERENCE_LOSSES`: ``dpo``, ``ipo``, ``robust``, ``hinge``,
    ``simpo``, ``cpo``, ``orpo``, ``kto_paired``, ``kto``, ...) with its keyword arguments."""
    part = PREFERENCE_LOSSES[loss]
    try:
        bound = Bound.of(part, loss_kwargs, key="recipe.loss", skip=("chosen_lengths", "rejected_lengths"))
    except RegistryError as e:
        raise RegistryError(f"PreferenceObjective.loss_kwargs: {e}") from None
    return PreferenceObjective(bound, needs_reference="ref_logps" in part.requires, paired=part.flag("paired"),
                               sft_coef=sft_coef, chunk_size=chunk_size, name=loss,
                               token_weighted=bool(part.flag("token_weights")),
                               extra_keys=tuple(sorted(part.requires - _KNOWN_COLUMNS)),
                               slots=3 if part.flag("rationale") else 2)


def preference_recipe(name: str, **overrides: Any) -> PreferenceObjective:
    """The :class:`PreferenceObjective` of a preset (:data:`PREFERENCE_RECIPES`: ``dpo``, ``rpo``,
    ``ipo``, ``simpo``, ``cpo``, ``orpo``, ``kto_paired``, ``kto``) with its paper's
    hyper-parameters. ``overrides`` are ``sft_coef``, ``chunk_size``, ``loss_kwargs`` (a
    mapping) or keyword arguments of the loss (``beta=0.05``, ``gamma=...``,
    ``label_smoothing=...``)."""
    if name not in PREFERENCE_RECIPES:
        close = difflib.get_close_matches(name, list(PREFERENCE_RECIPES), n=2, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise RegistryError(f"unknown preference recipe {name!r}; known: {', '.join(sorted(PREFERENCE_RECIPES))}"
                            f"{hint}")
    r = PREFERENCE_RECIPES[name]
    fields = {"sft_coef": r.sft_coef}
    kw = dict(r.loss_kwargs)
    for k, v in overrides.items():
        if k == "loss_kwargs":
            kw.update(dict(v))
        elif k in ("sft_coef", "chunk_size"):
            fields[k] = v
        else:
            kw[k] = v
    return preference_objective(r.loss, **fields, **kw)


# ---------------------------------------------------------------------------------- host helpers


def preference_arrays(batch: PreferenceBatch | KTOBatch) -> dict[str, np.ndarray]:
    """Train arrays of a data batch: a :class:`~jaxrl_llm.data.PreferenceBatch` (``[2B, L]``,
    chosen rows then rejected) becomes pair-major ``tokens``/``mask`` ``[B, 2, L]`` and
    ``loss_mask [B, 2, L - 1]`` (target-aligned); a :class:`~jaxrl_llm.data.KTOBatch` becomes
    rows ``tokens``/``mask`` ``[N, L]``, ``loss_mask [N, L - 1]`` and ``desirable [N]``."""
    if isinstance(batch, KTOBatch):
        return {"tokens": np.asarray(batch.tokens, np.int32), "mask": np.asarray(batch.mask, bool),
                "loss_mask": np.asarray(batch.loss_mask, bool)[:, 1:], "desirable": np.asarray(batch.desirable, bool)}
    if not isinstance(batch, PreferenceBatch):
        raise TypeError(f"preference_arrays needs a PreferenceBatch or KTOBatch, got {type(batch).__name__}")
    b, k = batch.num_pairs, batch.slots

    def pairs(x):  # [k B, ...] -> [B, k, ...]: chosen, rejected (and the rationale row)
        return np.stack([x[i * b:(i + 1) * b] for i in range(k)], axis=1)
    out = {"tokens": pairs(np.asarray(batch.tokens, np.int32)), "mask": pairs(np.asarray(batch.mask, bool)),
           "loss_mask": pairs(np.asarray(batch.loss_mask, bool)[:, 1:])}
    if batch.scope is not None:  # C3PO's per-pair scope (data.scope_field)
        out["scope"] = np.asarray(batch.scope, np.int32)
    return out


def sft_arrays(batch: SFTBatch) -> dict[str, np.ndarray]:
    """``tokens``, ``mask`` ``[B, L]`` and target-aligned ``loss_mask [B, L - 1]`` for
    :class:`~jaxrl_llm.training.SFTObjective`."""
    return {"tokens": np.asarray(batch.tokens, np.int32), "mask": np.asarray(batch.mask, bool),
            "loss_mask": np.asarray(batch.loss_mask, bool)[:, 1:]}


@functools.partial(jax.jit, static_argnums=(0, 1))
def _forward_sums(graphdef, chunk_size, params, frozen, tokens, mask, loss_mask):
    # one jit for every SequenceLogps of a graph: a trainer and an evaluator share compilations
    return sequence_logps(nnx.merge(graphdef, params, *frozen), tokens, mask, loss_mask, chunk_size=chunk_size)[0]


class SequenceLogps:
    """Jitted sequence log-likelihood sums of a model (no gradient): ``fn(params, frozen,
    tokens, mask, loss_mask) -> [...]`` numpy, for any leading shape (``[N, L]`` rows or
    ``[B, 2, L]`` pairs); ``microbatches`` forward passes of ``1 / microbatches`` of the rows
    each bound the memory like the train step's micro-batches."""

    def __init__(self, graphdef: Any, *, chunk_size: int = 128, microbatches: int = 1):
        if microbatches < 1:
            raise ValueError(f"microbatches must be >= 1, got {microbatches}")
        self.graphdef, self.chunk_size, self.microbatches = graphdef, chunk_size, microbatches

    def __call__(self, params: Any, frozen: tuple, tokens: Any, mask: Any, loss_mask: Any) -> np.ndarray:
        lead = tokens.shape[:-1]
        t, m, lm = (np.asarray(x).reshape((-1, x.shape[-1])) for x in (tokens, mask, loss_mask))
        rows = t.shape[0]
        if rows % self.microbatches:
            raise ValueError(f"{rows} rows are not divisible into {self.microbatches} reference micro-batches")
        k = rows // self.microbatches
        out = [np.asarray(_forward_sums(self.graphdef, self.chunk_size, params, tuple(frozen), t[i:i + k], m[i:i + k],
                                        lm[i:i + k])) for i in range(0, rows, k)]
        return np.concatenate(out).reshape(lead)


def kto_mismatched_rows(tokens: np.ndarray, mask: np.ndarray, loss_mask: np.ndarray, pad: int = 0
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """KTO's mismatched pairs: row ``i`` is prompt ``i`` + the completion of row ``i - 1``
    (cyclically, as TRL's KL dataset). Inputs are rows with a target-aligned ``loss_mask
    [N, L - 1]`` marking the completions; returns ``(tokens, mask, loss_mask)`` in the same
    layout, right-padded to ``L`` (or the next power of two above it if a row is longer)."""
    comp = np.concatenate([np.zeros((len(tokens), 1), bool), np.asarray(loss_mask, bool)], axis=1)
    mask = np.asarray(mask, bool)
    prompts = [tokens[i][mask[i] & ~comp[i]].tolist() for i in range(len(tokens))]
    comps = [tokens[i][comp[i]].tolist() for i in range(len(tokens))]
    rows = [prompts[i] + comps[i - 1] for i in range(len(tokens))]
    need = max(len(r) for r in rows)
    length = tokens.shape[1] if need <= tokens.shape[1] else 1 << (need - 1).bit_length()
    out, out_mask = pad_rows(rows, length, pad)
    lm = np.zeros_like(out_mask)
    for i in range(len(rows)):
        lm[i, len(prompts[i]):len(rows[i])] = True
    return out, out_mask, lm[:, 1:]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _forward_tokens(graphdef, chunk_size, params, frozen, tokens, mask):
    return policy_logprobs(nnx.merge(graphdef, params, *frozen), {"tokens": tokens, "mask": mask},
                           chunk_size=chunk_size)[0]


def _add_token_weights(objective: PreferenceObjective, arrays: dict, graphdef: Any, ref_params: Any,
                       aux_params: Any, frozen: tuple, microbatches: int = 1) -> dict:
    """TGDPO: ``token_weights [B, 2, L - 1]`` from the auxiliary (token-reward) model and the
    reference, and ``ref_logps`` as the same token-weighted sums. The forward passes run on
    ``1 / microbatches`` of the rows at a time (the trainer's ``ref_microbatches``)."""
    kw = dict(objective.loss.kwargs) if hasattr(objective.loss, "kwargs") else {}
    tokens, mask, lm = (np.asarray(arrays[k]) for k in ("tokens", "mask", "loss_mask"))
    b, _, n = tokens.shape
    flat_t, flat_m = tokens.reshape(-1, n), mask.reshape(-1, n)
    rows = flat_t.shape[0]
    if rows % microbatches:
        raise ValueError(f"{rows} rows are not divisible into {microbatches} reference micro-batches")
    k = rows // microbatches

    def token_logps(params):
        return np.concatenate([np.asarray(_forward_tokens(graphdef, objective.chunk_size, params, tuple(frozen),
                                                          flat_t[i:i + k], flat_m[i:i + k]))
                               for i in range(0, rows, k)])
    ref, aux = token_logps(ref_params).reshape(b, 2, n - 1), token_logps(aux_params).reshape(b, 2, n - 1)
    ww, wl = core.tgdpo_token_weights(aux[:, 0], ref[:, 0], aux[:, 1], ref[:, 1], alpha=kw.get("alpha", 0.5),
                                      beta=kw.get("beta", 0.1))
    w = np.stack([np.asarray(ww), np.asarray(wl)], axis=1).astype(np.float32)
    out = dict(arrays)
    out["token_weights"] = np.where(lm, w, 0.0).astype(np.float32)
    out["ref_logps"] = np.sum(np.where(lm, w * ref, 0.0), axis=-1).astype(np.float32)
    return out


def _add_reference(objective: PreferenceObjective, arrays: dict, logps: SequenceLogps, ref_params: Any,
                   policy_params: Any, frozen: tuple, kto_reference_point: str) -> dict:
    """``ref_logps`` (and for unpaired KTO ``kl_ref_point``) added to ``arrays``."""
    if not objective.needs_reference:
        return arrays
    arrays = dict(arrays)
    if "ref_logps" not in arrays:  # (an evaluator computes them once)
        arrays["ref_logps"] = logps(ref_params, frozen, arrays["tokens"], arrays["mask"],
                                    arrays["loss_mask"]).astype(np.float32)
    if not objective.paired:
        z0 = 0.0
        if kto_reference_point == "mismatched":
            kl_rows = kto_mismatched_rows(arrays["tokens"], arrays["mask"], arrays["loss_mask"])
            z0 = float(core.kto_kl_reference_point(jnp.asarray(logps(policy_params, frozen, *kl_rows)),
                                                   jnp.asarray(logps(ref_params, frozen, *kl_rows))))
        arrays["kl_ref_point"] = np.full((arrays["tokens"].shape[0],), z0, np.float32)
    return arrays


def _check_batch_kind(objective: PreferenceObjective, batch: Any) -> None:
    if objective.paired and not isinstance(batch, PreferenceBatch):
        raise TypeError(f"loss {objective.name!r} trains on pairs: the data must yield PreferenceBatch "
                        f"(preference_dataset), got {type(batch).__name__}")
    if not objective.paired and not isinstance(batch, KTOBatch):
        raise TypeError(f"loss 'kto' trains on unpaired rows: the data must yield KTOBatch (kto_dataset), got "
                        f"{type(batch).__name__}")


_KTO_POINTS = ("mismatched", "zero")


def _shares_buffers(a: Any, b: Any) -> bool:
    ids = {id(x) for x in jax.tree.leaves(b)}
    return any(id(x) in ids for x in jax.tree.leaves(a))


# ---------------------------------------------------------------------------------- trainers


class PreferenceTrainer(HostLoop):
    """Offline preference optimisation: ``batch = next(data)`` -> pair-major arrays ->
    reference log-prob sums (a jitted forward of ``ref_params``, only when the loss needs
    them; for unpaired KTO also the reference point from mismatched completions under the
    current and the reference policy) -> ``train_step``.

    Args:
      graphdef, state, train_step: as :class:`HostLoop`; ``train_step`` from
        :func:`~jaxrl_llm.training.make_train_step` with ``objective``.
      data: a :class:`~jaxrl_llm.data.DataIterator` of :class:`~jaxrl_llm.data.PreferenceBatch`
        (:func:`~jaxrl_llm.data.preference_dataset`), or of :class:`~jaxrl_llm.data.KTOBatch`
        for ``loss="kto"``.
      objective: the :class:`PreferenceObjective` the step was built with.
      ref_params: the frozen reference policy's params (usually a copy of the initial params;
        required when ``objective.needs_reference``).
      ref_microbatches: forward passes the reference computation is split into.
      kto_reference_point: unpaired KTO's ``z0``: ``"mismatched"`` (TRL's estimate) or
        ``"zero"`` (TRL's ``calculate_KL=False``).
      **kw: ``seed``, ``frozen``, ``checkpointer``, ``checkpoint_every``, ``eval_fn``,
        ``eval_every``, ``log_fn``, ``config`` as :class:`HostLoop`.

    Metrics per step: the step's (``loss``, ``rewards/accuracy``, ``rewards/margin``, ...,
    ``grad_norm``), ``time/data``, ``time/reference``, ``time/update``, ``tokens`` (real
    tokens of the batch) and ``tokens_per_s``.
    """

    progress_desc = "preference"

    def __init__(self, graphdef: Any, state: Any, train_step: Any, data: Any, objective: PreferenceObjective, *,
                 ref_params: Any = None, ref_microbatches: int = 1, kto_reference_point: str = "mismatched",
                 aux_params: Any = None, **kw):
        if not isinstance(objective, PreferenceObjective):
            raise TypeError(f"PreferenceTrainer.objective must be a PreferenceObjective, got {type(objective).__name__}")
        if objective.needs_reference and ref_params is None:
            raise ValueError(f"PreferenceTrainer.ref_params is required: loss {objective.name!r} compares the policy "
                             f"with a frozen reference (pass e.g. a copy of the initial params)")
        if kto_reference_point not in _KTO_POINTS:
            raise ValueError(f"PreferenceTrainer.kto_reference_point must be one of {_KTO_POINTS}, got "
                             f"{kto_reference_point!r}")
        if objective.token_weighted and aux_params is None:
            raise ValueError(f"PreferenceTrainer.aux_params is required: loss {objective.name!r} weighs tokens by an "
                             f"auxiliary model's token rewards (model.aux_params in a run config)")
        super().__init__(graphdef, state, train_step, data, **kw)
        if ref_params is not None and _shares_buffers(ref_params, state.params):
            ref_params = jax.tree.map(jnp.copy, ref_params)  # a donating train step would delete them
        self.objective, self.ref_params, self.kto_reference_point = objective, ref_params, kto_reference_point
        self.aux_params = aux_params
        self.logps = SequenceLogps(graphdef, chunk_size=objective.chunk_size, microbatches=ref_microbatches)

    def prepare(self, batch: PreferenceBatch | KTOBatch) -> dict:
        """The train arrays of a data batch, with the reference log-probs."""
        _check_batch_kind(self.objective, batch)
        if self.objective.token_weighted:
            return _add_token_weights(self.objective, preference_arrays(batch), self.graphdef, self.ref_params,
                                      self.aux_params, self.frozen, self.logps.microbatches)
        return _add_reference(self.objective, preference_arrays(batch), self.logps, self.ref_params,
                              self.state.params, self.frozen, self.kto_reference_point)

    def step(self) -> dict:
        t: dict[str, float] = {}
        t0 = time.perf_counter()
        batch = next(self.data)
        t["time/data"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        arrays = self.prepare(batch)
        t["time/reference"] = time.perf_counter() - t0
        return self.train_on(arrays, int(np.sum(batch.mask)), t)


class SFTTrainer(HostLoop):
    """Supervised fine-tuning: ``batch = next(data)`` (:class:`~jaxrl_llm.data.SFTBatch` from
    :func:`~jaxrl_llm.data.sft_dataset`) -> :func:`sft_arrays` -> ``train_step`` (built with
    :class:`~jaxrl_llm.training.SFTObjective`). Arguments and metrics as
    :class:`PreferenceTrainer` (without the reference)."""

    progress_desc = "sft"

    def step(self) -> dict:
        t: dict[str, float] = {}
        t0 = time.perf_counter()
        batch = next(self.data)
        t["time/data"] = time.perf_counter() - t0
        return self.train_on(sft_arrays(batch), int(np.sum(batch.mask)), t)


class PreferenceEvaluator:
    """``evaluator(params, *frozen) -> {"eval/loss", "eval/rewards/accuracy", ...}``: the
    objective's loss and metrics on fixed held-out pairs (or KTO rows), without an update;
    usable as a trainer's ``eval_fn``. Reference log-probs are computed once, here."""

    def __init__(self, graphdef: Any, objective: PreferenceObjective, batch: PreferenceBatch | KTOBatch, *,
                 ref_params: Any = None, frozen: tuple = (), kto_reference_point: str = "mismatched",
                 prefix: str = "eval", aux_params: Any = None):
        if objective.needs_reference and ref_params is None:
            raise ValueError(f"PreferenceEvaluator.ref_params is required for loss {objective.name!r}")
        _check_batch_kind(objective, batch)
        self.objective, self.prefix, self.kto_reference_point = objective, prefix, kto_reference_point
        self.logps = SequenceLogps(graphdef, chunk_size=objective.chunk_size)
        self.ref_params = ref_params
        arrays = preference_arrays(batch)
        if objective.token_weighted:
            if aux_params is None:
                raise ValueError(f"PreferenceEvaluator.aux_params is required for loss {objective.name!r}")
            arrays = _add_token_weights(objective, arrays, graphdef, ref_params, aux_params, tuple(frozen))
        elif objective.needs_reference:
            arrays["ref_logps"] = self.logps(ref_params, tuple(frozen), arrays["tokens"], arrays["mask"],
                                             arrays["loss_mask"]).astype(np.float32)
        self.arrays = arrays

        def evaluate(params, frozen, arrays):
            model = nnx.merge(graphdef, params, *frozen)
            s, metrics = objective.loss_sum(model, arrays, jax.random.key(0))
            return stats.safe_divide(s, objective.weight(arrays)), metrics
        self._fn = jax.jit(evaluate)

    def __call__(self, params: Any, *frozen: Any) -> dict[str, float]:
        arrays = self.arrays
        if not self.objective.paired:
            arrays = _add_reference(self.objective, arrays, self.logps, self.ref_params, params, tuple(frozen),
                                    self.kto_reference_point)
        loss, metrics = jax.device_get(self._fn(params, tuple(frozen), arrays))
        out = {f"{self.prefix}/loss": float(loss)}
        out.update({f"{self.prefix}/{k}": float(v) for k, v in metrics.items()})
        return out

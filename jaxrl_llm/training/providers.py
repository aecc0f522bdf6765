"""What the RL loop computes on request: one provider per input a recipe's parts may require.

:attr:`jaxrl_llm.training.recipes.RLRecipe.requires` is the union of what the recipe's parts
need (an estimator's ``requires``, ``ref_logp`` for a KL term, ``rollout_logp`` for importance
corrections). For each such name the loop runs the provider registered here, once per step,
and nothing else: a recipe without a KL term never runs the reference policy, one without a
critic never builds one. A new kind of input is one function here, registered in
:data:`PROVIDERS`, and available to every estimator after it.

A provider is ``fn(trainer, step: StepBatch) -> None``: it reads the step's arrays and writes
its result into ``step.arrays`` (target-aligned ``[N, L - 1]`` per-token arrays, the train
step's layout) or ``step.inputs`` (sequence-level ``[N]`` / ``[N, K]`` estimator inputs), and
may add metrics. The inputs in :data:`INTRINSIC` need no provider (the batch has them, or the
estimate phase makes them). A new input is declared once, with its kind, in
:data:`jaxrl_llm.algorithms.estimators.PROVIDED_INPUTS` (which also gives the config-time trial
its shape) and computed here.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.algorithms.estimators import PROVIDED_INPUTS
from jaxrl_llm.algorithms.allocation import GVM_SLOT
from jaxrl_llm.algorithms.selection import SPO_SLOT, spo_estimates
from jaxrl_llm.core.entropy import sum_pi_squared_from_logits
from jaxrl_llm.models.transformer import softcap_logits
from jaxrl_llm.parallel.multihost import gather
from jaxrl_llm.training.objectives import critic_values, policy_logprobs, policy_mean_logprobs
from jaxrl_llm.training.prompt_store import STORE_INPUTS

__all__ = ["StepBatch", "PROVIDERS", "INTRINSIC", "TOKEN_ARRAYS", "spo_update", "provider", "policy_logp",
           "policy_sum_pi_squared", "policy_entropy", "policy_head_grad_norm", "policy_mean_logp"]

#: inputs the loop has without a provider, and where they come from
INTRINSIC = {"old_logp": "always in the batch (the sampler's, or recomputed with recipe.old_logp=recompute)",
             "token_rewards": "made by the estimate phase from the scores (minus the KL when it is in the reward)",
             "rollout_logp": "the sampler's log-probs, kept by the assemble phase before a recompute"}
#: per-token inputs (``PROVIDED_INPUTS`` kind ``"token"``): the target-aligned train array holding
#: each (its own name unless listed), sliced to the completion for the estimator
TOKEN_ARRAYS = {name: {"values": "old_values"}.get(name, name)
                for name, kind in PROVIDED_INPUTS.items() if kind == "token" and name != "token_rewards"}


@dataclasses.dataclass
class StepBatch:
    """One step's batch while it is assembled (host numpy).

    Attributes:
      arrays: the train arrays (``tokens``, ``mask`` ``[N, L]``; target-aligned ``loss_mask``,
        ``old_logp``, ... ``[N, L - 1]``; ``completion_mask [N, T]``, ``group_ids [N]``).
      inputs: sequence-level estimator inputs (``greedy_scores [N]``, ``component_scores [N, K]``).
      scores: ``[N]`` the shaped rewards; valid: ``[N]`` rows that take part.
      prompt_len: ``P`` (completion token ``t`` sits at target column ``P - 1 + t``).
      prompts, prompt_ids, columns: per group (the rows' group ids index them).
      per_fn: each reward function's ``[N]`` scores (``NaN``: does not apply).
      metrics: extra metrics of this step; timings: seconds per phase.
      key: the step's rollout key.
      keys: per group, the prompt's key in the run's :class:`~jaxrl_llm.training.PromptStore`.
      unfiltered: after a batch filter (PF-PPO's resample), ``(arrays, scores, valid)`` as they
        were before it, for the per-prompt bookkeeping (the store, trackers); else ``None``.
      totals: ``[N]`` the reward totals before shaping (what the prompt store counts a pass by).
      origin: ``(rounds, groups, rows)``: the sampling rounds, the ``(round, group)`` of each
        train group and its rows in its round (single-turn steps); cat: ``cat(get)`` joins
        ``get(round)[rows]`` over the train groups (a per-row array of the rounds, in batch order).
      kl_coef: an adaptive KL controller's coefficient for a KL in the reward (else None).
      returns: the estimator's returns (``[N, T]``, a critic's targets) until the critic takes them.
      extra: further per-step arrays the loop's parts share (an agent step's ``turn_end``).
    """

    arrays: dict[str, np.ndarray]
    scores: np.ndarray
    valid: np.ndarray
    prompt_len: int
    prompts: list[str]
    prompt_ids: list[list[int]]
    columns: dict[str, list]
    per_fn: dict[str, np.ndarray]
    inputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    key: Any = None
    keys: list[str] = dataclasses.field(default_factory=list)
    unfiltered: tuple | None = None
    totals: np.ndarray | None = None
    origin: tuple | None = None
    cat: Callable | None = None
    kl_coef: Any = None
    returns: Any = None
    extra: dict = dataclasses.field(default_factory=dict)

    def rows_as_sampled(self) -> tuple[dict, np.ndarray, np.ndarray]:
        """``(arrays, scores, valid)`` of the rows as sampled (before any batch filter)."""
        return self.unfiltered if self.unfiltered is not None else (self.arrays, self.scores, self.valid)

    @property
    def completion_mask(self) -> np.ndarray:
        """``[N, T]`` the response tokens trained on (valid rows only)."""
        return self.arrays["completion_mask"] & self.valid[:, None]

    @property
    def num_groups(self) -> int:
        return len(self.prompt_ids)


PROVIDERS: dict[str, Callable[[Any, StepBatch], None]] = {}


def provider(name: str) -> Callable:
    """Register ``fn(trainer, step)`` as the provider of input ``name``."""
    def deco(fn):
        if name in PROVIDERS:
            raise ValueError(f"provider {name!r} is registered twice")
        PROVIDERS[name] = fn
        return fn
    return deco


# ------------------------------------------------------------------------------------ jitted passes
# module-level jits (static graph): a second trainer in the same process (a restart, a test) reuses
# their compilations


@partial(jax.jit, static_argnums=(0, 1, 2, 3), static_argnames=("prompt_len", "rows_per_prompt"))
def policy_logp(graphdef, chunk_size, temperature, from_host, params, others, tokens, mask, *, prompt_len=0,
                rows_per_prompt=0, routes=None):
    """``[N, L - 1]`` teacher-forced log-probs of ``tokens[:, 1:]`` at ``temperature``.

    ``rows_per_prompt > 0``: blocks of that many rows share their first ``prompt_len`` columns,
    encoded once per block; only the completion targets get log-probs (0 before them).
    ``routes [N, L, layers, k]``: a mixture of experts computes with these experts (routing
    replay)."""
    from flax import nnx

    if from_host:  # a reference policy kept in host memory (model.offload_reference): HBM only for this pass
        params = jax.device_put(params, jax.memory.Space.Device)
    batch = {"tokens": tokens, "mask": mask}
    if rows_per_prompt:
        batch["prefix_mask"] = mask[:, :prompt_len]
    if routes is not None:
        batch["routes"] = routes
    logp, _ = policy_logprobs(nnx.merge(graphdef, params, *others), batch, chunk_size=chunk_size,
                              temperature=temperature, rows_per_prompt=rows_per_prompt,
                              routing_replay=routes is not None)
    return logp


@partial(jax.jit, static_argnums=(0,))
def _critic_values(graphdef, params, others, tokens, mask):
    from flax import nnx

    return critic_values(nnx.merge(graphdef, params, *others), {"tokens": tokens, "mask": mask})


@partial(jax.jit, static_argnums=(0, 1, 2))
def policy_sum_pi_squared(graphdef, chunk_size, temperature, params, others, tokens, mask, routes=None):
    """``[N, L - 1]`` ``sum_v pi(v)^2`` of the temperature-scaled next-token distribution at
    each position (chunks of ``chunk_size`` positions: never ``[N, L, V]`` at once)."""
    from flax import nnx

    model = nnx.merge(graphdef, params, *others)
    hidden, _ = model(tokens, mask, routes=routes)
    h = hidden[:, :-1]
    w = model.unembedding()
    n, length, d = h.shape
    c = min(chunk_size, length)
    pad = (-length) % c
    hp = jnp.pad(h, ((0, 0), (0, pad), (0, 0))).reshape(n, (length + pad) // c, c, d).swapaxes(0, 1)

    def one(hc):
        logits = softcap_logits(jnp.einsum("bcd,dv->bcv", hc.astype(jnp.float32), w.astype(jnp.float32)),
                                model.final_softcap)
        return sum_pi_squared_from_logits(logits, temperature)

    out = jax.lax.map(one, hp).swapaxes(0, 1).reshape(n, length + pad)
    return jax.lax.stop_gradient(out[:, :length])


#: positions of a row whose logits :func:`policy_head_grad_norm` forms at once
HEAD_GRAD_CHUNK = 512


@partial(jax.jit, static_argnums=(0,))
def policy_head_grad_norm(graphdef, params, others, tokens, mask, loss_mask, routes=None):
    """``[N]`` per row, the L2 norm of the gradient of the row's response log-likelihood
    ``sum_t log pi(y_t)`` (temperature 1, over ``loss_mask``) with respect to the output
    projection ``W [D, V]``: ``|| sum_t h_t (onehot(y_t) - pi_t)^T ||`` from the final hidden
    states, one row at a time and :data:`HEAD_GRAD_CHUNK` positions at a time (``[chunk, V]`` logits, a
    ``[D, V]`` accumulator per row; no backward pass)."""
    from flax import nnx

    model = nnx.merge(graphdef, params, *others)
    hidden, _ = model(tokens, mask, routes=routes)
    w = model.unembedding().astype(jnp.float32)
    cap = model.final_softcap
    length = hidden.shape[1] - 1
    c = min(HEAD_GRAD_CHUNK, length)
    pad = (-length) % c

    def chunk(g, args):  # the row's gradient so far [D, V], plus one chunk's h^T e ([c, V] logits at a time)
        h, y, m = args
        h = h.astype(jnp.float32)
        z = h @ w
        p = jax.nn.softmax(softcap_logits(z, cap), axis=-1)
        e = (jax.nn.one_hot(y, w.shape[1], dtype=jnp.float32) - p) * m[:, None]
        if cap is not None:  # through the soft-cap: d(c tanh(z / c)) / dz = 1 - tanh^2
            e = e * (1.0 - jnp.square(jnp.tanh(z / cap)))
        return g + h.T @ e, None

    def one(args):
        h, y, m = (jnp.pad(a, ((0, pad),) + ((0, 0),) * (a.ndim - 1)) for a in args)
        xs = (h.reshape((-1, c) + h.shape[1:]), y.reshape(-1, c), m.reshape(-1, c))
        g, _ = jax.lax.scan(chunk, jnp.zeros(w.shape, jnp.float32), xs)
        return jnp.sqrt(jnp.sum(g ** 2))

    out = jax.lax.map(one, (hidden[:, :-1], tokens[:, 1:], loss_mask.astype(jnp.float32)))
    return jax.lax.stop_gradient(out)


@partial(jax.jit, static_argnums=(0, 1, 2))
def policy_entropy(graphdef, chunk_size, temperature, params, others, tokens, mask, routes=None):
    """``[N, L - 1]`` entropy of the temperature-scaled next-token distribution at each position
    (chunked: never ``[N, L, V]`` at once)."""
    from flax import nnx

    batch = {"tokens": tokens, "mask": mask} if routes is None else {"tokens": tokens, "mask": mask, "routes": routes}
    _, ent = policy_logprobs(nnx.merge(graphdef, params, *others), batch, chunk_size=chunk_size,
                             temperature=temperature, with_entropy=True, routing_replay=routes is not None)
    return jax.lax.stop_gradient(ent)


@partial(jax.jit, static_argnums=(0, 1, 2))
def policy_mean_logp(graphdef, chunk_size, temperature, params, others, tokens, mask, routes=None):
    """``[N, L - 1]`` mean over the vocabulary of the temperature-scaled log-probs at each
    position (ROVER's uniform-policy value; chunked)."""
    from flax import nnx

    batch = {"tokens": tokens, "mask": mask} if routes is None else {"tokens": tokens, "mask": mask, "routes": routes}
    return policy_mean_logprobs(nnx.merge(graphdef, params, *others), batch, chunk_size=chunk_size,
                                temperature=temperature, routing_replay=routes is not None)


def _replayed(tr, arrays: dict):
    """The batch's sampler routes when the update replays them (a mixture of experts,
    ``train.routing_replay``), so a provider's forward pass uses the same experts; else None."""
    return arrays.get("routes") if tr.recipe.objective.routing_replay else None


def _target(step: StepBatch, values: Any) -> np.ndarray:
    """Host values zeroed outside the loss mask, float32."""
    return np.where(step.arrays["loss_mask"], np.asarray(values), 0.0).astype(np.float32)


# ------------------------------------------------------------------------------------ providers


@provider("ref_logp")
def _ref_logp(tr, step: StepBatch) -> None:
    """Log-probs of the frozen reference policy (a KL term in the loss or the reward)."""
    a = step.arrays
    step.arrays["ref_logp"] = _target(step, tr.logp(tr.ref_params, tr.frozen, a["tokens"], a["mask"],
                                                    prompt_len=step.prompt_len, routes=a.get("routes")))


@provider("gvm_stats")
def _gvm_stats(tr, step: StepBatch) -> None:
    """GVM-RAFT's per-prompt statistics of this visit, for the allocation of its next one: the
    acceptance rate (reward total >= data.pass_threshold) and the mean, over accepted responses,
    of the gradient norm of the response log-likelihood w.r.t. the output projection, under the
    policy that sampled them; stored per prompt key in the store's slot ``allocator/gvm``."""
    a = step.arrays
    gn = np.asarray(gather(policy_head_grad_norm(tr.graphdef, tr.state.params, tr.frozen, a["tokens"], a["mask"],
                                                 a["loss_mask"], _replayed(tr, a))), np.float64)
    gid, valid = np.asarray(a["group_ids"]), np.asarray(step.valid)
    passed = valid & (np.asarray(step.totals) >= tr.store.pass_threshold)
    slot = tr.store.slot(GVM_SLOT)
    for g, key in enumerate(step.keys):
        rows = (gid == g) & valid
        if not rows.any():
            continue
        ok = rows & passed
        slot[key] = {"grad_norm": float(gn[ok].mean()) if ok.any() else 0.0, "accept": float(ok.sum() / rows.sum()),
                     "step": int(tr.iteration)}
    step.metrics["allocation/grad_norm_accepted_mean"] = float(gn[passed].mean()) if passed.any() else 0.0


@provider("values")
def _values(tr, step: StepBatch) -> None:
    """The critic's values at rollout time (``old_values``, the value loss's clipping anchor)."""
    a = step.arrays
    v = gather(_critic_values(tr.critic.graphdef, tr.critic.state.params, tr.critic.frozen, a["tokens"], a["mask"]))
    step.arrays["old_values"] = _target(step, v)


@provider("greedy_scores")
def _greedy_scores(tr, step: StepBatch) -> None:
    """The reward of a greedy completion of each row's prompt (ReMax's baseline), scored and
    shaped like the samples."""
    t0 = time.perf_counter()
    broll = tr.baseline_sampler(tr.state.params, step.prompt_ids, step.key, *tr.frozen)  # greedy: key unused
    out = tr.score(step.prompts, step.columns, broll)
    base = tr.shape(out, broll, step.prompts, step.keys, update=False)
    group = step.arrays["group_ids"]
    step.inputs["greedy_scores"] = base[group]
    valid_group = np.zeros(len(step.prompt_ids), bool)
    valid_group[group[step.valid]] = True
    step.metrics.update({"baseline/reward_mean": float(base[valid_group].mean()) if valid_group.any() else 0.0,
                         "baseline/length_mean": float(np.mean(broll.lengths)),
                         "time/baseline": time.perf_counter() - t0})


@provider("sum_pi_squared")
def _sum_pi_squared(tr, step: StepBatch) -> None:
    """``sum_v pi(v)^2`` of the sampling policy (the policy before the update) at each response
    position (the Optimal Token Baseline's path-variance proxy)."""
    a = step.arrays
    obj = tr.recipe.objective
    sp = gather(policy_sum_pi_squared(tr.graphdef, obj.chunk_size, obj.temperature, tr.state.params,
                                      tr.frozen, a["tokens"], a["mask"], _replayed(tr, a)))
    step.arrays["sum_pi_squared"] = _target(step, sp)


@provider("old_entropy")
def _old_entropy(tr, step: StepBatch) -> None:
    """The sampling policy's (the policy before the update) token entropy at each response
    position: HAPO's and CANON's entropy signals."""
    a = step.arrays
    obj = tr.recipe.objective
    ent = gather(policy_entropy(tr.graphdef, obj.chunk_size, obj.temperature, tr.state.params, tr.frozen,
                                a["tokens"], a["mask"], _replayed(tr, a)))
    step.arrays["old_entropy"] = _target(step, ent)
    cm = step.arrays["loss_mask"]
    step.metrics["old_entropy/mean"] = float(np.asarray(ent)[cm].mean()) if cm.any() else 0.0


@provider("old_mean_logp")
def _old_mean_logp(tr, step: StepBatch) -> None:
    """The vocabulary-mean log-prob at each response position under the policy before the update
    (the trainer's parameters; the sampling policy itself when on-policy): ROVER's next-state value
    under the old policy, whose log-probs are best recomputed by the same pass
    (``recipe.old_logp=recompute``, the preset's)."""
    a = step.arrays
    obj = tr.recipe.objective
    v = gather(policy_mean_logp(tr.graphdef, obj.chunk_size, obj.temperature, tr.state.params, tr.frozen,
                                a["tokens"], a["mask"], _replayed(tr, a)))
    step.arrays["old_mean_logp"] = _target(step, v)


def mask_prompt_tokens(tokens: np.ndarray, mask: np.ndarray, prompt_len: int, key: jax.Array, prob: float,
                       fill: int) -> tuple[np.ndarray, int]:
    """``tokens`` with each real prompt token (column ``< prompt_len``, ``mask`` set) replaced by
    ``fill`` with probability ``prob`` (drawn from ``key``), and the number replaced."""
    hit = np.asarray(jax.random.bernoulli(key, prob, tokens.shape)) & np.asarray(mask, bool) & (
        np.arange(tokens.shape[1])[None] < prompt_len)
    return np.where(hit, fill, tokens).astype(tokens.dtype), int(hit.sum())


@provider("masked_logp")
def _masked_logp(tr, step: StepBatch) -> None:
    """PAPO: log-probs of the sampled tokens under the policy before the update, given the
    prompt with each token replaced by the pad token with probability ``mask_prob`` (the loss's
    argument; a fresh mask each step, from the step's key). Logs the share of prompt tokens masked."""
    a = step.arrays
    import inspect

    kw = dict(tr.recipe.objective.policy_kwargs)
    param = inspect.signature(tr.recipe.objective.policy_loss).parameters.get("mask_prob")
    prob = float(kw.get("mask_prob", 0.6 if param is None else param.default))  # the surrogate's own default
    fill = int(tr.sampler.config.pad_token_id)
    masked, n = mask_prompt_tokens(a["tokens"], a["mask"], step.prompt_len, jax.random.fold_in(step.key, 0x9A90),
                                   prob, fill)
    step.arrays["masked_logp"] = _target(step, tr.logp(tr.state.params, tr.frozen, masked, a["mask"],
                                                       prompt_len=step.prompt_len, routes=a.get("routes")))
    real = int((np.asarray(a["mask"], bool)[:, :step.prompt_len]).sum())
    step.metrics["papo/masked_prompt_frac"] = n / max(real, 1)


@partial(jax.jit, static_argnums=(0, 6))
def aligndistil_teacher_pass(graphdef, dpo_params, reverse_params, others, tokens, mask, beta2):
    """``([N, L - 1] teacher log-prob of each next token, [N, L - 1] w)`` of AlignDistil's teacher
    (:func:`jaxrl_llm.core.aligndistil_teacher`) from the two models' logits, one row at a time
    (``[L, V]`` logits of each model at once, never ``[N, L, V]``)."""
    from flax import nnx

    from jaxrl_llm.core import aligndistil_teacher

    dpo = nnx.merge(graphdef, dpo_params, *others)
    rev = nnx.merge(graphdef, reverse_params, *others)
    hd, _ = dpo(tokens, mask)
    hr, _ = rev(tokens, mask)

    def one(args):
        a, b, y = args
        return aligndistil_teacher(dpo.logits(a), rev.logits(b), y, beta2=beta2)

    return jax.lax.map(one, (hd[:, :-1], hr[:, :-1], tokens[:, 1:]))


def _aligndistil_teacher(tr, step: StepBatch) -> None:
    """AlignDistil's teacher on the sampled tokens: the DPO model (``model.aux_params``) and the
    reverse-DPO model (the reference slot) give each response token's teacher log-prob and its
    weight ``w`` (``beta2``: the loss's argument)."""
    if "teacher_logp" in step.arrays:
        return
    a = step.arrays
    beta2 = float(dict(tr.recipe.objective.policy_kwargs).get("beta2", 15.0))
    lt, w = aligndistil_teacher_pass(tr.graphdef, tr.aux_params, tr.ref_params, tr.frozen, a["tokens"], a["mask"],
                                     beta2)
    step.arrays["teacher_logp"] = _target(step, gather(lt))
    step.arrays["teacher_weight"] = np.where(a["loss_mask"], np.asarray(gather(w)), 1.0).astype(np.float32)
    cm = a["loss_mask"]
    step.metrics["aligndistil/w_mean"] = float(np.asarray(step.arrays["teacher_weight"])[cm].mean()) if cm.any() else 0.0


PROVIDERS["teacher_logp"] = _aligndistil_teacher
PROVIDERS["teacher_weight"] = _aligndistil_teacher  # one pass computes both (the second call returns at once)


#: where DECS's thinking chunks start (the authors' splitter's words, at a line or word start)
DECS_MARKERS = ("Wait", "But", "Alternatively", "Hmm", "Let", "Therefore")


def decs_chunk_ends(pieces: list[str], markers=DECS_MARKERS, end_tag: str = "</think>") -> list[int]:
    """Token counts at which each thinking chunk of a response ends, from the decoded text of each
    response token: a new chunk starts at a token that begins one of ``markers`` at the start of a
    word (the token starts with whitespace, or the text before it ends with whitespace); the
    thinking ends with the token that completes ``end_tag`` (or with the response)."""
    text, think_end = "", len(pieces)
    for i, piece in enumerate(pieces):
        text += piece
        if end_tag in text:
            think_end = i + 1
            break
    ends, text = [], ""
    for i, piece in enumerate(pieces[:think_end]):
        word_start = piece[:1].isspace() or text[-1:].isspace()
        if i > 0 and word_start and any(piece.lstrip().startswith(mk) for mk in markers):
            ends.append(i)
        text += piece
    return ends + [think_end]


@provider("decs_token_rewards")
def _decs_token_rewards(tr, step: StepBatch) -> None:
    """DECS's token rewards: a correct response's thinking is cut into chunks, each chunk prefix
    is scored by the run's reward functions (the verifier stands in for the paper's detector
    model), and the tokens up to the end of the first prefix that is already correct are the
    necessary ones (:func:`jaxrl_llm.core.decs_token_rewards`)."""
    from jaxrl_llm.core import decs_token_rewards

    a = step.arrays
    kw = dict(tr.recipe.estimator.kwargs)
    beta, thr, metric = float(kw.get("beta", 0.1)), float(kw.get("threshold", 1.0)), kw.get("metric")
    cm = np.asarray(step.completion_mask, bool)
    c0 = step.prompt_len - 1
    toks = np.asarray(a["tokens"])[:, step.prompt_len:]
    gid = np.asarray(a["group_ids"])
    outcome = np.asarray(step.per_fn[metric] if metric else (step.totals if step.totals is not None else step.scores),
                         np.float64)
    correct = np.nan_to_num(outcome, nan=0.0) >= thr
    necessary = cm.sum(1).astype(np.float32)
    cand = []  # (prefix text, row, tokens in the prefix, prefix ids)
    for i in np.flatnonzero(correct & cm.any(1)):
        ids = [int(t) for t in toks[i][cm[i]]]
        # each token's text after the token before it (a two-token decode keeps the leading space
        # of a SentencePiece token); the verifier reads whole-prefix decodes at the chunk ends only
        dec = tr.tokenizer.decode
        pieces = []
        for k in range(len(ids)):
            one = dec(ids[max(k - 1, 0):k], skip_special_tokens=True)
            two = dec(ids[max(k - 1, 0):k + 1], skip_special_tokens=True)
            pieces.append(two[len(os.path.commonprefix([one, two])):])
        for e in decs_chunk_ends(pieces):
            cand.append((dec(ids[:e], skip_special_tokens=True), int(i), e, ids[:e]))
    if cand:
        res = tr.rewards([step.prompts[gid[c[1]]] for c in cand], [c[0] for c in cand],
                         completion_ids=[c[3] for c in cand], completion_lengths=[c[2] for c in cand],
                         **{k: [v[gid[c[1]]] for c in cand] for k, v in step.columns.items()})
        vals = np.asarray(res.per_fn[metric] if metric else res.total, np.float64)
        found: dict[int, int] = {}
        for (_, i, e, _), v in zip(cand, np.nan_to_num(vals, nan=0.0)):
            if v >= thr and i not in found:
                found[i] = e
        for i, e in found.items():
            necessary[i] = e
    max_len = float(kw.get("max_length") or tr.sampler.config.max_new_tokens)
    r = np.asarray(decs_token_rewards(correct, necessary, cm, beta=beta, max_length=max_len), np.float32)
    out = np.zeros(np.asarray(a["loss_mask"]).shape, np.float32)
    out[:, c0:c0 + r.shape[1]] = r
    step.arrays["decs_token_rewards"] = out
    lens = cm.sum(1)
    ok = correct & (lens > 0)
    step.metrics["decs/redundant_frac"] = float(np.mean(1.0 - necessary[ok] / lens[ok])) if ok.any() else 0.0


@provider("budget_scores")
def _budget_scores(tr, step: StepBatch) -> None:
    """BRPO's budget scores are made by its loop part (recipe.loop_part=brpo) in the assemble phase."""
    if "budget_scores" not in step.inputs:
        from jaxrl_llm.config import ConfigError

        raise ConfigError("recipe.advantage=brpo reads each trace's summary scores after every thinking budget: set "
                          "recipe.loop_part=brpo")


@provider("nash_pref")
def _nash_pref(tr, step: StepBatch) -> None:
    """Nash-MD's preferences are made by its loop part (recipe.loop_part=nash_md) in the
    assemble phase; without it the estimator has nothing to read."""
    if "nash_pref" not in step.inputs:
        from jaxrl_llm.config import ConfigError

        raise ConfigError("recipe.advantage=nash_md reads each row's preference over a mixture sample: set "
                          "recipe.loop_part=nash_md (or use recipe.name=nash_md)")


@provider("aux_logp")
def _aux_logp(tr, step: StepBatch) -> None:
    """Log-probs of the sampled tokens under the auxiliary policy (``model.aux_params``)."""
    a = step.arrays
    step.arrays["aux_logp"] = _target(step, tr.logp(tr.aux_params, tr.frozen, a["tokens"], a["mask"],
                                                    routes=a.get("routes")))


def _mc_values(tr, step: StepBatch) -> None:
    """SPO's Monte-Carlo values: cut points in every response (before every ``interval``-th token the
    sampling policy gave probability below ``threshold``; the estimator's arguments), ``rollouts``
    continuations sampled from each cut prefix with the current policy, scored by the run's reward
    functions on the whole completion (prefix + continuation, cut to the length budget), and the
    mean reward written at the cut: ``mc_cuts`` / ``mc_values`` (target-aligned). The values are of
    the reward functions' totals, so the recipe may not shape rewards (``build_recipe`` refuses).
    On several hosts every process holds the same global batch (the loop's convention), so every
    process finds the same cut points and samples the same continuations in the same collective
    sampler calls; as for the step's own completions, each process scores a contiguous share of
    the cut points' continuations and the totals are exchanged."""
    from jaxrl_llm.core.segments import spo_cut_points
    from jaxrl_llm.rollout.sampler import Sampler
    from jaxrl_llm.training.rl import to_target_aligned

    if "mc_values" in step.arrays:
        return
    t0 = time.perf_counter()
    kw = dict(tr.recipe.estimator.kwargs)
    threshold, interval, n = float(kw.get("threshold", 0.9)), int(kw.get("interval", 5)), int(kw.get("rollouts", 4))
    a, p = step.arrays, step.prompt_len
    cm = step.completion_mask
    width = cm.shape[1]
    cuts = np.asarray(spo_cut_points(a["old_logp"][:, p - 1:], cm, threshold=threshold, interval=interval))
    values = np.zeros(cuts.shape, np.float32)
    rows, ts = np.nonzero(cuts)
    if len(rows):
        key = (n, p + width)
        sampler = tr.aux_samplers.get(key)
        if sampler is None:  # one continuation sampler per (rollouts, prefix width), batch sizes bucketed
            cfg = dataclasses.replace(tr.sampler.config, num_samples=n)
            sampler = tr.aux_samplers[key] = Sampler(tr.sampler.graphdef, cfg, length_buckets=(p + width,),
                                                     batch_buckets=tuple(2 ** k for k in range(3, 17)),
                                                     mesh=tr.sampler.mesh, unroll_layers=tr.sampler.unroll_layers)
        group = a["group_ids"]
        comp = a["tokens"][:, p:]
        prefixes = [list(step.prompt_ids[group[i]]) + comp[i, :t].tolist() for i, t in zip(rows, ts)]
        roll = sampler(tr.state.params, prefixes, jax.random.fold_in(step.key, 0x5E6), *tr.frozen)
        ctoks, cmask = np.asarray(roll.tokens), np.asarray(roll.mask).astype(bool)
        ids, texts, prompts, cols = [], [], [], {k: [] for k in step.columns}
        for j, (i, t) in enumerate(zip(rows, ts)):
            for r in range(n):
                cont = ctoks[j * n + r][cmask[j * n + r]][:width - t].tolist()
                full = comp[i, :t].tolist() + cont
                ids.append(full)
                texts.append(tr.tokenizer.decode(full, skip_special_tokens=True))
                prompts.append(step.prompts[group[i]])
                for k in step.columns:
                    cols[k].append(step.columns[k][group[i]])
        totals = _score_split(tr, n, prompts, texts, ids, cols)
        values[rows, ts] = totals.reshape(len(rows), n).mean(axis=1)
    step.arrays["mc_cuts"] = to_target_aligned(cuts.astype(np.float32), p)
    step.arrays["mc_values"] = to_target_aligned(values, p)
    step.metrics.update({"mc/cut_points_per_response": float(cuts[step.valid].sum(1).mean()) if step.valid.any()
                         else 0.0, "mc/rollouts": float(len(rows) * n), "time/mc_values": time.perf_counter() - t0})


def _score_split(tr, n: int, prompts: list, texts: list, ids: list, cols: dict) -> np.ndarray:
    """``[len(texts)]`` reward totals of continuations in blocks of ``n`` (one block per cut point);
    with several processes each scores a contiguous share of the blocks and the totals are
    exchanged, so every process ends with the same values."""
    from jaxrl_llm.parallel.multihost import allgather_objects

    blocks = len(texts) // n
    n_proc = jax.process_count()
    bounds = np.linspace(0, blocks, n_proc + 1).round().astype(int) * n
    lo, hi = (0, len(texts)) if n_proc == 1 else (bounds[jax.process_index()], bounds[jax.process_index() + 1])
    mine = np.zeros(0, np.float32)
    if hi > lo:
        out = tr.rewards(prompts[lo:hi], texts[lo:hi], completion_ids=ids[lo:hi],
                         completion_lengths=[len(x) for x in ids[lo:hi]],
                         group_ids=np.repeat(np.arange(lo // n, hi // n), n).tolist(),
                         **{k: v[lo:hi] for k, v in cols.items()})
        mine = np.asarray(out.total, np.float32)
    return mine if n_proc == 1 else np.concatenate(allgather_objects(mine))


PROVIDERS["mc_values"] = _mc_values
PROVIDERS["mc_cuts"] = _mc_values  # one provider computes both (the second call returns at once)


@provider("iteration")
def _iteration(tr, step: StepBatch) -> None:
    """``[N]`` the trainer's iteration (0-based) when the batch was sampled: a schedule's clock."""
    step.inputs["iteration"] = np.full(len(step.scores), float(tr.iteration), np.float32)


@provider("prompt_confidence")
def _prompt_confidence(tr, step: StepBatch) -> None:
    """``[N]`` the low-probability confidence of each row's prompt under the sampling policy (the
    policy before the update): the mean log-prob of its least likely ``fraction`` of tokens (the
    estimator's argument) over the prompt tokens that have a predecessor."""
    from jaxrl_llm.core.group_advantages import low_probability_confidence

    a, p = step.arrays, step.prompt_len
    lp = np.asarray(tr.logp(tr.state.params, tr.frozen, a["tokens"], a["mask"]))[:, :p - 1]
    pm = a["mask"][:, :p - 1] & a["mask"][:, 1:p]  # both the predicting and the predicted token are real
    frac = float(dict(tr.recipe.estimator.kwargs).get("fraction", 0.2))
    step.inputs["prompt_confidence"] = np.asarray(low_probability_confidence(lp, pm, fraction=frac), np.float32)


@provider("answer_ids")
def _answer_ids(tr, step: StepBatch) -> None:
    """``[N]`` the answer cluster of each row: the completions decoded and keyed by the recipe's
    clusterer (:mod:`jaxrl_llm.algorithms.answers`), ids equal within a group for equal keys."""
    from jaxrl_llm.algorithms.answers import cluster_ids

    a = step.arrays
    p = step.prompt_len
    toks, cm = a["tokens"][:, p:], a["completion_mask"]
    texts = [tr.tokenizer.decode(toks[i][cm[i]], skip_special_tokens=True) for i in range(len(toks))]
    keys = tr.recipe.clusterer(texts)
    ids = cluster_ids(keys, a["group_ids"])
    step.inputs["answer_ids"] = ids
    k = np.array([len(set(ids[(a["group_ids"] == g) & step.valid])) for g in range(step.num_groups)])
    present = np.array([((a["group_ids"] == g) & step.valid).any() for g in range(step.num_groups)])
    step.metrics["answers/clusters_per_group"] = float(k[present].mean()) if present.any() else 0.0


@provider("tree_prefix_ids")
def _tree_prefix_ids(tr, step: StepBatch) -> None:
    """``[N, D + 1]`` the dense id of each row's depth-``d`` subtree (column 0 its prompt group,
    column ``d`` the rows of that group sharing its ``d``-th segment node; ``-1`` past the row's
    depth), from the tree sampler's ``paths``."""
    paths = step.arrays.get("tree_paths")
    if paths is None:
        raise ValueError("recipe.advantage=treepo reads the tree of each prompt's responses: sample with "
                         "rollout.tree_segment=<tokens per segment> (TreePO's tree sampler)")
    gid = np.asarray(step.arrays["group_ids"])
    n, d = paths.shape
    out = np.full((n, d + 1), -1, np.int32)
    out[:, 0] = gid
    for col in range(d):
        rows = np.flatnonzero(paths[:, col] >= 0)
        if rows.size:  # dense ids of the (group, node) pairs
            _, dense = np.unique(np.stack([gid[rows], paths[rows, col]], 1), axis=0, return_inverse=True)
            out[rows, col + 1] = dense.ravel()
    step.inputs["tree_prefix_ids"] = out
    present = out[:, 1:] >= 0
    step.metrics["tree/depth_mean"] = float(present.sum(1)[step.valid].mean()) if step.valid.any() else 0.0


@provider("truncated")
def _truncated(tr, step: StepBatch) -> None:
    """``[N]`` 1 where the sampler stopped a response at the length budget rather than a stop token."""
    step.inputs["truncated"] = (~np.asarray(step.arrays["stopped"], bool)).astype(np.float32)
    step.metrics["response/truncated_frac"] = float(step.inputs["truncated"][step.valid].mean()) if \
        step.valid.any() else 0.0


@provider("component_scores")
def _component_scores(tr, step: StepBatch) -> None:
    """``[N, K]`` each reward function's unweighted score (``NaN``, "does not apply", as 0), in
    the order of the run's rewards."""
    names = list(step.per_fn)
    step.inputs["component_scores"] = np.stack(
        [np.nan_to_num(np.asarray(step.per_fn[k], np.float32), nan=0.0) for k in names], axis=1)
    step.metrics["component_scores/count"] = float(len(names))


def _store_input(name: str) -> Callable:
    def fn(tr, step: StepBatch) -> None:
        if not step.keys:
            raise ValueError(f"input {name!r} reads the prompt statistics store, but this step's batch has no prompt "
                             f"keys")
        per_group = tr.store.lookup(step.keys)  # the store as it was when the step began
        step.inputs[name] = per_group[name][np.asarray(step.arrays["group_ids"])]
    fn.__name__ = f"_{name}"
    fn.__doc__ = f"``[N]`` {STORE_INPUTS[name]} (:mod:`jaxrl_llm.training.prompt_store`)."
    return fn


for _name in STORE_INPUTS:
    provider(_name)(_store_input(_name))


# ------------------------------------------------------------------------------------ trackers
# Inputs backed by per-prompt state that a loop part updates after the policy update (in the
# prompt store, so it is checkpointed): SPO's tracker (jaxrl_llm.training.parts.spo_tracker).


def part_args(bound) -> dict[str, Any]:
    """A bound part's arguments with the function's own defaults filled in."""
    import inspect

    sig = inspect.signature(bound.part.fn)
    out = {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    out.update(dict(bound.kwargs))
    return out


@provider("spo_value")
def _spo_value(tr, step: StepBatch) -> None:
    """``[N]`` SPO's tracked success probability of each row's prompt, from before the step."""
    args = part_args(tr.recipe.estimator)
    scores, valid = np.asarray(step.scores, np.float64), np.asarray(step.valid)
    bad = valid & ~((scores >= 0.0) & (scores <= 1.0))
    if bad.any():
        raise ValueError(f"recipe.advantage=single_stream_po tracks a success probability: rewards (after shaping) must "
                         f"be in [0, 1], got {scores[bad][:4].tolist()} (rows {np.flatnonzero(bad)[:4].tolist()})")
    p = spo_estimates(tr.store.slot(SPO_SLOT), step.keys, args["init_alpha"], args["init_beta"])
    step.inputs["spo_value"] = p[np.asarray(step.arrays["group_ids"])]
    step.metrics["tracker/value_mean"] = float(p.mean()) if p.size else 0.0


def spo_update(tr, step: StepBatch) -> None:
    """SPO's tracker after the actor update, once per prompt visit: the forgetting factor from the
    updated policy's change on the prompt's stored response (or a constant), then ``alpha <- rho
    alpha + sum r``, ``beta <- rho beta + sum (1 - r)`` over the prompt's valid rows (one row with
    SPO's single sample), and the prompt's newest response stored with its log-probs under the
    updated policy (for the next visit's divergence). Rows are those sampled (before a batch
    filter); a response is the sampler's (rejection masks do not cut it)."""
    import jax.numpy as jnp

    from jaxrl_llm.core.curriculum import beta_tracker_update, kl_adaptive_forgetting, mean_abs_logp_change

    args = part_args(tr.recipe.estimator)
    a, scores, valid = step.rows_as_sampled()
    p = step.prompt_len
    gid, valid = np.asarray(a["group_ids"]), np.asarray(valid)
    scores = np.asarray(scores, np.float64)
    slot = tr.store.slot(SPO_SLOT)
    keys = step.keys
    n, width = a["tokens"].shape
    t_len = width - p
    rho = np.full(len(keys), float(args["rho"]), np.float32)
    need_logp = args["forgetting"] == "kl"
    if need_logp:
        seen = [g for g, k in enumerate(keys) if k in slot and slot[k].get("response")]
        div = np.zeros(len(keys), np.float32)
        if seen:
            toks = np.full((n, width), tr.sampler.config.pad_token_id, np.int32)
            mask = np.zeros((n, width), bool)
            stored = np.zeros((n, t_len), np.float32)
            rmask = np.zeros((n, t_len), bool)
            for j, g in enumerate(seen[:n]):
                pid, resp = step.prompt_ids[g], slot[keys[g]]["response"]
                if len(resp) > t_len:
                    raise ValueError(f"SPO tracker: the stored response of {keys[g]!r} has {len(resp)} tokens, more "
                                     f"than this run's rollout.max_new_tokens allow ({t_len})")
                toks[j, p - len(pid):p], mask[j, p - len(pid):p] = pid, True
                toks[j, p:p + len(resp)], mask[j, p:p + len(resp)] = resp, True
                stored[j, :len(resp)], rmask[j, :len(resp)] = slot[keys[g]]["logp"], True
            lp = np.asarray(tr.logp(tr.state.params, tr.frozen, toks, mask))[:, p - 1:]
            d = np.asarray(mean_abs_logp_change(jnp.asarray(stored), jnp.asarray(lp), jnp.asarray(rmask)))
            div[seen[:n]] = d[:len(seen[:n])]
            step.metrics["tracker/divergence_mean"] = float(d[:len(seen[:n])].mean())
        rho = np.asarray(kl_adaptive_forgetting(jnp.asarray(div), half_life=args["half_life"],
                                                rho_min=args["rho_min"], rho_max=args["rho_max"]))
        now = np.asarray(tr.logp(tr.state.params, tr.frozen, a["tokens"], a["mask"]))[:, p - 1:]
    cm = np.asarray(a["mask"], bool)[:, p:]  # the sampled response (a rejection mask does not cut it)
    for g in sorted(set(gid[valid].tolist())):
        rows = np.flatnonzero(valid & (gid == g))
        entry = dict(slot.get(keys[g], {"alpha": float(args["init_alpha"]), "beta": float(args["init_beta"])}))
        al, be = entry["alpha"], entry["beta"]
        for j, i in enumerate(rows):  # the evidence decays once per visit, every row's reward is added
            al, be = beta_tracker_update(al, be, float(scores[i]), float(rho[g]) if j == 0 else 1.0)
        entry["alpha"], entry["beta"] = float(al), float(be)
        if need_logp:  # the prompt's newest response (the last valid row of its group)
            i = rows[-1]
            entry["response"] = a["tokens"][i, p:][cm[i]].tolist()
            entry["logp"] = [float(v) for v in now[i][cm[i]]]
        slot[keys[g]] = entry
    step.metrics["tracker/rho_mean"] = float(rho.mean()) if rho.size else 0.0
    step.metrics["tracker/prompts"] = float(len(slot))


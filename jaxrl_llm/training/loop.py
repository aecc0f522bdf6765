"""The RL loop: ``collect -> assemble -> estimate -> update -> log``, one function per phase.

:class:`RLTrainer` is a :class:`~jaxrl_llm.training.host_loop.HostLoop` (evaluation, logging,
checkpoints every N steps / on SIGTERM / at the end, exact resume) whose step is::

    step      = collect(key)       # data -> rollout -> rewards -> shaping, per sampling round; the
                                   #   recipe's group filter decides which groups are kept
    step      = assemble(step)     # the train arrays; the providers of what the recipe requires
                                   #   (old-log-prob recompute, reference pass, critic values, greedy
                                   #   baseline, ...); importance corrections
    step      = estimate(step)     # advantages (jit): the recipe's estimator; KL in the reward
    metrics   = update(step, key)  # epochs x mini-batches of the train step (and the critic's)
    return log(step, metrics)      # the step's metrics

The loop never asks which algorithm it runs: the recipe (:class:`~jaxrl_llm.training.recipes.RLRecipe`)
holds the parts as objects and lists what they require; the providers
(:mod:`jaxrl_llm.training.providers`) compute exactly that.

Every random choice derives from ``(seed, iteration, round)``: the key of iteration ``s`` is
``fold_in(key(seed), s)``, split into a rollout key and a mini-batch shuffling key; sampling
round ``r`` uses the rollout key itself for ``r = 0`` and ``fold_in(rollout_key, r)`` after. A
run resumed from a checkpoint at iteration ``s`` (train state, critic state, KL controller,
data-iterator state and history restored) continues bit for bit as if never stopped.

**Group filters** (DAPO's dynamic sampling). Each round draws one data batch of ``B`` prompts,
samples and scores it, and keeps the groups the filter accepts. Rounds continue until ``B``
groups are kept (``B`` = the size of the step's first data batch) or the filter's
``max_rounds`` are done. The train batch always has the fixed shape ``B x G`` rows, so the
train step never recompiles: the first ``B`` kept groups in order of generation (extra kept
groups of the last round are discarded, as verl truncates), and when the cap is hit with
``k < B`` kept, the remaining ``B - k`` slots are filled with dropped groups whose
``loss_mask`` is all zero and which are marked invalid for the estimator. Such rows add
exactly nothing to the loss, its normalising weight or batch statistics, so the update equals
training on the ``k`` kept groups alone. A mini-batch without any loss token is not run (a zero
gradient would still move Adam's parameters through its momentum).

**Several processes** (multi-host; :func:`jaxrl_llm.parallel.initialize`). Every process runs
this same loop on the same *global* batch: the same prompts, the same keys, the sampler and
train step as one SPMD program over the whole mesh, rollouts and log-probabilities fetched in
full (:func:`~jaxrl_llm.parallel.gather`). Only the reward functions are split: each process
scores a contiguous share of the groups and the outputs are exchanged, so scores, advantages,
filter decisions and metrics are identical on every host and equal to a one-process run's.
"""

from __future__ import annotations

import copy
import dataclasses
import time
import types
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.algorithms.estimators import AGENT_KINDS, PROVIDED_INPUTS
from jaxrl_llm.core.policy_losses import ratio_metrics as core_ratio_metrics
from jaxrl_llm.algorithms.sampling import ShapingInputs, metric_values
from jaxrl_llm.algorithms.allocation import AllocateInputs, check_allocation, history_window
from jaxrl_llm.algorithms.hints import HintInputs, trains_in_plain_context
from jaxrl_llm.algorithms.replay import ReplayInputs, apply_replacements, entry_of
from jaxrl_llm.algorithms.selection import SPO_SLOT, SelectInputs, check_selection
from jaxrl_llm.data.pipeline import PromptBatch
from jaxrl_llm.parallel.multihost import allgather_objects, gather
from jaxrl_llm.parallel.sharding import in_host_memory
from jaxrl_llm.rewards.base import RewardOutput
from jaxrl_llm.rollout.sampler import Rollout, Sampler, bucket, pad_prompts
from jaxrl_llm.training.host_loop import HostLoop
from jaxrl_llm.training.prompt_store import STORE_INPUTS, PromptStore, prompt_keys
from jaxrl_llm.training.prefix import PrefixPlan, block_rows, check_blocks, microbatch_order
from jaxrl_llm.training.providers import AFTER_UPDATE, INTRINSIC, PROVIDERS, TOKEN_ARRAYS, StepBatch, policy_logp
from jaxrl_llm.training.recipes import RLRecipe, estimate_advantages
from jaxrl_llm.training.rl import Critic, align_routes, build_rl_batch, minibatches, to_target_aligned

__all__ = ["RLTrainer", "compute_advantages"]



_estimate_jit = jax.jit(estimate_advantages, static_argnums=(0, 1, 2))


def compute_advantages(rec: RLRecipe, scores, completion_mask, group_ids, num_groups: int, **inputs: Any
                       ) -> jax.Array:
    """``[N, T]`` advantages of the recipe's estimator (and its KL in the reward) for one batch,
    outside the loop: ``inputs`` are what the estimator requires (``values``, ``greedy_scores``,
    ``old_logp`` and ``ref_logp`` for a KL in the reward, ...) and optionally ``valid [N]``.
    Jit-able with ``num_groups`` static."""
    base = {"scores": scores, "mask": completion_mask, "group_ids": group_ids,
            "valid": inputs.pop("valid", jnp.ones(jnp.shape(scores), bool))}
    return estimate_advantages(rec.estimator, rec.kl_reward, num_groups, {**base, **inputs})[0]


FEEDBACK = "selector/feedback"  # the store slot of the last trained step's per-prompt feedback to a selector


def _slot(part_name: str) -> str:
    """The prompt store's slot of a stateful shaping part."""
    return f"shaping/{part_name}"


def _merge_reward_metrics(outs: list) -> dict[str, float]:
    """The reward metrics of several rounds' :class:`~jaxrl_llm.rewards.RewardOutput` as one
    batch: means and stds over all rows, counts and seconds summed."""
    if len(outs) == 1:
        return dict(outs[0].metrics)
    merged: dict[str, float] = {}
    total = np.concatenate([o.total for o in outs]).astype(np.float64)
    for k in outs[0].metrics:
        vals = [o.metrics[k] for o in outs]
        name, _, stat = k.rpartition("/")
        if stat in ("mean", "std"):
            if name == "rewards/total":
                x = total
            elif name.startswith("rewards/") and name[len("rewards/"):] in outs[0].per_fn:
                x = np.concatenate([o.per_fn[name[len("rewards/"):]] for o in outs]).astype(np.float64)
                x = x[~np.isnan(x)]
            else:
                merged[k] = float(np.mean(vals))
                continue
            merged[k] = (float(x.mean()) if stat == "mean" else float(x.std())) if x.size else float("nan")
        elif k == "rewards/abandoned_threads":
            merged[k] = float(vals[-1])
        else:  # errors, timeouts, nonfinite, seconds, failed rows
            merged[k] = float(np.sum(vals))
    return merged


@partial(jax.jit, static_argnums=(0,))
def _last_scores(graphdef, params, frozen, tokens, mask):
    """``[B]`` a score-head model's output at the last position of left-padded rows."""
    from flax import nnx

    model = nnx.merge(graphdef, params, *frozen)
    hidden, _ = model(tokens, mask)
    return model.scores(hidden[:, -1])[:, 0].astype(jnp.float32)


def _put_rows(base, rows: np.ndarray, new) -> np.ndarray:
    """A copy of ``base`` with ``base[rows] = new``."""
    out = np.array(base, copy=True)
    out[rows] = np.asarray(new).astype(out.dtype)
    return out


def _take_rollout_rows(roll, rows=None):
    """``roll`` (a rollout NamedTuple) as host arrays, its rows ``rows`` only (all: None); fields
    that are None (a dense model's ``routes``) stay None."""
    return type(roll)(*(None if x is None else (np.asarray(x) if rows is None else np.asarray(x)[rows])
                        for x in roll))


def _put_result(roll, out: RewardOutput, rows: np.ndarray, sub, sub_out: RewardOutput):
    """``(roll, out)`` with rows ``rows`` replaced by the rows of ``(sub, sub_out)``, in order.
    A mixture of experts' ``routes`` are dropped (the replaced rows were sampled from other
    prompts: the update then has no routes to replay, which the run's config checks refuse)."""
    roll = roll._replace(**{f: _put_rows(getattr(roll, f), rows, getattr(sub, f))
                            for f in ("tokens", "mask", "logprobs", "lengths", "stopped")})
    if getattr(roll, "routes", None) is not None:
        roll = roll._replace(routes=None)
    out = RewardOutput(_put_rows(out.total, rows, sub_out.total),
                       {k: _put_rows(v, rows, sub_out.per_fn[k]) for k, v in out.per_fn.items()},
                       {k: _put_rows(v, rows, sub_out.failed[k]) for k, v in out.failed.items()}, out.metrics)
    return roll, out


def _subset(batch: PromptBatch, idx) -> PromptBatch:
    """The prompts ``idx`` of a batch, in that order."""
    return PromptBatch([batch.prompt_ids[i] for i in idx], [batch.prompts[i] for i in idx],
                       [batch.raw_prompts[i] for i in idx], {k: [v[i] for i in idx] for k, v in batch.columns.items()},
                       [batch.where[i] for i in idx])


def _drop_unsampled(batch: PromptBatch, roll: Rollout, counts: np.ndarray) -> tuple[PromptBatch, Rollout]:
    """The prompts an allocator gave rollouts, and the rollout's prompt ids renumbered to them."""
    keep = np.flatnonzero(counts > 0)
    new_id = np.full(len(counts), -1, np.int64)
    new_id[keep] = np.arange(len(keep))
    pidx = new_id[np.asarray(roll.prompt_index)].astype(np.int32)
    return _subset(batch, keep), roll._replace(prompt_index=pidx)


@dataclasses.dataclass
class _Round:
    """One sampling round: the data batch, its rollout, its rewards and shaped scores, how many
    responses the recipe's truncation cut, and the prompts' keys in the prompt store."""

    batch: Any
    roll: Any
    out: Any
    scores: np.ndarray
    truncated: int = 0
    keys: list = dataclasses.field(default_factory=list)
    #: with replay: the rollout and rewards trained on (rows replaced by stored responses);
    #: ``roll`` / ``out`` stay as sampled (the store, the buffer and the metrics read them)
    train_roll: Any = None
    train_out: Any = None
    #: with hints: the batch trained on (hinted groups' prompts)
    train_batch: Any = None
    #: with a plain-context hint part (Guide): the groups sampled with a hint, trained after the
    #: plain prompt against the hinted context's log-probs
    hinted: frozenset = frozenset()

    @property
    def t_batch(self):
        return self.batch if self.train_batch is None else self.train_batch

    @property
    def t_roll(self):
        return self.roll if self.train_roll is None else self.train_roll

    @property
    def t_out(self):
        return self.out if self.train_out is None else self.train_out


class RLTrainer(HostLoop):
    """On-policy RL with a recipe (see the module docstring).

    Args:
      graphdef: the policy's graph (``nnx.split``); ``state.params`` are its trained params.
      state: the initial :class:`~jaxrl_llm.training.TrainState`.
      train_step: from :func:`~jaxrl_llm.training.make_train_step` with ``recipe.objective``.
      sampler: a :class:`~jaxrl_llm.rollout.Sampler` whose config has ``num_samples ==
        recipe.num_samples`` and the temperature of ``recipe.objective`` (one temperature: the
        sampler's; the trainer refuses two).
      data: a :class:`~jaxrl_llm.data.DataIterator` of prompt batches (or any iterator of
        :class:`~jaxrl_llm.data.PromptBatch` with ``get_state`` / ``set_state``).
      rewards: a :class:`~jaxrl_llm.rewards.Rewards`.
      recipe: the :class:`~jaxrl_llm.training.RLRecipe`.
      tokenizer: decodes completions for the reward functions.
      seed: the run's seed (rollout keys derive from it, the iteration and the round).
      frozen: further state parts for ``nnx.merge`` (e.g. frozen base weights under LoRA).
      ref_params: the frozen reference policy's params, required when the recipe has a KL term
        (``"ref_logp"`` in ``recipe.requires``); they may live in host memory
        (:func:`jaxrl_llm.parallel.to_host_memory`): each reference pass then moves them in.
      critic: a :class:`~jaxrl_llm.training.Critic`, required when the estimator reads values
        (PPO); its state is updated in place and checkpointed with the policy.
      baseline_sampler: the greedy sampler of recipes that require ``greedy_scores`` (ReMax);
        default: the sampler's config with ``greedy=True, num_samples=1`` and the same buckets.
      aux_params: an auxiliary policy's params (same graph), required when the recipe reads
        ``aux_logp`` (RTO's DPO model).
      store: the run's :class:`~jaxrl_llm.training.PromptStore` (per-prompt statistics, updated
        after every step and checkpointed; default: a new one passing at reward >= 1).
      candidates: with a prompt selector (``recipe.selector``), data batches hold this many
        candidates per trained prompt and the selector picks ``len(batch) // candidates``.
      staleness: ``k >= 1`` samples each step with the policy of ``k`` updates before (the
        initial policy for the first ``k`` steps; one-step-off-policy training for ``k = 1``).
        Needs ``recipe.old_logp=recompute``: the ratio's old policy is the current one, and the
        sampler's log-probs are the behaviour policy's (``rollout_logp``) for the recipe's
        importance correction (``recipe.is_weights=tis`` / ``icepop``, ``recipe.rejection``);
        the mismatch is logged (``offpolicy/*``). The past policies are checkpointed.
      checkpointer, checkpoint_every, eval_fn, eval_every, log_fn, config: as
        :class:`~jaxrl_llm.training.host_loop.HostLoop` (``eval_fn(params, *frozen)``).

    After each step, ``last_batch`` holds its host arrays (train arrays plus ``scores``, the
    shaped scores, ``valid``, the rows that count, and the estimator's sequence inputs such
    as ``greedy_scores``), for inspection; :meth:`last_samples` decodes a few of its rows.
    """

    progress_metric = "rewards/total/mean"
    progress_desc = "RL"
    #: inputs this loop's assemble phase makes itself (no provider)
    own_inputs: tuple[str, ...] = ()

    def __init__(self, graphdef, state, train_step: Callable, sampler, data, rewards, recipe: RLRecipe, tokenizer, *,
                 seed: int = 0, frozen: tuple = (), ref_params: Any = None, critic: Critic | None = None,
                 baseline_sampler: Sampler | None = None, aux_params: Any = None, store: PromptStore | None = None,
                 candidates: int = 1, staleness: int = 0, asynchronous: bool = False,
                 prompt_encoder: Callable | None = None, prompt_value: Critic | None = None,
                 shared_prefix: PrefixPlan | None = None, logprob_packing: Callable | None = None, **loop_kw: Any):
        if sampler.config.num_samples != recipe.num_samples:
            raise ValueError(f"sampler samples {sampler.config.num_samples} completions per prompt but the recipe "
                             f"expects num_samples={recipe.num_samples}")
        temp = 1.0 if sampler.config.greedy else sampler.config.temperature
        if recipe.objective.temperature != temp:
            raise ValueError(f"the recipe's objective computes log-probs at temperature {recipe.objective.temperature} "
                             f"but the sampler samples at {temp}: the importance ratios would be biased; build both "
                             f"from one value (build_recipe(..., temperature=sampler.config.temperature))")
        if recipe.needs_reference and ref_params is None:
            raise ValueError(f"recipe {recipe.name!r} has a KL term (it requires ref_logp): pass ref_params")
        if "aux_logp" in recipe.requires and aux_params is None:
            raise ValueError(f"recipe {recipe.name!r} (estimator {recipe.estimator.name!r}) reads an auxiliary "
                             f"policy's log-probs: pass aux_params (model.aux_params in a run config)")
        if recipe.needs_critic and critic is None:
            raise ValueError(f"recipe {recipe.name!r} estimates advantages from a critic's values: pass "
                             f"critic=Critic(...) (e.g. Critic.create(cfg, optimizer, recipe.value_objective, "
                             f"policy_params=...))")
        if critic is not None and not recipe.needs_critic:
            raise ValueError(f"critic given but recipe {recipe.name!r} (estimator {recipe.estimator.name!r}) uses no "
                             f"critic")
        if "greedy_scores" in recipe.requires:
            if baseline_sampler is None:
                baseline_sampler = Sampler(sampler.graphdef, dataclasses.replace(sampler.config, greedy=True,
                                                                                 num_samples=1),
                                           length_buckets=sampler.length_buckets, batch_buckets=sampler.batch_buckets,
                                           mesh=sampler.mesh, unroll_layers=sampler.unroll_layers,
                                           param_rules=sampler.param_rules)
            if not baseline_sampler.config.greedy or baseline_sampler.config.num_samples != 1:
                raise ValueError("baseline_sampler must decode greedily (SamplingConfig.greedy=True) with "
                                 f"num_samples=1, got greedy={baseline_sampler.config.greedy}, "
                                 f"num_samples={baseline_sampler.config.num_samples}")
        agent_only = {k for k in recipe.requires if PROVIDED_INPUTS.get(k) in AGENT_KINDS} - set(self.own_inputs)
        if agent_only:
            raise ValueError(f"recipe {recipe.name!r} requires {sorted(agent_only)}, which only an agent run provides "
                             f"(multi-turn episodes: AgentTrainer, an AgentRunConfig experiment)")
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise ValueError(f"rollout.staleness must be an int >= 0, got {staleness!r}")
        cast = getattr(getattr(sampler, "config", None), "weight_dtype", None)
        self.sampler_cast = cast is not None  # the sampler decodes with cast weights: log-probs of another model
        if self.sampler_cast and not recipe.recompute_old_logp:
            raise ValueError(f"the sampler decodes in {cast} (SamplingConfig.weight_dtype): set recipe.old_logp=recompute "
                             f"(the ratio's old policy is then the training weights', and the sampler's log-probs feed "
                             f"the mismatch metrics and the importance correction)")
        if staleness and not recipe.recompute_old_logp:
            raise ValueError(f"rollout.staleness={staleness} samples with an older policy: set recipe.old_logp=recompute "
                             f"(the ratio's old policy is then the current one, and the sampler's log-probs feed the "
                             f"importance correction)")
        if asynchronous:
            why = ("rollout.staleness >= 1 (the rollout of the next step is sampled during this step's update, with "
                   "the policy from before it)" if not staleness else
                   "no recipe.selector (it reads the prompt statistics of the step still being trained)"
                   if recipe.selector is not None else
                   "no recipe.allocator (it reads the prompt statistics of the step still being trained)"
                   if recipe.allocator is not None else
                   "one process (a background sampling thread and the trainer's collectives could interleave "
                   "differently on each host)" if jax.process_count() > 1 else "")
            if why:
                raise ValueError(f"rollout.asynchronous=true needs {why}")
        needs_pv = recipe.selector is not None and "prompt_value" in recipe.selector.part.requires
        if needs_pv and prompt_value is None:
            raise ValueError(f"recipe.selector={recipe.selector.name} scores candidates with a prompt value model: pass "
                             f"prompt_value=Critic.create(...) (a score-head model; objective ValueObjective(None))")
        if prompt_value is not None and not needs_pv:
            raise ValueError("prompt_value given but the recipe's selector reads no prompt value model")
        if hasattr(sampler, "segment"):  # TreePO's tree sampler: a prompt's rows are one tree
            clash = [k for k, part in (("recipe.hints", recipe.hints), ("recipe.replay", recipe.replay),
                                       ("recipe.allocator", recipe.allocator)) if part is not None]
            if clash:
                raise ValueError(f"rollout.tree_segment (a tree of each prompt's responses) cannot be combined with "
                                 f"{', '.join(clash)}: they replace or re-divide a prompt's responses")
        if recipe.hints is not None and prompt_encoder is None:
            raise ValueError(f"recipe.hints={recipe.hints.name} samples hinted prompts: pass prompt_encoder (raw prompt "
                             f"-> (token ids, rendered text), the data pipeline's rendering)")
        if not isinstance(candidates, int) or candidates < 1:
            raise ValueError(f"rollout.candidates must be an int >= 1, got {candidates!r}")
        if recipe.selector is None and candidates > 1:
            raise ValueError(f"rollout.candidates={candidates} draws candidate prompts for a selector, but recipe "
                             f"{recipe.name!r} has none (set recipe.selector, or rollout.candidates=1)")
        if recipe.selector is not None and candidates < 2:
            raise ValueError(f"recipe.selector={recipe.selector.name} chooses among candidate prompts: set "
                             f"rollout.candidates >= 2 (candidates drawn per trained prompt)")
        want = shared_prefix.rows_per_prompt if shared_prefix is not None else 0
        if recipe.objective.rows_per_prompt != want:
            raise ValueError(f"the objective encodes prompts in blocks of rows_per_prompt="
                             f"{recipe.objective.rows_per_prompt} rows but shared_prefix={shared_prefix} gives {want}: "
                             f"build both from one plan (jaxrl_llm.training.prefix.plan_shared_prefix)")
        if shared_prefix is not None and (recipe.allocator is not None or recipe.batch_filter is not None
                                          or recipe.hints is not None):
            raise ValueError("shared_prefix (train.shared_prefix) needs every prompt group's rows to share one prompt "
                             "and one size: it cannot be combined with recipe.allocator, recipe.batch_filter or "
                             "recipe.hints")
        missing = recipe.requires - set(PROVIDERS) - set(INTRINSIC) - set(self.own_inputs)
        if missing:
            raise ValueError(f"recipe {recipe.name!r} requires {sorted(missing)}, which no provider computes")
        super().__init__(graphdef, state, train_step, data, seed=seed, frozen=frozen, **loop_kw)
        self.sampler, self.rewards, self.recipe, self.tokenizer = sampler, rewards, recipe, tokenizer
        self.ref_params, self.critic, self.baseline_sampler = ref_params, critic, baseline_sampler
        self.aux_params = aux_params
        self.aux_samplers: dict = {}  # samplers of providers (Monte-Carlo continuations), built on first use
        self.kl_state = recipe.kl_controller.init() if recipe.kl_controller is not None else None
        names = [s.name for s in getattr(rewards, "specs", ())]
        # per-prompt statistics, and the per-prompt state of stateful shaping parts (HAPO's
        # history) in its slots; checkpointed with the loop
        self.store = store if store is not None else PromptStore()
        window = history_window(recipe.allocator)
        if window and self.store.recent_window != window:
            if len(self.store):
                raise ValueError(f"recipe.allocator={recipe.allocator.name} reads each prompt's last {window} outcomes, "
                                 f"but the given store (with records) keeps {self.store.recent_window}")
            self.store.recent_window = window
        self._alloc_metrics: dict[str, float] = {}
        self._replay_metrics: dict[str, float] = {}
        self._hint_metrics: dict[str, float] = {}
        self._sampler_metrics: dict[str, float] = {}
        self.candidates = candidates
        self.staleness = staleness
        self.shared_prefix = shared_prefix
        self.logprob_packing = logprob_packing  # packed log-prob passes (train.max_tokens_per_microbatch) or None
        self.prompt_encoder = prompt_encoder
        self.prompt_value = prompt_value  # PCL's value model of prompts (pass rate at the last prompt token)
        # asynchronous rollout: the next step's first sampling round runs in a background thread
        # (on the sampler's own devices) while this step's update runs
        self.asynchronous = bool(asynchronous)
        self._pool = None
        self._pending: tuple | None = None  # (iteration, batch, future) of the read-ahead rollout
        self._data_state_ahead: Any = None  # the data state before the read-ahead batch
        self._update_interval = (0.0, 0.0)
        # the policies of the last k updates, oldest first (copies: the train step donates its state)
        self._stale: list = [jax.tree.map(jnp.copy, state.params)] * staleness
        if "spo_value" in recipe.requires:
            self.store.slot(SPO_SLOT)  # SPO's tracker (prompt selectors may read it from the first step)
        self._select_metrics: dict[str, float] = {}
        self._stateful = [sh.name for sh in recipe.shaping if sh.part.flag("stateful")]
        for name in self._stateful:
            self.store.slot(_slot(name))
        self._shaping_state_at_step: dict[str, Any] = {}
        for sh in recipe.shaping:  # a bad shaping argument fails here, not after the first rollout
            sh(ShapingInputs(np.zeros(1, np.float32), np.ones(1, np.int32), np.zeros(1, np.int32), 1,
                             sampler.config.max_new_tokens, {n: np.zeros(1, np.float32) for n in names},
                             ("",) if sh.part.flag("needs_text") else (), ("",), 0,
                             {} if sh.part.flag("stateful") else None))
        self.last_batch: dict[str, np.ndarray] | None = None
        self._last_prompts: list[str] = []
        self._last_keys: list[str] = []
        self._est: dict = {}

    # ------------------------------------------------------------------ helpers for phases and providers

    def _merged_routes(self, rounds, cat):
        """The rounds' sampler routes (mixture of experts) for the train batch, when the update
        replays them (``train.routing_replay``); None otherwise."""
        obj = self.recipe.objective
        if not (obj.routing_replay or obj.router_mismatch):
            return None
        if any(r.t_roll is not r.roll or getattr(r.t_roll, "routes", None) is None for r in rounds):
            raise RuntimeError("a mixture of experts' update reads the sampler's expert routes, but a rollout came back "
                               "without them (a transformed rollout: hints, replay; or a sampler that does not record "
                               "them)")
        # rounds may have used different prompt buckets: align each to the widest before joining
        width = max(np.asarray(r.t_roll.routes).shape[1] - np.asarray(r.t_roll.tokens).shape[1] for r in rounds)
        return cat(lambda x: align_routes(np.asarray(x.t_roll.routes), np.asarray(x.t_roll.tokens).shape[1], width))

    def logp(self, params, others, tokens, mask, prompt_len: int | None = None, routes=None) -> np.ndarray:
        """``[N, L - 1]`` teacher-forced log-probs of ``params`` at the sampling temperature.

        With ``shared_prefix`` and the batch's ``prompt_len``, each prompt group is encoded once
        when its rows are consecutive and share the prompt (checked here); only the completion
        targets then hold log-probs (0 over the prompt's own). ``routes``: the sampler's experts
        (mixture of experts), replayed when the objective replays routing."""
        obj = self.recipe.objective
        kw = {}
        if obj.routing_replay:
            if routes is None:
                raise ValueError("train.routing_replay: this log-prob pass has no routes to replay")
            kw["routes"] = routes
        if self.logprob_packing is not None and not kw:  # packed passes (train.max_tokens_per_microbatch)
            return self.logprob_packing(obj.chunk_size, obj.temperature, in_host_memory(params), params, others,
                                        tokens, mask)
        if self.shared_prefix is not None and prompt_len:
            r = block_rows(self.recipe.num_samples, tokens.shape[0], self.shared_prefix.batch_ways)
            if r > 1 and not check_blocks(tokens, mask, prompt_len, r):
                kw = dict(prompt_len=int(prompt_len), rows_per_prompt=r)
        return gather(policy_logp(self.graphdef, obj.chunk_size, obj.temperature, in_host_memory(params), params,
                                  others, tokens, mask, **kw))

    def rollout_key(self, iteration: int) -> jax.Array:
        """The key of ``iteration``; split into ``(rollout key, mini-batch key)``."""
        return jax.random.fold_in(jax.random.key(self.seed), iteration)

    @staticmethod
    def round_key(rollout_key: jax.Array, round_index: int) -> jax.Array:
        """The sampling key of round ``round_index`` of a step (group filters)."""
        return rollout_key if round_index == 0 else jax.random.fold_in(rollout_key, round_index)

    @staticmethod
    def _row_prompts(prompts, roll) -> np.ndarray:
        """``[N]`` the position in ``prompts`` of each row's prompt: the rollout's distinct prompt
        ids in increasing order are the prompts (each prompt has at least one row)."""
        pidx = np.asarray(roll.prompt_index)
        ids = np.unique(pidx)
        if len(ids) != len(prompts):
            raise ValueError(f"internal: a rollout of {len(ids)} distinct prompts scored against {len(prompts)} prompts")
        return np.searchsorted(ids, pidx)

    def _score_groups(self, prompts, columns: dict, roll, lo: int, hi: int):
        """Rewards of the rows of prompts ``lo:hi`` (whole groups, of any sizes)."""
        pos = self._row_prompts(prompts, roll)
        rows = np.flatnonzero((pos >= lo) & (pos < hi))
        toks, cmask = np.asarray(roll.tokens)[rows], np.asarray(roll.mask)[rows].astype(bool)
        completions = [self.tokenizer.decode(toks[i][cmask[i]], skip_special_tokens=True) for i in range(len(toks))]
        cols = {k: list(v) for k, v in columns.items()}
        return self.rewards([prompts[pos[i]] for i in rows], completions,
                            completion_ids=[toks[i][cmask[i]].tolist() for i in range(len(toks))],
                            completion_lengths=np.asarray(roll.lengths)[rows].tolist(),
                            group_ids=np.asarray(roll.prompt_index)[rows].tolist(),
                            **{k: [v[pos[i]] for i in rows] for k, v in cols.items()})

    def score(self, prompts, columns: dict, roll):
        """Rewards of every row. With several processes each scores a contiguous share of
        the groups (reward functions are the host-side cost that grows with the batch) and
        the outputs are exchanged, so every process ends with the same scores."""
        n_proc = jax.process_count()
        if n_proc == 1:
            return self._score_groups(prompts, columns, roll, 0, len(prompts))
        bounds = np.linspace(0, len(prompts), n_proc + 1).round().astype(int)
        lo, hi = bounds[jax.process_index()], bounds[jax.process_index() + 1]
        mine = self._score_groups(prompts, columns, roll, lo, hi) if hi > lo else None
        outs = [o for o in allgather_objects(mine) if o is not None]
        if len(outs) == 1:
            return outs[0]
        return RewardOutput(total=np.concatenate([o.total for o in outs]),
                            per_fn={k: np.concatenate([o.per_fn[k] for o in outs]) for k in outs[0].per_fn},
                            failed={k: np.concatenate([o.failed[k] for o in outs]) for k in outs[0].failed},
                            metrics=_merge_reward_metrics(outs))

    def shape(self, out, roll, prompts, keys=(), *, update: bool = True) -> np.ndarray:
        """``[N]`` float32 scores after the recipe's shaping (added to the reward total) of the
        completions of ``prompts`` (one group each; ``keys``: their store keys). ``update=False``:
        stateful parts read their state as it was when the step began and keep it (a baseline's
        completions)."""
        num_groups = len(prompts)
        scores = np.asarray(out.total, np.float32)
        decoded: dict[bool, tuple[str, ...]] = {}

        def texts(flag) -> tuple[str, ...]:  # needs_text=True: plain text; "raw": special tokens kept
            if not flag:
                return ()
            skip = flag != "raw"
            if skip not in decoded:
                toks, cm = np.asarray(roll.tokens), np.asarray(roll.mask).astype(bool)
                decoded[skip] = tuple(self.tokenizer.decode(toks[i][cm[i]], skip_special_tokens=skip)
                                      for i in range(len(toks)))
            return decoded[skip]
        for sh in self.recipe.shaping:
            stateful = bool(sh.part.flag("stateful"))
            state = None
            if stateful:
                state = self.store.slot(_slot(sh.name)) if update else self._shaping_state_at_step[sh.name]
            x = ShapingInputs(scores, np.asarray(roll.lengths), np.asarray(roll.prompt_index), num_groups,
                              self.sampler.config.max_new_tokens, out.per_fn, texts(sh.part.flag("needs_text")),
                              tuple(prompts), self.iteration, state, tuple(keys))
            bonus = sh(x)
            if stateful:
                bonus, new = bonus
                if update:
                    self.store.slots[_slot(sh.name)] = dict(new)
            scores = (scores + np.asarray(bonus)).astype(np.float32)
        return scores

    def truncate(self, batch, roll, out):
        """The recipe's truncation (DOT): cut responses to the lengths it returns and score the
        round again; ``(rollout, rewards, responses cut)``."""
        tr = self.recipe.truncation
        if tr is None:
            return roll, out, 0
        lengths = np.asarray(roll.lengths)
        x = ShapingInputs(np.asarray(out.total, np.float32), lengths, np.asarray(roll.prompt_index), len(batch),
                          self.sampler.config.max_new_tokens, out.per_fn, (), tuple(batch.prompts), self.iteration)
        new = np.minimum(np.asarray(tr(x)), lengths)
        cut = new < lengths
        if not cut.any():
            return roll, out, 0
        mask = np.asarray(roll.mask).astype(bool) & (np.arange(np.shape(roll.mask)[1])[None] < new[:, None])
        roll = roll._replace(mask=mask, lengths=new.astype(np.asarray(roll.lengths).dtype),
                             stopped=np.asarray(roll.stopped) & ~cut)
        # score again only the groups with a cut response (whole groups: reward functions see
        # group ids), the other rows keep their scores
        pidx = np.asarray(roll.prompt_index)
        groups = np.unique(pidx[cut])
        rows = np.flatnonzero(np.isin(pidx, groups))
        sub = _take_rollout_rows(roll, rows)
        again = self.score([batch.prompts[i] for i in groups],
                           {k: [list(v)[i] for i in groups] for k, v in batch.columns.items()}, sub)
        total = np.array(out.total, copy=True)
        total[rows] = again.total
        per_fn, failed = {}, {}
        for k in out.per_fn:
            per_fn[k] = np.array(out.per_fn[k], copy=True)
            per_fn[k][rows] = again.per_fn[k]
            failed[k] = np.array(out.failed[k], copy=True)
            failed[k][rows] = again.failed[k]
        keep = np.ones(len(total), bool)
        keep[rows] = False
        # metrics: means and stds of the final scores; counts and seconds of both calls
        first = RewardOutput(total[keep], {k: v[keep] for k, v in per_fn.items()}, {}, out.metrics)
        merged = _merge_reward_metrics([first, again])
        return roll, RewardOutput(total, per_fn, failed, merged), int(cut.sum())

    # ------------------------------------------------------------------ phases

    def collect(self, k_roll: jax.Array, t: dict) -> tuple[list[_Round], list[tuple[int, int]], list, int]:
        """Sampling rounds until the group filter has kept a batch of groups (one round without
        a filter): ``(rounds, kept (round, prompt) pairs, dropped pairs, batch size B)``."""
        gf = self.recipe.group_filter
        rounds: list[_Round] = []
        kept: list[tuple[int, int]] = []
        dropped: list[tuple[int, int]] = []
        target = 0
        self._shaping_state_at_step = {n: dict(self.store.slot(_slot(n))) for n in self._stateful}
        self._replay_metrics = {}
        self._hint_metrics = {}
        self._sampler_metrics = {}
        params = self._stale[0] if self.staleness else self.state.params  # the policy this step samples with
        for r in range(gf.max_rounds):
            if r == 0 and self._pending is not None:  # sampled during the last step's update
                t0 = time.perf_counter()
                batch, roll = self._take_ahead(t)
                t["time/rollout"] += time.perf_counter() - t0
                counts = None
                target = len(batch)
            else:
                t0 = time.perf_counter()
                batch = self.next_batch(r)
                t["time/data"] += time.perf_counter() - t0
                target = target or len(batch)
                t0 = time.perf_counter()
                counts = self.allocate(batch)
                roll = self.sampler(params, batch.prompt_ids, self.round_key(k_roll, r), *self.frozen,
                                    **({} if counts is None else {"counts": counts}))
                t["time/rollout"] += time.perf_counter() - t0
                for k, v in getattr(self.sampler, "last_stats", {}).items():  # the tree sampler's token counts
                    self._sampler_metrics[k] = self._sampler_metrics.get(k, 0.0) + v
            if counts is not None and not counts.all():  # prompts given no rollout leave the round
                batch, roll = _drop_unsampled(batch, roll, counts)
            t0 = time.perf_counter()
            out = self.score(batch.prompts, batch.columns, roll)
            roll, out, cut = self.truncate(batch, roll, out)
            keys = prompt_keys(batch.where, batch.columns)
            t_batch, t_roll, t_out, hinted = self.hint(batch, roll, out, params, self.round_key(k_roll, r))
            t_roll, t_out = self.replay(t_roll, t_out, keys, r)
            rounds.append(_Round(batch, roll, out, self.shape(t_out, t_roll, t_batch.prompts, keys), cut, keys,
                                 None if t_roll is roll else t_roll, None if t_out is out else t_out,
                                 None if t_batch is batch else t_batch, hinted))
            keep = gf.keep(gf.values(t_out.total, t_out.per_fn), np.asarray(roll.prompt_index), len(batch))
            kept += [(r, i) for i in np.flatnonzero(keep)]
            dropped += [(r, i) for i in np.flatnonzero(~keep)]
            t["time/rewards"] += time.perf_counter() - t0
            if len(kept) >= target:
                break
        return rounds, kept, dropped, target

    def _read_ahead(self, params) -> None:
        """Start sampling the next step's first round in a background thread, with ``params``
        (the policy that step samples with): its data batch is drawn now, in order."""
        import concurrent.futures

        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxrl-sampler")
        it = self.iteration + 1
        self._data_state_ahead = self.data.get_state()
        batch = self.next_batch(0)
        key = self.round_key(jax.random.split(self.rollout_key(it))[0], 0)
        sampler, frozen = self.sampler, self.frozen

        def work():
            start = time.time()
            roll = sampler(params, batch.prompt_ids, key, *frozen)
            roll = _take_rollout_rows(roll)  # wait for the devices here, not in the trainer
            return roll, start, time.time()
        self._pending = (it, batch, self._pool.submit(work))

    def _take_ahead(self, t: dict):
        """The read-ahead batch and rollout of this step, with the overlap of its sampling and
        the last update (wall-clock intervals) in ``t``."""
        it, batch, fut = self._pending
        self._pending = None
        if it != self.iteration:
            raise RuntimeError(f"internal: a rollout read ahead for iteration {it} taken at {self.iteration}")
        wait0 = time.perf_counter()
        roll, start, end = fut.result()
        u0, u1 = self._update_interval
        t["async/wait_s"] = time.perf_counter() - wait0
        t["async/sample_s"] = end - start
        t["async/overlap_s"] = max(0.0, min(end, u1) - max(start, u0))
        t["async/sample_start"], t["async/sample_end"] = start, end
        t["async/update_start"], t["async/update_end"] = u0, u1
        return batch, roll

    def data_state(self) -> Any:
        return self._data_state_ahead if self._pending is not None else self.data.get_state()

    def _prompt_tokens(self, prompt_ids, extra: int = 0):
        """Left-padded ``[B, P + extra]`` prompts (``P``: the sampler's bucket) and their mask."""
        length = bucket(max(len(p) for p in prompt_ids), self.sampler.length_buckets)
        tokens, mask = pad_prompts(prompt_ids, length, len(prompt_ids), self.sampler.config.pad_token_id)
        if extra:
            tokens = np.concatenate([tokens, np.full((len(tokens), extra), self.sampler.config.pad_token_id,
                                                     tokens.dtype)], 1)
            mask = np.concatenate([mask, np.ones((len(mask), extra), bool)], 1)
        return tokens, mask

    def _prompt_values(self, prompt_ids) -> np.ndarray:
        """The prompt value model's score at the last token of each prompt."""
        pv = self.prompt_value
        tokens, mask = self._prompt_tokens(prompt_ids)
        return np.asarray(gather(_last_scores(pv.graphdef, pv.state.params, pv.frozen, tokens, mask)), np.float64)

    def _fit_prompt_value(self, step: StepBatch) -> dict:
        """PCL: one step of the prompt value model on this step's trained prompts, towards each
        one's mean reward total (before shaping) over its valid rows; returns its metrics."""
        gid, valid = np.asarray(step.arrays["group_ids"]), np.asarray(step.valid)
        totals = np.asarray(step.totals, np.float64)
        g = len(step.prompt_ids)
        has = np.array([((gid == k) & valid).any() for k in range(g)])
        target = np.array([totals[(gid == k) & valid].mean() if has[k] else 0.0 for k in range(g)], np.float32)
        before = self._prompt_values(step.prompt_ids)
        tokens, mask = self._prompt_tokens(step.prompt_ids, extra=1)
        width = tokens.shape[1] - 1  # the target-aligned columns; the last prompt token is column width - 1
        lm = np.zeros((g, width), bool)
        lm[:, width - 1] = has
        ret = np.zeros((g, width), np.float32)
        ret[:, width - 1] = target
        batch = {"tokens": tokens, "mask": mask, "loss_mask": lm, "old_values": np.zeros_like(ret), "returns": ret}
        pv = self.prompt_value
        pv.state, m = pv.train_step(pv.state, batch, *pv.frozen)
        m = jax.device_get(m)
        return {"pcl/value_loss": float(m["vf_loss"]),
                "pcl/abs_error": float(np.abs(before - target)[has].mean()) if has.any() else 0.0}

    def next_batch(self, round_index: int):
        """The next data batch; with a selector, the candidates it picks (its state and the
        feedback it consumed are updated in the store)."""
        batch = next(self.data)
        sel = self.recipe.selector
        if sel is None:
            return batch
        if len(batch) % self.candidates:
            raise ValueError(f"a data batch of {len(batch)} prompts is not a multiple of rollout.candidates="
                             f"{self.candidates}")
        b = len(batch) // self.candidates
        keys = prompt_keys(batch.where, batch.columns)
        name = f"selector/{sel.name}"
        feedback = self.store.slots.get(FEEDBACK) or None
        rng = np.random.default_rng([self.seed, self.iteration, round_index, 0x5E1EC7])
        stats = self.store.lookup(keys)
        predicted = None
        if self.prompt_value is not None:
            predicted = self._prompt_values(batch.prompt_ids)
        x = SelectInputs(tuple(keys), batch.columns, stats, b, self.iteration, rng,
                         copy.deepcopy(self.store.slot(name)), copy.deepcopy(feedback),
                         types.MappingProxyType(self.store.slots), predicted)
        idx, new_state = sel(x)
        idx = check_selection(sel.name, idx, len(batch), b)
        self.store.slots[name] = dict(new_state)
        self.store.slots[FEEDBACK] = {}  # consumed
        seen = stats["prompt_seen"] > 0
        self._select_metrics = {
            "select/chosen_seen_frac": float(seen[idx].mean()),
            "select/candidates_pass_rate": float(stats["prompt_pass_rate"][seen].mean()) if seen.any() else 0.0,
            "select/chosen_pass_rate": float(stats["prompt_pass_rate"][idx][seen[idx]].mean()) if seen[idx].any()
            else 0.0}
        if predicted is not None:
            self._select_metrics.update({"select/predicted_chosen_mean": float(predicted[idx].mean()),
                                         "select/predicted_candidates_mean": float(predicted.mean())})
        return _subset(batch, idx)

    def hint(self, batch, roll, out, params, key: jax.Array):
        """The recipe's hints on one scored round: ``(batch, rollout, rewards, hinted groups)`` to
        train on, the groups the part picks sampled again with hinted prompts (stage after stage)
        by the round's policy ``params``. A plain-context part's hinted groups keep their plain
        prompts in the batch (the responses and their hinted-context log-probs change)."""
        part = self.recipe.hints
        if part is None:
            return batch, roll, out, frozenset()
        if part.part.flag("levels"):
            return self._hint_levels(batch, roll, out, params, key)
        plain = trains_in_plain_context(part)
        raw = tuple(batch.raw_prompts)
        ids, texts = list(batch.prompt_ids), list(batch.prompts)
        hinted: set[int] = set()
        too_long = 0
        for stage in range(64):
            x = HintInputs(metric_values(out.total, out.per_fn, dict(part.kwargs).get("metric"), "recipe.hints"),
                           np.asarray(roll.prompt_index), batch.columns, raw, frozenset(hinted), stage, self.iteration)
            todo = {}
            for grp, hint_raw in part(x).items():
                enc = self._encode_fitting(hint_raw)
                if enc is None:  # the hinted prompt does not fit the sampler's buckets: not hinted
                    too_long += 1
                    continue
                todo[int(grp)] = enc
            if not todo:
                break
            groups = sorted(todo)
            sub, sub_out = self._sample_hinted(params, [todo[k] for k in groups], groups, batch,
                                               jax.random.fold_in(key, 0x41C7 + stage), self.recipe.num_samples)
            pidx = np.asarray(roll.prompt_index)
            rows = np.concatenate([np.flatnonzero(pidx == k) for k in groups])
            roll, out = _put_result(roll, out, rows, sub, sub_out)
            if not plain:
                for k in groups:
                    ids[k], texts[k] = todo[k]
            hinted |= set(groups)
            self._hint_metrics[f"hints/stage{stage}_groups"] = (self._hint_metrics.get(f"hints/stage{stage}_groups", 0.0)
                                                                 + len(groups))
        self._hint_metrics["hints/groups"] = self._hint_metrics.get("hints/groups", 0.0) + len(hinted)
        self._hint_metrics["hints/too_long"] = self._hint_metrics.get("hints/too_long", 0.0) + too_long
        if not hinted:
            return batch, roll, out, frozenset()
        if plain:
            return batch, roll, out, frozenset(hinted)
        return (PromptBatch(ids, texts, list(batch.raw_prompts), batch.columns, list(batch.where)), roll, out,
                frozenset(hinted))

    def _encode_fitting(self, raw):
        """A hinted raw prompt as ``(token ids, text)``, or ``None`` if it is longer than the
        sampler's largest prompt bucket."""
        enc = self.prompt_encoder(raw)
        return None if len(enc[0]) > max(self.sampler.length_buckets) else enc

    def _sample_hinted(self, params, encs: list, groups: list, batch, key: jax.Array, per_prompt: int):
        """``(rollout, rewards)`` of ``per_prompt`` responses (``<= num_samples``) to each encoded
        prompt, sampled in the round's shape (padded to its batch size: no new compilation) and
        scored with the data columns of its group in ``groups``."""
        g = self.recipe.num_samples
        pad = [e[0] for e in encs]
        pad += [pad[0]] * (len(batch) - len(pad))
        sub = self.sampler(params, pad, key, *self.frozen)
        take = (np.arange(len(encs))[:, None] * g + np.arange(per_prompt)[None]).ravel()
        sub = _take_rollout_rows(sub, take)._replace(
            prompt_index=np.repeat(np.arange(len(encs)), per_prompt).astype(np.int32))
        sub_out = self.score([e[1] for e in encs], {c: [list(v)[k] for k in groups] for c, v in batch.columns.items()},
                             sub)
        return sub, sub_out

    def _hint_levels(self, batch, roll, out, params, key: jax.Array):
        """A levels hint part (Scaf-GRPO) on one scored round: one response per hint level of
        each group the part names (the first of each prompt's rows), and the mildest level's
        success (outcome ``> 0``) in the group's first row, trained after the plain prompt."""
        part = self.recipe.hints
        metric = dict(part.kwargs).get("metric")
        pidx = np.asarray(roll.prompt_index)
        x = HintInputs(metric_values(out.total, out.per_fn, metric, "recipe.hints"), pidx, batch.columns,
                       tuple(batch.raw_prompts), frozenset(), 0, self.iteration)
        items, too_long = [], 0
        asked = part(x)
        for grp, levels in asked.items():
            for lv, raw in enumerate(levels):
                enc = self._encode_fitting(raw)
                if enc is None:  # does not fit the sampler's buckets: not tried
                    too_long += 1
                    continue
                items.append((int(grp), lv, enc))
        best: dict[int, tuple[int, Any, Any, int]] = {}  # group -> (level, sub rollout, sub rewards, row)
        for c0 in range(0, len(items), len(batch)):
            chunk = items[c0:c0 + len(batch)]
            sub, sub_out = self._sample_hinted(params, [e[2] for e in chunk], [e[0] for e in chunk], batch,
                                               jax.random.fold_in(key, 0x5CAF + c0), 1)
            ok = metric_values(sub_out.total, sub_out.per_fn, metric, "recipe.hints") > 0
            for j, (grp, lv, _) in enumerate(chunk):
                if ok[j] and (grp not in best or lv < best[grp][0]):
                    best[grp] = (lv, sub, sub_out, j)
        for grp, (lv, sub, sub_out, j) in best.items():
            one = _take_rollout_rows(sub, [j])
            roll, out = _put_result(roll, out, np.flatnonzero(pidx == grp)[:1], one,
                                    RewardOutput(np.asarray(sub_out.total)[[j]],
                                                 {k: np.asarray(v)[[j]] for k, v in sub_out.per_fn.items()},
                                                 {k: np.asarray(v)[[j]] for k, v in sub_out.failed.items()},
                                                 sub_out.metrics))
        hm = self._hint_metrics
        hm["hints/groups"] = hm.get("hints/groups", 0.0) + len(asked)
        hm["hints/levels_sampled"] = hm.get("hints/levels_sampled", 0.0) + len(items)
        hm["hints/rescued_groups"] = hm.get("hints/rescued_groups", 0.0) + len(best)
        hm["hints/too_long"] = hm.get("hints/too_long", 0.0) + too_long
        if best:
            hm["hints/level_mean"] = float(np.mean([b[0] + 1 for b in best.values()]))
        return batch, roll, out, frozenset()

    def replay(self, roll, out, keys: list, round_index: int):
        """The recipe's replay on one scored round: ``(rollout, rewards)`` to train on (the
        given ones without replay or without a replacement); the part's buffer is updated."""
        rep = self.recipe.replay
        if rep is None:
            return roll, out
        name = f"replay/{rep.name}"
        rng = np.random.default_rng([self.seed, self.iteration, round_index, 0x4E9A1])
        x = ReplayInputs(tuple(keys), metric_values(out.total, out.per_fn, dict(rep.kwargs).get("metric"), "recipe.replay"),
                         np.asarray(roll.prompt_index), rng,
                         copy.deepcopy(self.store.slot(name)), lambda i: entry_of(roll, out, i, self.iteration),
                         self.iteration)
        replace, buf, metrics = rep(x)
        self.store.slots[name] = dict(buf)
        for k, v in metrics.items():
            self._replay_metrics[k] = self._replay_metrics.get(k, 0.0) + v if k in (
                "replay/collapsed_groups", "replay/injected") else v
        return apply_replacements(roll, out, replace)

    def allocate(self, batch) -> np.ndarray | None:
        """The recipe's allocator's rollouts per prompt of ``batch`` (``None``: ``num_samples``
        each), from the store as it was when the step began."""
        alloc = self.recipe.allocator
        if alloc is None:
            return None
        keys = prompt_keys(batch.where, batch.columns)
        g = self.recipe.num_samples
        x = AllocateInputs(tuple(keys), types.MappingProxyType(self.store.records), self.store.lookup(keys), g,
                           len(keys) * g, self.iteration, types.MappingProxyType(self.store.slots))
        counts, metrics = alloc(x)
        counts = check_allocation(alloc.name, counts, len(keys), len(keys) * g)
        self._alloc_metrics = {**dict(metrics), "allocation/max": float(counts.max()),
                               "allocation/min": float(counts.min()), "allocation/unsampled_prompts": float((counts == 0).sum())}
        return counts

    def assemble(self, rounds: list[_Round], kept: list, dropped: list, target: int, key: jax.Array) -> StepBatch:
        """The train batch of ``target`` groups (fixed shape: dropped groups fill it as invalid
        rows), the old log-probs, and every input the recipe requires (its providers)."""
        rec = self.recipe
        groups = kept[:target] + dropped[:target - min(len(kept), target)]
        valid_group = np.arange(len(groups)) < min(len(kept), target)
        rows = [np.flatnonzero(np.asarray(rounds[r].roll.prompt_index) == i) for r, i in groups]

        def cat(get):
            return np.concatenate([np.asarray(get(rounds[r]))[ix] for (r, _), ix in zip(groups, rows)])

        merged = Rollout(*(cat(lambda x, f=f: getattr(x.t_roll, f)) for f in ("tokens", "mask", "logprobs", "lengths",
                                                                               "stopped")),
                         np.concatenate([np.full(len(ix), j, np.int32) for j, ix in enumerate(rows)]),
                         self._merged_routes(rounds, cat))
        prompt_ids = [rounds[r].t_batch.prompt_ids[i] for r, i in groups]
        prompt_len = bucket(max(len(p) for p in prompt_ids), self.sampler.length_buckets)
        arrays = build_rl_batch(prompt_ids, merged, prompt_len, self.sampler.config.pad_token_id)
        arrays["stopped"] = np.asarray(merged.stopped, bool)
        if hasattr(rounds[0].t_roll, "paths"):  # a tree rollout (TreePO): each response's segment nodes
            arrays["tree_paths"] = cat(lambda x: x.t_roll.paths)
        valid = np.concatenate([np.full(len(ix), v) for v, ix in zip(valid_group, rows)])
        step = StepBatch(
            arrays, cat(lambda x: x.scores), valid, prompt_len, [rounds[r].t_batch.prompts[i] for r, i in groups],
            prompt_ids, {k: [rounds[r].batch.columns[k][i] for r, i in groups] for k in rounds[0].batch.columns},
            {k: cat(lambda x, k=k: x.t_out.per_fn[k]) for k in rounds[0].out.per_fn}, key=key,
            keys=[rounds[r].keys[i] for r, i in groups], totals=cat(lambda x: x.t_out.total))
        arrays["loss_mask"] = to_target_aligned(step.completion_mask, prompt_len)
        if "hinted" in rec.objective.loss_inputs:  # rows a plain-context hint part re-sampled (Guide)
            step.inputs["hinted"] = np.concatenate([np.full(len(ix), i in rounds[r].hinted, np.float32)
                                                    for (r, i), ix in zip(groups, rows)])
            step.metrics["hints/hinted_rows_frac"] = float(step.inputs["hinted"][valid].mean()) if valid.any() else 0.0
        if rec.recompute_old_logp:
            if "rollout_logp" in rec.requires or self.staleness or self.sampler_cast:
                arrays["rollout_logp"] = arrays["old_logp"]
            lp = self.logp(self.state.params, self.frozen, arrays["tokens"], arrays["mask"], prompt_len,
                           routes=arrays.get("routes"))
            arrays["old_logp"] = np.where(arrays["loss_mask"], np.asarray(lp), 0.0).astype(np.float32)
        self._behaviour_metrics(step, arrays["loss_mask"] & valid[:, None])
        for name in sorted(rec.requires - set(INTRINSIC)):
            PROVIDERS[name](self, step)
        self._corrections(step)
        return step

    def _behaviour_metrics(self, step: StepBatch, lm: np.ndarray) -> None:
        """The sampler's (behaviour) log-probs against the recomputed old ones over the trained
        tokens ``lm``: ``offpolicy/*`` for a stale sampler policy, ``sampler_mismatch/*`` for a
        sampler with cast weights (both, when both hold: the ratio then mixes the two)."""
        prefixes = [p for p, on in (("offpolicy", self.staleness), ("sampler_mismatch", self.sampler_cast)) if on]
        if not prefixes:
            return
        a = step.arrays
        met = core_ratio_metrics(jnp.asarray(a["old_logp"] - a["rollout_logp"]), jnp.asarray(lm))
        for p in prefixes:
            step.metrics.update({f"{p}/{k}": float(v) for k, v in met.items()})
        if self.staleness:
            step.metrics["offpolicy/staleness"] = float(self.staleness)

    def _corrections(self, step: StepBatch) -> None:
        """Importance weights and rejection masks from the recomputed and the sampler's log-probs."""
        rec, a = self.recipe, step.arrays
        for part, apply in ((rec.is_correction, self._set_is_weights), (rec.rejection, self._reject)):
            if part is not None:
                out, met = part(jnp.asarray(a["old_logp"]), jnp.asarray(a["rollout_logp"]), jnp.asarray(a["loss_mask"]))
                apply(step, np.asarray(out, np.float32))
                step.metrics.update({f"correction/{k}": float(v) for k, v in met.items()})

    @staticmethod
    def _set_is_weights(step: StepBatch, w: np.ndarray) -> None:
        step.arrays["is_weights"] = w

    @staticmethod
    def _reject(step: StepBatch, keep: np.ndarray) -> None:
        """Rejected tokens leave the loss, its normaliser and the advantages (verl masks the
        response before computing them)."""
        kept = keep > 0
        step.arrays["loss_mask"] = step.arrays["loss_mask"] & kept
        step.arrays["completion_mask"] = step.arrays["completion_mask"] & kept[:, step.prompt_len - 1:]

    def _estimate_fn(self) -> Callable:
        """The jitted estimate, shared between trainers when the recipe's parts are hashable
        (every registered part is), else compiled once per trainer."""
        rec = self.recipe
        try:
            hash((rec.estimator, rec.kl_reward))
        except TypeError:
            fn = self._est.get("fn")
            if fn is None:
                fn = self._est["fn"] = jax.jit(estimate_advantages, static_argnums=(0, 1, 2))
            return fn
        return _estimate_jit

    def estimate(self, step: StepBatch) -> None:
        """Advantages (and returns) of the recipe's estimator; writes ``advantages`` (and
        ``returns`` for a critic) into the train arrays."""
        rec, a = self.recipe, step.arrays
        c0 = step.prompt_len - 1  # completion token t sits at target column c0 + t
        inputs = {"scores": step.scores, "mask": step.completion_mask, "group_ids": a["group_ids"]}
        if rec.group_filter.max_rounds > 1:  # only a group filter leaves invalid filler rows (static per recipe)
            inputs["valid"] = step.valid
        need = set(rec.estimator.part.requires) | ({"old_logp", "ref_logp"} if rec.kl_reward else set())
        for name in need:
            if name in TOKEN_ARRAYS:
                inputs[name] = a[TOKEN_ARRAYS[name]][:, c0:]
            elif name in step.inputs:
                inputs[name] = step.inputs[name]
        kl_coef = self.kl_state.coef if (rec.kl_reward is not None and rec.kl_reward.adaptive) else None
        adv, ret, kl, keep = self._estimate_fn()(rec.estimator, rec.kl_reward, step.num_groups,
                                                 {k: jnp.asarray(v) for k, v in inputs.items()}, kl_coef)
        a["advantages"] = to_target_aligned(np.asarray(adv, np.float32), step.prompt_len)
        if keep is not None:  # the estimator restricts the loss to some response tokens (SPO's probability mask)
            kept = to_target_aligned(np.asarray(keep, bool), step.prompt_len)
            step.metrics["advantages/loss_token_frac"] = float(kept.sum() / max(a["loss_mask"].sum(), 1))
            a["loss_mask"] = a["loss_mask"] & kept
        if rec.needs_critic:
            a["returns"] = to_target_aligned(np.asarray(ret, np.float32), step.prompt_len)
        if kl is not None:
            cm = step.completion_mask
            kl = np.asarray(kl)
            step.metrics["kl_in_reward/mean"] = float(kl[cm].mean()) if cm.any() else 0.0
            # the controller's KL: the mean over sequences of each sequence's token mean (verl)
            per_seq = np.where(cm.any(1), (kl * cm).sum(1) / np.maximum(cm.sum(1), 1), 0.0)
            step.metrics["kl_in_reward/seq_mean"] = float(per_seq[cm.any(1)].mean()) if cm.any() else 0.0
        step.inputs.update({k: inputs[k] for k in inputs if k not in TOKEN_ARRAYS and k not in (
            "scores", "mask", "valid", "group_ids")})

    def _filter_batch(self, step: StepBatch) -> None:
        """The recipe's batch filter: a resample of the valid rows (PF-PPO), after the advantages;
        its key is its own stream of the iteration's key (never a mini-batch shuffling key)."""
        if self.recipe.batch_filter is None:
            return
        key = jax.random.fold_in(self.rollout_key(self.iteration), 1 << 20)
        idx = np.asarray(self.recipe.batch_filter(key, jnp.asarray(step.scores), jnp.asarray(step.valid)))
        n = len(step.scores)

        def take(v):
            return v[idx] if np.ndim(v) and v.shape[0] == n else v
        step.unfiltered = (step.arrays, step.scores, step.valid)  # for the per-prompt bookkeeping
        step.arrays = {k: take(v) for k, v in step.arrays.items()}
        step.inputs = {k: take(np.asarray(v)) for k, v in step.inputs.items()}
        step.scores, step.valid = step.scores[idx], step.valid[idx]
        step.metrics["batch_filter/unique_rows"] = float(len(np.unique(idx)))

    def update(self, step: StepBatch, k_mb: jax.Array) -> tuple[list, list, int]:
        """Epochs x mini-batches of the train step (the critic's first, on the same rows)."""
        rec, a = self.recipe, step.arrays
        if rec.objective.kl_coef_from_batch:
            a["kl_coef"] = np.full((a["tokens"].shape[0],), float(self.kl_state.coef), np.float32)
        actor_keys = rec.objective.batch_keys()
        critic_keys = rec.value_objective.batch_keys() if self.critic is not None else ()
        if "scores" in actor_keys:  # a surrogate that reads the sequence rewards (DisCO, ...)
            a["scores"] = np.asarray(step.scores, np.float32)
        for k in rec.objective.loss_inputs:  # row-level inputs a surrogate reads (component scores, ...)
            if k not in a and k in step.inputs:
                a[k] = np.asarray(step.inputs[k])
        plan = self.shared_prefix
        if plan is not None:  # Prefix Grouper: the prompt's mask (its width is the prompt length)
            a["prefix_mask"] = a["mask"][:, :step.prompt_len]
        train = {k: v for k, v in a.items() if k in actor_keys or k in critic_keys}
        # a surrogate that compares the rows of a prompt sees whole groups in every mini-batch, and
        # so does a shared-prefix update (its micro-batches hold blocks of rows of one prompt)
        whole_groups = "group_ids" in actor_keys or plan is not None
        if plan is not None and "group_ids" not in train:
            train["group_ids"] = a["group_ids"]
        train_actor = self.critic is None or self.iteration >= rec.critic_warmup
        step_metrics, critic_metrics, empty = [], [], 0
        for epoch in range(rec.epochs):
            for mb in minibatches(train, rec.num_minibatches, jax.random.fold_in(k_mb, epoch),
                                  whole_groups=whole_groups):
                if plan is not None:
                    mb = self._prefix_order(mb, step.prompt_len)
                if not mb["loss_mask"].any():
                    empty += 1
                    continue
                if self.critic is not None:
                    self.critic.state, cm = self.critic.train_step(self.critic.state,
                                                                   {k: mb[k] for k in critic_keys}, *self.critic.frozen)
                    critic_metrics.append(cm)
                if train_actor:
                    self.state, m = self.train_step(self.state, {k: mb[k] for k in actor_keys}, *self.frozen)
                    step_metrics.append(m)
        step_metrics, critic_metrics = jax.device_get((step_metrics, critic_metrics))
        return step_metrics, critic_metrics, empty

    def _prefix_order(self, mb: dict, prompt_len: int) -> dict:
        """A mini-batch of whole groups (group-contiguous) in the row order the shared-prefix
        train step expects, checked: every block of its micro-batches has one prompt."""
        plan = self.shared_prefix
        order = microbatch_order(len(mb["tokens"]), plan)
        mb = {k: v[order] for k, v in mb.items()}
        why = check_blocks(mb["tokens"], mb["mask"], prompt_len, plan.rows_per_prompt, plan.num_microbatches)
        if why:
            raise RuntimeError(f"train.shared_prefix: {why} (the rows of a prompt group must share its prompt); run "
                               f"with train.shared_prefix=false")
        return mb

    def _update_kl_controller(self, step: StepBatch, step_metrics: list) -> None:
        """One controller update per iteration with the batch's KL (the reward's, or the loss
        term's as measured by the train steps), ``n`` = rows of the batch."""
        rec = self.recipe
        if rec.kl_controller is None:
            return
        if rec.kl_reward is not None:
            current = step.metrics["kl_in_reward/seq_mean"]
        elif step_metrics:
            current = float(np.mean([m["policy/kl_ref"] for m in step_metrics]))
        else:
            return
        self.kl_state = rec.kl_controller.update(self.kl_state, current, int(step.valid.sum()))
        step.metrics["kl/coef"] = float(self.kl_state.coef)

    def step(self) -> dict:
        """One RL iteration; returns its metrics (also appended to ``history`` by :meth:`run`)."""
        t = {"time/data": 0.0, "time/rollout": 0.0, "time/rewards": 0.0}
        k_roll, k_mb = jax.random.split(self.rollout_key(self.iteration))
        rounds, kept, dropped, target = self.collect(k_roll, t)
        t0 = time.perf_counter()
        step = self.assemble(rounds, kept, dropped, target, k_roll)
        t1 = time.perf_counter()
        self.estimate(step)
        self._filter_batch(step)
        t["time/estimate"] = time.perf_counter() - t1
        t["time/prepare"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        # the policy being updated now is the one the step k steps later samples with
        current = jax.tree.map(jnp.copy, self.state.params) if self.staleness else None
        if self.asynchronous:  # the next step samples with the policy k - 1 updates before this one's
            self._read_ahead((self._stale[1:] + [current])[0])
        u0 = time.time()
        step_metrics, critic_metrics, empty = self.update(step, k_mb)
        self._update_interval = (u0, time.time())
        t["time/update"] = time.perf_counter() - t0
        if self.staleness:
            self._stale = self._stale[1:] + [current]
        for name in sorted(self.recipe.requires & set(AFTER_UPDATE)):  # trackers (SPO's), after the update
            AFTER_UPDATE[name](self, step)
        if self.prompt_value is not None:
            step.metrics.update(self._fit_prompt_value(step))
        self.observe(step, rounds)
        self.iteration += 1
        self._update_kl_controller(step, step_metrics)
        self._last_prompts, self._last_keys, self._last_step = step.prompts, step.keys, step
        self.last_batch = dict(step.arrays, scores=step.scores, valid=step.valid, **step.inputs)
        return self.log(step, rounds, kept, target, step_metrics, critic_metrics, empty, t)

    def log(self, step: StepBatch, rounds: list[_Round], kept: list, target: int, step_metrics: list,
            critic_metrics: list, empty: int, t: dict) -> dict:
        """The step's metrics: the update's (means over mini-batches), the critic's, the rewards',
        the sampling and the phases' timings."""
        gen_lengths = np.concatenate([np.asarray(x.roll.lengths) for x in rounds])
        gen_stopped = np.concatenate([np.asarray(x.roll.stopped) for x in rounds])
        gen_tokens = float(sum(np.asarray(x.roll.mask).sum() for x in rounds))
        metrics = self._update_metrics(step_metrics, critic_metrics)
        metrics.update(_merge_reward_metrics([x.out for x in rounds]))
        if self.recipe.shaping:
            metrics["rewards/shaped/mean"] = float(np.concatenate([x.scores for x in rounds]).mean())
        if self.recipe.truncation is not None:
            metrics["truncation/responses"] = float(sum(x.truncated for x in rounds))
        if self.recipe.group_filter.max_rounds > 1:
            n_groups = len(step.prompt_ids)
            chosen = min(len(kept), target)
            metrics.update({"sampling/rounds": float(len(rounds)),
                            "sampling/generated_groups": float(sum(len(x.batch) for x in rounds)),
                            "sampling/kept_groups": float(len(kept)), "sampling/train_groups": float(chosen),
                            "sampling/filler_groups": float(n_groups - chosen),
                            "sampling/empty_minibatches": float(empty)})
        metrics.update(step.metrics)
        metrics["batch/prompt_len"] = float(step.prompt_len)  # the train batch's prompt bucket (its shape)
        if self._sampler_metrics:  # tokens decoded against the responses' tokens (summed over rounds)
            sm = dict(self._sampler_metrics)
            if "tree/leaf_tokens" in sm:
                sm["tree/saved_frac"] = 1.0 - sm["tree/decoded_tokens"] / max(sm["tree/leaf_tokens"], 1.0)
            metrics.update(sm)
        if self.recipe.allocator is not None:
            metrics.update(self._alloc_metrics)
        if self.recipe.replay is not None:
            metrics.update(self._replay_metrics)
        if self.recipe.hints is not None:
            metrics.update(self._hint_metrics)
        metrics.update({"response/length_mean": float(gen_lengths.mean()),
                        "response/length_max": float(gen_lengths.max()),
                        "response/stopped_frac": float(np.mean(gen_stopped)),
                        **self._advantage_metrics(step), "tokens_per_s": gen_tokens / max(t["time/rollout"], 1e-9)})
        metrics.update(t)
        return metrics

    def observe(self, step: StepBatch, rounds: list) -> None:
        """Report every group sampled this step (kept or dropped by a group filter) to the prompt
        store, with the raw reward totals; adds the store's metrics to the step's."""
        seen = self.store.lookup(step.keys)["prompt_seen"] if step.keys else np.zeros(0)
        for x in rounds:
            self.store.observe(self.iteration, x.keys, x.out.total, x.roll.lengths, x.roll.prompt_index)
        step.metrics.update(self.store.summary())
        if seen.size:
            step.metrics["prompts/new_frac"] = float(np.mean(seen == 0))
        # per trained group: mean |advantage| of its rows (over their response tokens), pass rate, spread
        arrays, scores, valid = step.rows_as_sampled()
        gid, valid = np.asarray(arrays["group_ids"]), np.asarray(valid)
        cm = arrays["completion_mask"] & valid[:, None]
        adv = np.abs(arrays["advantages"][:, step.prompt_len - 1:]) * cm
        row_abs = adv.sum(1) / np.maximum(cm.sum(1), 1)
        fb = {"step": self.iteration, "keys": [], "abs_adv": [], "pass_rate": [], "reward_mean": []}
        spread, group_rows = [], []
        for g, key in enumerate(step.keys):
            rows = (gid == g) & valid
            if not rows.any():
                continue
            rec = self.store.records[key]  # this step's visit (raw rewards)
            fb["keys"].append(key)
            fb["abs_adv"].append(float(row_abs[rows].mean()))
            fb["pass_rate"].append(rec["last_pass_rate"])
            fb["reward_mean"].append(rec["last_reward_mean"])
            spread.append(bool(np.ptp(np.asarray(scores)[rows]) > 0))
            group_rows.append(int(rows.sum()))
        if spread:
            # the fraction of groups with a reward spread, and of samples in such groups (Knapsack
            # RL's "effective gradient ratio": the samples with a non-zero GRPO gradient)
            step.metrics["prompts/spread_groups_frac"] = float(np.mean(spread))
            step.metrics["prompts/effective_samples_frac"] = float(np.dot(spread, group_rows) / sum(group_rows))
        if self.recipe.selector is not None:
            self.store.slots[FEEDBACK] = fb
            step.metrics.update(self._select_metrics)

    def _update_metrics(self, step_metrics: list, critic_metrics: list) -> dict[str, Any]:
        """Step and iteration, the update's metrics (means over mini-batches), the critic's."""
        metrics: dict[str, Any] = {"step": int(self.state.step), "iteration": self.iteration}
        if step_metrics:
            metrics.update({k: float(np.mean([m[k] for m in step_metrics])) for k in step_metrics[0]})
        metrics["skipped_updates"] = float(sum(m["skipped"] for m in step_metrics))
        if critic_metrics:
            metrics.update({f"critic/{k}": float(np.mean([m[k] for m in critic_metrics])) for k in critic_metrics[0]})
        return metrics

    @staticmethod
    def _advantage_metrics(step: StepBatch) -> dict[str, float]:
        """Mean and standard deviation of the advantages over the trained response tokens, and the
        mean length of the responses whose mean advantage is negative / positive (the responses
        the update pushes down / up: Dr.GRPO's length bias shows in the first), and the fraction
        of trained responses whose advantage is 0 on every token (no gradient from the policy
        term: GRPO's groups without a reward spread)."""
        adv = step.arrays["advantages"][:, step.prompt_len - 1:]
        cmask = step.completion_mask
        out = {"advantages/mean": float(adv[cmask].mean()) if cmask.any() else 0.0,
               "advantages/std": float(adv[cmask].std()) if cmask.any() else 0.0}
        lens = cmask.sum(1)
        row_adv = np.where(cmask, adv, 0.0).sum(1) / np.maximum(lens, 1)
        if (lens > 0).any():
            zero = ~np.any(cmask & (np.abs(adv) > 0), axis=1)
            out["advantages/zero_frac"] = float(zero[lens > 0].mean())
        for name, rows in (("neg_adv", (lens > 0) & (row_adv < 0)), ("pos_adv", (lens > 0) & (row_adv > 0))):
            if rows.any():
                out[f"response/length_mean_{name}"] = float(lens[rows].mean())
        return out

    def last_samples(self, n: int = 4) -> list[dict]:
        """Up to ``n`` rows of the last train batch, one per group first: ``prompt``,
        ``completion`` (decoded), ``reward`` (the shaped score) and ``advantage`` (its mean
        over the completion), for sample logs."""
        b = self.last_batch
        if b is None:
            return []
        # sample k of every group, k = 0, 1, ... (groups of any size: by rank within the group)
        gid = np.asarray(b["group_ids"])
        rank = np.zeros(len(gid), np.int64)
        for grp in np.unique(gid):
            rows = np.flatnonzero(gid == grp)
            rank[rows] = np.arange(len(rows))
        order = np.lexsort((np.arange(len(gid)), rank)).tolist()
        cmask = b["completion_mask"]
        p = b["tokens"].shape[1] - cmask.shape[1]
        out = []
        for i in [i for i in order if b["valid"][i]][:n]:
            adv = b["advantages"][i, p - 1:][cmask[i]]
            out.append({"prompt": self._last_prompts[b["group_ids"][i]],
                        "completion": self.tokenizer.decode(b["tokens"][i, p:][cmask[i]], skip_special_tokens=True),
                        "reward": float(b["scores"][i]), "advantage": float(adv.mean()) if adv.size else 0.0})
        return out

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_state(self) -> Any:
        """The train state, plus the critic's (``{"policy", "critic"}``) and the adaptive KL
        controller's (``"kl_controller"``) when the recipe has them."""
        if self.critic is None and self.kl_state is None and not self.staleness and self.prompt_value is None:
            return self.state
        out: dict[str, Any] = {"policy": self.state}
        if self.prompt_value is not None:
            out["prompt_value"] = self.prompt_value.state
        if self.critic is not None:
            out["critic"] = self.critic.state
        if self.kl_state is not None:
            out["kl_controller"] = self.kl_state
        if self.staleness:
            out["stale_params"] = list(self._stale)
        return out

    def loop_state(self) -> dict:
        """The prompt store (statistics and the stateful parts' slots)."""
        return {"prompt_store": self.store.state_dict()}

    def load_loop_state(self, record: dict) -> None:
        if "prompt_store" in record:
            self.store.load_state_dict(record["prompt_store"])
            return
        if record.get("shaping_state"):
            raise ValueError("this checkpoint keeps stateful shaping state by prompt text (written before the prompt "
                             "store); it cannot be resumed by this version: start the run again")
        if self._stateful or self.recipe.requires & set(STORE_INPUTS):
            raise ValueError("this checkpoint was written before the prompt store; recipe "
                             f"{self.recipe.name!r} reads per-prompt state, which it does not hold: start the run "
                             "again")
        # an older checkpoint of a recipe that does not read the store: statistics restart empty

    def load_checkpoint_state(self, state: Any) -> None:
        self._pending = None  # a read-ahead rollout of the state being replaced
        if self.critic is None and self.kl_state is None and not self.staleness and self.prompt_value is None:
            self.state = state
            return
        self.state = state["policy"]
        if self.prompt_value is not None:
            self.prompt_value.state = state["prompt_value"]
        if self.staleness:
            self._stale = list(state["stale_params"])
        if self.critic is not None:
            self.critic.state = state["critic"]
        if self.kl_state is not None:
            self.kl_state = state["kl_controller"]

"""The RL loop: ``collect -> assemble -> estimate -> update -> log``, one function per phase.

:class:`RLTrainer` is a :class:`~jaxrl_llm.training.host_loop.HostLoop` (evaluation, logging,
checkpoints every N steps / on SIGTERM / at the end, exact resume) whose step is::

    collect(key)                   # per sampling round: data -> rollout -> rewards -> shaping; a
                                   #   group filter decides which groups are kept
    step = assemble(key)           # the train arrays; the providers of what the recipe requires
                                   #   (old-log-prob recompute, reference pass, critic values, greedy
                                   #   baseline, ...); importance corrections
    step = estimate(step)          # advantages (jit): the recipe's estimator; KL in the reward
    update(step, key)              # epochs x mini-batches of the train step (and the parts' models)
    observe(step); return log(step)  # the prompt store and the parts record the step; its metrics

The loop never asks which algorithm it runs: the recipe (:class:`~jaxrl_llm.training.recipes.RLRecipe`)
holds the parts as objects and lists what they require; the providers
(:mod:`jaxrl_llm.training.providers`) compute exactly that. Nor does it ask which loop-level
methods it runs: selectors, allocators, hints, replay, stale and asynchronous sampling, the tree
sampler, truncation, shaping, group and batch filters, the critic, the KL controller, trackers
and the prompt value model are loop parts (:mod:`jaxrl_llm.training.parts`), each declaring the
phases it hooks into, what it needs and provides and what it cannot be combined with. The
trainer builds them from its settings, validates them once, and runs each phase through the
parts that declared it::

    sample -> [select -> allocate -> the sampler] -> score -> truncate -> resample -> shape -> keep
    -> assemble -> estimate -> filter -> update -> after_update -> observe

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

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.rollout.sampler import Rollout, Sampler, bucket
from jaxrl_llm.training.loop_services import LoopServices, apply_corrections, check_recipe_inputs, greedy_baseline
from jaxrl_llm.training.parts.registry import LoopSettings, build_parts
from jaxrl_llm.training.prefix import PrefixPlan
from jaxrl_llm.training.prompt_store import STORE_INPUTS, PromptStore, prompt_keys
from jaxrl_llm.training.providers import INTRINSIC, PROVIDERS, TOKEN_ARRAYS, StepBatch
from jaxrl_llm.training.recipes import RLRecipe, estimate_advantages
from jaxrl_llm.training.rl import Critic, build_rl_batch, minibatches, to_target_aligned
from jaxrl_llm.training.rounds import Round, drop_unsampled, merge_reward_metrics

__all__ = ["RLTrainer", "compute_advantages", "UpdatePlan", "StepState"]


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


@dataclasses.dataclass
class StepState:
    """What one step has done so far, for the phases and parts that run after: the rounds, the
    kept and dropped ``(round, group)`` pairs, the batch size, the mini-batch key, the policy's
    update metrics and the count of mini-batches without a loss token."""

    k_mb: Any = None
    rounds: list = dataclasses.field(default_factory=list)
    kept: list = dataclasses.field(default_factory=list)
    dropped: list = dataclasses.field(default_factory=list)
    target: int = 0
    policy_metrics: list = dataclasses.field(default_factory=list)
    empty: int = 0


@dataclasses.dataclass
class UpdatePlan:
    """The update phase's value: the train arrays, the batch keys mini-batches carry, whether
    they hold whole groups, whether the policy trains this step, per-mini-batch reorderings
    (``order``) and further steps run on each non-empty mini-batch before the policy's (``steps``)."""

    arrays: dict
    prompt_len: int
    keys: set
    whole_groups: bool
    train_policy: bool = True
    order: list = dataclasses.field(default_factory=list)
    steps: list = dataclasses.field(default_factory=list)


class RLTrainer(LoopServices):
    """On-policy RL with a recipe and loop parts (see the module docstring).

    Args:
      graphdef: the policy's graph (``nnx.split``); ``state.params`` are its trained params.
      state: the initial :class:`~jaxrl_llm.training.TrainState`.
      train_step: from :func:`~jaxrl_llm.training.make_train_step` with ``recipe.objective``.
      sampler: a :class:`~jaxrl_llm.rollout.Sampler` whose config has ``num_samples ==
        recipe.num_samples`` and the temperature of ``recipe.objective`` (one temperature: the
        sampler's; the trainer refuses two). A :class:`~jaxrl_llm.rollout.TreeSampler` turns on
        the tree part; a config with ``weight_dtype`` the cast-sampler part.
      data: a :class:`~jaxrl_llm.data.DataIterator` of prompt batches (or any iterator of
        :class:`~jaxrl_llm.data.PromptBatch` with ``get_state`` / ``set_state``).
      rewards: a :class:`~jaxrl_llm.rewards.Rewards`.
      recipe: the :class:`~jaxrl_llm.training.RLRecipe` (its selector, allocator, hints, replay,
        truncation, shaping, filters and KL controller become loop parts).
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
        initial policy for the first ``k`` steps). Needs ``recipe.old_logp=recompute``; the
        sampler's log-probs are the behaviour policy's (``rollout_logp``) and the mismatch is
        logged (``offpolicy/*``). The past policies are checkpointed.
      asynchronous: sample the next step's first round during this step's update (needs
        ``staleness >= 1``).
      prompt_encoder: raw prompt -> ``(token ids, text)`` (hints sample hinted prompts).
      prompt_value: PCL's prompt value model (a :class:`~jaxrl_llm.training.Critic` with a score
        head), required by a selector that reads predictions.
      shared_prefix: a :class:`~jaxrl_llm.training.prefix.PrefixPlan` (``train.shared_prefix``).
      logprob_packing: packed log-prob passes (``train.max_tokens_per_microbatch``) or None.
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
    #: the loop plays multi-turn episodes (the capability ``episodes``) instead of completions
    episodes = False

    def __init__(self, graphdef, state, train_step: Callable, sampler, data, rewards, recipe: RLRecipe, tokenizer, *,
                 seed: int = 0, frozen: tuple = (), ref_params: Any = None, critic: Critic | None = None,
                 baseline_sampler: Sampler | None = None, aux_params: Any = None, store: PromptStore | None = None,
                 candidates: int = 1, staleness: int = 0, asynchronous: bool = False,
                 prompt_encoder: Callable | None = None, prompt_value: Critic | None = None,
                 shared_prefix: PrefixPlan | None = None, logprob_packing: Callable | None = None,
                 progress: Any = None, horizon: Any = None, **loop_kw: Any):
        check_recipe_inputs(recipe, sampler, ref_params, aux_params, self.own_inputs)
        self.parts = build_parts(LoopSettings(
            recipe, candidates=candidates, staleness=staleness, asynchronous=bool(asynchronous),
            sampler_dtype=getattr(getattr(sampler, "config", None), "weight_dtype", None),
            tree=getattr(sampler, "segment", None), shared_prefix=shared_prefix, episodes=self.episodes,
            processes=jax.process_count(), prompt_encoder=prompt_encoder, critic=critic, prompt_value=prompt_value,
            progress=progress, horizon=horizon))
        super().__init__(graphdef, state, train_step, data, seed=seed, frozen=frozen, **loop_kw)
        self.sampler, self.rewards, self.recipe, self.tokenizer = sampler, rewards, recipe, tokenizer
        self.baseline_sampler = greedy_baseline(recipe, sampler, baseline_sampler)
        self.ref_params, self.aux_params, self.critic, self.progress = ref_params, aux_params, critic, progress
        self.prompt_encoder = prompt_encoder
        self.prefix_plan, self.logprob_packing = shared_prefix, logprob_packing
        self.aux_samplers: dict = {}  # samplers of providers (Monte-Carlo continuations), built on first use
        # per-prompt statistics, and the per-prompt state of parts in its slots; checkpointed
        self.store = store if store is not None else PromptStore()
        self.data_state_ahead: Any = None  # the data state before a batch drawn ahead of its step
        self.round_index = 0
        self.timings: dict[str, float] = {}
        self.current = StepState()
        self.last_batch: dict[str, np.ndarray] | None = None
        self._last_prompts: list[str] = []
        self._last_keys: list[str] = []
        self._est: dict = {}
        for p in self.parts:
            p.attach(self)

    # ------------------------------------------------------------------ phases

    def collect(self, k_roll: jax.Array) -> None:
        """Sampling rounds until the kept groups fill a batch or no part allows another round."""
        cur = self.current
        for r in range(self.parts.max_rounds):
            rnd = self.parts("sample", self, Round(r, self.round_key(k_roll, r), self.state.params))
            self.play(rnd)
            t0 = time.perf_counter()
            rnd = self.parts("keep", self, rnd)
            keep = np.ones(len(rnd.batch), bool) if rnd.keep is None else np.asarray(rnd.keep)
            cur.rounds.append(rnd)
            cur.kept += [(r, i) for i in np.flatnonzero(keep)]
            cur.dropped += [(r, i) for i in np.flatnonzero(~keep)]
            self.timings["time/rewards"] += time.perf_counter() - t0
            if len(cur.kept) >= cur.target:
                break

    def play(self, rnd: Round) -> None:
        """One single-turn round: data (the select phase), rollouts per prompt (allocate), the
        sampler, rewards (score), truncate, resample and shape."""
        t = self.timings
        if rnd.roll is None:  # not sampled ahead of the step
            t0 = time.perf_counter()
            rnd.batch = self.next_batch(rnd.index)
            t["time/data"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            rnd = self.parts("allocate", self, rnd)
            rnd.roll = self.sampler(rnd.params, rnd.batch.prompt_ids, rnd.key, *self.frozen,
                                    **({} if rnd.counts is None else {"counts": rnd.counts}))
            t["time/rollout"] += time.perf_counter() - t0
        self.current.target = self.current.target or len(rnd.batch)
        if rnd.counts is not None and not rnd.counts.all():  # prompts given no rollout leave the round
            rnd.batch, rnd.roll = drop_unsampled(rnd.batch, rnd.roll, rnd.counts)
        t0 = time.perf_counter()
        rnd.out = self.score(rnd.batch.prompts, rnd.batch.columns, rnd.roll)
        rnd = self.parts("score", self, rnd)
        rnd = self.parts("truncate", self, rnd)
        rnd.keys = prompt_keys(rnd.batch.where, rnd.batch.columns)
        rnd = self.parts("resample", self, rnd)
        rnd.scores = self.shape(rnd.t_out, rnd.t_roll, rnd.t_batch.prompts, rnd.keys)
        t["time/rewards"] += time.perf_counter() - t0

    def build_batch(self, key: jax.Array) -> StepBatch:
        """The train batch of ``target`` groups (fixed shape: dropped groups fill it as invalid rows)."""
        cur = self.current
        rounds, target = cur.rounds, cur.target
        groups = cur.kept[:target] + cur.dropped[:target - min(len(cur.kept), target)]
        valid_group = np.arange(len(groups)) < min(len(cur.kept), target)
        rows = [np.flatnonzero(np.asarray(rounds[r].roll.prompt_index) == i) for r, i in groups]

        def cat(get):
            return np.concatenate([np.asarray(get(rounds[r]))[ix] for (r, _), ix in zip(groups, rows)])

        merged = Rollout(*(cat(lambda x, f=f: getattr(x.t_roll, f)) for f in ("tokens", "mask", "logprobs", "lengths",
                                                                               "stopped")),
                         np.concatenate([np.full(len(ix), j, np.int32) for j, ix in enumerate(rows)]),
                         self.merged_routes(rounds, cat))
        prompt_ids = [rounds[r].t_batch.prompt_ids[i] for r, i in groups]
        prompt_len = bucket(max(len(p) for p in prompt_ids), self.sampler.length_buckets)
        arrays = build_rl_batch(prompt_ids, merged, prompt_len, self.sampler.config.pad_token_id)
        arrays["stopped"] = np.asarray(merged.stopped, bool)
        valid = np.concatenate([np.full(len(ix), v) for v, ix in zip(valid_group, rows)])
        step = StepBatch(
            arrays, cat(lambda x: x.scores), valid, prompt_len, [rounds[r].t_batch.prompts[i] for r, i in groups],
            prompt_ids, {k: [rounds[r].batch.columns[k][i] for r, i in groups] for k in rounds[0].batch.columns},
            {k: cat(lambda x, k=k: x.t_out.per_fn[k]) for k in rounds[0].out.per_fn}, key=key,
            keys=[rounds[r].keys[i] for r, i in groups], totals=cat(lambda x: x.t_out.total),
            origin=(rounds, groups, rows), cat=cat)
        arrays["loss_mask"] = to_target_aligned(step.completion_mask, prompt_len)
        return step

    def own_providers(self) -> dict[str, Callable]:
        """Providers of the inputs this loop makes itself (:attr:`own_inputs`)."""
        return {}

    def assemble(self, key: jax.Array) -> StepBatch:
        """The train batch, the recomputed old log-probs (the sampler's kept as ``rollout_logp``
        when the recipe or a part reads them), the assemble phase, the providers of every input
        the recipe requires, and the recipe's importance corrections."""
        rec = self.recipe
        step = self.build_batch(key)
        a = step.arrays
        if rec.recompute_old_logp:
            if "rollout_logp" in rec.requires or "rollout_logp" in self.parts.reads:
                a["rollout_logp"] = a["old_logp"]
            lp = self.logp(self.state.params, self.frozen, a["tokens"], a["mask"], step.prompt_len,
                           routes=a.get("routes"))
            a["old_logp"] = np.where(a["loss_mask"], np.asarray(lp), 0.0).astype(np.float32)
        step = self.parts("assemble", self, step)
        providers = {**PROVIDERS, **self.own_providers()}
        for name in sorted(rec.requires - set(INTRINSIC)):
            providers[name](self, step)
        apply_corrections(rec, step)
        return step

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

    def estimate(self, step: StepBatch) -> StepBatch:
        """Advantages of the recipe's estimator into the train arrays (its returns in
        ``step.returns``), then the estimate phase."""
        rec, a = self.recipe, step.arrays
        c0 = step.prompt_len - 1  # completion token t sits at target column c0 + t
        inputs = {"scores": step.scores, "mask": step.completion_mask, "group_ids": a["group_ids"]}
        if self.parts.max_rounds > 1:  # only a group filter leaves invalid filler rows (static per run)
            inputs["valid"] = step.valid
        need = set(rec.estimator.part.requires) | ({"old_logp", "ref_logp"} if rec.kl_reward else set())
        for name in need:
            if name in TOKEN_ARRAYS:
                inputs[name] = a[TOKEN_ARRAYS[name]][:, c0:]
            elif name in step.inputs:
                inputs[name] = step.inputs[name]
        adv, step.returns, kl, keep = self._estimate_fn()(rec.estimator, rec.kl_reward, step.num_groups,
                                                          {k: jnp.asarray(v) for k, v in inputs.items()}, step.kl_coef)
        a["advantages"] = to_target_aligned(np.asarray(adv, np.float32), step.prompt_len)
        if keep is not None:  # the estimator restricts the loss to some response tokens (SPO's probability mask)
            kept = to_target_aligned(np.asarray(keep, bool), step.prompt_len)
            step.metrics["advantages/loss_token_frac"] = float(kept.sum() / max(a["loss_mask"].sum(), 1))
            a["loss_mask"] = a["loss_mask"] & kept
        if kl is not None:
            cm = step.completion_mask
            kl = np.asarray(kl)
            step.metrics["kl_in_reward/mean"] = float(kl[cm].mean()) if cm.any() else 0.0
            # the controller's KL: the mean over sequences of each sequence's token mean (verl)
            per_seq = np.where(cm.any(1), (kl * cm).sum(1) / np.maximum(cm.sum(1), 1), 0.0)
            step.metrics["kl_in_reward/seq_mean"] = float(per_seq[cm.any(1)].mean()) if cm.any() else 0.0
        step.inputs.update({k: inputs[k] for k in inputs if k not in TOKEN_ARRAYS and k not in (
            "scores", "mask", "valid", "group_ids")})
        return self.parts("estimate", self, step)

    def update(self, step: StepBatch, k_mb: jax.Array) -> None:
        """The update phase (parts add batch keys, reorderings and steps of their own models),
        then epochs x mini-batches of the train step."""
        rec, a = self.recipe, step.arrays
        actor_keys = rec.objective.batch_keys()
        if "scores" in actor_keys:  # a surrogate that reads the sequence rewards (DisCO, ...)
            a["scores"] = np.asarray(step.scores, np.float32)
        for k in rec.objective.loss_inputs:  # row-level inputs a surrogate reads (component scores, ...)
            if k not in a and k in step.inputs:
                a[k] = np.asarray(step.inputs[k])
        # a surrogate that compares the rows of a prompt sees whole groups in every mini-batch
        plan = self.parts("update", self, UpdatePlan(a, step.prompt_len, set(actor_keys), "group_ids" in actor_keys))
        train = {k: v for k, v in a.items() if k in plan.keys}
        cur = self.current
        for epoch in range(rec.epochs):
            for mb in minibatches(train, rec.num_minibatches, jax.random.fold_in(k_mb, epoch),
                                  whole_groups=plan.whole_groups):
                for reorder in plan.order:
                    mb = reorder(mb)
                if not mb["loss_mask"].any():
                    cur.empty += 1
                    continue
                for other in plan.steps:
                    other(mb)
                if plan.train_policy:
                    self.state, m = self.train_step(self.state, {k: mb[k] for k in actor_keys}, *self.frozen)
                    cur.policy_metrics.append(m)
        cur.policy_metrics = jax.device_get(cur.policy_metrics)

    def step(self) -> dict:
        """One RL iteration; returns its metrics (also appended to ``history`` by :meth:`run`)."""
        t = self.timings = {"time/data": 0.0, "time/rollout": 0.0, "time/rewards": 0.0}
        k_roll, k_mb = jax.random.split(self.rollout_key(self.iteration))
        self.current = StepState(k_mb=k_mb)
        self.collect(k_roll)
        t0 = time.perf_counter()
        step = self.assemble(k_roll)
        t1 = time.perf_counter()
        step = self.parts("filter", self, self.estimate(step))
        t["time/estimate"] = time.perf_counter() - t1
        t["time/prepare"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.update(step, k_mb)
        t["time/update"] = time.perf_counter() - t0
        step = self.parts("after_update", self, step)
        self.observe(step)
        self.iteration += 1
        self._last_prompts, self._last_keys, self._last_step = step.prompts, step.keys, step
        self.last_batch = dict(step.arrays, scores=step.scores, valid=step.valid, **step.inputs)
        return self.log(step)

    def record(self, step: StepBatch) -> None:
        """Report every group sampled this step (kept or dropped by a group filter) to the prompt
        store with the raw reward totals, and the store's and the trained groups' metrics."""
        seen = self.store.lookup(step.keys)["prompt_seen"] if step.keys else np.zeros(0)
        for x in self.current.rounds:
            self.store.observe(self.iteration, x.keys, x.out.total, x.roll.lengths, x.roll.prompt_index)
        step.metrics.update(self.store.summary())
        if seen.size:
            step.metrics["prompts/new_frac"] = float(np.mean(seen == 0))
        arrays, scores, valid = step.rows_as_sampled()
        gid, valid = np.asarray(arrays["group_ids"]), np.asarray(valid)
        spread, group_rows = [], []
        for g in range(len(step.keys)):
            rows = (gid == g) & valid
            if rows.any():
                spread.append(bool(np.ptp(np.asarray(scores)[rows]) > 0))
                group_rows.append(int(rows.sum()))
        if spread:
            # the fraction of groups with a reward spread, and of samples in such groups (Knapsack
            # RL's "effective gradient ratio": the samples with a non-zero GRPO gradient)
            step.metrics["prompts/spread_groups_frac"] = float(np.mean(spread))
            step.metrics["prompts/effective_samples_frac"] = float(np.dot(spread, group_rows) / sum(group_rows))

    def observe(self, step: StepBatch) -> None:
        """The prompt store's record of the step, then the observe phase."""
        self.record(step)
        self.parts("observe", self, step)

    def round_metrics(self, step: StepBatch) -> dict[str, float]:
        """The rewards' metrics over every round, the sampling's, and the train batch's shape."""
        rounds = self.current.rounds
        gen_lengths = np.concatenate([np.asarray(x.roll.lengths) for x in rounds])
        gen_tokens = float(sum(np.asarray(x.roll.mask).sum() for x in rounds))
        return {**merge_reward_metrics([x.out for x in rounds]), "batch/prompt_len": float(step.prompt_len),
                "response/length_mean": float(gen_lengths.mean()), "response/length_max": float(gen_lengths.max()),
                "response/stopped_frac": float(np.mean(np.concatenate([np.asarray(x.roll.stopped) for x in rounds]))),
                "tokens_per_s": gen_tokens / max(self.timings["time/rollout"], 1e-9)}

    def log(self, step: StepBatch) -> dict:
        """The step's metrics: the update's (means over mini-batches), the rounds', the step's,
        the parts', the advantages' and the phases' timings."""
        metrics = self.update_metrics(self.current.policy_metrics)
        metrics.update(self.round_metrics(step))
        metrics.update(step.metrics)
        metrics.update(self.parts.metrics())
        metrics.update(self.advantage_metrics(step))
        metrics.update(self.timings)
        return metrics

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_state(self) -> Any:
        """The train state, plus the parts' arrays by their keys (``{"policy", "critic",
        "kl_controller", "stale_params", "prompt_value", "progress"}``) when any part has some."""
        arrays = self.parts.arrays()
        return {"policy": self.state, **arrays} if arrays else self.state

    def load_checkpoint_state(self, state: Any) -> None:
        for p in self.parts:
            p.restored(self)
        if not any(p.array_key for p in self.parts):
            self.state = state
            return
        self.state = state["policy"]
        self.parts.load_arrays(state)

    def loop_state(self) -> dict:
        """The prompt store (statistics and the parts' per-prompt slots), and the parts' own JSON
        state when any keeps some outside the store."""
        parts = self.parts.state_dict()
        return {"prompt_store": self.store.state_dict(), **({"parts": parts} if parts else {})}

    def load_loop_state(self, record: dict) -> None:
        self.parts.load_state_dict(record.get("parts", {}))
        if "prompt_store" in record:
            self.store.load_state_dict(record["prompt_store"])
            return
        if record.get("shaping_state"):
            raise ValueError("this checkpoint keeps stateful shaping state by prompt text (written before the prompt "
                             "store); it cannot be resumed by this version: start the run again")
        if any(p.keeps_prompt_state for p in self.parts) or self.recipe.requires & set(STORE_INPUTS):
            raise ValueError("this checkpoint was written before the prompt store; recipe "
                             f"{self.recipe.name!r} reads per-prompt state, which it does not hold: start the run "
                             "again")
        # an older checkpoint of a recipe that does not read the store: statistics restart empty

"""The RL loop as a readable composition: data -> rollout -> rewards -> advantages -> update.

:class:`RLTrainer` owns the jitted pieces (sampler, advantage function, train step) and the
host-side state (data iterator, metric history). One call of :meth:`RLTrainer.step` is::

    batch    = next(data)                                  # prompts of this host (grain)
    rollout  = sampler(params, batch.prompt_ids, key)      # G completions per prompt (jit)
    scores   = rewards(prompts, completions, **columns)    # Python reward functions, isolated
    (DAPO: repeat the three lines until enough groups have a reward spread)
    arrays   = build_rl_batch(...) + advantages (jit)      # target-aligned train arrays
                                                           # (+ greedy baseline / critic values)
    for epoch, minibatch: state = train_step(state, mb)    # jit, micro-batched, exact norm.
                          critic = critic_step(critic, mb) # PPO

Every random choice derives from ``(seed, iteration, round)``: the key of iteration ``s`` is
``fold_in(key(seed), s)``, split into a rollout key and a mini-batch shuffling key; sampling
round ``r`` of the iteration uses the rollout key itself for ``r = 0`` and
``fold_in(rollout_key, r)`` after. A run resumed from a checkpoint at iteration ``s`` (train
state, critic state, data-iterator state and history restored) continues bit for bit as if
never stopped, however many prompt batches dynamic sampling consumed per step.

**Dynamic sampling** (DAPO, ``recipe.dynamic_sampling``). Each round draws one data batch of
``B`` prompts, samples and scores it, and keeps the groups whose filter values are not all
equal (:func:`jaxrl_llm.core.dynamic_sampling_mask`; the filter looks at the reward total
before overlong shaping, or at one reward function, ``recipe.dynamic_sampling_metric``).
Rounds continue until ``B`` groups are kept (``B`` = the size of the step's first data
batch) or ``recipe.max_sampling_rounds`` rounds are done. The train batch always has the
fixed shape ``B x G`` rows, so the train step never recompiles: the first ``B`` kept groups
in order of generation (extra kept groups of the last round are discarded, as verl
truncates), and when the cap is hit with ``k < B`` kept, the remaining ``B - k`` slots are
filled with dropped groups whose ``loss_mask`` is all zero and which are marked invalid
for the advantage estimator. Such rows add exactly nothing to the loss, to its
normalising weight (every aggregation weight counts masked tokens or sequences with a
token) or to batch-level statistics, so the update equals training on the ``k`` kept groups
alone. A mini-batch without any loss token is not run (a zero gradient would still move
Adam's parameters through its momentum), so with ``k = 0`` the step makes no update.

**Several processes** (multi-host; :func:`jaxrl_llm.parallel.initialize`). Every process
runs this same loop on the same *global* batch: the same prompts (the data iterator is not
split per host), the same keys, the sampler and train step as one SPMD program over the
whole mesh, rollouts and log-probabilities fetched in full (:func:`~jaxrl_llm.parallel.gather`).
Only the reward functions are split: each process scores a contiguous share of the groups
and the outputs are exchanged, so scores, advantages, the dynamic-sampling decision and the
metrics are identical on every host and equal to a one-process run's. The host-side arrays
are a batch of tokens, small next to the model.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxrl_llm.core as core
from jaxrl_llm.data.pipeline import repeat_columns
from jaxrl_llm.parallel.multihost import allgather_objects, gather
from jaxrl_llm.parallel.sharding import in_host_memory
from jaxrl_llm.rewards.base import RewardOutput
from jaxrl_llm.rollout.sampler import Rollout, Sampler, bucket
from jaxrl_llm.training.checkpoint import Checkpointer, PreemptionGuard
from jaxrl_llm.training.objectives import PolicyObjective, policy_logprobs
from jaxrl_llm.training.rl import (Critic, RLRecipe, advantages_and_returns, build_rl_batch, critic_values, minibatches,
                                   outcome_token_rewards, to_target_aligned)

__all__ = ["RLTrainer", "write_jsonl"]

TRAIN_KEYS = ("tokens", "mask", "loss_mask", "old_logp", "advantages", "ref_logp")
CRITIC_KEYS = ("tokens", "mask", "loss_mask", "old_values", "returns")


# module-level jits (static graph): a second trainer in the same process (a restart, a test)
# reuses their compilations
@partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _policy_logp(graphdef, chunk_size, temperature, from_host, params, others, tokens, mask):
    from flax import nnx

    if from_host:  # a reference policy kept in host memory (model.offload_reference): HBM only for this pass
        params = jax.device_put(params, jax.memory.Space.Device)

    logp, _ = policy_logprobs(nnx.merge(graphdef, params, *others), {"tokens": tokens, "mask": mask},
                              chunk_size=chunk_size, temperature=temperature)
    return logp


@partial(jax.jit, static_argnums=(0,))
def _critic_values(graphdef, params, others, tokens, mask):
    from flax import nnx

    return critic_values(nnx.merge(graphdef, params, *others), {"tokens": tokens, "mask": mask})


_dynamic_sampling_mask = jax.jit(core.dynamic_sampling_mask, static_argnums=2)


def _advantages(rec: RLRecipe, num_groups: int, inputs: dict):
    inputs, kl = dict(inputs), None
    if "ref_logp" in inputs:  # KL-in-reward
        m = inputs["completion_mask"]
        inputs["token_rewards"], kl = core.kl_in_reward(
            outcome_token_rewards(inputs["scores"], m), inputs.pop("old_logp"), inputs.pop("ref_logp"), m,
            rec.kl_in_reward_coef, rec.kl_in_reward_estimator)
    adv, ret = advantages_and_returns(rec, num_groups=num_groups, **inputs)
    return adv, ret, kl


_advantages_jit = jax.jit(_advantages, static_argnums=(0, 1))


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


class RLTrainer:
    """On-policy RL with a recipe (see the module docstring).

    Args:
      graphdef: the policy's graph (``nnx.split``); ``state.params`` are its trained params.
      state: the initial :class:`~jaxrl_llm.training.TrainState`.
      train_step: from :func:`~jaxrl_llm.training.make_train_step` with ``recipe.objective``.
      sampler: a :class:`~jaxrl_llm.rollout.Sampler` whose config has
        ``num_samples == recipe.num_samples``.
      data: a :class:`~jaxrl_llm.data.DataIterator` of prompt batches (or any iterator of
        :class:`~jaxrl_llm.data.PromptBatch` with ``get_state`` / ``set_state``).
      rewards: a :class:`~jaxrl_llm.rewards.Rewards`.
      recipe: the :class:`~jaxrl_llm.training.RLRecipe`.
      tokenizer: decodes completions for the reward functions.
      seed: the run's seed (rollout keys derive from it, the iteration and the round).
      frozen: further state parts for ``nnx.merge`` (e.g. frozen base weights under LoRA).
      ref_params: reference policy params for a KL term (``recipe.objective.kl_coef > 0`` or
        ``recipe.kl_in_reward_coef > 0``); they may live in host memory
        (:func:`jaxrl_llm.parallel.to_host_memory`): each reference pass then moves them in.
      critic: a :class:`~jaxrl_llm.training.Critic` (required by ``advantage_type="critic"``
        recipes, e.g. PPO); its state is updated in place and checkpointed with the policy.
      baseline_sampler: the greedy sampler of ``advantage_type="greedy_baseline"`` recipes
        (ReMax); default: the sampler's config with ``greedy=True, num_samples=1`` and the
        same buckets.
      checkpointer, checkpoint_every: save every N steps (and on SIGTERM and at the end).
      eval_fn, eval_every: ``eval_fn(params) -> dict`` of metrics every N steps.
      log_fn: called with each step's metrics dict (console / JSONL / TensorBoard writers).
      config: the resolved run config, stored with checkpoints.

    After each step, ``last_batch`` holds its host arrays (train arrays plus ``scores``, the
    shaped scores, ``valid``, the rows that count, and ``baseline_scores`` for ReMax), for
    inspection; :meth:`last_samples` decodes a few of its rows for sample logs.
    """

    def __init__(self, graphdef, state, train_step: Callable, sampler, data, rewards, recipe: RLRecipe, tokenizer, *,
                 seed: int = 0, frozen: tuple = (), ref_params: Any = None, critic: Critic | None = None,
                 baseline_sampler: Sampler | None = None, checkpointer: Checkpointer | None = None,
                 checkpoint_every: int = 0, eval_fn: Callable[[Any], dict] | None = None, eval_every: int = 0,
                 log_fn: Callable[[dict], None] | None = None, config: Any = None):
        if sampler.config.num_samples != recipe.num_samples:
            raise ValueError(f"sampler samples {sampler.config.num_samples} completions per prompt but the recipe "
                             f"expects num_samples={recipe.num_samples}")
        if recipe.objective.kl_coef and ref_params is None:
            raise ValueError("the recipe has a KL term (objective.kl_coef > 0): pass ref_params")
        if recipe.kl_in_reward_coef and ref_params is None:
            raise ValueError("the recipe folds a KL into the reward (kl_in_reward_coef > 0): pass ref_params")
        if recipe.advantage_type == "critic" and critic is None:
            raise ValueError(f"recipe {recipe.name!r} has advantage_type='critic': pass critic=Critic(...) "
                             f"(e.g. Critic.create(cfg, optimizer, recipe.value_objective, policy_params=...))")
        if critic is not None and recipe.advantage_type != "critic":
            raise ValueError(f"critic given but recipe {recipe.name!r} has advantage_type="
                             f"{recipe.advantage_type!r}, which uses no critic")
        if recipe.advantage_type == "greedy_baseline":
            if baseline_sampler is None:
                import dataclasses

                baseline_sampler = Sampler(sampler.graphdef, dataclasses.replace(sampler.config, greedy=True,
                                                                                 num_samples=1),
                                           length_buckets=sampler.length_buckets, batch_buckets=sampler.batch_buckets,
                                           mesh=sampler.mesh, unroll_layers=sampler.unroll_layers)
            if not baseline_sampler.config.greedy or baseline_sampler.config.num_samples != 1:
                raise ValueError("baseline_sampler must decode greedily (SamplingConfig.greedy=True) with "
                                 f"num_samples=1, got greedy={baseline_sampler.config.greedy}, "
                                 f"num_samples={baseline_sampler.config.num_samples}")
        self.overlong = (recipe.overlong_lengths(sampler.config.max_new_tokens) if recipe.overlong_shaping else None)
        self.graphdef, self.state, self.train_step = graphdef, state, train_step
        self.sampler, self.data, self.rewards, self.recipe, self.tokenizer = sampler, data, rewards, recipe, tokenizer
        self.seed, self.frozen, self.ref_params = seed, tuple(frozen), ref_params
        self.critic, self.baseline_sampler = critic, baseline_sampler
        self.checkpointer, self.checkpoint_every = checkpointer, checkpoint_every
        self.eval_fn, self.eval_every, self.log_fn, self.config = eval_fn, eval_every, log_fn, config
        self.history: list[dict] = []
        self.iteration = 0  # steps done
        self.last_batch: dict[str, np.ndarray] | None = None
        self._last_prompts: list[str] = []
        self._adv: dict = {}

    # ------------------------------------------------------------------ pieces

    def _logp(self, params, others, tokens, mask) -> np.ndarray:
        obj = self.recipe.objective
        return gather(_policy_logp(self.graphdef, obj.chunk_size, obj.temperature, in_host_memory(params), params,
                                   others, tokens, mask))

    def _values(self, params, others, tokens, mask) -> np.ndarray:
        return gather(_critic_values(self.critic.graphdef, params, others, tokens, mask))

    def _adv_fn(self, num_groups: int, names: tuple[str, ...]) -> Callable:
        """``inputs -> (advantages, returns, kl-in-reward)``, jitted; shared between trainers
        when the recipe is hashable (every preset is), else compiled per trainer."""
        try:
            hash(self.recipe)
        except TypeError:  # e.g. an array in advantage_kwargs
            fn = self._adv.get((num_groups, names))
            if fn is None:
                fn = self._adv[(num_groups, names)] = jax.jit(partial(_advantages, self.recipe, num_groups))
            return fn
        return partial(_advantages_jit, self.recipe, num_groups)

    def advantages(self, scores: np.ndarray, completion_mask: np.ndarray, group_ids: np.ndarray, num_groups: int,
                   **inputs: Any) -> np.ndarray:
        """``[N, T]`` host advantages of the recipe (jitted once per ``num_groups`` and inputs);
        ``inputs`` as :func:`~jaxrl_llm.training.advantages_and_returns` (``valid``,
        ``baseline_scores``, ``values``, ``token_rewards``)."""
        args = {"scores": scores, "completion_mask": completion_mask, "group_ids": group_ids, **inputs}
        fn = self._adv_fn(num_groups, tuple(sorted(args)))
        return np.asarray(fn({k: jnp.asarray(v) for k, v in args.items()})[0])

    def rollout_key(self, iteration: int) -> jax.Array:
        """The key of ``iteration``; split into ``(rollout key, mini-batch key)``."""
        return jax.random.fold_in(jax.random.key(self.seed), iteration)

    @staticmethod
    def round_key(rollout_key: jax.Array, round_index: int) -> jax.Array:
        """The sampling key of round ``round_index`` of a step (dynamic sampling)."""
        return rollout_key if round_index == 0 else jax.random.fold_in(rollout_key, round_index)

    def _score_groups(self, prompts, columns: dict, roll, g: int, lo: int, hi: int):
        """Rewards of the rows of prompts ``lo:hi`` (whole groups)."""
        rows = slice(lo * g, hi * g)
        toks, cmask = np.asarray(roll.tokens)[rows], np.asarray(roll.mask)[rows].astype(bool)
        completions = [self.tokenizer.decode(toks[i][cmask[i]], skip_special_tokens=True) for i in range(len(toks))]
        return self.rewards([p for p in prompts[lo:hi] for _ in range(g)], completions,
                            completion_ids=[toks[i][cmask[i]].tolist() for i in range(len(toks))],
                            completion_lengths=np.asarray(roll.lengths)[rows].tolist(),
                            group_ids=np.asarray(roll.prompt_index)[rows].tolist(),
                            **repeat_columns({k: list(v)[lo:hi] for k, v in columns.items()}, g))

    def _score(self, prompts, columns: dict, roll, g: int):
        """Rewards of every row. With several processes each scores a contiguous share of
        the groups (reward functions are the host-side cost that grows with the batch) and
        the outputs are exchanged, so every process ends with the same scores."""
        n_proc = jax.process_count()
        if n_proc == 1:
            return self._score_groups(prompts, columns, roll, g, 0, len(prompts))
        bounds = np.linspace(0, len(prompts), n_proc + 1).round().astype(int)
        lo, hi = bounds[jax.process_index()], bounds[jax.process_index() + 1]
        mine = self._score_groups(prompts, columns, roll, g, lo, hi) if hi > lo else None
        outs = [o for o in allgather_objects(mine) if o is not None]
        if len(outs) == 1:
            return outs[0]
        return RewardOutput(total=np.concatenate([o.total for o in outs]),
                            per_fn={k: np.concatenate([o.per_fn[k] for o in outs]) for k in outs[0].per_fn},
                            failed={k: np.concatenate([o.failed[k] for o in outs]) for k in outs[0].failed},
                            metrics=_merge_reward_metrics(outs))

    def _shape(self, total: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Scores after the recipe's shaping (DAPO's overlong penalty)."""
        total = np.asarray(total, np.float32)
        if self.overlong is None:
            return total
        pen = core.overlong_penalty(jnp.asarray(lengths), self.overlong[0], self.overlong[1],
                                    self.recipe.overlong_penalty_factor)
        return (total + np.asarray(pen)).astype(np.float32)

    def _keep_groups(self, out, roll, num_prompts: int) -> np.ndarray:
        """``[num_prompts]`` bool: groups with a spread of the dynamic-sampling metric."""
        name = self.recipe.dynamic_sampling_metric
        if name is None:
            vals = out.total
        elif name in out.per_fn:
            vals = np.nan_to_num(out.per_fn[name], nan=0.0)  # None ("does not apply") counts 0, as in the total
        else:
            raise ValueError(f"RLRecipe.dynamic_sampling_metric {name!r} is not a reward function; "
                             f"the rewards are {sorted(out.per_fn)}")
        pidx = np.asarray(roll.prompt_index)
        rows = np.asarray(_dynamic_sampling_mask(jnp.asarray(vals, jnp.float32), jnp.asarray(pidx), num_prompts))
        keep = np.zeros(num_prompts, bool)
        keep[pidx[rows]] = True
        return keep

    # ------------------------------------------------------------------ one step

    def step(self) -> dict:
        """One RL iteration; returns its metrics (also appended to ``history`` by :meth:`run`)."""
        rec, g = self.recipe, self.recipe.num_samples
        t = {"time/data": 0.0, "time/rollout": 0.0, "time/rewards": 0.0}
        key = self.rollout_key(self.iteration)
        k_roll, k_mb = jax.random.split(key)

        # ---- rollouts and rewards (several rounds with dynamic sampling)
        rounds: list[tuple[Any, Any, Any, np.ndarray]] = []  # (batch, rollout, reward output, shaped scores)
        kept: list[tuple[int, int]] = []  # (round, prompt) of groups to train on
        dropped: list[tuple[int, int]] = []
        target = 0
        for r in range(rec.max_sampling_rounds if rec.dynamic_sampling else 1):
            t0 = time.perf_counter()
            batch = next(self.data)
            t["time/data"] += time.perf_counter() - t0
            target = target or len(batch)
            t0 = time.perf_counter()
            roll = self.sampler(self.state.params, batch.prompt_ids, self.round_key(k_roll, r), *self.frozen)
            t["time/rollout"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            out = self._score(batch.prompts, batch.columns, roll, g)
            rounds.append((batch, roll, out, self._shape(out.total, roll.lengths)))
            if rec.dynamic_sampling:
                keep = self._keep_groups(out, roll, len(batch))
                kept += [(r, i) for i in np.flatnonzero(keep)]
                dropped += [(r, i) for i in np.flatnonzero(~keep)]
            else:
                kept = [(r, i) for i in range(len(batch))]
            t["time/rewards"] += time.perf_counter() - t0
            if len(kept) >= target:
                break

        # ---- the train batch: B groups, fixed shape (module docstring)
        t0 = time.perf_counter()
        chosen = kept[:target]
        groups = chosen + dropped[:target - len(chosen)]
        valid_group = np.arange(len(groups)) < len(chosen)
        rows = [np.flatnonzero(np.asarray(rounds[r][1].prompt_index) == i) for r, i in groups]

        def cat(get):
            return np.concatenate([np.asarray(get(rounds[r]))[ix] for (r, _), ix in zip(groups, rows)])

        merged = Rollout(*(cat(lambda x, f=f: getattr(x[1], f)) for f in ("tokens", "mask", "logprobs", "lengths",
                                                                             "stopped")),
                         np.concatenate([np.full(len(ix), j, np.int32) for j, ix in enumerate(rows)]))
        scores = cat(lambda x: x[3])
        valid = np.concatenate([np.full(len(ix), v) for v, ix in zip(valid_group, rows)])
        prompt_ids = [rounds[r][0].prompt_ids[i] for r, i in groups]
        prompt_len = bucket(max(len(p) for p in prompt_ids), self.sampler.length_buckets)
        arrays = build_rl_batch(prompt_ids, merged, prompt_len, self.sampler.config.pad_token_id)
        cmask = arrays["completion_mask"] & valid[:, None]
        arrays["loss_mask"] = to_target_aligned(cmask, prompt_len)
        if rec.old_logp == "recompute":
            lp = self._logp(self.state.params, self.frozen, arrays["tokens"], arrays["mask"])
            arrays["old_logp"] = np.where(arrays["loss_mask"], np.asarray(lp), 0.0).astype(np.float32)
        if self.ref_params is not None:
            lp = self._logp(self.ref_params, self.frozen, arrays["tokens"], arrays["mask"])
            arrays["ref_logp"] = np.where(arrays["loss_mask"], np.asarray(lp), 0.0).astype(np.float32)

        # ---- advantages
        c0 = prompt_len - 1  # completion token t sits at target column c0 + t
        inputs: dict[str, np.ndarray] = {"scores": scores, "completion_mask": cmask, "group_ids": arrays["group_ids"]}
        extra: dict[str, Any] = {}
        if rec.advantage_type == "group" and rec.dynamic_sampling:
            inputs["valid"] = valid
        if rec.advantage_type != "group" and rec.kl_in_reward_coef:
            inputs["old_logp"], inputs["ref_logp"] = arrays["old_logp"][:, c0:], arrays["ref_logp"][:, c0:]
        if rec.advantage_type == "greedy_baseline":
            t1 = time.perf_counter()
            cols = {k: [rounds[r][0].columns[k][i] for r, i in groups] for k in rounds[0][0].columns}
            broll = self.baseline_sampler(self.state.params, prompt_ids, k_roll, *self.frozen)  # greedy: key unused
            bout = self._score([rounds[r][0].prompts[i] for r, i in groups], cols, broll, 1)
            base = self._shape(bout.total, broll.lengths)
            inputs["baseline_scores"] = base[arrays["group_ids"]]
            extra.update({"baseline/reward_mean": float(base[valid_group].mean()) if valid_group.any() else 0.0,
                          "baseline/length_mean": float(np.mean(broll.lengths)),
                          "time/baseline": time.perf_counter() - t1})
        if rec.advantage_type == "critic":
            v = self._values(self.critic.state.params, self.critic.frozen, arrays["tokens"], arrays["mask"])
            arrays["old_values"] = np.where(arrays["loss_mask"], np.asarray(v), 0.0).astype(np.float32)
            inputs["values"] = arrays["old_values"][:, c0:]
        adv, ret, kl = self._adv_fn(target, tuple(sorted(inputs)))({k: jnp.asarray(v) for k, v in inputs.items()})
        adv = np.asarray(adv, np.float32)
        arrays["advantages"] = to_target_aligned(adv, prompt_len)
        if rec.advantage_type == "critic":
            arrays["returns"] = to_target_aligned(np.asarray(ret, np.float32), prompt_len)
        if kl is not None:
            extra["kl_in_reward/mean"] = float(np.asarray(kl)[cmask].mean()) if cmask.any() else 0.0
        t["time/prepare"] = time.perf_counter() - t0

        # ---- updates: epochs x mini-batches (critic first, on the same rows)
        t0 = time.perf_counter()
        train = {k: v for k, v in arrays.items() if k in TRAIN_KEYS or k in CRITIC_KEYS}
        train_actor = self.critic is None or self.iteration >= rec.critic_warmup
        actor_keys = TRAIN_KEYS
        if isinstance(rec.objective, PolicyObjective) and not rec.objective.kl_coef:
            actor_keys = tuple(k for k in TRAIN_KEYS if k != "ref_logp")  # used by KL-in-reward only
        step_metrics, critic_metrics, empty = [], [], 0
        for epoch in range(rec.epochs):
            k_epoch = jax.random.fold_in(k_mb, epoch)
            for mb in minibatches(train, rec.num_minibatches, k_epoch):
                if not mb["loss_mask"].any():
                    empty += 1
                    continue
                if self.critic is not None:
                    self.critic.state, cm = self.critic.train_step(self.critic.state,
                                                                   {k: mb[k] for k in CRITIC_KEYS}, *self.critic.frozen)
                    critic_metrics.append(cm)
                if train_actor:
                    self.state, m = self.train_step(self.state, {k: mb[k] for k in actor_keys if k in mb}, *self.frozen)
                    step_metrics.append(m)
        step_metrics, critic_metrics = jax.device_get((step_metrics, critic_metrics))
        t["time/update"] = time.perf_counter() - t0
        self.iteration += 1
        self._last_prompts = [rounds[r][0].prompts[i] for r, i in groups]
        self.last_batch = dict(arrays, scores=scores, valid=valid)
        if "baseline_scores" in inputs:
            self.last_batch["baseline_scores"] = inputs["baseline_scores"]

        # ---- metrics
        gen_lengths = np.concatenate([np.asarray(x[1].lengths) for x in rounds])
        gen_stopped = np.concatenate([np.asarray(x[1].stopped) for x in rounds])
        gen_tokens = float(sum(np.asarray(x[1].mask).sum() for x in rounds))
        metrics: dict[str, Any] = {"step": int(self.state.step), "iteration": self.iteration}
        if step_metrics:
            metrics.update({k: float(np.mean([m[k] for m in step_metrics])) for k in step_metrics[0]})
        metrics["skipped_updates"] = float(sum(m["skipped"] for m in step_metrics))
        if critic_metrics:
            metrics.update({f"critic/{k}": float(np.mean([m[k] for m in critic_metrics])) for k in critic_metrics[0]})
        metrics.update(_merge_reward_metrics([x[2] for x in rounds]))
        if self.overlong is not None:
            metrics["rewards/shaped/mean"] = float(np.concatenate([x[3] for x in rounds]).mean())
        if rec.dynamic_sampling:
            metrics.update({"sampling/rounds": float(len(rounds)),
                            "sampling/generated_groups": float(sum(len(x[0]) for x in rounds)),
                            "sampling/kept_groups": float(len(kept)), "sampling/train_groups": float(len(chosen)),
                            "sampling/filler_groups": float(len(groups) - len(chosen)),
                            "sampling/empty_minibatches": float(empty)})
        metrics.update(extra)
        metrics.update({"response/length_mean": float(gen_lengths.mean()),
                        "response/length_max": float(gen_lengths.max()),
                        "response/stopped_frac": float(np.mean(gen_stopped)),
                        "advantages/mean": float(adv[cmask].mean()) if cmask.any() else 0.0,
                        "advantages/std": float(adv[cmask].std()) if cmask.any() else 0.0,
                        "tokens_per_s": gen_tokens / max(t["time/rollout"], 1e-9)})
        metrics.update(t)
        return metrics

    def last_samples(self, n: int = 4) -> list[dict]:
        """Up to ``n`` rows of the last train batch, one per group first: ``prompt``,
        ``completion`` (decoded), ``reward`` (the shaped score) and ``advantage`` (its mean
        over the completion), for sample logs."""
        b = self.last_batch
        if b is None:
            return []
        g = self.recipe.num_samples
        order = [i for k in range(g) for i in range(k, len(b["valid"]), g)]  # sample k of every group, k = 0, 1, ...
        cmask = b["completion_mask"]
        p = b["tokens"].shape[1] - cmask.shape[1]
        out = []
        for i in [i for i in order if b["valid"][i]][:n]:
            adv = b["advantages"][i, p - 1:][cmask[i]]
            out.append({"prompt": self._last_prompts[b["group_ids"][i]],
                        "completion": self.tokenizer.decode(b["tokens"][i, p:][cmask[i]], skip_special_tokens=True),
                        "reward": float(b["scores"][i]), "advantage": float(adv.mean()) if adv.size else 0.0})
        return out

    # ------------------------------------------------------------------ the run

    def _ckpt_state(self) -> Any:
        return self.state if self.critic is None else {"policy": self.state, "critic": self.critic.state}

    def save(self, metrics: dict | None = None) -> None:
        """Checkpoint the train state (and the critic's, as ``{"policy", "critic"}``), the
        data iterator and the history."""
        if self.checkpointer is None:
            return
        self.checkpointer.save(self.iteration, self._ckpt_state(), data_state=self.data.get_state(),
                               loop={"iteration": self.iteration, "seed": self.seed}, config=self.config,
                               history=self.history, metrics=metrics)

    def restore(self) -> bool:
        """Resume from the latest checkpoint, if any; True if one was restored."""
        if self.checkpointer is None or self.checkpointer.latest_step() is None:
            return False
        state, record = self.checkpointer.restore(self._ckpt_state())
        if self.critic is None:
            self.state = state
        else:
            self.state, self.critic.state = state["policy"], state["critic"]
        self.data.set_state(record["data_state"])
        self.iteration = int(record["loop"]["iteration"])
        self.history = list(record["history"])
        return True

    def run(self, steps: int, *, progress: bool = False) -> list[dict]:
        """Train until ``steps`` iterations are done (counting those of a resumed run)."""
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=steps, initial=self.iteration, desc="RL", dynamic_ncols=True)
        with PreemptionGuard() as guard:
            while self.iteration < steps:
                metrics = self.step()
                if self.eval_fn is not None and self.eval_every and self.iteration % self.eval_every == 0:
                    metrics.update(self.eval_fn(self.state.params))
                self.history.append(metrics)
                if self.log_fn is not None:
                    self.log_fn(metrics)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{metrics['rewards/total/mean']:.3f}")
                stop = guard.should_stop()
                if self.checkpointer is not None and (
                        stop or self.iteration == steps
                        or (self.checkpoint_every and self.iteration % self.checkpoint_every == 0)):
                    self.save({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
                if stop:
                    break
        if bar is not None:
            bar.close()
        if self.checkpointer is not None:
            self.checkpointer.wait()
        return self.history


def write_jsonl(path: str | Path) -> Callable[[dict], None]:
    """A ``log_fn`` appending each metrics dict as a JSON line to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def log(metrics: dict) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
    return log

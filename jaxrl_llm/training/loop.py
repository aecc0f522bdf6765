"""The RL loop as a readable composition: data -> rollout -> rewards -> advantages -> update.

:class:`RLTrainer` owns the jitted pieces (sampler, advantage function, train step) and the
host-side state (data iterator, metric history). One call of :meth:`RLTrainer.step` is::

    batch    = next(data)                                  # prompts of this host (grain)
    rollout  = sampler(params, batch.prompt_ids, key)      # G completions per prompt (jit)
    scores   = rewards(prompts, completions, **columns)    # Python reward functions, isolated
    arrays   = build_rl_batch(...) + advantages (jit)      # target-aligned train arrays
    for epoch, minibatch: state = train_step(state, mb)    # jit, micro-batched, exact norm.

Every random choice derives from ``(seed, step)``: the rollout key of step ``s`` is
``fold_in(key(seed), s)``, so a run resumed from a checkpoint at step ``s`` (train state,
data-iterator state and history restored) continues bit for bit as if never stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.data.pipeline import repeat_columns
from jaxrl_llm.rollout.sampler import bucket
from jaxrl_llm.training.checkpoint import Checkpointer, PreemptionGuard
from jaxrl_llm.training.objectives import policy_logprobs
from jaxrl_llm.training.rl import RLRecipe, build_rl_batch, compute_advantages, minibatches, to_target_aligned

__all__ = ["RLTrainer", "write_jsonl"]

TRAIN_KEYS = ("tokens", "mask", "loss_mask", "old_logp", "advantages", "ref_logp")


class RLTrainer:
    """On-policy RL with a group recipe (see the module docstring).

    Args:
      graphdef: the policy's graph (``nnx.split``); ``state.params`` are its trained params.
      state: the initial :class:`~jaxrl_llm.training.TrainState`.
      train_step: from :func:`~jaxrl_llm.training.make_train_step` with ``recipe.objective``.
      sampler: a :class:`~jaxrl_llm.rollout.Sampler` whose config has
        ``num_samples == recipe.num_samples``.
      data: a :class:`~jaxrl_llm.data.DataIterator` of prompt batches.
      rewards: a :class:`~jaxrl_llm.rewards.Rewards`.
      recipe: the :class:`~jaxrl_llm.training.RLRecipe`.
      tokenizer: decodes completions for the reward functions.
      seed: the run's seed (rollout keys derive from it and the step).
      frozen: further state parts for ``nnx.merge`` (e.g. frozen base weights under LoRA).
      ref_params: reference policy params for a KL term (``recipe.objective.kl_coef > 0``).
      checkpointer, checkpoint_every: save every N steps (and on SIGTERM and at the end).
      eval_fn, eval_every: ``eval_fn(params) -> dict`` of metrics every N steps.
      log_fn: called with each step's metrics dict (console / JSONL / TensorBoard writers).
      config: the resolved run config, stored with checkpoints.
    """

    def __init__(self, graphdef, state, train_step: Callable, sampler, data, rewards, recipe: RLRecipe, tokenizer, *,
                 seed: int = 0, frozen: tuple = (), ref_params: Any = None, checkpointer: Checkpointer | None = None,
                 checkpoint_every: int = 0, eval_fn: Callable[[Any], dict] | None = None, eval_every: int = 0,
                 log_fn: Callable[[dict], None] | None = None, config: Any = None):
        if sampler.config.num_samples != recipe.num_samples:
            raise ValueError(f"sampler samples {sampler.config.num_samples} completions per prompt but the recipe "
                             f"expects num_samples={recipe.num_samples}")
        if recipe.objective.kl_coef and ref_params is None:
            raise ValueError("the recipe has a KL term (objective.kl_coef > 0): pass ref_params")
        self.graphdef, self.state, self.train_step = graphdef, state, train_step
        self.sampler, self.data, self.rewards, self.recipe, self.tokenizer = sampler, data, rewards, recipe, tokenizer
        self.seed, self.frozen, self.ref_params = seed, tuple(frozen), ref_params
        self.checkpointer, self.checkpoint_every = checkpointer, checkpoint_every
        self.eval_fn, self.eval_every, self.log_fn, self.config = eval_fn, eval_every, log_fn, config
        self.history: list[dict] = []
        self.iteration = 0  # rollout batches consumed
        self._adv = {}
        self._logp = jax.jit(self._forward_logp)

    # ------------------------------------------------------------------ pieces

    def _forward_logp(self, params, others, tokens, mask):
        from flax import nnx

        model = nnx.merge(self.graphdef, params, *others)
        logp, _ = policy_logprobs(model, {"tokens": tokens, "mask": mask},
                                  chunk_size=self.recipe.objective.chunk_size,
                                  temperature=self.recipe.objective.temperature)
        return logp

    def advantages(self, scores: np.ndarray, completion_mask: np.ndarray, group_ids: np.ndarray, num_groups: int):
        fn = self._adv.get(num_groups)
        if fn is None:
            fn = self._adv[num_groups] = jax.jit(
                lambda s, m, g: compute_advantages(self.recipe, s, m, g, num_groups))
        return np.asarray(fn(jnp.asarray(scores), jnp.asarray(completion_mask), jnp.asarray(group_ids)))

    def rollout_key(self, iteration: int) -> jax.Array:
        return jax.random.fold_in(jax.random.key(self.seed), iteration)

    # ------------------------------------------------------------------ one step

    def step(self) -> dict:
        """One RL iteration; returns its metrics (also appended to ``history``)."""
        t = {}
        t0 = time.perf_counter()
        batch = next(self.data)
        t["time/data"] = time.perf_counter() - t0
        key = self.rollout_key(self.iteration)
        k_roll, k_mb = jax.random.split(key)

        t0 = time.perf_counter()
        roll = self.sampler(self.state.params, batch.prompt_ids, k_roll, *self.frozen)
        t["time/rollout"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        g = self.recipe.num_samples
        toks, cmask = np.asarray(roll.tokens), np.asarray(roll.mask).astype(bool)
        completions = [self.tokenizer.decode(toks[i][cmask[i]], skip_special_tokens=True) for i in range(len(toks))]
        prompts = [p for p in batch.prompts for _ in range(g)]
        cols = repeat_columns(batch.columns, g)
        out = self.rewards(prompts, completions, completion_ids=[toks[i][cmask[i]].tolist() for i in range(len(toks))],
                           completion_lengths=np.asarray(roll.lengths).tolist(),
                           group_ids=np.asarray(roll.prompt_index).tolist(), **cols)
        t["time/rewards"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        prompt_len = bucket(max(len(p) for p in batch.prompt_ids), self.sampler.length_buckets)
        pad = self.sampler.config.pad_token_id
        arrays = build_rl_batch(batch.prompt_ids, roll, prompt_len, pad)
        adv = self.advantages(out.total, arrays["completion_mask"], arrays["group_ids"], len(batch))
        arrays["advantages"] = to_target_aligned(adv.astype(np.float32), prompt_len)
        if self.recipe.old_logp == "recompute":
            lp = self._logp(self.state.params, self.frozen, arrays["tokens"], arrays["mask"])
            arrays["old_logp"] = np.where(arrays["loss_mask"], np.asarray(lp), 0.0).astype(np.float32)
        if self.ref_params is not None:
            lp = self._logp(self.ref_params, self.frozen, arrays["tokens"], arrays["mask"])
            arrays["ref_logp"] = np.where(arrays["loss_mask"], np.asarray(lp), 0.0).astype(np.float32)
        train = {k: v for k, v in arrays.items() if k in TRAIN_KEYS}
        t["time/prepare"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        step_metrics = []
        for epoch in range(self.recipe.epochs):
            k_epoch = jax.random.fold_in(k_mb, epoch)
            for mb in minibatches(train, self.recipe.num_minibatches, k_epoch):
                self.state, m = self.train_step(self.state, mb, *self.frozen)
                step_metrics.append(m)
        step_metrics = jax.device_get(step_metrics)
        t["time/update"] = time.perf_counter() - t0
        self.iteration += 1

        lengths = np.asarray(roll.lengths)
        metrics: dict[str, Any] = {"step": int(self.state.step), "iteration": self.iteration}
        metrics.update({k: float(np.mean([m[k] for m in step_metrics])) for k in step_metrics[0]})
        metrics["skipped_updates"] = float(sum(m["skipped"] for m in step_metrics))
        metrics.update(out.metrics)
        metrics.update({"response/length_mean": float(lengths.mean()), "response/length_max": float(lengths.max()),
                        "response/stopped_frac": float(np.mean(roll.stopped)),
                        "advantages/mean": float(adv[cmask].mean()) if cmask.any() else 0.0,
                        "advantages/std": float(adv[cmask].std()) if cmask.any() else 0.0,
                        "tokens_per_s": float(cmask.sum() / max(t["time/rollout"], 1e-9))})
        metrics.update(t)
        return metrics

    # ------------------------------------------------------------------ the run

    def save(self, metrics: dict | None = None) -> None:
        if self.checkpointer is None:
            return
        self.checkpointer.save(self.iteration, self.state, data_state=self.data.get_state(),
                               loop={"iteration": self.iteration, "seed": self.seed}, config=self.config,
                               history=self.history, metrics=metrics)

    def restore(self) -> bool:
        """Resume from the latest checkpoint, if any; True if one was restored."""
        if self.checkpointer is None or self.checkpointer.latest_step() is None:
            return False
        self.state, record = self.checkpointer.restore(self.state)
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

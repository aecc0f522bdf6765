"""``recipe.batch_filter`` (PF-PPO): a resample of the valid rows after the advantages
(:data:`jaxrl_llm.algorithms.BATCH_FILTERS`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.training.parts.base import LoopPart, loop_part

__all__ = ["BatchFilter"]


@loop_part
class BatchFilter(LoopPart):
    """Its key is its own stream of the iteration's key (never a mini-batch shuffling key); the
    rows as sampled stay in ``step.unfiltered`` for the per-prompt bookkeeping."""

    key = "recipe.batch_filter"
    phases = frozenset({"filter"})

    def __init__(self, bound):
        self.bound, self.name = bound, bound.name

    @classmethod
    def from_run(cls, run):
        bf = run.recipe.batch_filter
        return None if bf is None else cls(bf)

    def filter(self, ctx, step):
        key = jax.random.fold_in(ctx.rollout_key(ctx.iteration), 1 << 20)
        idx = np.asarray(self.bound(key, jnp.asarray(step.scores), jnp.asarray(step.valid)))
        n = len(step.scores)

        def take(v):
            return v[idx] if np.ndim(v) and v.shape[0] == n else v
        step.unfiltered = (step.arrays, step.scores, step.valid)
        step.arrays = {k: take(v) for k, v in step.arrays.items()}
        step.inputs = {k: take(np.asarray(v)) for k, v in step.inputs.items()}
        step.scores, step.valid = step.scores[idx], step.valid[idx]
        step.metrics["batch_filter/unique_rows"] = float(len(np.unique(idx)))
        return step

"""SPA-RL's progress estimator (``recipe.advantage=spa``, agent runs): scores each turn with the
model before the step's update, then is fitted on the same episodes; checkpointed as ``progress``."""

from __future__ import annotations

from functools import partial

import jax
import numpy as np

from jaxrl_llm.config import ConfigError
from jaxrl_llm.training.parts.base import LoopPart, Need, loop_part
from jaxrl_llm.training.rl import minibatches

__all__ = ["Progress"]


@partial(jax.jit, static_argnums=(0,))
def _contributions(graphdef, params, others, tokens, mask, turn_end, turn_mask):
    """``[N, K]`` the progress estimator's per-turn outputs (SPA-RL's contributions)."""
    from flax import nnx

    from jaxrl_llm.training.objectives import turn_contributions

    model = nnx.merge(graphdef, params, *others)
    return turn_contributions(model, {"tokens": tokens, "mask": mask, "turn_end": turn_end, "turn_mask": turn_mask})


@loop_part
class Progress(LoopPart):
    key = "recipe.advantage=spa"
    phases = frozenset({"assemble", "after_update"})
    requires = (Need("episodes", "SPA-RL's progress estimator scores the turns of episodes: run it as an agent "
                                 "experiment"),)
    array_key = "progress"
    model_arg = "progress"
    model_unused = ("progress estimator given but recipe {recipe.name!r} (estimator {recipe.estimator.name!r}) does "
                    "not read progress")

    def __init__(self, model, recipe):
        self.model, self.recipe, self.name = model, recipe, recipe.estimator.name
        self._batch: dict | None = None
        self._metrics: list = []

    @property
    def label(self) -> str:
        return f"recipe.advantage={self.name} (its progress estimator)"

    @classmethod
    def from_run(cls, run):
        rec = run.recipe
        if not rec.needs_progress_model:
            return None
        if run.models and run.progress is None:
            raise ConfigError(f"recipe {rec.name!r} (estimator {rec.estimator.name!r}) reads a progress estimator's "
                              f"contributions: pass progress=Critic.create(cfg, optimizer, ProgressObjective(), "
                              f"policy_params=...)")
        return cls(run.progress, rec)

    def assemble(self, ctx, step):
        a, p = step.arrays, self.model
        pb = {"tokens": a["tokens"], "mask": a["mask"], "turn_end": step.extra["turn_end"],
              "turn_mask": step.extra["turn_mask"], "outcome": np.asarray(step.scores).astype(np.float32)}
        c = np.asarray(_contributions(p.graphdef, p.state.params, p.frozen,
                                      *(pb[x] for x in ("tokens", "mask", "turn_end", "turn_mask"))))
        step.inputs["progress"] = c
        self._batch = pb
        tm = pb["turn_mask"]
        step.metrics.update({"progress/contribution_mean": float(c[tm].mean()) if tm.any() else 0.0,
                             "progress/sum_error_mean": float(np.mean(np.abs(c.sum(1) - pb["outcome"])))})
        return step

    def after_update(self, ctx, step):
        """Epochs x mini-batches of the recipe on this step's episodes, shuffled with its own
        stream of the mini-batch key."""
        rec, p = self.recipe, self.model
        key = jax.random.fold_in(ctx.current.k_mb, 1 << 21)
        ms = []
        for epoch in range(rec.epochs):
            for mb in minibatches(self._batch, rec.num_minibatches, jax.random.fold_in(key, epoch)):
                p.state, m = p.train_step(p.state, mb, *p.frozen)
                ms.append(m)
        self._metrics = jax.device_get(ms)
        self._batch = None
        return step

    def metrics(self):
        pm = self._metrics
        return {f"progress/{k}": float(np.mean([m[k] for m in pm])) for k in pm[0]} if pm else {}

    def arrays(self):
        return self.model.state

    def load_arrays(self, arrays):
        self.model.state = arrays

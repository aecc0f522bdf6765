"""The critic of estimators that read values (PPO's GAE): fitted on the policy's mini-batches,
checkpointed as ``critic``."""

from __future__ import annotations

import jax
import numpy as np

from jaxrl_llm.config import ConfigError
from jaxrl_llm.training.parts.base import LoopPart, loop_part
from jaxrl_llm.training.rl import to_target_aligned

__all__ = ["CriticPart"]


@loop_part
class CriticPart(LoopPart):
    """Writes the estimator's ``returns`` into the train arrays and takes one critic step per
    mini-batch before the policy's; the policy waits ``recipe.critic_warmup`` iterations."""

    key = "recipe.critic"
    phases = frozenset({"estimate", "update"})
    array_key = "critic"
    model_arg = "critic"
    model_unused = "critic given but recipe {recipe.name!r} (estimator {recipe.estimator.name!r}) uses no critic"

    def __init__(self, critic, recipe):
        self.critic, self.recipe, self.name = critic, recipe, recipe.estimator.name
        self._metrics: list = []

    @classmethod
    def from_run(cls, run):
        rec = run.recipe
        if not rec.needs_critic:
            return None
        if run.models and run.critic is None:
            raise ConfigError(f"recipe {rec.name!r} estimates advantages from a critic's values: pass critic=Critic(...) "
                              f"(e.g. Critic.create(cfg, optimizer, recipe.value_objective, policy_params=...))")
        return cls(run.critic, rec)

    def estimate(self, ctx, step):
        step.arrays["returns"] = to_target_aligned(np.asarray(step.returns, np.float32), step.prompt_len)
        return step

    def update(self, ctx, plan):
        keys = self.recipe.value_objective.batch_keys()
        plan.keys |= set(keys)
        plan.train_policy = plan.train_policy and ctx.iteration >= self.recipe.critic_warmup
        self._metrics = []
        c = self.critic

        def step(mb):
            c.state, m = c.train_step(c.state, {k: mb[k] for k in keys}, *c.frozen)
            self._metrics.append(m)
        plan.steps.append(step)
        return plan

    def metrics(self):
        ms = jax.device_get(self._metrics)
        return {f"critic/{k}": float(np.mean([m[k] for m in ms])) for k in ms[0]} if ms else {}

    def arrays(self):
        return self.critic.state

    def load_arrays(self, arrays):
        self.critic.state = arrays

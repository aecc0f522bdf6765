"""Off-policy sampling: ``rollout.staleness = k`` samples each step with the policy of ``k``
updates before; ``rollout.sampler_dtype`` samples with cast weights. Both keep the sampler's
log-probs as ``rollout_logp`` beside the recomputed old ones and log their mismatch."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.config import ConfigError
from jaxrl_llm.core.policy_losses import ratio_metrics
from jaxrl_llm.training.parts.base import Clash, LoopPart, Need, loop_part

__all__ = ["Staleness", "SamplerCast", "behaviour_metrics"]


def behaviour_metrics(step, prefix: str) -> None:
    """The sampler's (behaviour) log-probs against the recomputed old ones over the trained
    tokens, as ``<prefix>/*`` metrics."""
    a = step.arrays
    lm = a["loss_mask"] & step.valid[:, None]
    met = ratio_metrics(jnp.asarray(a["old_logp"] - a["rollout_logp"]), jnp.asarray(lm))
    step.metrics.update({f"{prefix}/{k}": float(v) for k, v in met.items()})


@loop_part
class Staleness(LoopPart):
    """The policies of the last ``k`` updates, oldest first (copies: the train step donates its
    state); the initial policy for the first ``k`` steps. Checkpointed as ``stale_params``."""

    key = "rollout.staleness"
    phases = frozenset({"sample", "assemble", "update", "after_update"})
    requires = (Need("old_logp=recompute", "set recipe.old_logp=recompute (the ratio's old policy is then the current "
                                           "one, and the sampler's log-probs feed the importance correction)"),)
    provides = frozenset({"stale_policy"})
    conflicts = (Clash("episodes", "the agent loop samples with the current policy (stale rollouts are for "
                                   "single-turn runs)"),)
    reads = frozenset({"rollout_logp"})
    array_key = "stale_params"

    def __init__(self, k: int):
        self.k, self.name = k, str(k)
        self.stale: list = []
        self.current = None

    @classmethod
    def from_run(cls, run):
        k = run.staleness
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ConfigError(f"rollout.staleness must be an int >= 0, got {k!r}")
        return cls(k) if k else None

    def attach(self, ctx):
        self.stale = [jax.tree.map(jnp.copy, ctx.state.params)] * self.k

    def upcoming(self):
        """The policy the next step samples with, once this step's update is done."""
        return (self.stale[1:] + [self.current])[0]

    def sample(self, ctx, rnd):
        rnd.params = self.stale[0]
        return rnd

    def assemble(self, ctx, step):
        behaviour_metrics(step, "offpolicy")
        step.metrics["offpolicy/staleness"] = float(self.k)
        return step

    def update(self, ctx, plan):
        # the policy being updated now is the one the step k steps later samples with
        self.current = jax.tree.map(jnp.copy, ctx.state.params)
        return plan

    def after_update(self, ctx, step):
        self.stale, self.current = self.stale[1:] + [self.current], None
        return step

    def arrays(self):
        return list(self.stale)

    def load_arrays(self, arrays):
        self.stale = list(arrays)


@loop_part
class SamplerCast(LoopPart):
    """The sampler decodes with weights cast to ``rollout.sampler_dtype``: its log-probs are
    another model's, so the ratio's old policy is recomputed with the training weights."""

    key = "rollout.sampler_dtype"
    phases = frozenset({"assemble"})
    requires = (Need("old_logp=recompute", "set recipe.old_logp=recompute (the sampler decodes with cast weights "
                                           "(SamplingConfig.weight_dtype): the ratio's old policy is then the training "
                                           "weights', and the sampler's log-probs feed the mismatch metrics and the "
                                           "importance correction)"),)
    reads = frozenset({"rollout_logp"})

    def __init__(self, dtype: str):
        self.name = str(dtype)

    @classmethod
    def from_run(cls, run):
        return None if run.sampler_dtype is None else cls(run.sampler_dtype)

    def assemble(self, ctx, step):
        behaviour_metrics(step, "sampler_mismatch")
        return step

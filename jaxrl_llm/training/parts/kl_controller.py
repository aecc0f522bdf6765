"""``recipe.kl.controller``: the adaptive KL coefficient, updated once per iteration from the
batch's KL and checkpointed as ``kl_controller``."""

from __future__ import annotations

import numpy as np

from jaxrl_llm.training.parts.base import LoopPart, loop_part

__all__ = ["KLController"]


@loop_part
class KLController(LoopPart):
    """The coefficient reaches the estimator (a KL in the reward) as ``step.kl_coef`` and the loss
    (``kl_coef`` per row) through the train arrays; after the step the controller moves it towards
    its target with the reward's KL, or the loss term's as measured by the train steps."""

    key = "recipe.kl.controller"
    phases = frozenset({"assemble", "observe"})
    array_key = "kl_controller"

    def __init__(self, controller):
        self.controller, self.name = controller, getattr(controller, "name", "adaptive")
        self.state = controller.init()

    @classmethod
    def from_run(cls, run):
        c = run.recipe.kl_controller
        return None if c is None else cls(c)

    def assemble(self, ctx, step):
        rec = ctx.recipe
        if rec.kl_reward is not None and rec.kl_reward.adaptive:
            step.kl_coef = self.state.coef
        if rec.objective.kl_coef_from_batch:
            step.arrays["kl_coef"] = np.full((step.arrays["tokens"].shape[0],), float(self.state.coef), np.float32)
        return step

    def observe(self, ctx, step):
        if ctx.recipe.kl_reward is not None:
            current = step.metrics["kl_in_reward/seq_mean"]
        elif ctx.current.policy_metrics:
            current = float(np.mean([m["policy/kl_ref"] for m in ctx.current.policy_metrics]))
        else:
            return step
        self.state = self.controller.update(self.state, current, int(step.valid.sum()))
        step.metrics["kl/coef"] = float(self.state.coef)
        return step

    def arrays(self):
        return self.state

    def load_arrays(self, arrays):
        self.state = arrays

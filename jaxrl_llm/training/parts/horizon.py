"""``env.horizon``: a schedule of the agent loop's policy-turn cap over training steps
(:data:`jaxrl_llm.algorithms.HORIZONS`); with ``env.max_turns`` the smaller applies."""

from __future__ import annotations

from jaxrl_llm.training.parts.base import LoopPart, Need, loop_part

__all__ = ["Horizon"]


@loop_part
class Horizon(LoopPart):
    key = "env.horizon"
    phases = frozenset({"sample"})
    requires = (Need("episodes", "a turn-cap schedule applies to an agent run's episodes"),)

    def __init__(self, schedule):
        self.schedule, self.name = schedule, getattr(schedule, "name", "schedule")

    @classmethod
    def from_run(cls, run):
        return None if run.horizon is None else cls(run.horizon)

    def sample(self, ctx, rnd):
        cap = self.schedule(ctx.iteration)
        rnd.turn_cap = cap if rnd.turn_cap is None else min(rnd.turn_cap, cap)
        return rnd

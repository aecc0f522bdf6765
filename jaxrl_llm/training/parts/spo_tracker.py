"""SPO's tracker (``recipe.advantage=single_stream_po``): each prompt's success probability as a
Beta posterior in the prompt store's slot, updated after the policy update."""

from __future__ import annotations

from jaxrl_llm.algorithms.selection import SPO_SLOT
from jaxrl_llm.training.parts.base import Clash, LoopPart, loop_part
from jaxrl_llm.training.providers import spo_update

__all__ = ["SPOTracker"]


@loop_part
class SPOTracker(LoopPart):
    key = "recipe.advantage=single_stream_po"
    phases = frozenset({"after_update"})
    conflicts = (Clash("episodes", "SPO's tracker follows single-turn prompts; the agent loop does not run it"),)

    @property
    def label(self) -> str:
        return "recipe.advantage=single_stream_po (its tracker)"

    @classmethod
    def from_run(cls, run):
        return cls() if "spo_value" in run.recipe.requires else None

    def attach(self, ctx):
        ctx.store.slot(SPO_SLOT)  # prompt selectors may read it from the first step

    def after_update(self, ctx, step):
        spo_update(ctx, step)
        return step

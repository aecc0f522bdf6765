"""``recipe.allocator``: rollouts per prompt from the prompt store (:data:`jaxrl_llm.algorithms.ALLOCATORS`)."""

from __future__ import annotations

import types

from jaxrl_llm.algorithms.allocation import AllocateInputs, check_allocation, history_window
from jaxrl_llm.training.parts.base import Clash, LoopPart, loop_part
from jaxrl_llm.training.prompt_store import prompt_keys

__all__ = ["Allocator"]


@loop_part
class Allocator(LoopPart):
    """Divides the round's ``B x num_samples`` rollouts among its prompts (a prompt given none
    leaves the round), from the store as it was when the step began."""

    key = "recipe.allocator"
    phases = frozenset({"allocate"})
    conflicts = (Clash("episodes", "it divides single-turn rollouts; the agent loop does not run it"),)

    def __init__(self, bound):
        self.bound, self.name = bound, bound.name
        self._metrics: dict[str, float] = {}

    @classmethod
    def from_run(cls, run):
        a = run.recipe.allocator
        return None if a is None else cls(a)

    def attach(self, ctx):
        window = history_window(self.bound)
        if window and ctx.store.recent_window != window:
            if len(ctx.store):
                raise ValueError(f"recipe.allocator={self.name} reads each prompt's last {window} outcomes, but the "
                                 f"given store (with records) keeps {ctx.store.recent_window}")
            ctx.store.recent_window = window

    def allocate(self, ctx, rnd):
        keys = prompt_keys(rnd.batch.where, rnd.batch.columns)
        g, store = ctx.recipe.num_samples, ctx.store
        x = AllocateInputs(tuple(keys), types.MappingProxyType(store.records), store.lookup(keys), g,
                           len(keys) * g, ctx.iteration, types.MappingProxyType(store.slots))
        counts, metrics = self.bound(x)
        counts = check_allocation(self.name, counts, len(keys), len(keys) * g)
        self._metrics = {**dict(metrics), "allocation/max": float(counts.max()),
                         "allocation/min": float(counts.min()),
                         "allocation/unsampled_prompts": float((counts == 0).sum())}
        rnd.counts = counts
        return rnd

    def metrics(self):
        return dict(self._metrics)

"""``recipe.group_filter`` (DAPO's dynamic sampling): which groups of a round are kept, and up
to how many rounds a step samples (:data:`jaxrl_llm.algorithms.GROUP_FILTERS`)."""

from __future__ import annotations

import numpy as np

from jaxrl_llm.training.parts.base import Clash, LoopPart, loop_part

__all__ = ["GroupFilterPart"]


@loop_part
class GroupFilterPart(LoopPart):
    """Rounds continue until a batch of groups is kept or ``max_rounds`` are done (the loop's
    ``collect``); with more than one round, the groups left over fill the batch as invalid rows
    and the ``sampling/*`` metrics count them."""

    key = "recipe.group_filter"
    phases = frozenset({"keep", "observe"})
    conflicts = (Clash("episodes", "group filters re-sample single-turn prompts; the agent loop does not run them"),)

    def __init__(self, gf, name: str):
        self.gf, self.name = gf, name
        self.max_rounds = gf.max_rounds

    @classmethod
    def from_run(cls, run):
        gf = run.recipe.group_filter
        spec = getattr(run.recipe, "spec", None)
        name = getattr(getattr(spec, "group_filter", None), "name", "") or ""
        if run.episodes and gf.max_rounds == 1:  # keeps every group: nothing to run in an agent loop
            return None
        return cls(gf, name)

    def keep(self, ctx, rnd):
        out = rnd.t_out
        rnd.keep = self.gf.keep(self.gf.values(out.total, out.per_fn), np.asarray(rnd.roll.prompt_index),
                                len(rnd.batch))
        return rnd

    def observe(self, ctx, step):
        if self.max_rounds > 1:
            cur = ctx.current
            chosen = min(len(cur.kept), cur.target)
            step.metrics.update({"sampling/rounds": float(len(cur.rounds)),
                                 "sampling/generated_groups": float(sum(len(x.batch) for x in cur.rounds)),
                                 "sampling/kept_groups": float(len(cur.kept)), "sampling/train_groups": float(chosen),
                                 "sampling/filler_groups": float(len(step.prompt_ids) - chosen),
                                 "sampling/empty_minibatches": float(cur.empty)})
        return step

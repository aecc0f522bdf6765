"""``recipe.replay``: a buffer of earlier responses that replaces rows of a scored round
(:data:`jaxrl_llm.algorithms.REPLAYS`); the buffer lives in the prompt store's slot."""

from __future__ import annotations

import copy

import numpy as np

from jaxrl_llm.algorithms.replay import ReplayInputs, apply_replacements, entry_of
from jaxrl_llm.algorithms.sampling import metric_values
from jaxrl_llm.training.parts.base import Clash, LoopPart, loop_part

__all__ = ["Replay"]

_SUMMED = ("replay/collapsed_groups", "replay/injected")


@loop_part
class Replay(LoopPart):
    """Replaces rows of each round (after hints) with stored responses; the buffer is updated
    with the round as sampled."""

    key = "recipe.replay"
    phases = frozenset({"resample"})
    conflicts = (Clash("episodes", "it replaces single-turn responses; the agent loop does not run it"),)

    def __init__(self, bound):
        self.bound, self.name = bound, bound.name
        self._metrics: dict[str, float] = {}

    @classmethod
    def from_run(cls, run):
        r = run.recipe.replay
        return None if r is None else cls(r)

    def metrics(self):
        return dict(self._metrics)

    def resample(self, ctx, rnd):
        if rnd.index == 0:
            self._metrics = {}
        roll, out = rnd.t_roll, rnd.t_out
        name = f"replay/{self.name}"
        rng = np.random.default_rng([ctx.seed, ctx.iteration, rnd.index, 0x4E9A1])
        x = ReplayInputs(tuple(rnd.keys), metric_values(out.total, out.per_fn, dict(self.bound.kwargs).get("metric"),
                                                        "recipe.replay"),
                         np.asarray(roll.prompt_index), rng, copy.deepcopy(ctx.store.slot(name)),
                         lambda i: entry_of(roll, out, i, ctx.iteration), ctx.iteration)
        replace, buf, metrics = self.bound(x)
        ctx.store.slots[name] = dict(buf)
        for k, v in metrics.items():
            self._metrics[k] = self._metrics.get(k, 0.0) + v if k in _SUMMED else v
        new_roll, new_out = apply_replacements(roll, out, replace)
        if new_roll is not rnd.roll:
            rnd.train_roll = new_roll
        if new_out is not rnd.out:
            rnd.train_out = new_out
        return rnd

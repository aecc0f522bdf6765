"""``recipe.truncation`` (DOT): responses cut to the lengths the part returns before training,
the cut groups scored again (:data:`jaxrl_llm.algorithms.TRUNCATIONS`)."""

from __future__ import annotations

import numpy as np

from jaxrl_llm.algorithms.sampling import ShapingInputs
from jaxrl_llm.rewards.base import RewardOutput
from jaxrl_llm.training.parts.base import Clash, LoopPart, loop_part
from jaxrl_llm.training.rounds import merge_reward_metrics, take_rollout_rows

__all__ = ["Truncation"]


@loop_part
class Truncation(LoopPart):
    key = "recipe.truncation"
    phases = frozenset({"truncate"})
    conflicts = (Clash("episodes", "it cuts single-turn completions; the agent loop does not run it"),)

    def __init__(self, bound):
        self.bound, self.name = bound, bound.name
        self.cut = 0

    @classmethod
    def from_run(cls, run):
        t = run.recipe.truncation
        return None if t is None else cls(t)

    def metrics(self):
        return {"truncation/responses": float(self.cut)}

    def truncate(self, ctx, rnd):
        if rnd.index == 0:
            self.cut = 0
        batch, roll, out = rnd.batch, rnd.roll, rnd.out
        lengths = np.asarray(roll.lengths)
        x = ShapingInputs(np.asarray(out.total, np.float32), lengths, np.asarray(roll.prompt_index), len(batch),
                          ctx.sampler.config.max_new_tokens, out.per_fn, (), tuple(batch.prompts), ctx.iteration)
        new = np.minimum(np.asarray(self.bound(x)), lengths)
        cut = new < lengths
        if not cut.any():
            return rnd
        mask = np.asarray(roll.mask).astype(bool) & (np.arange(np.shape(roll.mask)[1])[None] < new[:, None])
        roll = roll._replace(mask=mask, lengths=new.astype(np.asarray(roll.lengths).dtype),
                             stopped=np.asarray(roll.stopped) & ~cut)
        # score again only the groups with a cut response (whole groups: reward functions see
        # group ids), the other rows keep their scores
        pidx = np.asarray(roll.prompt_index)
        groups = np.unique(pidx[cut])
        rows = np.flatnonzero(np.isin(pidx, groups))
        again = ctx.score([batch.prompts[i] for i in groups],
                          {k: [list(v)[i] for i in groups] for k, v in batch.columns.items()},
                          take_rollout_rows(roll, rows))
        total = np.array(out.total, copy=True)
        total[rows] = again.total
        per_fn, failed = {}, {}
        for k in out.per_fn:
            per_fn[k] = np.array(out.per_fn[k], copy=True)
            per_fn[k][rows] = again.per_fn[k]
            failed[k] = np.array(out.failed[k], copy=True)
            failed[k][rows] = again.failed[k]
        keep = np.ones(len(total), bool)
        keep[rows] = False
        # metrics: means and stds of the final scores; counts and seconds of both calls
        first = RewardOutput(total[keep], {k: v[keep] for k, v in per_fn.items()}, {}, out.metrics)
        rnd.roll, rnd.out = roll, RewardOutput(total, per_fn, failed, merge_reward_metrics([first, again]))
        self.cut += int(cut.sum())
        return rnd

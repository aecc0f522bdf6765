"""ReST-GRPO's variance filter (ReST-RL, Zhoubian et al., arXiv:2508.19576; METHODS.md #194),
as a loop part: ``recipe.loop_part=variance_filter``.

GRPO learns nothing from a group whose rewards are all equal, and little from one whose rewards
barely differ. ReST-GRPO's first stage keeps for training only the prompts whose sampled rewards
vary: the authors' data script (THUDM/ReST-RL @b86959b, ``experiment/process_gen_data.py``) drops
a prompt when ``np.std(rewards) < std_accept_threshold_grpo`` (default 0.05) over its sampled
completions. This part does that online, during training:

- **observe**: for every group trained this step, ``std`` of its valid rows' reward totals
  (before shaping; population std, as numpy); below ``min_std`` the prompt's key is set aside
  until iteration ``t + cooldown`` (in the prompt store's slot ``variance_filter``, so it is
  checkpointed with the loop and a resumed run is bit for bit the same);
- **select**: each data batch's set-aside prompts are replaced, in order, by the next prompts of
  the data iterator that are not set aside (at most ``max_draws`` further batches are read; when
  they run out, the remaining set-aside prompts are trained after all and counted).

``min_std`` = 0.05 and the strict ``<`` on the population std are the authors'. What is not
reproduced: their filter runs offline on completions sampled before a training round, and the
prompts it keeps also give new prompts (line prefixes of their best completion, when its reward
reaches ``completion_accept_threshold_grpo``); ``cooldown`` (how long a prompt stays out) and
``max_draws`` are this library's. Metrics: ``variance_filter/set_aside`` (prompts out now),
``variance_filter/set_aside_now`` (set aside by this step), ``variance_filter/replaced`` and
``variance_filter/kept_anyway`` (this step's batch).
"""

from __future__ import annotations

import numpy as np

from jaxrl_llm.algorithms.registry import Part
from jaxrl_llm.config import ConfigError
from jaxrl_llm.training.parts.base import Clash, loop_part
from jaxrl_llm.training.parts.options import LOOP_PART_OPTIONS, NamedLoopPart
from jaxrl_llm.training.prompt_store import prompt_keys
from jaxrl_llm.training.rounds import concat, subset

__all__ = ["VarianceFilter"]

SLOT = "variance_filter"


@loop_part
class VarianceFilter(NamedLoopPart):
    key = "recipe.loop_part=variance_filter"
    phases = frozenset({"select", "observe"})
    keeps_prompt_state = True
    conflicts = (Clash("recipe.selector", "both choose the step's prompts (a selector among candidates)"),
                 Clash("rollout.asynchronous", "the next step's prompts are drawn before this step sets any aside"),
                 Clash("episodes", "it filters data prompts; the agent loop draws environment seeds"))

    def __init__(self, *, min_std: float = 0.05, cooldown: int = 50, max_draws: int = 4):
        if not (isinstance(min_std, (int, float)) and min_std >= 0):
            raise ConfigError(f"recipe.loop_part.min_std must be a number >= 0, got {min_std!r}")
        for name, v in (("cooldown", cooldown), ("max_draws", max_draws)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"recipe.loop_part.{name} must be an int >= 0, got {v!r}")
        self.min_std, self.cooldown, self.max_draws = float(min_std), cooldown, max_draws
        self.name = "variance_filter"
        self._metrics: dict[str, float] = {}

    def _aside(self, ctx, keys) -> np.ndarray:
        until = ctx.store.slot(SLOT)
        return np.array([until.get(k, -1) > ctx.iteration for k in keys], bool)

    def select(self, ctx, batch):
        keys = prompt_keys(batch.where, batch.columns)
        aside = self._aside(ctx, keys)
        self._metrics = {"variance_filter/replaced": 0.0, "variance_filter/kept_anyway": 0.0}
        if not aside.any():
            return batch
        need = int(aside.sum())
        batches, fresh = [batch], []  # fresh: replacements' positions in concat(batches), in data order
        for _ in range(self.max_draws):
            if len(fresh) >= need:
                break
            more = next(ctx.data)
            start = sum(len(b) for b in batches)
            batches.append(more)
            fresh += [start + i for i in np.flatnonzero(~self._aside(ctx, prompt_keys(more.where, more.columns)))]
        take = fresh[:need]
        left = list(np.flatnonzero(aside)[:need - len(take)])  # ran out of replacements: trained after all
        self._metrics = {"variance_filter/replaced": float(len(take)),
                         "variance_filter/kept_anyway": float(len(left))}
        return subset(concat(batches), [int(i) for i in [*np.flatnonzero(~aside), *take, *left]])

    def observe(self, ctx, step):
        until = ctx.store.slot(SLOT)
        arrays, _, valid = step.rows_as_sampled()
        gid = np.asarray(arrays["group_ids"])
        totals = np.asarray(step.totals, np.float64)  # the rows as sampled (before a batch filter)
        now = 0
        for g, key in enumerate(step.keys):
            rows = (gid == g) & np.asarray(valid)
            if rows.sum() >= 2 and totals[rows].std() < self.min_std:
                until[key] = ctx.iteration + 1 + self.cooldown
                now += 1
        for key in [k for k, t in until.items() if t <= ctx.iteration + 1]:  # back in the pool
            del until[key]
        step.metrics["variance_filter/set_aside"] = float(len(until))
        step.metrics["variance_filter/set_aside_now"] = float(now)
        return step


LOOP_PART_OPTIONS.register(Part(
    "variance_filter", VarianceFilter,
    paper="ReST-RL: Achieving Accurate Code Reasoning of LLMs with Optimized Self-Training and Decoding "
          "(Zhoubian et al.), arXiv:2508.19576",
    methods=(194,), verified="hand values; threshold rule from the authors' code (THUDM/ReST-RL @b86959b)",
    tests="tests/training/test_variance_filter.py",
    note="ReST-GRPO's data filter online: a prompt whose group reward std < min_std (0.05, the authors') is set "
         "aside for cooldown steps and replaced by the next data prompts; the offline pass and the partial-solution "
         "prompts are not reproduced"))

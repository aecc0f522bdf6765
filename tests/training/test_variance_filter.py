"""ReST-GRPO's variance filter (recipe.loop_part=variance_filter, METHODS.md #194): a loop part
added as one module and one registry entry (docs/extending.md, second walk-through)."""

import dataclasses
import types

import numpy as np
import pytest

from jaxrl_llm.config import ConfigError
from jaxrl_llm.data.pipeline import PromptBatch
from jaxrl_llm.training.parts.variance_filter import SLOT, VarianceFilter
from jaxrl_llm.training.prompt_store import PromptStore
from jaxrl_llm.training.providers import StepBatch
from test_rl_recipes_extra import PROMPTS, make, max_diff, resumed_after_one_step, varied_or_const, without_timings


def batch(idx):
    ids = [[i + 1] for i in idx]
    return PromptBatch(ids, [str(i) for i in idx], ids, {"n": list(idx)}, [f"toy:{i}" for i in idx])


def test_set_aside_and_replacement_by_hand():
    part = VarianceFilter(min_std=0.1, cooldown=2, max_draws=1)
    ctx = types.SimpleNamespace(store=PromptStore(), iteration=5, data=None)
    # groups of 3 rows: stds 0 (all equal), 0.0471 (< 0.1), 0.4714, and a group with one valid row
    totals = np.array([1, 1, 1, 0.1, 0.2, 0.2, 0, 1, 0, 0, 1, 1], np.float64)
    gid = np.repeat(np.arange(4), 3)
    valid = np.ones(12, bool)
    valid[10:] = False
    step = StepBatch({"group_ids": gid}, totals.astype(np.float32), valid, 1, ["a", "b", "c", "d"],
                     [[1]] * 4, {}, {}, keys=["toy:0", "toy:1", "toy:2", "toy:3"], totals=totals)
    part.observe(ctx, step)
    # set aside until iteration 5 + 1 + 2: in the batches of iterations 6 and 7, back at 8
    assert ctx.store.slot(SLOT) == {"toy:0": 8, "toy:1": 8}
    assert step.metrics["variance_filter/set_aside"] == 2 and step.metrics["variance_filter/set_aside_now"] == 2
    ctx.iteration = 6
    ctx.data = iter([batch([1, 4, 0, 5])])
    out = part.select(ctx, batch([0, 1, 2, 3]))
    # toy:0 and toy:1 replaced, in order, by the next batch's prompts that are not set aside
    assert out.where == ["toy:2", "toy:3", "toy:4", "toy:5"] and out.columns["n"] == [2, 3, 4, 5]
    assert part.metrics() == {"variance_filter/replaced": 2.0, "variance_filter/kept_anyway": 0.0}
    ctx.data = iter([batch([1, 0, 1, 4])])  # only one usable replacement within max_draws=1
    out = part.select(ctx, batch([0, 1, 2, 3]))
    assert out.where == ["toy:2", "toy:3", "toy:4", "toy:0"]
    assert part.metrics() == {"variance_filter/replaced": 1.0, "variance_filter/kept_anyway": 1.0}
    ctx.iteration = 8  # the cooldown is over: nothing set aside, the batch as drawn
    assert part.select(ctx, batch([0, 1, 2, 3])).where == ["toy:0", "toy:1", "toy:2", "toy:3"]
    ctx.iteration = 7
    part.observe(ctx, dataclasses.replace(step, metrics={}, totals=totals + np.repeat([0.0, 5.0, 0, 0], 3)))
    assert ctx.store.slot(SLOT) == {"toy:0": 10, "toy:1": 10}  # set aside again, until 7 + 1 + 2
    with pytest.raises(ConfigError, match="min_std must be a number >= 0"):
        VarianceFilter(min_std=-1)
    with pytest.raises(ConfigError, match="cooldown must be an int >= 0"):
        VarianceFilter(cooldown=1.5)


def test_in_the_loop_prompts_without_spread_leave_and_a_resume_is_bitwise(tmp_path):
    """The toy task's even prompts score 0.5 on every sample (no spread): after their first visit
    they are set aside, and the loop trains the next prompts instead; the set-aside list is
    checkpointed with the prompt store, so a resumed run goes on bit for bit."""
    rows = [(p, i % 2 == 0) for i, p in enumerate(PROMPTS)]
    kw = dict(g=4, rows=rows, reward=varied_or_const, loop_part={"name": "variance_filter", "min_std": 1e-6,
                                                                   "cooldown": 3})
    tr = make("grpo", **kw)
    assert [p.key for p in tr.parts if p.key.startswith("recipe.loop_part")] == ["recipe.loop_part=variance_filter"]
    keys, ms = [], []
    for _ in range(3):
        ms.append(tr.step())
        keys.append(list(tr._last_keys))
    assert keys[0] == ["toy:0", "toy:1", "toy:2", "toy:3"] and keys[1] == ["toy:4", "toy:5", "toy:6", "toy:7"]
    # step 3 draws toy:0..3 again: the even ones are set aside and replaced by the next odd ones
    assert keys[2] == ["toy:1", "toy:3", "toy:5", "toy:7"]
    assert ms[2]["variance_filter/replaced"] == 2 and ms[1]["variance_filter/set_aside"] == 4

    resumed = resumed_after_one_step(tmp_path, **kw)
    got = [resumed.step() for _ in range(2)]
    for a, b in zip(got, ms[1:]):
        assert without_timings(a) == without_timings(b)
    assert max_diff(resumed.state.params, tr.state.params) == 0


def test_config_errors_are_one_line():
    from jaxrl_llm.algorithms import RegistryError

    with pytest.raises(RegistryError, match="recipe.loop_part: unknown loop part 'varience_filter'.*variance_filter"):
        make("grpo", g=4, loop_part="varience_filter")
    with pytest.raises(RegistryError, match="recipe.loop_part=variance_filter: unknown argument 'std'"):
        make("grpo", g=4, loop_part={"name": "variance_filter", "std": 1})
    with pytest.raises(ConfigError, match=r"^recipe.loop_part=variance_filter cannot be combined with "
                                          r"recipe.selector=sec: both choose the step's prompts"):
        make("grpo", g=4, candidates=2, selector={"name": "sec", "column": "const"}, loop_part="variance_filter")

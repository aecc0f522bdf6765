"""INSPO (recipe.loop_part=inspo, METHODS.md #42): a population of instructions asked as the
prompts' system message, drawn by softmax over their weights, credited with their groups'
rewards, pruned, checkpointed."""

import types

import numpy as np
import pytest

from jaxrl_llm.config import ConfigError
from jaxrl_llm.data.pipeline import PromptBatch
from jaxrl_llm.training.parts.inspo import INSPO, instruction_probs, with_instruction
from jaxrl_llm.training.providers import StepBatch
from test_hints import HintData, encode_ints
from test_rl_recipes_extra import make, max_diff, without_timings

INSTR = ["1 1", "2 2", "3 3"]


def test_sampling_distribution_and_prompt_rewrite_by_hand():
    p = instruction_probs([0.0, np.log(3.0)], 1.0)
    np.testing.assert_allclose(p, [0.25, 0.75])
    np.testing.assert_allclose(instruction_probs([0.0, np.log(3.0)], 2.0), [1 / (1 + np.sqrt(3)), np.sqrt(3) / (1 + np.sqrt(3))])
    assert with_instruction("q", "be brief") == "be brief\nq"
    chat = [{"role": "system", "content": "old"}, {"role": "user", "content": "q"}]
    assert with_instruction(chat, "new") == [{"role": "system", "content": "new"}, {"role": "user", "content": "q"}]


def test_credit_and_pruning_by_hand():
    part = INSPO(instructions=INSTR, prune_every=2, min_uses=1, min_population=2)
    part._chosen = {"toy:0": "1 1", "toy:1": "2 2", "toy:2": "1 1"}
    totals = np.array([1, 1, 0, 0, 0.5, 0.5], np.float64)  # group means 1, 0, 0.5
    step = StepBatch({"group_ids": np.repeat(np.arange(3), 2)}, totals.astype(np.float32), np.ones(6, bool), 1,
                     ["a", "b", "c"], [[1]] * 3, {}, {}, keys=["toy:0", "toy:1", "toy:2"], totals=totals)
    part.observe(types.SimpleNamespace(iteration=1), step)  # iteration 1: (1 + 1) % 2 == 0, a pruning step
    assert part.uses == {"1 1": 2, "2 2": 1, "3 3": 0}
    assert part.weight("1 1") == 0.75 and part.weight("2 2") == 0.0 and part.weight("3 3") == 0.0
    # "3 3" is unused (fewer than min_uses credits): the worst used one, "2 2", goes
    assert part.population == ["1 1", "3 3"] and step.metrics["inspo/pruned"] == 1.0
    state = part.state_dict()
    again = INSPO(instructions=INSTR)
    again.load_state_dict(state)
    assert again.population == part.population and again.weight("1 1") == 0.75
    with pytest.raises(ConfigError, match="instructions must be a list"):
        INSPO(instructions="just one")
    with pytest.raises(ConfigError, match="duplicates"):
        INSPO(instructions=["a", "a"])


def test_in_the_loop_prompts_carry_their_instruction_and_a_resume_is_exact(tmp_path):
    from jaxrl_llm.training import Checkpointer

    def kw():  # a fresh data iterator each time (its state is the checkpoint's)
        return dict(g=4, prompts_per_step=2, encoder=encode_ints, buckets=(16,), data=HintData(),
                    loop_part={"name": "inspo", "instructions": INSTR, "prune_every": 1, "min_uses": 1})

    tr = make("grpo", **kw())
    ms = [tr.step()]
    tr.checkpointer = Checkpointer(tmp_path, keep_last=1)
    tr.save()
    tr.checkpointer.wait()
    ms += [tr.step() for _ in range(2)]
    assert all(np.isfinite(m["loss"]) for m in ms)
    assert ms[0]["inspo/population"] == 3 and ms[-1]["inspo/population"] < 3  # pruned, one a step
    b = tr.last_batch
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    firsts = {tuple(b["tokens"][i, :p][b["mask"][i, :p]][:2]) for i in range(len(b["tokens"]))}
    assert firsts <= {(1, 1), (2, 2), (3, 3)}  # every prompt starts with an instruction's tokens
    assert ms[-1]["inspo/too_long"] == 0
    resumed = make("grpo", **kw())
    resumed.checkpointer = Checkpointer(tmp_path, keep_last=1)
    assert resumed.restore()
    got = [resumed.step() for _ in range(2)]
    for a, b_ in zip(got, ms[1:]):
        assert without_timings(a) == without_timings(b_)
    assert max_diff(resumed.state.params, tr.state.params) == 0


def test_a_prompt_that_would_not_fit_is_asked_without_an_instruction():
    long = " ".join(["9"] * 20)  # 20 tokens: no prompt fits the 16-token bucket with it
    tr = make("grpo", g=4, prompts_per_step=2, encoder=encode_ints, buckets=(16,), data=HintData(),
              loop_part={"name": "inspo", "instructions": [long]})
    m = tr.step()
    assert m["inspo/too_long"] == 2 and np.isfinite(m["loss"])
    part = tr.parts.get("recipe.loop_part=inspo")
    assert part.uses[long] == 0  # the prompts asked without it credit it nothing

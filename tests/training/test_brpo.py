"""BRPO in the loop (recipe.advantage=brpo with recipe.loop_part=brpo, METHODS.md #13): each
trace cut at the budgets, summaries sampled after the forced end of the thinking and scored, their
means the estimator's input, and each thinking segment's tokens given its budget's advantage.
The formula: tests/core/test_group_advantages.py."""

import numpy as np
import pytest

from test_rl_recipes_extra import T, make, target_frac

import jaxrl_llm.core as C
from jaxrl_llm.algorithms.estimators import budget_bounds
from jaxrl_llm.config import ConfigError


def test_budgets_summaries_and_segment_advantages():
    # the run's prompt bucket holds only the prompt: the summaries get a sampler of their own
    tr = make("grpo", g=4, reward=[target_frac], advantage={"name": "brpo", "prior": "uniform"},
              loop_part={"name": "brpo", "num_budgets": 2, "summaries": 2, "summary_text": ""})
    m = tr.step()
    assert "brpo/score_b0" in m and "brpo/score_b1" in m
    part = tr.parts.get("recipe.loop_part=brpo")
    sc = part._scores[0]
    assert sc.shape[1] == 2 and np.all((sc >= 0) & (sc <= 1))
    b = tr.last_batch
    cm = b["completion_mask"]
    adv = b["advantages"][:, -cm.shape[1]:]
    gid = b["group_ids"]
    want = np.asarray(C.brpo_advantages(sc, gid, int(gid.max()) + 1, prior=C.brpo_budget_prior(2, "uniform")))
    b0, _ = budget_bounds(cm.shape[1], 2)
    for i in range(len(cm)):
        t = np.flatnonzero(cm[i])
        np.testing.assert_allclose(adv[i, t[t < b0]], want[i, 0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(adv[i, t[t >= b0]], want[i, 1], rtol=1e-5, atol=1e-6)


def test_budget_bounds_and_refusals():
    assert budget_bounds(8, 4) == [2, 4, 6, 8] and budget_bounds(10, 3) == [4, 7, 10]
    tr = make("grpo", g=2, reward=[target_frac], advantage={"name": "brpo"})
    with pytest.raises(ConfigError, match="recipe.loop_part=brpo"):
        tr.step()
    with pytest.raises(ConfigError, match="summaries"):
        make("grpo", g=2, reward=[target_frac], buckets=(32,), advantage={"name": "brpo"},
             loop_part={"name": "brpo", "summaries": 3}).step()

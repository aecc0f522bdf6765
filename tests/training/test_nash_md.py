"""Nash-MD in the loop (recipe.name=nash_md, METHODS.md #200): the loop part samples the
mixture's opponents with the reference policy, scores them, and the estimator's advantage is the
preference minus 1/2 on every response token; the estimator without the part is refused. The
mixture sampler: tests/rollout/test_sampler.py; the loss against TRL:
tests/conformance/test_trl_nash_md.py."""

import numpy as np
import pytest

from test_rl_recipes_extra import make, target_frac

from jaxrl_llm.config import ConfigError


def test_opponents_preferences_and_advantages():
    tr = make("nash_md", g=2, reward=[target_frac], ref=True)
    m = [tr.step() for _ in range(2)]
    assert all(0.0 < x["nash/preference"] < 1.0 for x in m)
    assert all("policy/nash_kl" in x for x in m)
    b = tr.last_batch
    lm = b["completion_mask"]
    adv = b["advantages"][:, -lm.shape[1]:]
    per_row = np.array([adv[i][lm[i]].mean() if lm[i].any() else 0.0 for i in range(len(lm))])
    # every response token of a row carries the row's P - 1/2, with P in (0, 1)
    for i in range(len(lm)):
        if lm[i].any():
            np.testing.assert_allclose(adv[i][lm[i]], per_row[i], rtol=1e-6)
    assert np.all(np.abs(per_row) < 0.5) and np.any(per_row != 0)


def test_the_estimator_needs_its_loop_part():
    tr = make("grpo", g=2, reward=[target_frac], ref=True, advantage={"name": "nash_md"})
    with pytest.raises(ConfigError, match="recipe.loop_part=nash_md"):
        tr.step()


def test_nash_md_refuses_an_allocator():
    with pytest.raises(ConfigError, match="recipe.allocator"):
        make("nash_md", g=2, reward=[target_frac], ref=True, allocator={"name": "knapsack"})

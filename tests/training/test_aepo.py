"""AEPO in the loop (recipe.loop_part=aepo, METHODS.md #81): the temperature follows the entropy
estimate against the target, the better-than-group responses of the re-sampled quarter replace
rows of their own group with advantage +1, the entropy estimate comes from the update, and the
part refuses a run without recomputed old log-probs."""

import numpy as np
import pytest

from test_rl_recipes_extra import make, target_frac

from jaxrl_llm.config import ConfigError


def test_temperature_injection_and_forced_advantages():
    tr = make("grpo", g=4, reward=[target_frac], old_logp="recompute",
              loop_part={"name": "aepo", "target": 0.01, "max_rows": 3, "prompt_frac": 0.5})
    part = tr.parts.get("recipe.loop_part=aepo")
    m1 = tr.step()
    # no update yet: entropy 0 <= target, the hot temperature; at most max_rows rows injected
    assert m1["aepo/temperature"] == 1.2 and m1["aepo/entropy"] == 0.0
    assert 0 < m1["aepo/injected"] <= 3 and m1["aepo/forced_rows"] == m1["aepo/injected"]
    b = tr.last_batch
    lm = b["loss_mask"]
    forced = [i for i in range(len(lm)) if lm[i].any() and np.all(b["advantages"][i][lm[i]] == 1.0)]
    assert len(forced) >= m1["aepo/injected"]
    # each injected row sits in its own prompt's group, never in a group's first row
    gid = b["group_ids"]
    firsts = {int(np.flatnonzero(gid == g)[0]) for g in np.unique(gid)}
    assert not set(part._forced) & firsts
    assert part.entropy > 0.01  # -policy/logp_mean of the update
    m2 = tr.step()
    # above the target: the cold temperature, half the rows (3 // 2)
    assert m2["aepo/temperature"] == 0.8 and m2["aepo/injected"] <= 1


def test_aepo_needs_recomputed_old_log_probs():
    with pytest.raises(ConfigError, match="recipe.old_logp=recompute"):
        make("grpo", g=4, loop_part={"name": "aepo"})
    with pytest.raises(ConfigError, match="threshold must be a number >= 0"):
        from jaxrl_llm.training.parts.aepo import AEPO

        AEPO(threshold=-0.1)
    with pytest.raises(ConfigError, match="prompt_frac"):
        make("grpo", g=4, old_logp="recompute", loop_part={"name": "aepo", "prompt_frac": 2.0})


def test_aepo_refuses_importance_corrections():
    with pytest.raises(ConfigError, match="recipe.is_weights"):
        make("grpo", g=4, old_logp="recompute", mismatch=True, is_weights={"name": "icepop"},
             loop_part={"name": "aepo"})

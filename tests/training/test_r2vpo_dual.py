"""R²VPO's dual variable in the loop (recipe.loss=r2vpo, METHODS.md #26): the loss reads the
multiplier as a batch column, the loop moves it once per step by projected dual ascent from the
step's measured ratio variance, and a resumed run continues with the same multiplier (bit for
bit). The loss's formula is tested in tests/core/test_batch_losses.py."""

from __future__ import annotations

import numpy as np
import pytest

from test_rl_recipes_extra import make, max_diff, resumed_after_one_step, without_timings

from jaxrl_llm.core import r2vpo_dual_step

LOSS = {"name": "r2vpo", "delta": 1e-4, "lambda_init": 0.5, "lambda_lr": 50.0}


def test_the_multiplier_moves_by_dual_ascent_and_resumes(tmp_path):
    kw = dict(g=4, epochs=2, loss=LOSS)
    tr = make("grpo", **kw)
    part = tr.parts.get("recipe.loss=r2vpo")
    assert part is not None and part.lam == 0.5
    lam, ms = 0.5, []
    for _ in range(3):
        m = tr.step()
        ms.append(m)
        var = np.mean([pm["policy/r2vpo_ratio_var"] for pm in tr.current.policy_metrics])
        # the second epoch's ratio moved off 1: the variance is measured, and the multiplier follows it
        assert var > 0
        lam = r2vpo_dual_step(lam, var, delta=LOSS["delta"], lambda_lr=LOSS["lambda_lr"])
        assert m["r2vpo/lambda"] == pytest.approx(lam, rel=1e-6)
        assert part.lam == m["r2vpo/lambda"]
    assert ms[-1]["r2vpo/lambda"] != 0.5
    # the loss saw the multiplier of its step (the value before the step's update)
    assert float(tr.current.policy_metrics[-1]["policy/r2vpo_lambda"]) == pytest.approx(ms[1]["r2vpo/lambda"])

    resumed = resumed_after_one_step(tmp_path, **kw)
    assert resumed.parts.get("recipe.loss=r2vpo").lam == ms[0]["r2vpo/lambda"]
    got = [resumed.step() for _ in range(2)]
    for a, b in zip(got, ms[1:]):
        assert without_timings(a) == without_timings(b)
    assert max_diff(resumed.state.params, tr.state.params) == 0


def test_other_losses_have_no_multiplier():
    tr = make("grpo", g=4)
    assert tr.parts.get("recipe.loss=r2vpo") is None

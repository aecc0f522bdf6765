"""EPO in the loop (recipe.loss=epo, METHODS.md #203): the surrogate receives the current
policy's token entropy with its gradient, the loop part keeps the per-turn entropy history
(checkpointed: a resumed run is bit for bit the same) and writes each token's reference and the
phase weight. The loss: tests/core/test_policy_losses.py."""

import numpy as np
import pytest

from test_rl_recipes_extra import make, max_diff, resumed_after_one_step, without_timings



def test_the_history_is_the_mean_of_the_steps_entropies_and_resumes(tmp_path):
    kw = dict(g=4, loss={"name": "epo", "entropy_coef": 0.01, "phase_steps": 10})
    tr = make("grpo", **kw)
    part = tr.parts.get("recipe.loss=epo")
    assert part is not None and tr.recipe.objective.entropy_input
    ms, means = [], []
    for _ in range(3):
        ms.append(tr.step())
        b = tr.last_batch
        lm = b["loss_mask"]
        means.append(float(np.asarray(b["old_entropy"], np.float64)[lm].mean()))
        np.testing.assert_allclose(b["epo_entropy_ref"][lm], np.mean(means), rtol=1e-5)
        assert (b["epo_entropy_ref"][~lm] == 0).all()
    assert ms[0]["epo/phase_weight"] == 1.0 and ms[2]["epo/phase_weight"] < 1.0
    assert all("policy/epo_entropy" in m and m["policy/epo_entropy"] > 0 for m in ms)
    assert part.counts == [3]

    resumed = resumed_after_one_step(tmp_path, **kw)
    assert resumed.parts.get("recipe.loss=epo").counts == [1]
    got = [resumed.step() for _ in range(2)]
    for a, b in zip(got, ms[1:]):
        assert without_timings(a) == without_timings(b)
    assert max_diff(resumed.state.params, tr.state.params) == 0


def test_a_bad_phase_length_is_refused():
    with pytest.raises(Exception, match="phase_steps"):
        make("grpo", g=4, loss={"name": "epo", "phase_steps": 1})


def test_agent_tokens_take_their_turns_history():
    import types

    from jaxrl_llm.training.parts.epo import EntropyHistory

    part = EntropyHistory()
    lm = np.zeros((1, 7), bool)
    lm[0, 2:4] = lm[0, 5:7] = True  # prompt of 3 tokens (c0 = 2): turn 0 at 2-3, an observation at 4, turn 1 at 5-6
    step = types.SimpleNamespace(arrays={"loss_mask": lm, "old_entropy": np.array([[0, 0, 1., 3., 9., 2., 2.]])},
                                 extra={"turn_ids": np.array([[0, 0, -1, 1, 1]])}, prompt_len=3, metrics={})
    ctx = types.SimpleNamespace(iteration=0)
    part.estimate(ctx, step)
    np.testing.assert_allclose(step.arrays["epo_entropy_ref"], [[0, 0, 2., 2., 0, 2., 2.]])
    step.arrays["old_entropy"] = np.array([[0, 0, 3., 3., 9., 4., 4.]])
    part.estimate(ctx, step)
    assert part.sums == [5.0, 6.0] and part.counts == [2, 2]
    np.testing.assert_allclose(step.arrays["epo_entropy_ref"], [[0, 0, 2.5, 2.5, 0, 3., 3.]])

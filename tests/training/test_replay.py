"""ARPO's experience replay: the buffer and injection rules by hand, the loop trains on the
replaced rows (stored tokens, reward, behaviour log-probs) while the statistics see the round as
sampled, GRPO's advantages of an injected group, and bitwise resume with the buffer."""

import numpy as np
import pytest

from jaxrl_llm.algorithms import REPLAYS, RegistryError, ReplayInputs
from test_allocation_loop import any_target
from test_rl_recipes_extra import PROMPTS, make, straight_and_resumed

arpo = REPLAYS["arpo"].fn


def _x(keys, values, gid, buffer, seed=0):
    return ReplayInputs(tuple(keys), np.asarray(values, float), np.asarray(gid), np.random.default_rng(seed),
                        {k: list(v) for k, v in buffer.items()}, lambda i: {"row": i}, 5)


def test_arpo_rules_by_hand():
    # group 0 (key a): all fail -> its FIRST row (0) gets one of a's stored successes;
    # group 1 (key b): two successes, not collapsed; group 2 (key c): all fail, nothing stored
    vals = [0, 0, 0, 0, 1, 0, 0.5, 0, 0, 0, 0, 0]
    gid = [0] * 4 + [1] * 4 + [2] * 4
    buf = {"a": [{"id": "a0"}, {"id": "a1"}], "b": [{"id": "b0"}]}
    replace, new, met = arpo(_x(["a", "b", "c"], vals, gid, buf), capacity=2)
    assert set(replace) == {0} and replace[0]["id"] in ("a0", "a1")
    assert met["replay/collapsed_groups"] == 2 and met["replay/injected"] == 1
    # the buffer gets the round's successes (outcome > 0.1) as sampled, FIFO at capacity 2: b0, then rows 4
    # and 6 -> the oldest (b0) is dropped
    assert new["b"] == [{"row": 4}, {"row": 6}] and new["a"] == buf["a"] and "c" not in new
    # collapse needs population std < 0.05 and mean < 0.2: [0.1] * 4 is collapsed, [0, 0, 0, 0.3] is not
    # (std 0.13), [0.19] * 4 is, [0.2] * 4 is not (mean)
    for v, want in (([0.1] * 4, 1), ([0, 0, 0, 0.3], 0), ([0.19] * 4, 1), ([0.2] * 4, 0)):
        replace, _, met = arpo(_x(["a"], v, [0] * 4, {"a": [{"id": "a0"}]}))
        assert met["replay/collapsed_groups"] == want and len(replace) == want, v
    with pytest.raises(ValueError, match="capacity"):
        arpo(_x(["a"], [0] * 4, [0] * 4, {}), capacity=0)


ROWS = [(p, False) for p in PROMPTS[:4]]


def _trainer(**kw):
    return make("grpo", g=4, prompts_per_step=2, rows=ROWS, reward=any_target, old_logp="recompute",
                replay="arpo", **kw)


def test_loop_injects_stored_successes_into_collapsed_groups():
    tr = _trainer()
    injected = 0
    for _ in range(8):
        buf_before = {k: [dict(e) for e in v] for k, v in tr.store.slot("replay/arpo").items()}
        passes_before = {k: r["passes"] for k, r in tr.store.records.items()}
        m = tr.step()
        b, keys = tr.last_batch, tr._last_keys
        gid = b["group_ids"]
        p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
        for g, key in enumerate(keys):
            rows = np.flatnonzero(gid == g)
            scores = b["scores"][rows]
            rec = tr.store.records[key]
            if rec["last_pass_rate"] == 0 and buf_before.get(key):
                # collapsed as sampled (no pass this visit) with a stored success: injected; the first row
                # is a stored success of this prompt, from an earlier step
                assert scores[0] == 1 and not scores[1:].any()
                ids = b["tokens"][rows[0], p:][b["completion_mask"][rows[0]]].tolist()
                assert ids in [e["ids"] for e in buf_before[key]]
                # GRPO on [1, 0, 0, 0] (unbiased std 0.5): +1.5 / -0.5
                adv = [b["advantages"][i, p - 1:][b["completion_mask"][i]][0] for i in rows]
                np.testing.assert_allclose(adv, [1.5, -0.5, -0.5, -0.5], rtol=1e-5)
                # the statistics saw the group as sampled: no pass this visit
                assert rec["passes"] == passes_before.get(key, 0)
                injected += 1
            elif rec["last_step"] == tr.iteration - 1:  # not injected: the rows are the sampled ones
                assert scores.sum() == rec["last_pass_rate"] * len(rows)
        assert m.get("replay/injected", 0) == sum(
            1 for k in keys if tr.store.records[k]["last_pass_rate"] == 0 and buf_before.get(k))
    assert injected > 0  # not vacuous


def test_resume_with_a_replay_buffer_is_bitwise(tmp_path):
    a, b = straight_and_resumed(_trainer, 6, 3, tmp_path)
    assert a == b and a[2]["slots"]["replay/arpo"]


def test_replay_needs_recomputed_old_logp():
    with pytest.raises(RegistryError, match="recipe.old_logp=recompute"):
        make("grpo", g=4, replay="arpo")

"""Prompt selectors (SEC, VAS, SPO's priority) and SPO's tracker: hand-driven selections and
updates, the loop's candidate draw, determinism and bitwise resume."""

import dataclasses

import numpy as np
import pytest

import jaxrl_llm.core as core
from jaxrl_llm.algorithms import SELECTORS, SelectInputs
from jaxrl_llm.algorithms.selection import SPO_SLOT, _weighted_without_replacement
from jaxrl_llm.training import Checkpointer
from jaxrl_llm.training.prompt_store import STORE_INPUTS
from test_rl_recipes_extra import PROMPTS, make, target_frac


def _x(keys, num, *, stats=None, columns=None, state=None, feedback=None, slots=None, seed=0):
    st = {k: np.zeros(len(keys), np.float32) for k in STORE_INPUTS}
    st.update(stats or {})
    return SelectInputs(tuple(keys), columns or {}, st, num, 0, np.random.default_rng(seed), state or {}, feedback,
                        slots or {})


def test_sec_updates_values_from_feedback_then_draws_by_category():
    sec = SELECTORS["sec"].fn
    keys = ["a0", "a1", "b0", "b1", "b2"]
    cols = {"level": ["a", "a", "b", "b", "b"]}
    fb = {"step": 0, "keys": ["p", "q", "r"], "abs_adv": [0.8, 0.4, 0.1], "pass_rate": [0, 0, 0], "reward_mean": [0] * 3}
    state = {"q": {"a": 0.0, "b": 1.0, "c": 0.5}, "pending": {"p": "a", "q": "a", "r": "b"}}
    # TD(0), alpha 0.5: a <- 0.5 * 0 + 0.5 * mean(0.8, 0.4) = 0.3; b <- 0.5 * 1 + 0.5 * 0.1 = 0.55; c unplayed
    idx, new = sec(_x(keys, 2, columns=cols, state=state, feedback=fb), column="level", temperature=1e-3)
    assert new["q"] == pytest.approx({"a": 0.3, "b": 0.55, "c": 0.5})
    assert sorted(int(i) for i in idx) in ([2, 3], [2, 4], [3, 4])  # tau -> 0: the best category (b) only
    assert set(new["pending"]) == {keys[i] for i in idx} and set(new["pending"].values()) == {"b"}
    # the authors' code also decays the arms without problems in the step towards 0
    _, dec = sec(_x(keys, 2, columns=cols, state=state, feedback=fb), column="level", absent="decay")
    assert dec["q"] == pytest.approx({"a": 0.3, "b": 0.55, "c": 0.25})
    # a category that runs out of candidates is no longer drawn: all five picked
    idx, _ = sec(_x(keys, 5, columns=cols, state=state), column="level", temperature=1e-3)
    assert sorted(idx.tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="no column 'topic'"):
        sec(_x(keys, 2, columns=cols), column="topic")


def test_sec_probabilities_follow_boltzmann():
    sec = SELECTORS["sec"].fn
    keys = [f"k{i}" for i in range(40)]
    cols = {"level": ["a"] * 20 + ["b"] * 20}
    state = {"q": {"a": 0.0, "b": float(np.log(3.0))}}
    picks = [sec(_x(keys, 1, columns=cols, state=state, seed=s), column="level")[0][0] for s in range(2000)]
    frac_b = np.mean(np.array(picks) >= 20)
    assert abs(frac_b - 0.75) < 0.03  # softmax([0, log 3]) = [0.25, 0.75]


def test_vas_draws_the_high_variance_prompts_first():
    vas = SELECTORS["vas"].fn
    keys = ["p0", "p1", "p2", "p3", "p4"]
    stats = {"prompt_seen": np.array([4, 4, 4, 0, 4], np.float32),
             "prompt_pass_rate": np.array([0.0, 1.0, 0.5, 0.0, 0.25], np.float32)}
    # p(1 - p) = [0, 0, .25, .25 (unseen: 0.5), .1875], min-max normalised [0, 0, 1, 1, .75]
    for seed in range(20):
        idx, _ = vas(_x(keys, 3, stats=stats, seed=seed), fraction=1.0)
        assert sorted(idx.tolist()) == [2, 3, 4]
    idx, _ = vas(_x(keys, 2, stats=stats), fraction=0.5)
    assert len(set(idx.tolist())) == 2 and idx[0] in (2, 3, 4)  # one by score, one uniformly
    with pytest.raises(ValueError, match="fraction"):
        vas(_x(keys, 2, stats=stats), fraction=1.5)


def test_weighted_draw_frequencies_and_spo_priority():
    w = np.array([0.05, 0.55, 0.4])
    firsts = [_weighted_without_replacement(np.random.default_rng(s), w, 1, np.ones(3, bool))[0] for s in range(3000)]
    np.testing.assert_allclose(np.bincount(firsts, minlength=3) / 3000, w / w.sum(), atol=0.03)
    pri = SELECTORS["spo_priority"].fn
    with pytest.raises(ValueError, match="single_stream_po"):
        pri(_x(["a", "b"], 1))
    slots = {SPO_SLOT: {"a": {"alpha": 9.0, "beta": 0.0}, "b": {"alpha": 1.0, "beta": 1.0}}}
    # p = 1 -> weight 0.05; p = 0.5 -> 0.55; c unseen (prior 0.5) -> 0.55
    picks = [pri(_x(["a", "b", "c"], 1, slots=slots, seed=s))[0][0] for s in range(2000)]
    np.testing.assert_allclose(np.bincount(picks, minlength=3) / 2000, [0.05 / 1.15, 0.55 / 1.15, 0.55 / 1.15],
                               atol=0.03)


ROWS = [(p, i % 2 == 0) for i, p in enumerate(PROMPTS)]


def test_loop_selects_among_candidates_deterministically_and_resumes(tmp_path):
    kw = dict(g=4, prompts_per_step=2, rows=ROWS, candidates=3, selector={"name": "vas"})
    tr, twin = make("grpo", **kw), make("grpo", **kw)
    for it in range(2):
        m, m2 = tr.step(), twin.step()
        cand = {f"toy:{(6 * it + j) % len(ROWS)}" for j in range(6)}
        assert len(tr._last_keys) == 2 and set(tr._last_keys) <= cand
        assert tr._last_keys == twin._last_keys and m["loss"] == m2["loss"]
        assert {"select/chosen_pass_rate", "select/chosen_seen_frac", "prompts/spread_groups_frac"} <= set(m)
    tr.checkpointer = Checkpointer(tmp_path, keep_last=1)
    tr.save()
    tr.checkpointer.wait()
    fresh = make("grpo", **kw)
    fresh.checkpointer = Checkpointer(tmp_path, keep_last=1)
    assert fresh.restore() and fresh.store.state_dict() == tr.store.state_dict()
    a, b = tr.step(), fresh.step()
    assert tr._last_keys == fresh._last_keys and a["loss"] == b["loss"]


def test_loop_feeds_sec_its_categories_advantages():
    tr = make("grpo", g=4, prompts_per_step=2, rows=ROWS, candidates=2, selector={"name": "sec", "column": "const"})
    tr.step()
    b, keys = tr.last_batch, list(tr._last_keys)
    pending = tr.store.slot("selector/sec")["pending"]
    assert set(pending) == set(keys)
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    cm = b["completion_mask"]
    row_abs = (np.abs(b["advantages"][:, p - 1:]) * cm).sum(1) / np.maximum(cm.sum(1), 1)
    per: dict = {}
    for g, k in enumerate(keys):
        per.setdefault(pending[k], []).append(row_abs[b["group_ids"] == g].mean())
    tr.step()  # consumes the feedback before drawing
    q = tr.store.slot("selector/sec")["q"]
    for c, vals in per.items():
        assert q[c] == pytest.approx(0.5 * np.mean(vals), rel=1e-5)
    assert any(v > 0 for v in q.values())


def test_selector_configuration_errors():
    with pytest.raises(ValueError, match="rollout.candidates >= 2"):
        make("grpo", g=4, prompts_per_step=2, rows=ROWS, selector={"name": "vas"})
    with pytest.raises(ValueError, match="has none"):
        make("grpo", g=4, prompts_per_step=2, rows=ROWS, candidates=2)


def test_spo_tracker_follows_the_authors_update(tmp_path):
    tr = make("single_stream_po", g=1, prompts_per_step=2, rows=[(p, False) for p in PROMPTS[:3]])
    m1 = tr.step()
    b1, keys1 = {k: np.array(v) for k, v in tr.last_batch.items()}, list(tr._last_keys)
    np.testing.assert_allclose(b1["spo_value"], 0.5)  # the prior alpha = beta = 0.5
    p = b1["tokens"].shape[1] - b1["completion_mask"].shape[1]
    cm1 = b1["completion_mask"]
    np.testing.assert_allclose(b1["advantages"][:, p - 1:],
                               np.asarray(core.single_stream_advantages(b1["scores"], b1["spo_value"], cm1)), atol=1e-6)
    slot = tr.store.slot(SPO_SLOT)
    now = np.asarray(tr.logp(tr.state.params, tr.frozen, b1["tokens"], b1["mask"]))[:, p - 1:]
    for g, k in enumerate(keys1):  # first visit: D = 0, rho = rho_max = 0.96
        r = float(b1["scores"][g])
        assert slot[k]["alpha"] == pytest.approx(0.96 * 0.5 + r) and slot[k]["beta"] == pytest.approx(1.48 - r)
        assert slot[k]["response"] == b1["tokens"][g, p:][cm1[g]].tolist()
        np.testing.assert_allclose(slot[k]["logp"], now[g][cm1[g]], rtol=1e-6)  # under the updated policy
    assert m1["tracker/rho_mean"] == pytest.approx(0.96)
    before = {k: dict(v) for k, v in slot.items()}
    tr.step()  # toy:2 and toy:0: toy:0 is a second visit
    b2, keys2 = tr.last_batch, list(tr._last_keys)
    assert keys2 == ["toy:2", "toy:0"]
    e0 = before["toy:0"]
    np.testing.assert_allclose(b2["spo_value"][1], e0["alpha"] / (e0["alpha"] + e0["beta"]), rtol=1e-6)
    # rho of toy:0 from the policy's change on its stored response, measured after this step's update
    g0 = keys1.index("toy:0")
    lp = np.asarray(tr.logp(tr.state.params, tr.frozen, b1["tokens"], b1["mask"]))[g0, p - 1:][cm1[g0]]
    d = np.mean(np.abs(np.array(e0["logp"]) - lp))
    assert d > 0
    rho = float(core.kl_adaptive_forgetting(np.array([d]))[0])
    r2 = float(b2["scores"][1])
    assert tr.store.slot(SPO_SLOT)["toy:0"]["alpha"] == pytest.approx(rho * e0["alpha"] + r2, rel=1e-5)
    assert tr.store.slot(SPO_SLOT)["toy:0"]["beta"] == pytest.approx(rho * e0["beta"] + 1 - r2, rel=1e-5)
    # bitwise resume with the tracker
    tr.checkpointer = Checkpointer(tmp_path, keep_last=1)
    tr.save()
    tr.checkpointer.wait()
    fresh = make("single_stream_po", g=1, prompts_per_step=2, rows=[(p, False) for p in PROMPTS[:3]])
    fresh.checkpointer = Checkpointer(tmp_path, keep_last=1)
    assert fresh.restore()
    a, b = tr.step(), fresh.step()
    assert a["loss"] == b["loss"] and tr.store.state_dict() == fresh.store.state_dict()


def test_spo_refuses_rewards_outside_0_1():
    def two(prompts, completions, completion_ids, **_):
        return [2.0] * len(completions)
    tr = make("single_stream_po", g=1, prompts_per_step=2, reward=two)
    with pytest.raises(ValueError, match=r"rewards \(after shaping\) must be in \[0, 1\]"):
        tr.step()


def test_spo_priority_selector_in_the_loop():
    tr = make("single_stream_po", g=1, prompts_per_step=2, candidates=2, selector={"name": "spo_priority"},
              reward=target_frac)
    for _ in range(2):
        m = tr.step()
    assert len(tr.store.slot(SPO_SLOT)) >= 2 and "select/chosen_seen_frac" in m


def test_config_checks_name_the_fields():
    from pathlib import Path

    from jaxrl_llm.cli import load_experiment
    from jaxrl_llm.config import ConfigError, apply_overrides
    from jaxrl_llm.training.runner import check_rl

    exp = load_experiment(Path(__file__).parents[2] / "experiments" / "tiny_curriculum.py")
    assert check_rl(exp.default)["recipe"]["selector"]["name"] == "sec"
    check_rl(apply_overrides(exp.default, ["recipe.selector=none", "rollout.candidates=1"]))
    for overrides, msg in ((["rollout.candidates=1"], "rollout.candidates >= 2"),
                           (["recipe.selector=none"], "has none"),
                           (["rollout.staleness=1"], "recipe.old_logp=recompute"),
                           (["rollout.staleness=-1"], "rollout.staleness must be an int >= 0"),
                           (["data.budgets=[4,8]"], "cannot be combined")):
        with pytest.raises(ConfigError, match=msg):
            check_rl(apply_overrides(exp.default, overrides))
    check_rl(apply_overrides(exp.default, ["rollout.staleness=1", "recipe.old_logp=recompute"]))


def test_sec_counts_selected_prompts_a_group_filter_dropped_as_zero_gain():
    sec = SELECTORS["sec"].fn
    fb = {"step": 0, "keys": ["p"], "abs_adv": [0.8], "pass_rate": [0.5], "reward_mean": [0.5]}
    state = {"q": {"a": 0.0}, "pending": {"p": "a", "dropped": "a"}}
    _, new = sec(_x(["c0"], 1, columns={"level": ["a"]}, state=state, feedback=fb), column="level")
    assert new["q"]["a"] == pytest.approx(0.5 * 0.4)  # mean of 0.8 and 0 (the dropped group gave no gradient)


def test_spo_tracker_uses_the_sampled_rows_under_a_batch_filter_and_one_decay_per_visit():
    # PF-PPO resamples the train rows; the tracker still sees every sampled row once
    tr = make("single_stream_po", g=2, prompts_per_step=2, rows=[(p, False) for p in PROMPTS[:2]],
              batch_filter={"name": "pf_ppo"})
    tr.step()
    arrays, scores, valid = tr._last_step.rows_as_sampled()
    slot = tr.store.slot(SPO_SLOT)
    for g, k in enumerate(tr._last_keys):
        r = scores[arrays["group_ids"] == g]
        assert slot[k]["alpha"] == pytest.approx(0.96 * 0.5 + r.sum(), rel=1e-5)
        assert slot[k]["beta"] == pytest.approx(0.96 * 0.5 + (1 - r).sum(), rel=1e-5)


def test_pcl_picks_the_predictions_closest_to_the_target():
    pcl = SELECTORS["pcl"].fn
    x = _x(["a", "b", "c", "d", "e"], 2)
    x = dataclasses.replace(x, predicted=np.array([0.9, 0.45, 0.1, 0.55, 0.5]))
    idx, _ = pcl(x)
    assert idx.tolist() == [4, 1]  # |0.5 - 0.5| = 0, then the tie 0.45 / 0.55 goes to the earlier candidate
    idx, _ = pcl(x, target=0.1)
    assert idx.tolist() == [2, 1]
    with pytest.raises(ValueError, match="requires prompt_value"):
        pcl(_x(["a"], 1))


def test_pcl_in_the_loop_selects_by_the_value_model_fits_it_and_resumes(tmp_path):
    kw = dict(g=4, prompts_per_step=2, rows=ROWS, candidates=2, selector={"name": "pcl"}, pcl=True, critic_lr=1e-3)
    tr = make("grpo", **kw)
    for it in range(3):
        cand_keys = [f"toy:{(4 * it + j) % len(ROWS)}" for j in range(4)]
        cand_ids = [list(ROWS[(4 * it + j) % len(ROWS)][0]) for j in range(4)]
        pred = tr.parts.provider("prompt_value").predict(cand_ids)
        want = [cand_keys[i] for i in np.argsort(np.abs(pred - 0.5), kind="stable")[:2]]
        m = tr.step()
        assert tr._last_keys == want
        b = tr.last_batch
        target = np.array([b["scores"][b["group_ids"] == k].mean() for k in range(2)])
        ids = [cand_ids[cand_keys.index(k)] for k in want]
        before, after = pred[[cand_keys.index(k) for k in want]], tr.parts.provider("prompt_value").predict(ids)
        assert m["pcl/abs_error"] == pytest.approx(np.abs(before - target).mean(), rel=1e-4, abs=1e-6)
        # the fit's loss is 0.5 (V - mean reward)^2 at the last prompt token, averaged over the prompts
        assert m["pcl/value_loss"] == pytest.approx(0.5 * np.mean((before - target) ** 2), rel=1e-3, abs=1e-7)
        assert not np.allclose(after, before)
    straight = make("grpo", **kw)
    straight.run(3)
    first = make("grpo", **kw)
    first.checkpointer = Checkpointer(tmp_path, keep_last=1)
    first.run(2)
    resumed = make("grpo", **kw)
    resumed.checkpointer = Checkpointer(tmp_path, keep_last=1)
    assert resumed.restore()
    resumed.run(3)
    assert resumed._last_keys == straight._last_keys and resumed.history[-1]["loss"] == straight.history[-1]["loss"]
    np.testing.assert_array_equal(resumed.parts.provider("prompt_value").predict([[1, 2]]),
                                  straight.parts.provider("prompt_value").predict([[1, 2]]))
    with pytest.raises(ValueError, match="prompt value model"):
        make("grpo", g=4, prompts_per_step=2, rows=ROWS, candidates=2, selector={"name": "pcl"})

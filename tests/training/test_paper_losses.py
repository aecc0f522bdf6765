"""The seed papers' surrogates and reward designs in the loop (the toy task of
test_rl_recipes_extra.py): every preset and part runs two steps with finite metrics, coupled
losses see whole groups per mini-batch, and shaping parts write the method's reward."""

import dataclasses

import numpy as np
import pytest

import jaxrl_llm.core as core
from jaxrl_llm.algorithms import SHAPING, ShapingInputs
from jaxrl_llm.training import recipe
from test_rl_recipes_extra import TARGET, make, target_frac


def binary(prompts, completions, completion_ids, **_):
    """1 when a completion holds the target token at least twice (a 0/1 reward for DisCO-type losses)."""
    return [float(sum(t == TARGET for t in ids) >= 2) for ids in completion_ids]


def calls(prompts, completions, completion_ids, **_):
    return [float(sum(t == 3 for t in ids)) for ids in completion_ids]


# two presets by default (a coupled loss with group columns and one with the entropy provider); the rest compile a
# train step each (~10 s): -m slow
_SLOW = pytest.mark.slow


@pytest.mark.parametrize("name,kw", [
    pytest.param("loop", {}, marks=_SLOW), ("disco", {}), pytest.param("drpo", {}, marks=_SLOW),
    pytest.param("bapo", {"g": 4, "epochs": 1, "num_minibatches": 2}, marks=_SLOW), ("hapo", {"g": 4}),
    pytest.param("thinkless", {"ref": True}, marks=_SLOW), pytest.param("mdpo", {"epochs": 2}, marks=_SLOW),
    pytest.param("p3o", {}, marks=_SLOW),
])
def test_presets_run_two_steps(name, kw):
    kw = dict(kw)
    g = kw.pop("g", recipe(name).num_samples if recipe(name).num_samples <= 8 else 4)
    tr = make(name, g=g, reward=[binary] if name in ("disco", "drpo") else [target_frac], **kw)
    hist = [tr.step() for _ in range(2)]
    for m in hist:
        bad = {k: v for k, v in m.items() if isinstance(v, float) and not np.isfinite(v)}
        assert not bad, (name, bad)
    assert hist[-1]["skipped_updates"] == 0
    if tr.recipe.objective.coupled:
        assert any(k.startswith("policy/") for k in hist[-1])


def test_thinkless_reads_the_mode_from_the_control_token_kept_in_the_text():
    """The control token is a special token: a plain decode drops it, the shaping must see it."""
    from test_rl_recipes_extra import TARGET

    class SpecialTok:
        def decode(self, ids, skip_special_tokens=True):
            return "".join("" if i == TARGET and skip_special_tokens else "<short>" if i == TARGET else f"t{i} "
                           for i in map(int, ids))
    tr = make("grpo", g=4, reward=[always], shaping={"name": "thinkless"})
    tr.tokenizer = SpecialTok()
    tr.step()
    b = tr.last_batch
    first = b["tokens"][np.arange(len(b["tokens"])), b["tokens"].shape[1] - b["completion_mask"].shape[1]]
    assert (first == TARGET).any() and (first != TARGET).any()
    np.testing.assert_allclose(b["scores"], np.where(first == TARGET, 1.0, 0.5))  # short-correct 1, think 0.5


def test_disco_minibatches_hold_whole_groups_and_match_one_minibatch():
    """With two mini-batches of whole groups and one epoch on-policy, the coupled loss of each
    mini-batch is DisCO over its groups; the run completes and the logged objective is finite."""
    tr = make("disco", g=4, reward=[binary], num_minibatches=2)
    seen, step = [], tr.train_step

    def recording_step(state, arrays, *frozen):
        seen.append({k: np.asarray(arrays[k]) for k in ("group_ids", "scores", "tokens")})
        return step(state, arrays, *frozen)
    tr.train_step = recording_step
    m = tr.step()
    assert np.isfinite(m["policy/disco_kl"]) and m["policy/disco_groups"] >= 0
    b = tr.last_batch
    assert len(seen) == 2
    full = {tuple(sorted(map(bytes, b["tokens"][b["group_ids"] == gid]))) for gid in np.unique(b["group_ids"])}
    got = set()
    for mb in seen:  # each mini-batch: groups numbered 0..k-1, 4 rows each, every one a whole group of the batch
        ids, counts = np.unique(mb["group_ids"], return_counts=True)
        assert ids.tolist() == list(range(len(ids))) and np.all(counts == 4)
        got |= {tuple(sorted(map(bytes, mb["tokens"][mb["group_ids"] == gid]))) for gid in ids}
    assert got == full


@pytest.mark.slow
def test_bapo_logs_its_bounds():
    tr = make("bapo", g=4, reward=[target_frac], epochs=2, num_minibatches=2)
    m = [tr.step() for _ in range(2)][-1]
    assert 0.6 - 1e-6 <= m["policy/bapo_c_low"] <= 0.9 + 1e-6 and 1.2 - 1e-6 <= m["policy/bapo_c_high"] <= 3.0 + 1e-6


def _inputs(scores, lengths, per_fn=None, texts=()):
    n = len(scores)
    return ShapingInputs(np.asarray(scores, np.float32), np.asarray(lengths), np.repeat(np.arange(n // 4), 4), n // 4,
                         8, per_fn or {}, tuple(texts))


def test_shaping_parts_write_the_methods_rewards():
    x = _inputs([1, 1, 0, 0], [3, 5, 2, 4], texts=["<short> 4", "<think> long 4", "<think> 5", "<short> 7"])
    shaped = x.scores + SHAPING["thinkless"].fn(x)
    np.testing.assert_allclose(shaped, [1, 0.5, -1, -1])
    x = _inputs([1, 1, 1, 1], [3, 5, 2, 4])
    np.testing.assert_allclose(x.scores + SHAPING["concise"].fn(x), core.concise_reward(
        np.ones(4, bool), np.array([3, 5, 2, 4.]), np.zeros(4, np.int32), 1, max_length=8))
    x = _inputs([0, 1, 1, 1], [1, 1, 1, 1], texts=["a", "<tool_call>x</tool_call>", "<tool_call>" * 2, "<tool_call>" * 3])
    np.testing.assert_allclose(x.scores + SHAPING["otc"].fn(x), [0, 1, np.sin(np.pi * 4 / 3 / 2),
                                                                   np.sin(np.pi * 1.5 / 2)], atol=1e-6)
    x = _inputs([1, 1, 0, 1], [1] * 4, per_fn={"gen_rm": np.array([0., 1., 1., 0.])})
    np.testing.assert_allclose(x.scores + SHAPING["fapo"].fn(x, flaw_metric="gen_rm"), [1, 0, -1, 1])
    x = _inputs([0] * 4, [1] * 4, per_fn={"fmt": np.array([1, 1, 0, 1.]), "acc": np.array([1, 0, 0, 1.]),
                                          "think": np.array([.8, .9, .3, .4])})
    np.testing.assert_allclose(x.scores + SHAPING["posterior"].fn(x, format_metric="fmt", outcome_metric="acc",
                                                                  thinking_metric="think"), [2.8, 1, 0, 2.4], atol=1e-6)
    x = _inputs([0] * 4, [1] * 4, texts=["so 2", "#### 2", "3", "no answer"])
    np.testing.assert_allclose(x.scores + SHAPING["empo"].fn(x), [0.5, 0.5, 0.25, 0])
    # two empty answers: one cluster in the entropy (authors' TRL version), so the group is not
    # "all distinct" and the answers keep their shares; verl's version: each empty its own cluster
    x = _inputs([0] * 4, [1] * 4, texts=["so 2", "3", "no answer", "nothing"])
    np.testing.assert_allclose(x.scores + SHAPING["empo"].fn(x), [0.25, 0.25, 0, 0])
    np.testing.assert_allclose(x.scores + SHAPING["empo"].fn(x, empty_reward_zero=False), [0, 0, 0, 0])
    np.testing.assert_allclose(x.scores + SHAPING["empo"].fn(x, empty_reward_zero=False, threshold=False), [.25] * 4)
    x = _inputs([1, 0, 0, 1], [1] * 4)
    np.testing.assert_allclose(x.scores + SHAPING["self_play"].fn(x), [5 / 6, 1 / 6, 1 / 6, 5 / 6], atol=1e-6)
    # CGPO: reward model "rm", baseline "rm_ref", judges "safe" (NaN: does not apply -> passes) and "fmt"
    x = _inputs([0] * 4, [1] * 4, per_fn={"rm": np.array([2., 1., 3., 0.]), "rm_ref": np.array([1., 1., 1., 1.]),
                                          "safe": np.array([1., np.nan, 0., 1.]), "fmt": np.array([1., 1., 1., .4])})
    sig = lambda z: 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(x.scores + SHAPING["cgpo"].fn(x, reward_metric="rm", baseline_metric="rm_ref",
                                                             judges=["safe", "fmt"]), [sig(1), .5, 0, 0], atol=1e-6)
    np.testing.assert_allclose(x.scores + SHAPING["cgpo"].fn(x, reward_metric="rm"), sig(np.array([2., 1, 3, 0])),
                               atol=1e-6)
    with pytest.raises(ValueError, match="judge 'safety' is not a reward function"):
        SHAPING["cgpo"].fn(x, reward_metric="rm", judges=["safety"])
    # the cosine length reward in place of a correctness reward "acc" (characters), a format reward kept
    x = _inputs([2, 1, 1, 0], [1] * 4, per_fn={"acc": np.array([1., 0., 1., 0.]), "fmt": np.array([1., 1., 0., 0.])},
                texts=["", "x" * 10, "x" * 5, "x" * 10])
    got = x.scores + SHAPING["cosine_length"].fn(x, metric="acc", weight=2.0, max_length=10.0)
    np.testing.assert_allclose(got, [1 + 2 * 1.0, 1 + 2 * -0.5, 0 + 2 * 0.75, 0 + 2 * -0.5], atol=1e-6)
    # Auto-CEI: two reasoning lines then a refusal (2 steps), a refusal with no steps, a right and a wrong answer
    x = _inputs([1, 0, 0, 0], [1] * 4, texts=["x = 4", "step\n\nstep two\nSorry, I can't", "I don't know", "5"])
    import math
    got = x.scores + SHAPING["auto_cei"].fn(x, c1=1.0, c2=1.0, steps="before")
    np.testing.assert_allclose(got, [1, 2 / (1 + math.exp(-1.0)) - 1, 2 / (1 + math.exp(1.0)) - 1, -1], atol=1e-6)
    # the authors' count (the default): every piece of the whole completion, 4 and 1
    got = x.scores + SHAPING["auto_cei"].fn(x, c1=1.0, c2=1.0)
    np.testing.assert_allclose(got, [1, 2 / (1 + math.exp(-3.0)) - 1, 0.0, -1], atol=1e-6)
    # GUI-RCPO: the last [start, end] of each completion; [3, 1] and no brackets are no region
    x = _inputs([1, 0, 0, 1], [1] * 4, texts=["[0, 9] then [2, 3]", "at [2,3]", "[3, 1]", "none"])
    np.testing.assert_allclose(x.scores + SHAPING["region_consistency"].fn(x), [0.5, 0.5, 0, 0])
    # a region past the grid (or past int32) is no region: reward 0, never an error from model output
    x = _inputs([0] * 4, [1] * 4, texts=["[0, 99999]", "[1, 99999999999999]", "[2, 3]", "[2, 3]"])
    np.testing.assert_allclose(x.scores + SHAPING["region_consistency"].fn(x), [0, 0, 0.5, 0.5])
    x = _inputs([1, 1, 1, 0, 1, 0, 0, 0], [3, 5, 2, 4, 3, 5, 2, 4])
    np.testing.assert_allclose(x.scores + SHAPING["grpo_lambda"].fn(x), core.grpo_lambda_reward(
        x.scores > 0, np.asarray(x.lengths, np.float32), np.repeat([0, 1], 4), 2), atol=1e-6)


def test_campo_penalises_cut_responses_that_end_in_a_loop():
    from jaxrl_llm.algorithms.reward_designs import trailing_loop_fraction

    assert trailing_loop_fraction([1, 2, 3, 4]) == 0.0
    assert trailing_loop_fraction([1, 2, 3, 3]) == 0.5  # period 1, two copies
    assert trailing_loop_fraction([9, 1, 2, 1, 2, 1, 2]) == 6 / 7  # period 2, three copies from index 1
    # the longest period with a loop sets the start: [5, 6, 5, 6] (period 2) and, longer, period 4 twice
    assert trailing_loop_fraction([7, 5, 6, 5, 6, 5, 6, 5, 6]) == 8 / 9
    assert trailing_loop_fraction([1, 2, 3, 4, 1, 2, 3, 4, 4]) == 2 / 9  # the ending 4, 4 only
    assert trailing_loop_fraction([1, 2, 1, 2], min_repeats=3) == 0.0
    ids = (np.array([1, 2, 3, 4, 5, 6, 7, 8]), np.array([1, 2, 3, 4, 5, 6, 5, 6]), np.array([1, 2, 2]),
           np.array([3, 1, 1, 1, 1, 1, 1, 1]))
    x = dataclasses.replace(_inputs([1, 1, 1, 0], [8, 8, 3, 8]), token_ids=ids)  # the third ended before the cap
    # the last row: period 1 would start the loop at index 1, but period 3 (the longest with a copy) at 2
    np.testing.assert_allclose(x.scores + SHAPING["campo"].fn(x), [1, 1 - 0.5, 1, 0 - 6 / 8], atol=1e-6)
    np.testing.assert_allclose(x.scores + SHAPING["campo"].fn(x, constant=0.1), [1, 0.9, 1, -0.1], atol=1e-6)
    np.testing.assert_allclose(x.scores + SHAPING["campo"].fn(x, coef=0.0), x.scores)  # identity
    with pytest.raises(ValueError, match="min_repeats must be an int >= 2"):
        SHAPING["campo"].fn(x, min_repeats=1)


def test_group_contrastive_aux_by_hand():
    aux = "<aux>draw</aux> "
    # group 0: with aux 2/2 right, without 0/2: +1 to the aux rows; group 1: with 0/1, without 2/3: -1;
    # group 2: with 1/2, without 1/2: masked (0)
    texts = [aux + "a", aux + "b", "c", "d", aux + "e", "f", "g", "h", aux, aux, "i", "j"]
    x = _inputs([1, 1, 0, 0, 0, 1, 1, 0, 1, 0, 1, 0], [10] * 12, texts=texts)
    got = SHAPING["group_contrastive_aux"].fn(x, margin=0.2)
    np.testing.assert_allclose(got, [1, 1, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0])
    # a group whose responses all use it (or none does): masked; margin 1: everything masked
    assert np.all(SHAPING["group_contrastive_aux"].fn(x, margin=1.0) == 0)
    with_len = SHAPING["group_contrastive_aux"].fn(x, margin=0.2, aux_weight=0.0, length_weight=0.5, max_length=20)
    np.testing.assert_allclose(with_len, [0.25] * 12)


def test_apo_taxes_a_slow_mode_on_easy_queries():
    tag = "<classification>{}</classification> ok"
    texts = [tag.format("instant"), tag.format("instant"), tag.format("reasoning"), tag.format("agentic"),
             tag.format("reasoning"), tag.format("reasoning"), "no tag", tag.format("instant")]
    # group 0: instant succeeds 2 / 2 (p = 1 > tau): slow modes get 1 - 1 = 0; group 1: p = 0 / 1: no tax
    x = _inputs([1, 1, 1, 1, 1, 0, 1, 0], [1] * 8, texts=texts)
    np.testing.assert_allclose(x.scores + SHAPING["apo"].fn(x, tau=0.5), [1, 1, 0, 0, 1, 0, 1, 0])
    # p = 0.5 in group 0 (one instant wrong): the slow mode keeps 1 - 0.25 when tau < 0.5
    x2 = _inputs([1, 0, 1, 1], [1] * 4, texts=texts[:4])
    np.testing.assert_allclose(x2.scores + SHAPING["apo"].fn(x2, tau=0.4), [1, 0, 0.75, 0.75])
    np.testing.assert_allclose(x2.scores + SHAPING["apo"].fn(x2, tau=0.5), [1, 0, 1, 1])  # p = tau: not easy
    fmt = _inputs([1, 0, 1, 1], [1] * 4, texts=texts[:4], per_fn={"fmt": np.array([1.0, 1.0, 0.0, 1.0])})
    np.testing.assert_allclose(fmt.scores + SHAPING["apo"].fn(fmt, tau=0.9, format_metric="fmt"), [1, 0, 0, 1])
    with pytest.raises(ValueError, match="not a regular expression"):
        SHAPING["apo"].fn(x, tau=0.5, mode_pattern="(")
    with pytest.raises(ValueError, match="needs a group capturing the mode name"):
        SHAPING["apo"].fn(x, tau=0.5, mode_pattern="<classification>")


def test_gtalign_welfare_by_hand():
    import json
    import math

    cells = {k: {"LLM": 2.0, "user": 2.0} for k in ("DQ_AQ", "DQ_CQ", "DQ_DA", "VQ_AQ", "VQ_CQ", "VQ_DA")}
    cells["DQ_AQ"] = {"LLM": 1.0, "user": 3.0}  # one cell differs by more than 10 %: P = 2 / 12
    good = f"<thinking>t</thinking><payoff>{json.dumps(cells)}</payoff><analyze>a</analyze><response>r</response>"
    x = _inputs([1, 0, 1, 1], [1] * 4, texts=[good, good, good.replace("<response>r</response>", ""),
                                             good.replace('"VQ_DA"', '"VQ"')])
    got = x.scores + SHAPING["gtalign"].fn(x)
    win = lambda n, lo, hi: 1 / (1 + math.exp(0.005 * (lo - n))) / (1 + math.exp(0.005 * (n - hi)))  # noqa: E731
    rho = math.exp(-len(good.split("<response>")[0]) / 500)
    user = lambda a: 1e-4 + 0.5 * a + 0.2 * win(1, 20, 500) + 0.3 * rho  # noqa: E731
    llm = lambda a: 1e-4 + 0.2 + 0.2 * 2 / 12 + 0.4 * a + 0.2 * win(len(good.split()), 500, 1000)  # noqa: E731
    np.testing.assert_allclose(got, [math.sqrt(user(1) * llm(1)), math.sqrt(user(0) * llm(0)), 0, 0], rtol=1e-5)
    lin = x.scores + SHAPING["gtalign"].fn(x, mode="linear")
    np.testing.assert_allclose(lin[:2], [(user(1) + llm(1)) / 2, (user(0) + llm(0)) / 2], rtol=1e-5)
    assert got[0] < lin[0]  # the geometric mean is below the arithmetic one when the welfares differ


@pytest.mark.parametrize("shaping", ["grpo_lambda", "concise", "otc", "empo", "self_play", "campo",
                                     {"name": "fapo", "flaw_metric": "calls"},
                                     {"name": "posterior", "format_metric": "calls", "outcome_metric": "target_frac",
                                      "thinking_metric": "target_frac"}])
def test_shaping_parts_run_in_the_loop(shaping):
    tr = make("grpo", g=4, reward=[target_frac, calls], shaping=shaping)
    m = [tr.step() for _ in range(2)][-1]
    assert np.isfinite(m["rewards/shaped/mean"])


def test_think_short_follows_the_step_and_hapo_history_its_state():
    import dataclasses

    x = dataclasses.replace(_inputs([1, 1, 0, 0], [100, 200, 100, 300], per_fn={"fmt": np.array([2., 2, 0, 2])}),
                            step=0)
    kw = dict(initial_budget=200.0, final_budget=100.0, drops=1, interval=10, format_metric="fmt")
    np.testing.assert_allclose(x.scores + SHAPING["think_short"].fn(x, **kw), [0.95, 1.1, 0.15, 0.35], atol=1e-6)
    later = dataclasses.replace(x, step=10)  # the budget is 100 from step 10 on
    np.testing.assert_allclose(later.scores + SHAPING["think_short"].fn(later, **kw), [1.1, 0.8, 0.3, 0.2], atol=1e-6)
    # HAPO: state in, state out; the reward uses the history from before this batch
    h = dataclasses.replace(_inputs([1, 1, 0, 0, 0, 0, 0, 0], [3, 5, 2, 9, 4, 4, 4, 4]), prompts=("a", "b"),
                            state={"a": 4.0})
    bonus, state = SHAPING["hapo_history"].fn(h)
    np.testing.assert_allclose(h.scores + bonus, [1.382683, 0.617317, 0, -1, 0, 0, 0, 0], atol=1e-5)
    assert state == {"a": 3.0} and h.state == {"a": 4.0}  # "b" had no correct answer; the input is not changed
    again = dataclasses.replace(h, state=state, scores=np.array([0, 0, 0, 0, 1, 0, 0, 0], np.float32))
    _, state = SHAPING["hapo_history"].fn(again)
    assert state == {"a": 3.0, "b": 4.0}


def test_hapo_history_state_is_kept_across_steps_and_checkpointed(tmp_path):
    from jaxrl_llm.training import Checkpointer

    tr = make("grpo", g=4, reward=[target_frac], shaping={"name": "hapo_history", "threshold": 0.25})
    seen = {}
    for _ in range(3):
        before = dict(tr.store.slot("shaping/hapo_history"))
        tr.step()
        b = tr.last_batch
        lens = b["completion_mask"].sum(1)
        prompts = tr._last_keys  # the history is keyed by the prompts' store keys (source positions)
        assert len(set(prompts)) == len(prompts) and all(":" in k for k in prompts)
        hist = np.array([before.get(prompts[g], 0.0) for g in b["group_ids"]], np.float32)
        raw = np.array([target_frac(None, None, [row[-b["completion_mask"].shape[1]:][m].tolist()])[0]
                        for row, m in zip(b["tokens"], b["completion_mask"])])
        correct = raw >= 0.25
        want = core.hapo_history_reward(correct, lens, hist)
        np.testing.assert_allclose(b["scores"], np.asarray(want), atol=1e-6)  # shaped with the history from before
        for g, p in enumerate(prompts):
            ok = correct & (b["group_ids"] == g)
            if ok.any():
                seen[p] = min(seen.get(p, np.inf), float(lens[ok].min()))
        assert tr.store.slot("shaping/hapo_history") == seen
    assert seen  # some prompt has had a correct answer
    tr.checkpointer = Checkpointer(tmp_path, keep_last=1)
    tr.save()
    tr.checkpointer.wait()
    fresh = make("grpo", g=4, reward=[target_frac], shaping={"name": "hapo_history", "threshold": 0.25})
    fresh.checkpointer = Checkpointer(tmp_path, keep_last=1)
    assert fresh.restore() and fresh.store.state_dict() == tr.store.state_dict()
    a, b_ = tr.step(), fresh.step()
    assert a["rewards/shaped/mean"] == b_["rewards/shaped/mean"] and a["loss"] == b_["loss"]


def test_hdpo_reads_the_reward_functions():
    tr = make("grpo", g=4, reward=[binary, calls], loss={"name": "hdpo", "answer_index": 0, "calls_index": 1})
    m = [tr.step() for _ in range(2)][-1]
    b = tr.last_batch
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    ids = [row[p:][cm].tolist() for row, cm in zip(b["tokens"], b["completion_mask"])]
    np.testing.assert_array_equal(b["component_scores"], np.stack([binary(None, None, ids), calls(None, None, ids)], 1))
    _, a_tool = core.hdpo_advantages(b["component_scores"][:, 0], np.ones(len(ids), np.float32),
                                     b["component_scores"][:, 1], b["group_ids"], len(ids))
    assert np.isfinite(m["policy/hdpo_acc_loss"])
    assert m["policy/hdpo_tool_rows"] == np.sum(np.asarray(a_tool) != 0)  # one mini-batch of the whole batch


def always(prompts, completions, **_):
    return [1.0] * len(completions)


CALLS: list[list] = []


def length_frac(prompts, completions, completion_ids, group_ids, **_):
    CALLS.append(list(group_ids))
    return [len(ids) / 6 for ids in completion_ids]


def test_dot_truncation_cuts_outliers_and_scores_them_again():
    """A loose threshold (alpha 0.3, min_cut 1) so the toy's short responses get cut: the cut rows
    are trained on their first T_q tokens and the reward (here their length) is computed again."""
    tr = make("grpo", g=4, stop=True, reward=[always, length_frac],
              truncation={"name": "dot", "metric": "always", "alpha": 0.3, "min_cut": 1})
    cut = 0
    for _ in range(3):
        CALLS.clear()
        m = tr.step()
        cut += m["truncation/responses"]
        b = tr.last_batch
        # the round is scored once, then only the groups holding a cut response, whole, again
        assert sorted(CALLS[0]) == sorted(np.repeat(np.arange(len(CALLS[0]) // 4), 4).tolist())
        if m["truncation/responses"]:
            assert len(CALLS) == 2 and 0 < len(CALLS[1]) < len(CALLS[0])
            assert all(CALLS[1].count(x) == 4 for x in CALLS[1])
        else:
            assert len(CALLS) == 1
        p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
        lens = b["completion_mask"].sum(1)
        np.testing.assert_allclose(b["scores"], 1.0 + lens / 6, atol=1e-6)  # the rewards of what is trained on
        assert np.array_equal(b["loss_mask"][:, p - 1:], b["completion_mask"])
    assert cut > 0  # the loose threshold did cut some responses
    with pytest.raises(Exception, match="recipe.truncation: unknown rollout truncation 'cut'"):
        recipe("grpo", num_samples=4, truncation="cut")


def test_siri_cuts_every_response_at_the_steps_cap_and_scores_it_again():
    """SIRI's stair schedule with one compression and one expansion step: at step 0 every
    response is cut at 2 tokens and its reward (its length) computed on the cut response; at step
    1 the cap is the sampler's budget and nothing is cut."""
    from test_rl_recipes_extra import T

    tr = make("grpo", g=4, reward=[length_frac], truncation={
        "name": "siri", "low": 2, "high": T, "compress_steps": 1, "expand_steps": 1, "shape": "stair"})
    for step in range(2):
        m = tr.step()
        b = tr.last_batch
        lens = b["completion_mask"].sum(1)
        if step == 0:
            assert lens.max() == 2 and m["truncation/responses"] == len(lens)  # the toy never stops early
        else:
            assert lens.max() == T and m["truncation/responses"] == 0
        np.testing.assert_allclose(b["scores"], lens / 6, atol=1e-6)

"""GHPO's hints: the part's rules by hand; in the loop, all-fail groups are sampled again with a
prefix of the reference solution in the prompt, trained in that context (the sampler's
log-probs equal a teacher-forced pass on the hinted sequence), while the prompt statistics keep
the unhinted outcome."""

import dataclasses

import numpy as np
import pytest

from jaxrl_llm.algorithms import HINTS, HintInputs, RegistryError
from jaxrl_llm.data.pipeline import PromptBatch
from test_rl_recipes_extra import TARGET, make

ghpo = HINTS["ghpo"].fn
pope = HINTS["pope"].fn


def _x(values, gid, raws, sols, stage=0, hinted=(), step=0):
    return HintInputs(np.asarray(values, float), np.asarray(gid), {"solution": list(sols)}, tuple(raws),
                      frozenset(hinted), stage, step)


def test_ghpo_rules_by_hand():
    raws, sols = ["q0", "q1", "q2"], ["abcdefgh", "xyz", "0123456789"]
    vals, gid = [0, 0, 1, 0, -1, 0], [0, 0, 1, 1, 2, 2]
    # stage 0: the all-fail groups (outcome <= 0: groups 0 and 2) get the first round(len * 0.25) characters
    got = ghpo(_x(vals, gid, raws, sols), template="|")
    assert got == {0: "q0|ab", 2: "q2|" + "0123456789"[:round(2.5)]}  # Python's round: 2.5 -> 2
    # stage 1: only groups hinted before that still fail; 50%
    got = ghpo(_x([0, 0, 1, 0, 1, 0], gid, raws, sols, stage=1, hinted={0, 2}), template="|")
    assert got == {0: "q0|abcd"}
    assert ghpo(_x(vals, gid, raws, sols, stage=3, hinted={0}), template="|") == {}  # after 75%: done
    assert ghpo(_x(vals, gid, raws, sols, step=4), start_step=5) == {}
    # chat prompts: appended to the last user message
    got = ghpo(_x([0, 0], [0, 0], [[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]], ["ab"]),
               template="|", fractions=[1.0])
    assert got[0][-1] == {"role": "user", "content": "u|ab"} and got[0][0]["content"] == "s"
    with pytest.raises(ValueError, match="column 'answer'"):
        ghpo(_x(vals, gid, raws, sols), column="answer")
    with pytest.raises(ValueError, match="fractions"):
        ghpo(_x(vals, gid, raws, sols), fractions=[0.0])


def test_pope_grows_the_oracle_prefix_until_a_problem_is_solved():
    raws, sols = ["q0", "q1", "q2"], ["abcdefgh", "xyz", "0123456789abcdef"]
    gid = [0, 0, 1, 1, 2, 2]
    # stage 0: hard problems (every response <= 0: 0 and 2) get the shortest prefix, 12.5% of the characters
    got = pope(_x([0, 0, 1, 0, 0, -1], gid, raws, sols), template="|")
    assert got == {0: "q0|a", 2: "q2|01"}
    # stage 1: problem 0 was solved with 12.5% (minimally sufficient: it stops); 2 still fails -> 25%
    got = pope(_x([1, 0, 1, 0, 0, 0], gid, raws, sols, stage=1, hinted={0, 2}), template="|")
    assert got == {2: "q2|0123"}
    got = pope(_x([0, 0, 1, 0, 0, 0], gid, raws, sols, stage=3, hinted={2}), template="|")
    assert got == {2: "q2|" + "0123456789abcdef"[:12]}  # only problems hinted before and still failing
    assert pope(_x([0, 0, 1, 0, 0, 0], gid, raws, sols, stage=4, hinted={2}), template="|") == {}
    # the default instruction asks the model to continue the solution
    assert pope(_x([0, 0], [0, 0], ["q"], ["abcdefgh"]))[0].startswith("q\nBelow is the beginning of a correct")
    with pytest.raises(ValueError, match="must increase"):
        pope(_x([0, 0], [0, 0], ["q"], ["ab"]), fractions=[0.5, 0.25])
    with pytest.raises(ValueError, match="recipe.hints=pope reads the reference solution from data column 'sol'"):
        pope(_x([0, 0], [0, 0], ["q"], ["ab"]), column="sol")


class HintData:
    """Prompts as text of token ids; the solution is TARGET tokens (a hint puts TARGETs in context)."""

    def __init__(self, b=2):
        self.b, self.pos = b, 0
        self.rows = [("1 2 3", "7 7 7 7 7 7 7 7"), ("4 3 2", "7 7 7 7 7 7 7 7"), ("5 6", "7 7 7 7 7 7 7 7"),
                     ("2 5 3", "7 7 7 7 7 7 7 7")]

    def __next__(self):
        idx = [(self.pos + i) % len(self.rows) for i in range(self.b)]
        self.pos += self.b
        raws = [self.rows[i][0] for i in idx]
        return PromptBatch([encode(r)[0] for r in raws], raws, raws, {"solution": [self.rows[i][1] for i in idx]},
                           [f"toy:{i}" for i in idx])

    def get_state(self):
        return {"pos": self.pos}

    def set_state(self, s):
        self.pos = s["pos"]


def encode(raw):
    return [int(t) for t in raw.split()], raw


def assert_first_rows_trained_after_the_question(tr, b):
    """Each group's first row (a response sampled with a rebuilt prompt) is trained after the
    plain question of its HintData row."""
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    for gi, key in enumerate(tr._last_keys):
        row = np.flatnonzero(b["group_ids"] == gi)[0]
        q = HintData().rows[int(key.split(":")[1])][0]
        assert b["tokens"][row, :p][b["mask"][row, :p]].tolist() == encode(q)[0]


def first_is_target(prompts, completions, completion_ids, **_):
    """1 when the first completion token is TARGET (rare for the random model: groups fail)."""
    return [float(len(ids) > 0 and ids[0] == TARGET) for ids in completion_ids]


def test_ghpo_in_the_loop_trains_hinted_groups_in_their_context():
    kw = dict(g=4, prompts_per_step=2, reward=first_is_target, hints={"name": "ghpo", "template": " "},
              encoder=encode, buckets=(16,))
    tr = make("grpo", data=HintData(), **kw)
    fresh = make("grpo", data=HintData(), **kw)  # the initial policy, to check the sampler's log-probs
    m = tr.step()
    b = tr.last_batch
    assert m["hints/groups"] >= 1  # the random policy fails most groups: some were hinted
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    hinted = 0
    for gi, key in enumerate(tr._last_keys):
        rows = np.flatnonzero(b["group_ids"] == gi)
        prompt = b["tokens"][rows[0], :p][b["mask"][rows[0], :p]].tolist()
        rec = tr.store.records[key]
        if len(prompt) > 3 and prompt[-1] == TARGET:  # a hinted prompt (the question + TARGET tokens)
            hinted += 1
            assert rec["last_pass_rate"] == 0  # the statistics keep the unhinted outcome: all failed
            assert tr._last_prompts[gi].startswith(HintData().rows[int(key.split(":")[1])][0] + " 7")
    assert hinted == m["hints/groups"]
    lp = np.asarray(fresh.logp(fresh.state.params, fresh.frozen, b["tokens"], b["mask"]))
    lm = b["loss_mask"]
    np.testing.assert_allclose(b["old_logp"][lm], lp[lm], atol=2e-5)  # sampled in the hinted context
    assert any(k.startswith("hints/stage1") for k in m) or m["hints/stage0_groups"] >= 1


def test_hints_need_an_encoder_and_exclude_replay():
    with pytest.raises(ValueError, match="prompt_encoder"):
        make("grpo", g=4, hints="ghpo")
    with pytest.raises(RegistryError, match="cannot be combined"):
        make("grpo", g=4, hints="ghpo", replay="arpo", old_logp="recompute", encoder=encode)


guide = HINTS["guide"].fn


def test_guide_rules_by_hand():
    raws = ["q0", "q1", "q2"]
    cols = {"hint": ["H0", "H1", ""], "solution": ["s0", "s1", "s2"]}
    vals, gid = [0, 0, 1, 0, 0, 0], [0, 0, 1, 1, 2, 2]

    def x(values=vals, stage=0, step=0, c=cols):
        return HintInputs(np.asarray(values, float), np.asarray(gid), c, tuple(raws), frozenset(), stage, step)

    # groups with 0 of G correct (mean <= threshold 0): group 0; group 2 fails too but has no hint
    assert guide(x()) == {0: "H0"}
    assert guide(x(), threshold=0.5) == {0: "H0", 1: "H1"}  # group 1: mean 0.5
    assert guide(x(), column="solution", replace=False, template="|") == {0: "q0|s0", 2: "q2|s2"}
    assert guide(x(stage=1)) == {}  # one re-roll
    assert guide(x(step=2), start_step=3) == {}
    with pytest.raises(ValueError, match="data column 'hints'"):
        guide(x(), column="hints")


def test_guide_in_the_loop_trains_hinted_responses_after_the_plain_prompt():
    kw = dict(g=4, prompts_per_step=2, reward=first_is_target, encoder=encode, buckets=(16,), loss="guide",
              hints={"name": "guide", "column": "solution", "replace": False, "template": " "})
    tr = make("grpo", data=HintData(), **kw)
    fresh = make("grpo", data=HintData(), **kw)  # the initial policy
    m = tr.step()
    b = tr.last_batch
    assert m["hints/groups"] >= 1
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    hinted_rows = b["hinted"] > 0
    assert hinted_rows.any() and not hinted_rows.all()
    assert m["hints/hinted_rows_frac"] == pytest.approx(hinted_rows.mean())
    lm = b["loss_mask"]
    plain_lp = np.asarray(fresh.logp(fresh.state.params, fresh.frozen, b["tokens"], b["mask"]))
    for gi, key in enumerate(tr._last_keys):
        rows = np.flatnonzero(b["group_ids"] == gi)
        q = HintData().rows[int(key.split(":")[1])]
        prompt = b["tokens"][rows[0], :p][b["mask"][rows[0], :p]].tolist()
        assert prompt == encode(q[0])[0]  # every row trains after the plain prompt
        if not hinted_rows[rows[0]]:
            np.testing.assert_allclose(b["old_logp"][rows][lm[rows]], plain_lp[rows][lm[rows]], atol=2e-5)
            continue
        assert hinted_rows[rows].all()
        # the old log-probs are the sampler's in the hinted context: teacher-forced there, not here
        hp = encode(q[0] + " " + q[1])[0]
        comp = b["tokens"][rows, p:]
        cm = b["completion_mask"][rows]
        pad = 16 - len(hp)
        toks = np.concatenate([np.zeros((len(rows), pad), np.int32), np.tile(hp, (len(rows), 1)), comp], axis=1)
        mask = np.concatenate([np.zeros((len(rows), pad), bool), np.ones((len(rows), len(hp)), bool), cm], axis=1)
        hinted_lp = np.asarray(fresh.logp(fresh.state.params, fresh.frozen, toks, mask))[:, 15:]
        np.testing.assert_allclose(b["old_logp"][rows][:, p - 1:][cm], hinted_lp[cm], atol=2e-5)
        assert np.abs(b["old_logp"][rows][lm[rows]] - plain_lp[rows][lm[rows]]).max() > 1e-3
    assert "policy/hinted_gamma_mean" in m


def test_guide_needs_its_hint_part_and_the_samplers_logprobs():
    with pytest.raises(RegistryError, match="recipe.loss=guide reshapes"):
        make("grpo", g=4, loss="guide")
    with pytest.raises(RegistryError, match="recipe.old_logp=recompute would replace"):
        make("grpo", g=4, hints="guide", old_logp="recompute", encoder=encode)


scaf = HINTS["scaf_grpo"].fn


def test_scaf_grpo_rules_by_hand():
    raws = ["q0", [{"role": "user", "content": "q1"}], "q2"]
    cols = {"knowledge_parts": [["k1", "k2"], ["a", "b", "c", "d", "e"], None],
            "solution_parts": [["s1"], [], ["t1", "t2"]]}
    gid = [0, 0, 1, 1, 2, 2]

    def x(values, step=60, stage=0):
        return HintInputs(np.asarray(values, float), np.asarray(gid), cols, tuple(raws), frozenset(), stage, step)

    got = scaf(x([0, 0, 0, 0, 0, 0]))
    assert got[0] == ["Question: q0\nKnowledge Hints: k1", "Question: q0\nKnowledge Hints: k1 k2",
                      "Question: q0\nSolution Hints: s1"]
    # chat data: a rebuilt conversation with the system message; at most 4 parts per tier
    assert len(got[1]) == 4 and got[1][3] == [{"role": "system", "content": "Please reason step by step, and put "
                                                                          "your final answer within \\boxed{}."},
                                              {"role": "user", "content": "Question: q1\nKnowledge Hints: a b c d"}]
    assert got[2] == ["Question: q2\nSolution Hints: t1", "Question: q2\nSolution Hints: t1 t2"]
    # only groups whose outcomes are all exactly 0; from iteration warmup_steps on; one stage
    assert list(scaf(x([0, 0, 1, 0, 0, -1]))) == [0]
    assert scaf(x([0] * 6, step=49)) == {} and scaf(x([0] * 6, step=50)) != {}
    assert scaf(x([0] * 6, stage=1)) == {}
    with pytest.raises(ValueError, match="column 'knowledge_parts'"):
        HINTS["scaf_grpo"].fn(HintInputs(np.zeros(2), np.zeros(2, int), {}, ("q",), frozenset(), 0, 60))


class ScafData(HintData):
    """HintData with hint parts: knowledge "1" .. "4", solution four TARGETs."""

    def __next__(self):
        b = super().__next__()
        n = len(b.prompts)
        return PromptBatch(b.prompt_ids, b.prompts, b.raw_prompts,
                           {**b.columns, "knowledge_parts": [["1", "2", "3", "4"]] * n,
                            "solution_parts": [["7", "7", "7", "7"]] * n}, b.where)


def encode_ints(raw):
    return [int(t) for t in raw.replace("\n", " ").split() if t.isdigit()], raw


def solution_two(prompts, completions, **_):
    """1 exactly when the prompt carries at least two solution parts (levels 6 to 8, 1-based)."""
    return [float("Solution Hints: 7 7" in p) for p in prompts]


def test_scaf_grpo_in_the_loop_puts_the_mildest_success_in_the_first_row():
    tr = make("grpo", g=4, prompts_per_step=2, reward=solution_two, encoder=encode_ints, buckets=(16,),
              data=ScafData(), old_logp="recompute", hints={"name": "scaf_grpo", "warmup_steps": 0})
    m = tr.step()
    b = tr.last_batch
    # every plain group scores 0: both asked, 8 levels each, rescued at level 6 (two solution parts)
    assert m["hints/groups"] == 2 and m["hints/levels_sampled"] == 16 and m["hints/rescued_groups"] == 2
    assert m["hints/level_mean"] == 6
    for gi in range(2):
        rows = np.flatnonzero(b["group_ids"] == gi)
        np.testing.assert_array_equal(b["scores"][rows], [1, 0, 0, 0])  # the first row holds the success
    # trained after the plain prompt, with old log-probs recomputed there
    fresh = make("grpo", g=4, prompts_per_step=2, reward=solution_two, encoder=encode_ints, buckets=(16,),
                 data=ScafData(), old_logp="recompute", hints={"name": "scaf_grpo", "warmup_steps": 0})
    lp = np.asarray(fresh.logp(fresh.state.params, fresh.frozen, b["tokens"], b["mask"]))
    np.testing.assert_allclose(b["old_logp"][b["loss_mask"]], lp[b["loss_mask"]], atol=2e-5)
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    for gi, key in enumerate(tr._last_keys):
        row = np.flatnonzero(b["group_ids"] == gi)[0]
        q = HintData().rows[int(key.split(":")[1])][0]
        assert b["tokens"][row, :p][b["mask"][row, :p]].tolist() == encode_ints(q)[0]
    with pytest.raises(RegistryError, match="set recipe.old_logp=recompute"):
        make("grpo", g=4, hints="scaf_grpo", encoder=encode_ints)


critique = HINTS["critique_grpo"].fn


def test_critique_grpo_prompts_by_hand():
    raws = ["q0", [{"role": "user", "content": "q1"}]]
    x = HintInputs(np.array([1.0, 0.0, 0.0, 0.0]), np.array([0, 0, 1, 1]), {"answer": ["7", "9"]}, tuple(raws),
                   frozenset(), 0, 3, ("a", "b", "c", "d"))
    got = critique(x, template="{question}|{solution}|{critique}")
    assert got[0] == ["q0|a|The generated solution is correct, the ground truth is 7.",
                      "q0|b|The generated solution is incorrect, the ground truth is 7."]
    assert got[1][1] == [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": "q1|d|The generated solution is incorrect, the ground truth is 9."}]
    simple = critique(x, critique="simple", template="{critique}")
    assert simple[0] == ["The generated solution is correct.", "The generated solution is incorrect."]
    full = critique(x)[0][0]  # the authors' request, with the boxed-answer instruction
    assert full.startswith("Given the following inputs:\n**Question**: q0\n**Previous Solution**: a\n**Critique**: ")
    assert "`\\boxed{answer}`" in full and full.endswith("addresses all issues raised in the critique.")
    assert critique(dataclasses.replace(x, stage=1)) == {}
    with pytest.raises(ValueError, match="column 'answer'"):
        critique(dataclasses.replace(x, columns={}))
    with pytest.raises(ValueError, match="critique must be"):
        critique(x, critique="text")


def refined_sevens(prompts, completions, **_):
    """1 when the prompt is a refinement request (it holds the critique), else 0."""
    return [float("Critique" in p) for p in prompts]


def test_critique_grpo_in_the_loop_puts_one_refinement_per_group_and_marks_it():
    def enc(raw):
        text = raw if isinstance(raw, str) else raw[-1]["content"]
        return [int(t) for t in text.replace("\n", " ").split() if t.isdigit()][:14], text

    kw = dict(g=4, prompts_per_step=2, reward=refined_sevens, encoder=enc, buckets=(16,), data=HintData())
    tr = make("critique_grpo", **kw, hints={"name": "critique_grpo", "column": "solution",
                                            "template": "{question} {solution} {critique} Critique"})
    m = tr.step()
    b = tr.last_batch
    assert m["hints/groups"] == 2 and m["hints/levels_sampled"] == 8 and m["hints/rescued_groups"] == 2
    assert b["hinted"].tolist() == [1, 0, 0, 0, 1, 0, 0, 0]
    for gi in range(2):
        rows = np.flatnonzero(b["group_ids"] == gi)
        np.testing.assert_array_equal(b["scores"][rows], [1, 0, 0, 0])
    assert_first_rows_trained_after_the_question(tr, b)  # the refinement row
    assert np.isfinite(m["loss"])
    # no success among the refinements: the first refinement still takes the first row (keep_failed)
    tr0 = make("critique_grpo", **{**kw, "reward": lambda prompts, completions, **_: [0.0] * len(prompts)},
               hints={"name": "critique_grpo", "column": "solution"})
    m0 = tr0.step()
    assert m0["hints/rescued_groups"] == 0 and tr0.last_batch["hinted"].tolist() == [1, 0, 0, 0, 1, 0, 0, 0]
    with pytest.raises(RegistryError, match="recipe.loss=critique_grpo reshapes"):
        make("grpo", g=4, loss="critique_grpo", encoder=enc)


def test_critique_grpo_needs_a_prompt_bucket_longer_than_a_response():
    from jaxrl_llm.config import ConfigError

    with pytest.raises(ConfigError, match="largest prompt bucket .*must be longer"):
        make("critique_grpo", g=4, prompts_per_step=2, encoder=encode_ints, buckets=(4,), data=HintData(),
             hints={"name": "critique_grpo", "column": "solution"})

"""The span-grounding task (the text analogue of GUI grounding, for GUI-RCPO's region
consistency reward, METHODS.md #98): rows, verifier, split, and the label-free reward's
agreement with the labels when the group agrees."""

import numpy as np
import pytest

from jaxrl_llm.algorithms import SHAPING
from jaxrl_llm.algorithms.sampling import ShapingInputs
from jaxrl_llm.tasks import KINDS_OF_SPANS, get_task


def test_rows_hold_exactly_one_run_of_the_asked_kind():
    t = get_task("span_grounding")
    for r in t.rows("train", 40, seed=1):
        s, e = r["answer"]
        kind = set(KINDS_OF_SPANS[r["kind"]])
        inside = [w in kind for w in r["words"]]
        assert all(inside[s:e + 1]) and not any(inside[:s]) and not any(inside[e + 1:])
        assert f"{s} {r['words'][s]}" in r["prompt"] and t.score(r["solution"], r) == 1.0
    ev = {t.problem_key(r) for r in t.rows("eval", 30)}
    assert not ev & {t.problem_key(r) for r in t.rows("train", 200)}


def test_verifier():
    t = get_task("span_grounding")
    row = {"answer": [2, 4], "words": ["a"] * 6}
    assert t.score("I think [2, 4].", row) == 1.0
    assert t.score("[0, 1] no: [2, 4]", row) == 1.0  # the last span counts
    assert t.score("[2, 4] no: [2, 3]", row) == 0.0
    assert t.score("2 to 4", row) == 0.0
    soft = get_task("span_grounding", partial_credit=1.0)
    assert soft.score("[3, 5]", row) == pytest.approx(2 / 4)
    with pytest.raises(ValueError, match="run"):
        get_task("span_grounding", num_words=(3, 4), run=(3, 3))


def test_region_consistency_rewards_the_consensus_without_labels():
    t = get_task("span_grounding")
    row = t.rows("train", 1, seed=3)[0]
    s, e = row["answer"]
    texts = [f"[{s}, {e}]"] * 3 + [f"[{e + 1}, {e + 1}]"]  # three agree (and are right), one strays
    x = ShapingInputs(np.zeros(4, np.float32), np.ones(4), np.zeros(4, np.int64), 1, 8, {}, tuple(texts))
    r = SHAPING["region_consistency"].fn(x)
    assert r[0] == r[1] == r[2] == pytest.approx(0.75) and r[3] == pytest.approx(0.25)
    assert [t.score(c, row) for c in texts] == [1.0, 1.0, 1.0, 0.0]

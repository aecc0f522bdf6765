"""ICPO (METHODS.md #22): the in-context steered prompts (hand-built), demonstrations from a
JSONL pool or the step's other problems, deterministic per (seed, iteration, group); in the loop,
each group's first row replaced by a demonstration-guided response trained after the plain
question and marked for recipe.loss=icpo, with the annealed expert bonus on correct ones."""

import json

import numpy as np
import pytest

from jaxrl_llm.algorithms import HINTS, HintInputs
from jaxrl_llm.algorithms.hints import ICPO_INSTRUCTION, icpo_prompt
from test_hints import HintData, assert_first_rows_trained_after_the_question, encode
from test_rl_recipes_extra import make

icpo = HINTS["icpo"].fn
INST = ICPO_INSTRUCTION


def _x(raws, sols=None, step=0, stage=0):
    cols = {} if sols is None else {"solution": list(sols)}
    return HintInputs(np.zeros(len(raws)), np.arange(len(raws)), cols, tuple(raws), frozenset(), stage, step)


def test_prompt_by_hand_and_demonstrations_from_the_other_problems():
    # two problems: each one's only possible demonstration is the other
    out = icpo(_x(["1 + 1 = ? Let's think step by step.", "2 + 3 = ?"], ["2", "5"]))
    assert out[0] == [f"Question: 2 + 3 = ?{INST}\nAnswer: 5\n\n\nQuestion: 1 + 1 = ?{INST}\nAnswer:"]
    assert out[1] == [f"Question: 1 + 1 = ?{INST}\nAnswer: 2\n\n\nQuestion: 2 + 3 = ?{INST}\nAnswer:"]
    assert icpo(_x(["a", "b"], ["1", "2"], stage=1)) == {}  # one ask per round
    # never the problem itself; the same draw for the same iteration; the iteration changes it
    raws, sols = [f"q{i}" for i in range(12)], [f"s{i}" for i in range(12)]
    a = icpo(_x(raws, sols, step=3), n_demo=2)
    assert a == icpo(_x(raws, sols, step=3), n_demo=2)
    assert a != icpo(_x(raws, sols, step=4), n_demo=2)
    for g, (p,) in a.items():
        assert f"Question: q{g}{INST}\nAnswer: s{g}" not in p and p.count("Question:") == 3


def test_a_jsonl_pool_chat_prompts_and_bad_input(tmp_path):
    f = tmp_path / "demos.jsonl"
    f.write_text("\n".join(json.dumps({"question": f"d{i}", "solution": f"a{i}"}) for i in range(3)) + "\n")
    out = icpo(_x(["q"]), demos=str(f), n_demo=3)
    shots = out[0][0].split("\n\n\n")
    assert len(shots) == 4 and shots[-1] == f"Question: q{INST}\nAnswer:"
    assert sorted(shots[:3]) == [f"Question: d{i}{INST}\nAnswer: a{i}" for i in range(3)]
    # chat: the system message stays, the n-shot text is the user message (no instruction: the system's)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}]
    (msgs,) = icpo(_x([chat]), demos=str(f), n_demo=1)[0]
    assert msgs[0] == chat[0] and msgs[1]["role"] == "user" and msgs[1]["content"].endswith("Question: q\nAnswer:")
    assert INST not in msgs[1]["content"]
    with pytest.raises(ValueError, match="3 demonstrations asked, 1 available"):
        icpo(_x(["a", "b"], ["1", "2"]), n_demo=3)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x", "solution": "y"}\n{"question": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl line 2"):
        icpo(_x(["q"]), demos=str(bad))
    with pytest.raises(ValueError, match="data column 'solution'"):
        icpo(_x(["q", "r"]))
    with pytest.raises(ValueError, match="beta"):
        icpo(_x(["a", "b"], ["1", "2"]), beta=-1.0)


def guided_is_right(prompts, completions, **_):
    """1 for a response sampled with demonstrations in context (its prompt holds 'Question:')."""
    return [float("Question:" in p) for p in prompts]


def _enc(raw):
    text = raw if isinstance(raw, str) else raw[-1]["content"]
    return [int(t) for t in text.replace("\n", " ").split() if t.isdigit()][:14], text


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_in_the_loop_the_first_row_is_guided_marked_and_paid(beta):
    tr = make("icpo", g=4, prompts_per_step=2, reward=guided_is_right, encoder=_enc, buckets=(16,), data=HintData(),
              ref=True, hints={"name": "icpo", "beta": beta, "anneal_steps": 4})
    m = tr.step()
    b = tr.last_batch
    assert b["hinted"].tolist() == [1, 0, 0, 0, 1, 0, 0, 0]
    for gi in range(2):  # iteration 0: the whole bonus
        np.testing.assert_allclose(b["scores"][np.flatnonzero(b["group_ids"] == gi)], [1 + beta, 0, 0, 0])
    assert m["hints/expert_bonus"] == beta and m["hints/expert_bonus_rows"] == (2 if beta else 0)
    assert_first_rows_trained_after_the_question(tr, b)
    assert np.isfinite(m["loss"])
    m2 = tr.step()  # the bonus anneals: 1 - 1/4
    assert m2["hints/expert_bonus"] == pytest.approx(0.75 * beta)


def test_no_bonus_for_a_wrong_guided_response_and_guided_prompts_must_fit():
    from jaxrl_llm.config import ConfigError

    def nothing_right(prompts, completions, **_):
        return [0.0] * len(prompts)

    tr = make("icpo", g=4, prompts_per_step=2, reward=nothing_right, encoder=_enc, buckets=(16,), data=HintData(),
              ref=True, hints={"name": "icpo", "beta": 1.0})
    m = tr.step()
    assert m["hints/expert_bonus_rows"] == 0 and not tr.last_batch["scores"].any()
    assert tr.last_batch["hinted"].tolist() == [1, 0, 0, 0, 1, 0, 0, 0]  # guided rows stay, unpaid
    # n-shot prompts longer than every bucket: an error, not a run without guidance
    tr = make("icpo", g=4, prompts_per_step=2, reward=nothing_right, encoder=lambda raw: _enc(raw)[0] and (
        [1] * 40, raw if isinstance(raw, str) else raw[-1]["content"]) if "Question:" in str(raw) else encode(raw),
              buckets=(16,), data=HintData(), ref=True, hints={"name": "icpo"})
    with pytest.raises(ConfigError, match="none of the step's 2 rebuilt prompts fits"):
        tr.step()


def test_recompute_is_allowed_for_losses_that_do_not_read_the_hinted_old_log_probs():
    from jaxrl_llm.algorithms import RegistryError
    from jaxrl_llm.training import recipe

    assert recipe("icpo", num_samples=4).recompute_old_logp
    assert recipe("critique_grpo", num_samples=4, old_logp="recompute").recompute_old_logp
    with pytest.raises(RegistryError, match="recipe.old_logp=recompute would replace them"):
        recipe("grpo", num_samples=4, hints={"name": "guide", "column": "solution"}, loss="guide",
               old_logp="recompute")
    with pytest.raises(RegistryError, match="recipe.is_weights would weigh them"):
        recipe("icpo", num_samples=4, is_weights="tis")

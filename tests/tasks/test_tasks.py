"""Built-in tasks: determinism (also across processes), disjoint splits, verifiers, registry."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from jaxrl_llm.tasks import (
    TASKS,
    Arithmetic,
    ArithmeticMix,
    Countdown,
    Formatting,
    ReasoningGym,
    Task,
    evaluate_expression,
    extract_expression,
    get_task,
    parse_final_number,
    solve,
)

REPO = Path(__file__).resolve().parents[2]

# One configuration per preset plus the defaults: (label, task).
CONFIGS = [
    ("arith-default", Arithmetic()),
    *[(f"arith-{p}", Arithmetic.preset(p)) for p in Arithmetic.PRESETS],
    ("arith-tag", Arithmetic.preset("add2", answer_format="tag")),
    ("arith-boxed", Arithmetic.preset("mul", answer_format="boxed")),
    ("arith-neg", Arithmetic(ops=("-", "*"), operand_ranges=((-9, 9), (-9, 9)), allow_negative=True)),
    *[(f"arith-mix-{p}", ArithmeticMix.preset(p)) for p in ArithmeticMix.PRESETS],
    ("reasoning-gym-arith-mix", ReasoningGym.preset("arith_mix")),
    ("reasoning-gym-tag", ReasoningGym(datasets=("chain_sum",), answer_format="tag")),
    ("countdown-default", Countdown()),
    ("countdown-3", Countdown.preset("countdown3")),
    ("countdown-4", Countdown.preset("countdown4")),
    ("countdown-subset", Countdown(num_numbers=5, use_all=False)),
    ("countdown-addmul", Countdown(num_numbers=3, ops=("+", "*"), max_number=9, target_range=(10, 200))),
    ("game24", Countdown.game24()),
    ("formatting-default", Formatting()),
    *[(f"formatting-{p}", Formatting.preset(p)) for p in Formatting.PRESETS],
]
IDS = [c[0] for c in CONFIGS]
TASK_LIST = [c[1] for c in CONFIGS]

# Computes a digest of rows of several tasks; run in-process and in a fresh interpreter.
DIGEST_CODE = """
import hashlib, json
from jaxrl_llm.tasks import get_task
h = hashlib.sha256()
for name, kw in [("arithmetic", {"preset": "add3"}), ("arithmetic", {"preset": "sub"}), ("countdown", {}),
                 ("game24", {}), ("formatting", {"preset": "mixed"})]:
    task = get_task(name, **kw)
    for split, n in (("train", 40), ("eval", 10)):
        h.update(json.dumps(task.rows(split, n, seed=7), sort_keys=True).encode())
print(h.hexdigest())
"""


def _digest_in_process() -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(DIGEST_CODE, {})
    return buf.getvalue().strip()


# ---------------------------------------------------------------------- determinism


def test_same_args_same_rows_and_prefix():
    for task in TASK_LIST:
        a = task.rows("train", 60, seed=3)
        assert a == task.rows("train", 60, seed=3)
        assert a[:25] == task.rows("train", 25, seed=3)
        assert list(itertools.islice(task.iter_rows("train", seed=3), 60)) == a
        # an equal, separately constructed config gives the same rows
        twin = type(task)(**{f.name: getattr(task, f.name) for f in dataclasses.fields(task)})
        assert twin is not task and twin.rows("train", 60, seed=3) == a


def test_different_seeds_differ():
    for task in TASK_LIST:
        assert task.rows("train", 30, seed=0) != task.rows("train", 30, seed=1)


def test_rows_identical_in_fresh_process_with_other_hash_seed():
    env = dict(os.environ, PYTHONHASHSEED="4242")
    out = subprocess.run(
        [sys.executable, "-c", DIGEST_CODE], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == _digest_in_process()


def test_rows_are_json_serialisable_and_have_core_columns():
    for task in TASK_LIST:
        for r in task.rows("train", 20) + task.rows("eval", 5):
            assert isinstance(r["prompt"], str) and r["prompt"]
            assert isinstance(r["solution"], str) and r["solution"]
            assert "answer" in r
            assert json.loads(json.dumps(r)) == r


# ---------------------------------------------------------------------- splits


@pytest.mark.parametrize("task", TASK_LIST, ids=IDS)
def test_train_eval_disjoint(task: Task):
    n_eval = min(40, task._split_size("eval") or 40)
    train, ev = task.rows("train", 300), task.rows("eval", n_eval)
    k_train = {task.problem_key(r) for r in train}
    k_eval = {task.problem_key(r) for r in ev}
    assert not k_train & k_eval
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in ev}
    assert all(task.split_of(k) == "train" for k in k_train)
    assert all(task.split_of(k) == "eval" for k in k_eval)
    assert len(k_eval) == len(ev)  # eval never repeats


def test_split_rule_independent_of_difficulty_knobs():
    # a problem is on the same side for every arithmetic config: add1's eval problems are
    # never in the train split of a wider addition config
    small, big = Arithmetic.preset("add1"), Arithmetic(ops=("+",), operand_ranges=((0, 30), (0, 30)))
    eval_small = {small.problem_key(r) for r in small.rows("eval", small._split_size("eval"))}
    train_big = {big.problem_key(r) for r in big.rows("train", 2000)}
    assert eval_small and not eval_small & train_big


def test_independent_canonical_keys_disjoint():
    # keys recomputed here, not through problem_key
    a = Arithmetic.preset("add2x1")
    key = lambda r: (r["op"], *sorted((r["a"], r["b"])))  # noqa: E731
    assert not {key(r) for r in a.rows("train", 500)} & {key(r) for r in a.rows("eval", 100)}
    c = Countdown.game24()
    key = lambda r: (tuple(sorted(r["numbers"])), r["target"])  # noqa: E731
    assert not {key(r) for r in c.rows("train", 300)} & {key(r) for r in c.rows("eval", 100)}


def test_small_space_train_repeats_eval_raises():
    task = Arithmetic.preset("add1")
    n_train, n_eval = task._split_size("train"), task._split_size("eval")
    assert n_train + n_eval == task.space_size() == 55  # 0..9 + 0..9, commutative pairs merged
    rows = task.rows("train", 3 * n_train + 5)
    keys = [task.problem_key(r) for r in rows]
    assert len(set(keys[:n_train])) == n_train  # first pass covers the split without repeats
    assert len(set(keys)) == n_train
    assert len(task.rows("eval", n_eval)) == n_eval
    with pytest.raises(ValueError, match=rf"only {n_eval} distinct problems.*n={n_eval + 1} "):
        task.rows("eval", n_eval + 1)
    assert len(list(task.iter_rows("eval"))) == n_eval  # finite stream


def test_rows_argument_errors():
    task = Arithmetic()
    with pytest.raises(ValueError, match="split"):
        task.rows("test", 3)
    with pytest.raises(ValueError, match="n must be"):
        task.rows("train", -1)
    with pytest.raises(ValueError, match="seed"):
        task.rows("train", 3, seed=1.5)
    assert task.rows("train", 0) == []


# ---------------------------------------------------------------------- solutions verify


@pytest.mark.parametrize("task", TASK_LIST, ids=IDS)
def test_solutions_score_one(task: Task):
    n_eval = min(50, task._split_size("eval") or 50)
    for r in task.rows("train", 300, seed=5) + task.rows("eval", n_eval, seed=5):
        assert task.score(r["solution"], r) == 1.0, r


def test_corrupted_arithmetic_solutions_score_zero():
    for p in Arithmetic.PRESETS:
        task = Arithmetic.preset(p)
        for r in task.rows("train", 100):
            assert task.score(str(r["answer"] + 1), r) == 0.0
            assert task.score(r["solution"].replace(str(r["answer"]), str(r["answer"] - 1)), r) == 0.0


def test_corrupted_countdown_solutions_score_zero():
    for task in [Countdown(), Countdown.game24(), Countdown.preset("countdown3")]:
        for r in task.rows("train", 150):
            expr = r["solution"][len("<answer>"): -len("</answer>")]
            assert task.score(f"<answer>{expr}</answer>", r) == 1.0
            assert task.score(f"<answer>({expr}) * 1 + 1</answer>", r) == 0.0  # extra numbers
            assert task.score(f"<answer>{expr} + 0</answer>", r) == 0.0  # extra number, same value
            # drop the first number: use the target itself as a single literal instead
            assert task.score(f"<answer>{r['target']}</answer>", r) == 0.0


def test_corrupted_formatting_solutions_score_zero():
    task = Formatting.preset("mixed")
    for r in task.rows("train", 150):
        ans = list(r["answer"])
        swapped = [ans[1], ans[0], *ans[2:]]
        assert task.score(f"<answer>{', '.join(swapped)}</answer>", r) == 0.0
        assert task.score(f"<answer>{', '.join(ans[:-1])}</answer>", r) == 0.0


# ---------------------------------------------------------------------- arithmetic verifier


@pytest.mark.parametrize(
    "text,expected",
    [
        ("The answer is 1,234.", 1234),
        ("\\boxed{42}", 42),
        ("so \\boxed{1,234} done", 1234),
        ("<answer>42</answer>", 42),
        ("-7", -7),
        ("x = −7", -7),
        ("5.0", 5),
        ("It is 5.", 5),
        ("37 + 5 = 42", 42),
        ("3 and then 4", 4),
        ("<answer>1</answer> then <answer>2</answer>", None),  # two different answers: a hedge (issue 39)
        ("<answer>2</answer> then <answer>2</answer>", 2),
        ("<answer>7</answer> and 9 afterwards", 7),  # tag beats later numbers
        ("\\boxed{3} but 8", 3),  # boxed beats later numbers
        ("5-3", 3),  # binary minus, not a sign
        ("numbers 3,4", 4),
        ("2.5", Fraction(5, 2)),
        ("no number here", None),
        ("<answer>none</answer> 5", None),  # an answer tag without a number
        ("", None),
    ],
)
def test_parse_final_number(text, expected):
    assert parse_final_number(text) == expected


def test_arithmetic_score_cases():
    task = Arithmetic()
    row = {"answer": 1234}
    assert task.score("The answer is 1,234.", row) == 1.0
    assert task.score("1234.0", row) == 1.0
    assert task.score("1234.5", row) == 0.0
    assert task.score("I don't know", row) == 0.0
    assert task.score("1234 or maybe 1235", row) == 0.0
    assert task.score("-7", {"answer": -7}) == 1.0
    assert task.score("7", {"answer": -7}) == 0.0
    assert task.score("5.", {"answer": 5}) == 1.0


def test_arithmetic_generation_respects_knobs():
    for r in Arithmetic.preset("sub").rows("train", 200):
        assert 5 <= r["a"] <= 20 and 0 <= r["b"] <= 5 and r["answer"] == r["a"] - r["b"] >= 0
    for r in Arithmetic(ops=("-",), digits=2).rows("train", 200):
        assert 10 <= r["a"] <= 99 and 10 <= r["b"] <= 99 and r["answer"] >= 0
    for r in Arithmetic.preset("add2x1").rows("train", 200):
        assert 10 <= r["a"] <= 99 and 0 <= r["b"] <= 9
        assert r["prompt"] == f"What is {r['a']} + {r['b']}? Answer with the number only."
    for r in Arithmetic.preset("div").rows("train", 100):
        assert r["a"] % r["b"] == 0 and r["answer"] == r["a"] // r["b"] and f"{r['a']} / {r['b']}" in r["prompt"]
    neg = Arithmetic(ops=("-",), digits=1, allow_negative=True).rows("train", 100)
    assert any(r["answer"] < 0 for r in neg)
    ops = {r["op"] for r in Arithmetic.preset("mixed1").rows("train", 100)}
    assert ops == {"+", "-", "*"}
    custom = Arithmetic(instruction="Think, then answer.").rows("train", 1)[0]["prompt"]
    assert custom.endswith("? Think, then answer.")
    assert Arithmetic(instruction="").rows("train", 1)[0]["prompt"].endswith("?")
    r = Arithmetic(answer_format="tag").rows("train", 1)[0]
    assert r["solution"] == f"<answer>{r['answer']}</answer>" and "<answer>" in r["prompt"]


def test_arithmetic_config_errors():
    with pytest.raises(ValueError, match="ops"):
        Arithmetic(ops=("^",))
    with pytest.raises(ValueError, match="ops"):
        Arithmetic(ops=())
    with pytest.raises(ValueError, match="digits"):
        Arithmetic(digits=(0, 1))
    with pytest.raises(ValueError, match="operand_ranges"):
        Arithmetic(operand_ranges=((5, 1), (0, 3)))
    with pytest.raises(ValueError, match="answer_format"):
        Arithmetic(answer_format="json")
    with pytest.raises(ValueError, match="allow_negative"):
        Arithmetic(ops=("-",), operand_ranges=((0, 3), (5, 9)))
    with pytest.raises(ValueError, match="divisor"):
        Arithmetic(ops=("/",), operand_ranges=((1, 3), (0, 0)))


# ---------------------------------------------------------------------- countdown verifier


ROW24 = {"numbers": [1, 3, 4, 6], "target": 24, "answer": 24}


@pytest.mark.parametrize(
    "completion,score",
    [
        ("<answer>6 / (1 - 3 / 4)</answer>", 1.0),  # non-integer intermediate values are fine
        ("<answer>(1/3) * 3 * 4 * 6</answer>", 0.0),  # 3 used twice, 1 once: wrong multiset
        ("<answer>6 / (1 - 3 / 4) = 24</answer>", 1.0),
        ("<answer>24 = 6/(1-3/4)</answer>", 1.0),
        ("So the answer is 6 / (1 - 3 / 4) = 24.", 1.0),
        ("Let me try.\n6 / (1 - 3 / 4)", 1.0),
        ("<answer>6 × 4 × (4 − 3)</answer>", 0.0),  # 4 reused, 1 missing
        ("<answer>6 * 4 * (3 - 1)</answer>", 0.0),  # value 48
        ("<answer>6 * 4</answer>", 0.0),  # numbers missing
        ("<answer>6 * 4 * 1 * 3 * 1</answer>", 0.0),  # extra number
        ("<answer>(6 * 4) / (3 - 3) + 1</answer>", 0.0),
        ("<answer>6 * 4 / (3 - 1 - 2) + 0</answer>", 0.0),
        ("<answer>__import__('os').system('echo hi')</answer>", 0.0),
        ("<answer>abs(6*4*1) + 3 - 3</answer>", 0.0),
        ("<answer>6**1*4*(3-1-1)</answer>", 0.0),  # power not allowed
        ("<answer>(6 * 4 * 1) // 1 + 3 - 3</answer>", 0.0),
        ("<answer>6.0 / (1 - 3 / 4)</answer>", 0.0),  # float literal
        ("<answer>1_0</answer>", 0.0),
        ("<answer></answer>", 0.0),
        ("I cannot solve this.", 0.0),
        ("<answer>-(1 - 3 / 4) * -6 * 16 / 1</answer>", 0.0),
        ("<answer>" + "(" * 400 + "1" + ")" * 400 + "</answer>", 0.0),
    ],
)
def test_countdown_score_cases(completion, score):
    assert Countdown.game24().score(completion, ROW24) == score


def test_countdown_unary_minus_and_subset_rules():
    task = Countdown.game24()
    # unary minus is allowed (it adds nothing that reordering could not do)
    assert task.score("<answer>6 * 4 / (-(3 - 4))</answer>", {"numbers": [6, 4, 3, 4], "target": 24}) == 1.0
    sub = Countdown.game24(use_all=False)
    assert sub.score("<answer>6 * 4</answer>", ROW24) == 1.0
    assert sub.score("<answer>6 * 4 * 1</answer>", ROW24) == 1.0
    assert sub.score("<answer>6 * 4 * 1 * 1</answer>", ROW24) == 0.0  # 1 used twice


def test_countdown_never_executes_code(tmp_path):
    marker = tmp_path / "pwned"
    payload = f"<answer>__import__('pathlib').Path({str(marker)!r}).touch()</answer>"
    assert Countdown.game24().score(payload, ROW24) == 0.0
    assert not marker.exists()
    assert evaluate_expression("__import__('os')") is None
    assert evaluate_expression("1 / 0") is None
    assert evaluate_expression("(1 / 3) * 3") == (Fraction(1), [1, 3, 3])
    assert evaluate_expression("-2 * 3") == (Fraction(-6), [2, 3])


def test_extract_expression_rules():
    assert extract_expression("<answer>1 + 2</answer> then 3 * 8 = 24", 24) == "1 + 2"  # tag first
    assert extract_expression("we get 3 * 8 = 24. Also 2 + 2 = 4", 24) == "3 * 8"
    assert extract_expression("3 * 8 = 240", 24) == "3 * 8"  # "= 240" is not "= 24": last-line rule
    assert extract_expression("First 2 + 2 = 4.\n(1 + 2) * 8", 24) == "(1 + 2) * 8"
    assert extract_expression("nothing", 24) is None


def test_countdown_generation_respects_knobs():
    for r in Countdown.game24().rows("train", 100):
        assert len(r["numbers"]) == 4 and all(1 <= n <= 13 for n in r["numbers"]) and r["target"] == 24
        assert solve(r["numbers"], 24) is not None
    task = Countdown(num_numbers=3, min_number=2, max_number=9, target_range=(20, 60))
    for r in task.rows("train", 100):
        assert len(r["numbers"]) == 3 and all(2 <= n <= 9 for n in r["numbers"])
        assert 20 <= r["target"] <= 60 and r["answer"] == r["target"]
        assert "exactly once" in r["prompt"] and str(r["numbers"]) in r["prompt"]
    assert "at most once" in Countdown(use_all=False).rows("train", 1)[0]["prompt"]


def test_solver():
    assert solve([1, 3, 4, 6], 24) is not None
    assert solve([1, 1, 1, 1], 24) is None
    assert solve([3, 3, 8, 8], 24) is not None  # needs 8 / (3 - 8 / 3)
    expr = solve([3, 3, 8, 8], 24)
    assert evaluate_expression(expr)[0] == 24
    assert solve([5, 5], 5, use_all=False) is not None
    assert solve([5, 5], 5, use_all=True) is None  # 5+5, 5-5, 5*5, 5/5: none is 5


def test_countdown_config_errors():
    with pytest.raises(ValueError, match="num_numbers"):
        Countdown(num_numbers=1)
    with pytest.raises(ValueError, match="min_number"):
        Countdown(min_number=0)
    with pytest.raises(ValueError, match="target_range"):
        Countdown(target_range=(10, 5))
    with pytest.raises(ValueError, match="target"):
        Countdown(target=-3)
    with pytest.raises(ValueError, match="num_numbers"):
        Countdown(num_numbers=6, target=24)
    with pytest.raises(ValueError, match="ops"):
        Countdown(ops=("%",))
    with pytest.raises(ValueError, match="target_range"):
        Countdown(num_numbers=2, max_number=3, ops=("+",), target_range=(50, 60)).rows("train", 1)


# ---------------------------------------------------------------------- formatting verifier


def test_formatting_score_cases():
    task = Formatting()
    row = {"answer": ["apple", "fig", "pear"]}
    assert task.score("<answer>apple, fig, pear</answer>", row) == 1.0
    assert task.score("  <answer>apple,fig ,pear</answer>\n", row) == 1.0
    # right content, wrong format: partial credit 0.5
    assert task.score("apple, fig, pear", row) == 0.5  # no tags
    assert task.score("Sure! Here you go:\napple, fig, pear", row) == 0.5  # last line
    assert task.score("Sure! <answer>apple, fig, pear</answer>", row) == 0.5  # text outside
    assert task.score("<answer>apple fig pear</answer>", row) == 0.5  # separator
    assert task.score("<answer>Apple, Fig, Pear</answer>", row) == 0.5  # case
    assert task.score("<answer>pear</answer><answer>apple, fig, pear</answer>", row) == 0.5  # two tags
    # wrong content: 0
    assert task.score("<answer>fig, apple, pear</answer>", row) == 0.0  # wrong order
    assert task.score("<answer>apple, fig</answer>", row) == 0.0
    assert task.score("<answer>apple, fig, pear, plum</answer>", row) == 0.0
    assert task.score("Sure! apple, fig, pear", row) == 0.0  # extra word on the answer line
    assert task.score("", row) == 0.0
    strict = Formatting(partial_credit=0.0)
    assert strict.score("apple, fig, pear", row) == 0.0
    assert strict.score("<answer>apple, fig, pear</answer>", row) == 1.0


def test_formatting_generation():
    for r in Formatting.preset("mixed").rows("train", 200):
        w, mode = r["words"], r["mode"]
        assert 3 <= len(w) <= 6 and len(set(w)) == len(w)
        assert r["answer"] == {"sort": sorted(w), "sort_desc": sorted(w, reverse=True), "reverse": w[::-1]}[mode]
        assert w != r["answer"]
        assert ", ".join(w) in r["prompt"] and "<answer></answer>" in r["prompt"]
    with pytest.raises(ValueError, match="num_words"):
        Formatting(num_words=(1, 3))
    with pytest.raises(ValueError, match="modes"):
        Formatting(modes=("shuffle",))
    with pytest.raises(ValueError, match="partial_credit"):
        Formatting(partial_credit=2.0)


# ---------------------------------------------------------------------- reward protocol


def test_reward_protocol_with_columns():
    task = Arithmetic()
    rows = task.rows("train", 6)
    prompts = [r["prompt"] for r in rows]
    completions = [r["solution"] if i % 2 == 0 else "no idea" for i, r in enumerate(rows)]
    cols = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    out = task.reward(prompts, completions, trainer_state=object(), **cols)
    assert out == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert all(isinstance(x, float) for x in out)
    # only the required column is needed; conversational format works too
    conv_p = [[{"role": "user", "content": p}] for p in prompts]
    conv_c = [[{"role": "assistant", "content": c}] for c in completions]
    assert task.reward(conv_p, conv_c, answer=cols["answer"]) == out
    import numpy as np

    assert task.reward(prompts, completions, answer=np.asarray(cols["answer"])) == out


def test_reward_protocol_other_tasks():
    for task in [Countdown.game24(), Formatting()]:
        rows = task.rows("train", 4)
        cols = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
        assert task.reward([r["prompt"] for r in rows], [r["solution"] for r in rows], **cols) == [1.0] * 4
        assert task.reward([r["prompt"] for r in rows], ["x"] * 4, **cols) == [0.0] * 4


def test_reward_protocol_errors():
    task = Countdown.game24()
    rows = task.rows("train", 3)
    p, c = [r["prompt"] for r in rows], [r["solution"] for r in rows]
    with pytest.raises(ValueError, match="same length"):
        task.reward(p[:2], c, numbers=[r["numbers"] for r in rows], target=[24] * 3)
    with pytest.raises(ValueError, match="'numbers'"):
        task.reward(p, c, numbers=[[1, 2, 3, 4]] * 2, target=[24] * 3)
    with pytest.raises(ValueError, match="'target'"):
        task.reward(p, c, numbers=[r["numbers"] for r in rows])


# ---------------------------------------------------------------------- registry


def test_registry():
    assert {"arithmetic", "countdown", "game24", "formatting"} <= set(TASKS)
    assert get_task("arithmetic") == Arithmetic()
    assert get_task("arithmetic", preset="sub") == Arithmetic.preset("sub")
    assert get_task("arithmetic", preset="mul", answer_format="tag").answer_format == "tag"
    assert get_task("game24") == Countdown.game24()
    assert get_task("game24", use_all=False).use_all is False
    assert get_task("countdown", num_numbers=3).num_numbers == 3
    assert isinstance(get_task("formatting", preset="mixed"), Formatting)


def test_registry_errors():
    with pytest.raises(ValueError, match="unknown task 'gsm8k'.*arithmetic.*countdown.*formatting.*game24"):
        get_task("gsm8k")
    with pytest.raises(ValueError, match="unknown Arithmetic preset 'add9'.*add1"):
        get_task("arithmetic", preset="add9")
    with pytest.raises(ValueError, match="unknown argument.*'digitz'.*valid arguments: ops, digits"):
        get_task("arithmetic", digitz=2)
    with pytest.raises(ValueError, match="num_numbers"):
        get_task("countdown", num_numbers=0)


def test_arithmetic_mix_labels_levels_and_scores_like_arithmetic():
    task = get_task("arithmetic_mix", levels=("add1", "mul", "add3"))
    rows = task.rows("train", 300, seed=1)
    assert {r["level"] for r in rows} == {"add1", "mul", "add3"}
    for r in rows[:50]:
        inner = Arithmetic.preset(r["level"])
        assert r["prompt"] == f"What is {r['a']} {r['op']} {r['b']}? Answer with the number only."
        assert inner.score(str(r["answer"]), r) == task.score(str(r["answer"]), r) == 1.0
        assert task.score(str(r["answer"] + 1), r) == 0.0
        assert task.problem_key(r) == (r["level"], inner.problem_key(r))
    with pytest.raises(ValueError, match="unknown Arithmetic preset"):
        ArithmeticMix(levels=("add1", "nope"))
    assert "arithmetic_mix" in TASKS


def test_reasoning_gym_rows_score_with_the_family_verifier():
    task = get_task("reasoning_gym", preset="arith_mix")
    rows = task.rows("train", 60, seed=2)
    assert {r["level"] for r in rows} == {"chain_sum", "basic_arithmetic", "products"}
    cols = {"answer": [r["answer"] for r in rows], "entry": [r["entry"] for r in rows]}
    prompts = [r["prompt"] for r in rows]
    assert task.reward(prompts, [r["solution"] for r in rows], **cols) == [1.0] * len(rows)
    wrong = [str(int(float(r["answer"])) + 1) for r in rows]
    assert task.reward(prompts, wrong, **cols) == [0.0] * len(rows)
    tag = get_task("reasoning_gym", datasets=["chain_sum"], answer_format="tag")
    r = tag.rows("eval", 1)[0]
    assert tag.score(r["solution"], r) == 1.0 and tag.score(r["answer"], r) == 0.0  # no tag: 0
    with pytest.raises(ValueError, match="unknown reasoning-gym family"):
        get_task("reasoning_gym", datasets=["no_such_family"])
    with pytest.raises(ValueError, match=r"config\['chain_sum'\].*refused"):
        get_task("reasoning_gym", datasets=["chain_sum"], config={"chain_sum": {"min_terms": 5, "max_terms": 2}})

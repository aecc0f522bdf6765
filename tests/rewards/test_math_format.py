"""Math final-answer verifier, format rewards and length shaping on tricky cases."""

import threading

import numpy as np
import pytest

from jaxrl_llm import core
from jaxrl_llm.rewards import (KimiLengthReward, OverlongReward, RegexReward, TagFormatReward, extract_answer,
                               gsm8k_gold, last_boxed, math_equal, math_reward)


@pytest.mark.parametrize("text, want", [
    (r"so the answer is \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
    (r"first \boxed{3}, then corrected: \boxed{4}", "4"),  # several boxed answers: the last
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # nested braces
    (r"\fbox{7}", "7"),
    (r"\boxed 5 is it", "5"),
    (r"\boxed{unclosed", None),
    ("no boxed here", None),
])
def test_last_boxed(text, want):
    assert last_boxed(text) == want


@pytest.mark.parametrize("text, want", [
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),  # GSM8K
    ("The total is 1,234.", "1234"),  # thousands separator, trailing period
    ("It went from 5 to -7", "-7"),
    ("<answer> 42 </answer> (checked 3 times)", "42"),
    (r"\boxed{12} #### 13", "12"),  # boxed wins
    ("x = 3.50", "3.50"),
    ("I do not know.", None),
    ("", None),
])
def test_extract_answer(text, want):
    assert extract_answer(text) == want


def test_extract_methods_are_selectable():
    assert extract_answer("#### 5 and 6", methods=("number",)) == "6"
    assert extract_answer("no tag 5", methods=("tag",)) is None
    with pytest.raises(ValueError, match="unknown extraction method 'regex'"):
        extract_answer("5", methods=("regex",))


@pytest.mark.parametrize("pred, gold", [
    ("0.5", "1/2"), (r"\frac{1}{2}", "0.5"), (r"\dfrac12", "0.5"), ("1,234", "1234"),
    ("1,234,567", 1234567), ("3.0", "3"), (r"10^{3}", "1000"), (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}"),
    ("x=3", "3"), ("18 eggs", "18"), (r"\$18", "18"), (r"12\%", "12"), ("-5", "-5"), ("(1,2)", "(1, 2)"),
])
def test_equivalent_forms(pred, gold):
    assert math_equal(pred, gold)


@pytest.mark.parametrize("pred, gold", [
    ("5", "6"), ("0.333", "1/3"), ("2", r"\{1,2\}"), (None, "5"), ("", "5"), ("5", ""), ("-5", "5"), ("1234", "123"),
])
def test_non_equivalent(pred, gold):
    assert not math_equal(pred, gold)


def test_math_reward_protocol_and_threads():
    completions = [r"... \boxed{\frac{3}{4}}", "so 0.75", "#### 1,000", "no idea", r"\boxed{1}\boxed{2}"]
    answers = ["0.75", "3/4", "1000", "1", "1"]
    want = [1.0, 1.0, 1.0, 0.0, 0.0]
    assert math_reward(["q"] * 5, completions, answer=answers) == want
    got = []  # off the main thread math-verify's signal-based timeout must be off
    t = threading.Thread(target=lambda: got.append(math_reward(["q"] * 5, completions, answer=answers)))
    t.start()
    t.join()
    assert got == [want]


def test_gsm8k_gold():
    assert gsm8k_gold("Weng earns 12/60 = $0.2 per minute.\n#### 1,000") == "1000"
    with pytest.raises(ValueError, match="no '####'"):
        gsm8k_gold("just text")


def test_regex_reward():
    r1 = RegexReward(r"<think>.*?</think>\s*<answer>.*?</answer>")
    assert r1(["p"] * 3, ["<think>a\nb</think> <answer>3</answer>", "<answer>3</answer>",
                          "  <think>x</think><answer>3</answer>\n"]) == [1.0, 0.0, 1.0]
    assert RegexReward(r"\d+", full=False, value=0.5)(["p"] * 2, ["a 7", "none"]) == [0.5, 0.0]
    with pytest.raises(ValueError, match="not a valid regex"):
        RegexReward("(")


def test_tag_format_reward():
    strict = TagFormatReward()
    comps = ["<think>ok</think>\n<answer>5</answer>", "<answer>5</answer><think>ok</think>",
             "<think>a<think>b</think><answer>5</answer>", "<think>ok</think><answer>5</answer> trailing", "plain"]
    assert strict(["p"] * 5, comps) == [1.0, 0.0, 0.0, 0.0, 0.0]
    soft = TagFormatReward(strict=False)
    assert soft(["p"] * 5, comps) == [1.0, 1.0, 0.75, 1.0, 0.0]
    with pytest.raises(ValueError, match="tags"):
        TagFormatReward(tags=("a b",))


def test_overlong_reward_uses_the_core():
    r = OverlongReward(max_length=100, buffer_length=20, penalty_factor=1.0)
    lengths = [10, 80, 90, 100, 120]
    got = r(["p"] * 5, ["c"] * 5, completion_lengths=lengths)
    np.testing.assert_allclose(got, [0.0, 0.0, -0.5, -1.0, -2.0])
    np.testing.assert_allclose(got, np.asarray(core.overlong_penalty(np.asarray(lengths, np.float32), 100, 20)))
    with pytest.raises(ValueError, match="buffer_length"):
        OverlongReward(10, 20)


def test_kimi_length_reward():
    r = KimiLengthReward(math_reward)
    comps = ["5", "5", "4", "7", "7"]
    got = r(["p"] * 5, comps, answer=["5", "5", "5", "7", "7"], completion_lengths=[10, 20, 30, 5, 5],
            group_ids=[3, 3, 3, 9, 9])
    # group 3: lambda = 0.5, 0, -0.5; the third is wrong -> min(0, -0.5); group 9: equal lengths -> 0
    np.testing.assert_allclose(got, [0.5, 0.0, -0.5, 0.0, 0.0])

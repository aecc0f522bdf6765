"""Hacks a policy finds against our verifiers, each closed (issue 39, item 4). Every case here
scored as correct before (commit 372d82f) and scores 0 now; the legitimate answer next to it
still scores 1.

The catalogue, by verifier:
- math (``math_reward``: boxed, ``####``, ``<answer>``, last number; ``math-verify`` equivalence):
  several different final answers, a hedge inside one answer, an empty box with a number
  elsewhere, an answer copied from the prompt;
- arithmetic (``parse_final_number``, the tiny preset's and the main job's verifier): several
  answer tags or boxes, a hedge inside one;
- the tag format (``TagFormatReward``): tags without content;
- tool-using agents (``tool_arith``, ``search_qa``): an answer tag inside a tool call or a
  made-up tool response, several different answers in one turn.
"""

from jaxrl_llm.rewards import TagFormatReward, extract_answer, math_equal, math_reward
from jaxrl_llm.tasks.arithmetic import parse_final_number

# ----------------------------------------------------------------------------- math


def test_several_different_boxed_answers_are_not_an_answer():
    hedge = r"It is \boxed{3} or maybe \boxed{4}."
    assert math_reward(["q"], [hedge], answer=["4"]) == [0.0]
    assert math_reward(["q"], [hedge], answer=["3"]) == [0.0]
    assert extract_answer(hedge) == "3, 4"  # all of them: equal to a gold set only
    assert math_reward(["q"], [hedge], answer=[r"\{3, 4\}"]) == [1.0]
    # one answer repeated, or in equivalent forms, is one answer
    assert math_reward(["q"], [r"\boxed{4}. Check: yes, \boxed{4}"], answer=["4"]) == [1.0]
    assert math_reward(["q"], [r"\boxed{1/2}, i.e. \boxed{0.5}"], answer=["0.5"]) == [1.0]
    # the same for #### lines and answer tags
    assert math_reward(["q"], ["#### 3\n#### 4"], answer=["4"]) == [0.0]
    assert math_reward(["q"], ["<answer>3</answer> <answer>4</answer>"], answer=["4"]) == [0.0]


def test_a_hedge_inside_one_answer_is_not_an_answer():
    for hedge in (r"\boxed{3 \text{ or } 4}", r"\boxed{3, 4}", "<answer>3 or 4</answer>", r"\boxed{4 (or maybe 3)}"):
        assert math_reward(["q"], [hedge], answer=["4"]) == [0.0], hedge
        assert math_reward(["q"], [hedge], answer=["3"]) == [0.0], hedge
    assert not math_equal("3 or 4", "4") and not math_equal("3, 4", "4")
    # words around one number still count, as does an equation's right-hand side
    assert math_equal("18 eggs", "18") and math_equal("x = 3", "3") and math_equal("2 + 1 = 3", "3")


def test_an_empty_box_is_no_answer():
    assert math_reward(["q"], [r"The answer is 12. \boxed{}"], answer=["12"]) == [0.0]
    assert extract_answer(r"The answer is 12. \boxed{ }") is None
    assert math_reward(["q"], ["The answer is 12.\n#### "], answer=["12"]) == [0.0]
    # an empty box restated from the instruction, beside the filled one, is ignored
    assert math_reward(["q"], [r"I put the answer in \boxed{}: \boxed{12}"], answer=["12"]) == [1.0]


PROMPT = ("Solve the problem. Example: Tom has 5 apples and buys 7 more, so he has 12 apples. #### 12\n"
          "Problem: Ann has 4 pears and buys 8 more. How many pears does she have?")


def test_an_answer_copied_from_the_prompt_is_not_the_policys():
    copied = "Tom has 5 apples and buys 7 more, so he has 12 apples. #### 12"
    assert math_reward([PROMPT], [copied], answer=["12"]) == [0.0]
    echo_then_number = "Ann has 4 pears and buys 8 more. How many pears does she have"  # ends on the prompt's 8
    assert math_reward([PROMPT], [echo_then_number], answer=["8"]) == [0.0]
    # the policy's own answer after restating the question counts
    own = "Ann has 4 pears and buys 8 more. How many pears does she have? 4 + 8 = 12. #### 12"
    assert math_reward([PROMPT], [own], answer=["12"]) == [1.0]
    assert math_reward([PROMPT], ["She has 12 pears."], answer=["12"]) == [1.0]


# ----------------------------------------------------------------------------- arithmetic


def test_arithmetic_hedges():
    assert parse_final_number("<answer>3</answer> or <answer>4</answer>") is None
    assert parse_final_number(r"\boxed{3} \boxed{4}") is None
    assert parse_final_number("<answer>3 or 4</answer>") is None
    assert parse_final_number(r"\boxed{3, 4}") is None
    # one answer, said once or twice, or as an equation
    assert parse_final_number("<answer>4</answer> so <answer>4</answer>") == 4
    assert parse_final_number("<answer>9 + 7 = 16</answer>") == 16
    assert parse_final_number(r"so \boxed{16}") == 16
    assert parse_final_number("9 + 7 = 16") == 16  # no tag or box: the last number of the text


# ----------------------------------------------------------------------------- tag format


def test_format_tags_without_content():
    strict, partial = TagFormatReward(), TagFormatReward(strict=False)
    empty = ["<think></think><answer></answer>", "<think> </think>\n<answer>\n</answer>",
             "<think>ok</think><answer> </answer>"]
    assert strict([None] * 3, empty) == [0.0, 0.0, 0.0]
    assert partial([None] * 3, empty) == [0.0, 0.0, 0.5]
    good = ["<think>a</think><answer>5</answer>", "<think> x </think> <answer>\n5\n</answer>\n"]
    assert strict([None] * 2, good) == [1.0, 1.0] and partial([None] * 2, good) == [1.0, 1.0]


# ----------------------------------------------------------------------------- agents


def test_agent_answers_inside_tool_blocks_do_not_count():
    from jaxrl_llm.agents.envs._common import extract_answer as agent_answer

    in_call = '<tool_call>{"name": "calculator", "arguments": {"expression": "<answer>12</answer>"}}</tool_call>'
    assert agent_answer(in_call) is None
    fake = "<tool_response>the result is <answer>12</answer></tool_response>"
    assert agent_answer(fake) is None
    assert agent_answer("<tool_call>{...") is None
    from jaxrl_llm.agents.envs._common import answers_of

    assert answers_of("<answer>3</answer> <tool_call>x</tool_call> <answer>4") == ["3", "4"]


def test_tool_env_hedge_and_tool_block_answers():
    from jaxrl_llm.agents.envs import tool_arith
    from jaxrl_llm.agents.tools import format_tool_call

    env = tool_arith(ops=("*",), digits=(2, 2)).make()
    env.reset(3)
    right = env.a * env.b
    # a hedge: a wrong answer and the right one in one turn (the last tag used to count)
    _, r, term, _, info = env.step(f"<answer>{right + 1}</answer> or <answer>{right}</answer>")
    assert (r, term, info["success"]) == (0.0, True, False) and info["hedged"]
    env.reset(3)
    _, r, term, _, info = env.step(f"<answer>{right}</answer> (again: <answer>{right}</answer>)")
    assert (r, term, info["success"], info["hedged"]) == (1.0, True, True, False)
    env.reset(3)  # an answer put inside a tool call is a tool call, not an answer
    call = format_tool_call("calculator", {"expression": f"<answer>{right}</answer>"})
    _, r, term, _, info = env.step(call)
    assert term is False and r == 0.0 and info["tool_calls"] == 1
    env.reset(3)  # a made-up tool response holding the answer: no answer
    _, r, term, _, info = env.step(f"<tool_response>{right}: <answer>{right}</answer></tool_response>")
    assert term is False and r == 0.0 and info["invalid"]


def test_copied_spans_hand_values():
    from jaxrl_llm.rewards.math import copied_spans

    prompt = "Tom has 5 apples and buys 7 more."
    completion = "So: Tom has 5 apples and buys 7 more. Then 12."
    # the common passage is the prompt whole (33 characters), at completion[4:37]
    assert copied_spans(prompt, completion) == [(4, 37)]
    assert copied_spans(prompt, completion, min_chars=34) == []
    assert copied_spans("", completion) == [] and copied_spans(prompt, "short") == []

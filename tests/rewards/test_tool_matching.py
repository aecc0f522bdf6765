"""MatchTIR's turn rewards (METHODS.md #165; jaxrl_llm.rewards.tool_matching): the authors' call
similarity by hand, scipy's maximum matching against the authors' greedy one, the turn rewards of
an episode, the tool environment's gold calls and recorded calls, and the loop's [N, K] input."""

import types

import numpy as np
import pytest

from jaxrl_llm.agents.envs.tool_arith import ToolArithmetic, solve_tool_arith
from jaxrl_llm.rewards.tool_matching import call_similarity, match_calls, turn_rewards
from jaxrl_llm.training.agent_loop import matchtir_turn_rewards


def call(name, **args):
    return {"name": name, "arguments": args}


def test_call_similarity_by_hand():
    gold = call("search", query="paris", k=3)
    assert call_similarity(gold, gold) == 1.0                        # (1 + 1 + 2) / (2 + 2)
    assert call_similarity(call("Search", query="paris", k=5), gold) == pytest.approx(3 / 4)  # one value right
    assert call_similarity(call("search", query="paris"), gold) == pytest.approx((1 + 0.5 + 1) / 4)  # J = 1/2
    assert call_similarity(call("search"), gold) == pytest.approx(1 / 4)  # no arguments: J = 0
    assert call_similarity(call("lookup", query="paris", k=3), gold) == 0.0
    assert call_similarity(call("f"), call("f")) == 1.0  # no arguments on either side: (1 + 1) / 2


def test_hungarian_is_the_maximum_matching_greedy_is_the_release():
    gold = [call("f", a=1, b=2), call("f", a=1, b=9)]
    # p0 is closest to gold 0 (0.75 vs 1.0? no): p0 matches g0 fully and g1 half; p1 matches only g0 partly
    pred = [call("f", a=1, b=2), call("f", a=5, b=2)]
    s = np.array([[call_similarity(p, g) for g in gold] for p in pred])
    np.testing.assert_allclose(s, [[1.0, 0.75], [0.75, 0.5]])
    # greedy takes (p0, g0) = 1.0 first, then (p1, g1) = 0.5: total 1.5; the maximum is also 1.5 here
    np.testing.assert_allclose(match_calls(pred, gold, assignment="greedy"), [1.0, 0.5])
    # a case where greedy is worse: the best single pair blocks a better total
    s_pred = [call("f", a=1, b=2), call("f", a=1)]
    s_gold = [call("f", a=1, b=2), call("f", b=2)]
    s2 = np.array([[call_similarity(p, g) for g in s_gold] for p in s_pred])
    hung = match_calls(s_pred, s_gold, assignment="hungarian")
    greedy = match_calls(s_pred, s_gold, assignment="greedy")
    assert hung.sum() >= greedy.sum() - 1e-12
    assert hung.sum() == pytest.approx(max(s2[0, 0] + s2[1, 1], s2[0, 1] + s2[1, 0]))
    # extra calls earn `unmatched`; no gold calls: every call unmatched
    np.testing.assert_allclose(match_calls(pred + [call("g")], gold, unmatched=-0.5), [1.0, 0.5, -0.5])
    np.testing.assert_allclose(match_calls(pred, []), [0.0, 0.0])
    with pytest.raises(ValueError, match="assignment"):
        match_calls(pred, gold, assignment="ot")


def test_turn_rewards_mean_of_the_turns_calls_and_the_env_reward_elsewhere():
    gold = [call("calc", e="2*3"), call("calc", e="6+1")]
    turns = [[call("calc", e="2*3"), call("calc", e="9")], [call("calc", e="6+1")], []]
    r = turn_rewards(turns, gold, [0.0, 0.0, 1.0])
    # one matching over the episode: turn 0's first call -> 1, its second -> 0 (gold 1 is taken by turn 1)
    assert r == pytest.approx([0.5, 1.0, 1.0])
    with pytest.raises(ValueError, match="turns"):
        turn_rewards(turns, gold, [0.0, 1.0])


def test_the_tool_environment_gives_gold_calls_and_records_the_turns_calls():
    env = ToolArithmetic()
    _, info = env.reset(3)
    assert info["gold_calls"] == [{"name": "calculator", "arguments": {"expression": env.expression}}]
    first, answer = solve_tool_arith(env)
    _, r0, _, _, i0 = env.step(first)
    assert i0["calls"] == info["gold_calls"]
    assert turn_rewards([i0["calls"], []], info["gold_calls"], [r0, 1.0]) == [1.0, 1.0]


def test_the_loop_input_falls_back_to_the_env_rewards_without_gold_calls():
    ep = types.SimpleNamespace(tokens=[[1], [1]], rewards=[[0.0, 1.0], [0.5]],
                               turn_calls=[[[call("calc", e="1")], []], [[]]],
                               gold_calls=[[call("calc", e="1")], None])
    np.testing.assert_allclose(matchtir_turn_rewards(ep, 3), [[1.0, 1.0, 0.0], [0.5, 0.0, 0.0]])


def test_the_estimator_offers_the_matchings_the_rewards_module_has():
    from jaxrl_llm.algorithms.agent_estimators import MATCHTIR_ASSIGNMENTS
    from jaxrl_llm.rewards.tool_matching import ASSIGNMENTS

    assert MATCHTIR_ASSIGNMENTS == ASSIGNMENTS

"""Run schedules: ScalingInter-RL's staged turn cap by hand, in the agent loop (episodes end at
the stage's cap), and its config errors."""

import pytest

import jaxrl_llm.core as core
from jaxrl_llm.algorithms import HORIZONS
from jaxrl_llm.cli import load_experiment, resolve_experiment
from jaxrl_llm.config import ConfigError, apply_overrides
from jaxrl_llm.training.agent_runner import check_agent


def test_stage_schedule_by_hand():
    # the authors' rule, steps counted from 1: rounds[min((k - 1) // 100, K - 1)]; our step is k - 1
    stages = [6, 13, 20]
    assert [core.stage_schedule(s, stages, 100) for s in (0, 99, 100, 199, 200, 10_000)] == [6, 6, 13, 13, 20, 20]
    assert HORIZONS["scaling_inter"].fn(150, stages=[5, 8, 10], every=100) == 8
    assert HORIZONS["none"].fn(3) is None
    with pytest.raises(ValueError, match="every"):
        core.stage_schedule(0, stages, 0)
    with pytest.raises(ValueError, match="non-empty"):
        core.stage_schedule(0, [], 10)


def test_horizon_in_the_agent_loop_caps_the_episodes():
    from jaxrl_llm.algorithms.registry import Bound
    from test_agent_loop import make

    tr = make(horizon=Bound.of(HORIZONS["scaling_inter"], {"stages": [1, 2], "every": 1}))  # Echo: 3 turns per episode
    turns = []
    for _ in range(3):
        m = tr.step()
        turns.append((tr.last_episodes.turns.tolist(), m["env/max_turns"]))
    assert turns == [([1] * 8, 1.0), ([2] * 8, 2.0), ([2] * 8, 2.0)]


def test_horizon_config_errors():
    cfg = load_experiment(resolve_experiment("agent_grid_gigpo")).default
    check_agent(apply_overrides(cfg, ["env.horizon=scaling_inter", "env.horizon.stages=[2,4,8]",
                                      "env.horizon.every=10"]))
    with pytest.raises(ConfigError, match="env.horizon"):
        check_agent(apply_overrides(cfg, ["env.horizon=scaling_inter", "env.horizon.stages=[2,4,8]"]))
    with pytest.raises(ConfigError, match="turn cap of 0"):
        check_agent(apply_overrides(cfg, ["env.horizon=scaling_inter", "env.horizon.stages=[0,4]",
                                          "env.horizon.every=10"]))
    with pytest.raises(ConfigError, match="recipe.replay=arpo cannot be combined with an agent run"):
        check_agent(apply_overrides(cfg, ["recipe.replay=arpo", "recipe.old_logp=recompute"]))

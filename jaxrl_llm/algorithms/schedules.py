"""Schedules of the run over training steps: what changes with the step besides the weights.

``env.horizon=<name>`` (agent runs): the cap on policy turns per episode at each training step.
A schedule is ``fn(step, **params) -> value`` of the 0-based training iteration, computed from
the step alone, so a resumed run is at the right point of it.
"""

from __future__ import annotations

import jaxrl_llm.core as core
from jaxrl_llm.algorithms.registry import Part, new_registry

__all__ = ["HORIZONS"]

HORIZONS = new_registry("interaction horizon schedule", "env.horizon",
                        "fn(step, **params) -> the cap on policy turns per episode at that training step")


def _none(step: int):
    return None


HORIZONS.register(Part("none", _none, note="env.max_turns (or the environment's own cap) at every step"))


def scaling_inter(step: int, *, stages, every: int):
    return int(core.stage_schedule(step, stages, every))


HORIZONS.register(Part(
    "scaling_inter", scaling_inter,
    paper="AgentGym-RL: Training LLM Agents for Long-Horizon Decision Making through Multi-Turn RL (ScalingInter-RL; "
          "Xi et al.), arXiv:2509.08755", core=("stage_schedule",), methods=(260,),
    verified="hand values (the authors' code's rule)", tests="tests/training/test_schedules.py",
    note="stages: the turn caps (the authors' scripts: BabyAI 6, 13, 20; SciWorld and TextCraft 10, 20, 30; "
         "SearchQA 5, 8, 10; WebArena 8, 12, 15), every: steps per stage (100; WebArena 80); an episode at the cap "
         "is truncated and keeps its last reward"))

"""Rewards: the reward-function protocol with failure isolation, math and format verifiers,
length shaping, a code-execution sandbox and reward-model scoring."""

from jaxrl_llm.rewards import base, format, math, reward_model, sandbox
from jaxrl_llm.rewards.base import *  # noqa: F401,F403
from jaxrl_llm.rewards.format import *  # noqa: F401,F403
from jaxrl_llm.rewards.math import *  # noqa: F401,F403
from jaxrl_llm.rewards.reward_model import *  # noqa: F401,F403
from jaxrl_llm.rewards.sandbox import *  # noqa: F401,F403

__all__ = base.__all__ + format.__all__ + math.__all__ + reward_model.__all__ + sandbox.__all__

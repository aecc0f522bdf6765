"""Rollout: the jitted sampler (prefill + while-loop decode), sampling rules, text helpers."""

from jaxrl_llm.rollout import sampler, sampling, text
from jaxrl_llm.rollout.sampler import *  # noqa: F401,F403
from jaxrl_llm.rollout.sampling import *  # noqa: F401,F403
from jaxrl_llm.rollout.text import *  # noqa: F401,F403

__all__ = sampler.__all__ + sampling.__all__ + text.__all__

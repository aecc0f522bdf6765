"""Rollout: the jitted sampler (prefill + while-loop decode), TreePO's tree sampler, sampling rules, text helpers."""

from jaxrl_llm.rollout import sampler, sampling, text, tree
from jaxrl_llm.rollout.sampler import *  # noqa: F401,F403
from jaxrl_llm.rollout.sampling import *  # noqa: F401,F403
from jaxrl_llm.rollout.text import *  # noqa: F401,F403
from jaxrl_llm.rollout.tree import *  # noqa: F401,F403

__all__ = sampler.__all__ + sampling.__all__ + text.__all__ + tree.__all__

"""jaxrl_llm: pure functional policy optimisation of large language models in JAX.

The everyday names of :mod:`jaxrl_llm.core` are re-exported here flat, e.g.
``jaxrl_llm.grpo_advantages``, ``jaxrl_llm.ppo_clip_loss``, ``jaxrl_llm.aggregate``.
"""

from jaxrl_llm import core
from jaxrl_llm.core import *  # noqa: F401,F403

__version__ = "0.1.0.dev0"
__all__ = list(core.__all__) + ["core"]

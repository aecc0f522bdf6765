"""Meshes, logical-axis sharding rules and multi-host set-up."""

from jaxrl_llm.parallel.sharding import *  # noqa: F401,F403
from jaxrl_llm.parallel.sharding import constrain, logical_rules  # noqa: F401
from jaxrl_llm.parallel.multihost import *  # noqa: F401,F403
from jaxrl_llm.parallel import multihost, sharding

__all__ = list(sharding.__all__) + list(multihost.__all__)

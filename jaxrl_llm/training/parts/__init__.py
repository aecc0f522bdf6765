"""Loop parts: loop-level methods as plug-ins with declared phases, needs and conflicts
(:mod:`jaxrl_llm.training.parts.base`)."""

from jaxrl_llm.training.parts.base import *  # noqa: F401,F403
from jaxrl_llm.training.parts.base import __all__  # noqa: F401

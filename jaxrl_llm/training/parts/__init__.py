"""Loop parts: loop-level methods as plug-ins with declared phases, needs and conflicts
(:mod:`jaxrl_llm.training.parts.base`). Importing this package registers the built-in parts, in
the order they run within a phase (a new part: one module here and one import line below)."""

from jaxrl_llm.training.parts.base import *  # noqa: F401,F403
from jaxrl_llm.training.parts.base import __all__  # noqa: F401

# the registry (in phase order)
from jaxrl_llm.training.parts import horizon  # noqa: F401,E402
from jaxrl_llm.training.parts import selection  # noqa: F401,E402
from jaxrl_llm.training.parts import allocation  # noqa: F401,E402
from jaxrl_llm.training.parts import staleness  # noqa: F401,E402
from jaxrl_llm.training.parts import asynchronous  # noqa: F401,E402
from jaxrl_llm.training.parts import tree  # noqa: F401,E402
from jaxrl_llm.training.parts import truncation  # noqa: F401,E402
from jaxrl_llm.training.parts import hints  # noqa: F401,E402
from jaxrl_llm.training.parts import replay  # noqa: F401,E402
from jaxrl_llm.training.parts import shaping  # noqa: F401,E402
from jaxrl_llm.training.parts import group_filter  # noqa: F401,E402
from jaxrl_llm.training.parts import kl_controller  # noqa: F401,E402
from jaxrl_llm.training.parts import r2vpo  # noqa: F401,E402
from jaxrl_llm.training.parts import epo  # noqa: F401,E402
from jaxrl_llm.training.parts import critic  # noqa: F401,E402
from jaxrl_llm.training.parts import progress  # noqa: F401,E402
from jaxrl_llm.training.parts import batch_filter  # noqa: F401,E402
from jaxrl_llm.training.parts import shared_prefix  # noqa: F401,E402
from jaxrl_llm.training.parts import spo_tracker  # noqa: F401,E402
from jaxrl_llm.training.parts import prompt_value  # noqa: F401,E402
from jaxrl_llm.training.parts import variance_filter  # noqa: F401,E402
from jaxrl_llm.training.parts import aepo  # noqa: F401,E402
from jaxrl_llm.training.parts import nash_md  # noqa: F401,E402
from jaxrl_llm.training.parts import brpo  # noqa: F401,E402
from jaxrl_llm.training.parts import inspo  # noqa: F401,E402
from jaxrl_llm.training.parts import verl_er  # noqa: F401,E402
from jaxrl_llm.training.parts import bupo  # noqa: F401,E402

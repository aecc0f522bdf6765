"""Training: the functional train step with exact micro-batch accumulation, objectives, recipes
(named compositions of the parts in :mod:`jaxrl_llm.algorithms`), the RL loop and its
providers, preference and SFT trainers, checkpoints, telemetry and the experiment runner."""

from jaxrl_llm.training import (checkpoint, evaluate, host_loop, loop, objectives, preference, prompt_store,
                                providers, recipes, rl, step)
from jaxrl_llm.training.checkpoint import *  # noqa: F401,F403
from jaxrl_llm.training.evaluate import *  # noqa: F401,F403
from jaxrl_llm.training.host_loop import *  # noqa: F401,F403
from jaxrl_llm.training.loop import *  # noqa: F401,F403
from jaxrl_llm.training.objectives import *  # noqa: F401,F403
from jaxrl_llm.training.preference import *  # noqa: F401,F403
from jaxrl_llm.training.prompt_store import *  # noqa: F401,F403
from jaxrl_llm.training.providers import *  # noqa: F401,F403
from jaxrl_llm.training.recipes import *  # noqa: F401,F403
from jaxrl_llm.training.rl import *  # noqa: F401,F403
from jaxrl_llm.training.step import *  # noqa: F401,F403

__all__ = (checkpoint.__all__ + evaluate.__all__ + host_loop.__all__ + loop.__all__ + step.__all__ + objectives.__all__
           + preference.__all__ + prompt_store.__all__ + providers.__all__ + recipes.__all__ + rl.__all__)

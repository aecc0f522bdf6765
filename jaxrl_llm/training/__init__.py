"""Training: the functional train step with exact micro-batch accumulation, objectives, RL and preference
trainers."""

from jaxrl_llm.training import checkpoint, evaluate, host_loop, loop, objectives, preference, rl, step
from jaxrl_llm.training.evaluate import *  # noqa: F401,F403
from jaxrl_llm.training.host_loop import *  # noqa: F401,F403
from jaxrl_llm.training.loop import *  # noqa: F401,F403
from jaxrl_llm.training.checkpoint import *  # noqa: F401,F403
from jaxrl_llm.training.objectives import *  # noqa: F401,F403
from jaxrl_llm.training.preference import *  # noqa: F401,F403
from jaxrl_llm.training.rl import *  # noqa: F401,F403
from jaxrl_llm.training.step import *  # noqa: F401,F403

__all__ = (checkpoint.__all__ + evaluate.__all__ + host_loop.__all__ + loop.__all__ + step.__all__ + objectives.__all__
           + preference.__all__ + rl.__all__)

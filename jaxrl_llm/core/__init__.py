"""Pure array functions of policy optimisation: no model inside.

Submodules: :mod:`~jaxrl_llm.core.advantages`, :mod:`~jaxrl_llm.core.policy_losses`,
:mod:`~jaxrl_llm.core.kl`, :mod:`~jaxrl_llm.core.entropy`, :mod:`~jaxrl_llm.core.value`,
:mod:`~jaxrl_llm.core.aggregation`, :mod:`~jaxrl_llm.core.preference`,
:mod:`~jaxrl_llm.core.shaping`, :mod:`~jaxrl_llm.core.stats`, :mod:`~jaxrl_llm.core.turns`,
:mod:`~jaxrl_llm.core.group_advantages`, :mod:`~jaxrl_llm.core.batch_losses`,
:mod:`~jaxrl_llm.core.reward_shaping`, :mod:`~jaxrl_llm.core.segments`,
:mod:`~jaxrl_llm.core.curriculum`, :mod:`~jaxrl_llm.core.representation`,
:mod:`~jaxrl_llm.core.allocation` (host-side NumPy).
Every public name is also available here, e.g. ``jaxrl_llm.core.grpo_advantages``.
"""

from jaxrl_llm.core import (advantages, aggregation, allocation, batch_losses, curriculum, entropy, group_advantages, kl, policy_losses,
                            preference, representation, reward_shaping, segments, shaping, stats, turns, value)
from jaxrl_llm.core.advantages import *  # noqa: F401,F403
from jaxrl_llm.core.aggregation import *  # noqa: F401,F403
from jaxrl_llm.core.allocation import *  # noqa: F401,F403
from jaxrl_llm.core.batch_losses import *  # noqa: F401,F403
from jaxrl_llm.core.curriculum import *  # noqa: F401,F403
from jaxrl_llm.core.entropy import *  # noqa: F401,F403
from jaxrl_llm.core.group_advantages import *  # noqa: F401,F403
from jaxrl_llm.core.kl import *  # noqa: F401,F403
from jaxrl_llm.core.policy_losses import *  # noqa: F401,F403
from jaxrl_llm.core.preference import *  # noqa: F401,F403
from jaxrl_llm.core.representation import *  # noqa: F401,F403
from jaxrl_llm.core.reward_shaping import *  # noqa: F401,F403
from jaxrl_llm.core.segments import *  # noqa: F401,F403
from jaxrl_llm.core.shaping import *  # noqa: F401,F403
from jaxrl_llm.core.stats import *  # noqa: F401,F403
from jaxrl_llm.core.turns import *  # noqa: F401,F403
from jaxrl_llm.core.value import *  # noqa: F401,F403

__all__ = (
    advantages.__all__ + aggregation.__all__ + allocation.__all__ + batch_losses.__all__ + curriculum.__all__ + entropy.__all__ + group_advantages.__all__
    + kl.__all__ + policy_losses.__all__
    + preference.__all__ + representation.__all__ + reward_shaping.__all__ + segments.__all__ + shaping.__all__ + stats.__all__ + turns.__all__ + value.__all__
)

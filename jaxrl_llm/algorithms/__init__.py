"""Method parts as registries: every advantage estimator, policy surrogate, KL estimator and
controller, importance-weight correction, rollout rejection, reward shaping, group and batch
filter and preference loss the library implements, each a pure function over
:mod:`jaxrl_llm.core` with its paper, its verification and what it needs from the loop.

A recipe (:mod:`jaxrl_llm.training.recipes`) names one part of each kind; the names are looked
up here once, where the config is resolved. ``jaxrl-llm methods`` lists them all
(:mod:`jaxrl_llm.training.catalog`).
"""

from jaxrl_llm.algorithms import (allocation, answers, estimators, hints, losses, preference, registry, replay,
                                  sampling, selection)
from jaxrl_llm.algorithms import agent_estimators  # noqa: F401  (registers the turn-level estimators)
from jaxrl_llm.algorithms import schedules  # noqa: F401  (registers the run schedules)
from jaxrl_llm.algorithms import group_estimators  # noqa: F401  (registers the papers' group estimators)
from jaxrl_llm.algorithms import reward_designs  # noqa: F401  (registers the papers' reward designs)
from jaxrl_llm.algorithms.allocation import *  # noqa: F401,F403
from jaxrl_llm.algorithms.answers import *  # noqa: F401,F403
from jaxrl_llm.algorithms.estimators import *  # noqa: F401,F403
from jaxrl_llm.algorithms.hints import *  # noqa: F401,F403
from jaxrl_llm.algorithms.losses import *  # noqa: F401,F403
from jaxrl_llm.algorithms.preference import *  # noqa: F401,F403
from jaxrl_llm.algorithms.registry import *  # noqa: F401,F403
from jaxrl_llm.algorithms.replay import *  # noqa: F401,F403
from jaxrl_llm.algorithms.sampling import *  # noqa: F401,F403
from jaxrl_llm.algorithms.schedules import HORIZONS  # noqa: F401
from jaxrl_llm.algorithms.selection import *  # noqa: F401,F403

__all__ = (registry.__all__ + allocation.__all__ + answers.__all__ + estimators.__all__ + hints.__all__ + losses.__all__ + preference.__all__ + replay.__all__ + sampling.__all__ + schedules.__all__
           + selection.__all__)

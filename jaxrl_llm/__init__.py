"""jaxrl_llm: pure functional policy optimisation of large language models in JAX.

The everyday names of :mod:`jaxrl_llm.core` are re-exported here flat, e.g.
``jaxrl_llm.grpo_advantages``, ``jaxrl_llm.ppo_clip_loss``, ``jaxrl_llm.aggregate``.
They load on first use (PEP 562), so that ``import jaxrl_llm.cli`` does not import JAX: the
``jaxrl-llm`` command sets up the process (:mod:`jaxrl_llm.launch`) before anything heavy loads.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0.dev0"


def _core():
    return importlib.import_module("jaxrl_llm.core")


def __getattr__(name: str) -> Any:
    if name == "core":
        return _core()
    if name == "__all__":
        return list(_core().__all__) + ["core"]
    if not name.startswith("__"):
        core = _core()
        if name in core.__all__:
            return getattr(core, name)
    raise AttributeError(f"module 'jaxrl_llm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_core().__all__) | {"core"})

"""The run's settings as loop parts: :class:`LoopSettings` (what a run config or the trainer's
arguments say), :func:`capabilities` (what the settings give the parts) and :func:`build_parts`
(every registered part the settings turn on, validated from the declarations)."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_llm.config import ConfigError
from jaxrl_llm.training.parts.base import LOOP_PARTS, Parts

__all__ = ["LoopSettings", "capabilities", "build_parts", "part_classes"]


@dataclasses.dataclass
class LoopSettings:
    """The loop-level settings of a run. At config time (``check_rl``) the models are not built:
    ``models=False`` and the model fields stay None; the trainer passes its arguments."""

    recipe: Any
    candidates: int = 1
    staleness: int = 0
    asynchronous: bool = False
    #: the sampler decodes with cast weights (``rollout.sampler_dtype``), or None
    sampler_dtype: str | None = None
    #: tokens per segment of a tree of each prompt's responses (``rollout.tree_segment``), or None
    tree: int | None = None
    #: ``train.shared_prefix``: a :class:`~jaxrl_llm.training.prefix.PrefixPlan` (or True at config time)
    shared_prefix: Any = None
    #: an agent run: episodes of an environment instead of single-turn completions
    episodes: bool = False
    processes: int = 1
    prompt_encoder: Any = None
    critic: Any = None
    prompt_value: Any = None
    progress: Any = None
    horizon: Any = None
    #: the models (critic, prompt value, ...) are given (the trainer) or not built yet (config time)
    models: bool = True


def capabilities(run: LoopSettings) -> dict[str, str]:
    """What the run's settings give the parts: capability -> the setting that gives it."""
    caps: dict[str, str] = {}
    if run.recipe.recompute_old_logp:
        caps["old_logp=recompute"] = "recipe.old_logp=recompute"
    if run.processes == 1:
        caps["one_process"] = "one process"
    if run.prompt_encoder is not None or not run.models:
        caps["prompt_encoder"] = "the data pipeline's prompt encoder"
    if run.episodes:
        caps["episodes"] = "an agent run (multi-turn episodes)"
    return caps


def part_classes() -> list:
    """The registered loop part classes, in the order they run within a phase."""
    import jaxrl_llm.training.parts  # noqa: F401  (registers the built-in parts)

    return list(LOOP_PARTS)


def build_parts(run: LoopSettings) -> Parts:
    """The parts ``run`` turns on, validated (one-line :class:`ConfigError` on a missing need or a
    conflict). Models given without a part that reads them are refused too."""
    parts = [p for p in (cls.from_run(run) for cls in part_classes()) if p is not None]
    if run.models:
        claimed = {p.model_arg for p in parts if p.model_arg}
        for cls in part_classes():
            arg = cls.model_arg
            if arg and arg not in claimed and getattr(run, arg, None) is not None:
                raise ConfigError(cls.model_unused.format(recipe=run.recipe) if cls.model_unused else
                                  f"{arg} given but no part of this run reads it")
        bound = getattr(run.recipe, "loop_part", None)
        if bound is not None and not any(type(p) is bound.part.fn for p in parts):
            raise ConfigError(f"recipe.loop_part={bound.name}: its class is not a registered loop part that this run "
                              f"builds (decorate it with @loop_part; its from_run must return it)")
    return Parts(parts, capabilities(run))

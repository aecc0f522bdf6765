"""Built-in tasks for RL post-training of small LMs: generated, seeded, no download.

Each task is a frozen dataclass (its fields are the difficulty knobs) with a generator
(:meth:`~jaxrl_llm.tasks.base.Task.rows`, :meth:`~jaxrl_llm.tasks.base.Task.iter_rows`),
a verifier (:meth:`~jaxrl_llm.tasks.base.Task.score`, and the TRL-style
:meth:`~jaxrl_llm.tasks.base.Task.reward`) and disjoint train/eval splits; see
:mod:`jaxrl_llm.tasks.base` for the row format, determinism and split rules.

- :class:`Arithmetic`: ``What is 37 + 5?``; presets ``add1``, ``sub``, ``mul``, ``div``,
  ``add2x1``, ``add2``, ``add3``, ``mixed1``.
- :class:`ArithmeticMix`: several arithmetic presets mixed, each row labelled with its ``level``
  (presets ``add_levels``, ``four_ops``, ``add_three``): known, varying difficulty for curricula.
- :class:`ReasoningGym` (``reasoning_gym``): families of the reasoning-gym package with their
  verifiers and difficulty settings, each row labelled with its family (optional extra ``tasks``).
- :class:`Countdown`: reach a target with the given numbers and ``+ - * /``;
  ``Countdown.game24()``.
- :class:`Formatting`: reorder words, answer in exact ``<answer>a, b, c</answer>`` format.
- :class:`SpanGrounding`: find the run of one kind of word in a numbered list, answer
  ``[start, end]`` (the text analogue of GUI grounding, for GUI-RCPO's region consistency).

Registry::

    task = get_task("arithmetic", preset="sub")
    task = get_task("game24")
    rows = task.rows("train", 256, seed=0)
    rewards = task.reward(prompts, completions, answer=[r["answer"] for r in rows])
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from jaxrl_llm.tasks.arithmetic import Arithmetic, ArithmeticMix, find_numbers, parse_final_number
from jaxrl_llm.tasks.base import SPLITS, Task, stable_hash
from jaxrl_llm.tasks.countdown import Countdown, evaluate_expression, extract_expression, solve
from jaxrl_llm.tasks.formatting import Formatting
from jaxrl_llm.tasks.reasoning_gym import ReasoningGym
from jaxrl_llm.tasks.span_grounding import KINDS as KINDS_OF_SPANS, SpanGrounding

__all__ = [
    "Task",
    "Arithmetic",
    "ArithmeticMix",
    "Countdown",
    "Formatting",
    "ReasoningGym",
    "SpanGrounding",
    "KINDS_OF_SPANS",
    "TASKS",
    "get_task",
    "SPLITS",
    "stable_hash",
    "parse_final_number",
    "find_numbers",
    "evaluate_expression",
    "extract_expression",
    "solve",
]

#: Task name -> factory ``(preset=None, **kwargs) -> Task`` (``game24`` takes only kwargs).
TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": Arithmetic.create,
    "arithmetic_mix": ArithmeticMix.create,
    "countdown": Countdown.create,
    "game24": functools.partial(Countdown.create, "game24"),
    "formatting": Formatting.create,
    "reasoning_gym": ReasoningGym.create,
    "span_grounding": SpanGrounding.create,
}


def get_task(name: str, **kwargs: Any) -> Task:
    """The task registered as ``name`` in :data:`TASKS`, built with ``kwargs``.

    ``kwargs`` are the task's constructor arguments plus, except for ``game24``, an optional
    ``preset=`` (e.g. ``get_task("arithmetic", preset="mul", answer_format="tag")``).
    Unknown names, presets or arguments raise ``ValueError`` listing the valid ones.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name](**kwargs)

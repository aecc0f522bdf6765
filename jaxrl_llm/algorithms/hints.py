"""Hints for prompts the policy cannot solve yet: part of the reference solution in the prompt.

With ``recipe.hints=<name>`` the RL loop asks the part, after a round is scored, which groups
to sample again with a hinted prompt; it samples them (the same number of completions, the
same policy), scores them and trains on the hinted groups in their hinted context (the hint is
prompt, so it is never in the loss, and the log-probs are the policy's in that context). It
asks again with the new outcomes (``stage`` counts the asks) until the part returns no group.
The prompt statistics, the reward metrics and a replay buffer see the round as first sampled.

A part is ``fn(x: HintInputs, **params) -> {group: hinted raw prompt}``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxrl_llm.algorithms.registry import Part, new_registry

__all__ = ["HintInputs", "HINTS", "add_hint"]


@dataclasses.dataclass(frozen=True)
class HintInputs:
    """What a hint part sees for one round: ``values`` ``[N]`` each row's outcome (the reward
    total or the reward function named by the part's ``metric``, "does not apply" counting 0),
    ``group_ids`` ``[N]``, ``columns`` the data columns per group (the reference solution is
    one), ``raw_prompts`` each group's prompt as the data gives it (a string or chat messages)
    before any hint, ``hinted`` the groups hinted in earlier stages, ``stage`` the number of
    earlier asks this round and ``step`` the iteration."""

    values: np.ndarray
    group_ids: np.ndarray
    columns: Mapping[str, list]
    raw_prompts: tuple[Any, ...]
    hinted: frozenset
    stage: int
    step: int


HINTS = new_registry("hints", "recipe.hints", "fn(x: HintInputs, **params) -> {group: hinted raw prompt}")

#: GHPO's text before the solution prefix (the authors' ``ghpo_trainer.py``)
GHPO_TEXT = ("\n The following text is the beginning part of the answer, which you can refer to for solving the "
             "problem:\n")


def add_hint(raw: Any, text: str) -> Any:
    """``raw`` with ``text`` appended to its (last) user message."""
    if isinstance(raw, str):
        return raw + text
    msgs = [dict(m) for m in raw]
    for m in reversed(msgs):
        if m.get("role") == "user":
            m["content"] = str(m["content"]) + text
            return msgs
    raise ValueError("a chat prompt without a user message cannot take a hint")


def _none(x: HintInputs):
    return {}


HINTS.register(Part("none", _none, note="no hints"))


def ghpo(x: HintInputs, *, column: str = "solution", fractions=(0.25, 0.5, 0.75), start_step: int = 0,
         template: str = GHPO_TEXT, metric: str | None = None):
    """GHPO's guidance (arXiv:2507.10628; the authors' ``hkgc-1/GHPO`` @af0a7dd,
    ``src/ghpo/ghpo_trainer.py``): a group whose outcomes are all ``<= 0`` is sampled again with
    the first ``round(len(solution) * w)`` characters of the reference solution appended to the
    user message after ``template``, for ``w`` in ``fractions`` in turn (stage ``s`` uses
    ``fractions[s]``), each stage on the groups still all-fail; the last stage's samples stay
    whatever they score. From training step ``start_step`` on. ``metric``: the reward function
    whose outcome decides (GHPO: the accuracy reward, not the total); default the total."""
    del metric  # read by the loop (the values it passes)
    fractions = tuple(float(f) for f in fractions)
    if not fractions or any(not 0.0 < f <= 1.0 for f in fractions):
        raise ValueError(f"recipe.hints.fractions must be numbers in (0, 1], got {list(fractions)}")
    if x.stage >= len(fractions) or x.step < start_step:
        return {}
    if column not in x.columns:
        raise ValueError(f"recipe.hints={'ghpo'} reads the reference solution from data column {column!r}; the data "
                         f"has {sorted(x.columns)} (set recipe.hints.column)")
    vals = np.nan_to_num(np.asarray(x.values, np.float64), nan=0.0)
    gid = np.asarray(x.group_ids)
    w = fractions[x.stage]
    out = {}
    for g in range(len(x.raw_prompts)):
        rows = gid == g
        if rows.any() and (vals[rows] <= 0).all() and (x.stage == 0 or g in x.hinted):
            sol = str(x.columns[column][g])
            out[g] = add_hint(x.raw_prompts[g], template + sol[:round(len(sol) * w)])
    return out


HINTS.register(Part(
    "ghpo", ghpo, paper="GHPO: Adaptive Guidance for Stable and Efficient LLM Reinforcement Learning (Liu et al.), "
                        "arXiv:2507.10628", methods=(128,), verified="hand values (the authors' code's rules)",
    tests="tests/training/test_hints.py",
    note="the authors' code (hkgc-1/GHPO @af0a7dd): all-fail groups (outcome <= 0; metric=<the accuracy reward>) "
         "re-sampled with 25%, then 50%, then 75% of the solution's characters appended to the prompt, all within "
         "the step; trained in the hinted context with no ratio correction; tasks give the solution in a column "
         "(default 'solution')"))

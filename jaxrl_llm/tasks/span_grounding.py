"""Span grounding: find where a kind of word sits in a numbered list, answer ``[start, end]``.

The text analogue of GUI grounding (an instruction mapped to a region of the screen), for
GUI-RCPO's region consistency reward (``recipe.shaping=region_consistency``, METHODS.md #98):
the region is a run of consecutive word positions.

Prompt::

    Words: 0 pear, 1 red, 2 blue, 3 wolf, 4 fig. Which positions hold the run of colors?
    Answer as [start, end] (inclusive).

Exactly one run of consecutive words of the asked kind is in the list (the other words are of
other kinds). ``answer``: ``[start, end]``; ``solution``: ``"[1, 2]"``.

Difficulty knobs
    ``num_words=(lo, hi)``: the list's length; ``run=(lo, hi)``: the run's length.

Verifier (``score``)
    1.0 when the last ``[a, b]`` in the completion is the run exactly; else the overlap of the
    two spans over their union (intersection over union, as grounding benchmarks score boxes)
    times ``partial_credit`` (default 0: a strict 0/1 reward).

Split
    Canonical key: the list of words.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from jaxrl_llm.algorithms.reward_designs import parse_regions
from jaxrl_llm.tasks.base import Task

__all__ = ["SpanGrounding", "KINDS"]

#: word kinds: name (plural) -> words
KINDS: dict[str, tuple[str, ...]] = {
    "fruits": ("apple", "banana", "cherry", "grape", "lemon", "mango", "melon", "peach", "pear", "plum", "fig", "kiwi"),
    "animals": ("bear", "camel", "deer", "eagle", "fox", "goat", "horse", "lion", "mouse", "otter", "panda", "wolf"),
    "colors": ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "silver", "golden"),
    "instruments": ("bell", "drum", "flute", "piano", "violin", "guitar", "harp", "trumpet"),
}


@dataclass(frozen=True)
class SpanGrounding(Task):
    """Locate the run of words of one kind in a numbered list (module docstring).

    Args:
        num_words: inclusive ``(lo, hi)`` range of the list's length.
        run: inclusive ``(lo, hi)`` range of the run's length (``hi < num_words[0]``).
        partial_credit: weight of the intersection over union of a wrong span (0: strict).

    Rows: ``prompt``, ``answer`` (``[start, end]``), ``solution``, ``words``, ``kind``.
    """

    num_words: tuple[int, int] = (6, 9)
    run: tuple[int, int] = (2, 3)
    partial_credit: float = 0.0

    name: ClassVar[str] = "span_grounding"
    required_columns: ClassVar[tuple[str, ...]] = ("answer",)
    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "short": dict(num_words=(5, 6), run=(2, 2)),
        "long": dict(num_words=(10, 14), run=(2, 5)),
    }

    def __post_init__(self) -> None:
        for field in ("num_words", "run"):
            v = getattr(self, field)
            try:
                lo, hi = (int(x) for x in ((v, v) if isinstance(v, int) else v))
            except (TypeError, ValueError):
                raise ValueError(f"{field} must be an int or a pair (lo, hi), got {v!r}") from None
            if not 1 <= lo <= hi:
                raise ValueError(f"{field} must satisfy 1 <= lo <= hi, got {v!r}")
            object.__setattr__(self, field, (lo, hi))
        if not self.run[1] < self.num_words[0]:
            raise ValueError(f"run's longest ({self.run[1]}) must be shorter than the shortest list "
                             f"({self.num_words[0]})")
        longest = min(len(w) for w in KINDS.values())
        if self.run[1] > longest:
            raise ValueError(f"run must be at most {longest} words (the smallest kind), got {self.run!r}")
        if not 0.0 <= float(self.partial_credit) <= 1.0:
            raise ValueError(f"partial_credit must be in [0, 1], got {self.partial_credit!r}")

    def _propose(self, rng: random.Random) -> tuple[Hashable, Any]:
        kind = rng.choice(sorted(KINDS))
        n = rng.randint(*self.num_words)
        length = rng.randint(*self.run)
        start = rng.randint(0, n - length)
        others = [w for k, ws in sorted(KINDS.items()) if k != kind for w in ws]
        filler = rng.sample(others, n - length)
        words = filler[:start] + rng.sample(KINDS[kind], length) + filler[start:]
        return tuple(words), (kind, words, start, start + length - 1)

    def _realize(self, key: Hashable, payload: Any, rng: random.Random) -> dict | None:
        kind, words, s, e = payload
        listed = ", ".join(f"{i} {w}" for i, w in enumerate(words))
        return {"prompt": f"Words: {listed}. Which positions hold the run of {kind}? Answer as [start, end] "
                          f"(inclusive).",
                "answer": [s, e], "solution": f"[{s}, {e}]", "words": list(words), "kind": kind}

    def problem_key(self, row: Mapping[str, Any]) -> Hashable:
        return tuple(row["words"])

    def score(self, completion: str, row: Mapping[str, Any]) -> float:
        """1.0 for the exact span; else ``partial_credit`` x its intersection over union."""
        st, en, has = parse_regions([completion])
        if not has[0]:
            return 0.0
        s, e = (int(v) for v in row["answer"])
        a, b = int(st[0]), int(en[0])
        if (a, b) == (s, e):
            return 1.0
        inter = max(0, min(b, e) - max(a, s) + 1)
        return float(self.partial_credit) * inter / (max(b, e) - min(a, s) + 1)

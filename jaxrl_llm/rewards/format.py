"""Format rewards (regex, tag structure) and length shaping from the core, as reward functions.

All are callables with the reward-function protocol (``fn(prompts, completions, **columns)``)
and frozen dataclasses (their settings are fixed, hashable and printable in a config).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jaxrl_llm.core import shaping, stats

__all__ = ["RegexReward", "TagFormatReward", "OverlongReward", "KimiLengthReward"]


@dataclasses.dataclass(frozen=True)
class RegexReward:
    """``value`` when the completion matches ``pattern`` (``re.fullmatch`` when ``full``, else
    ``re.search``), else 0. The DeepSeek-R1 format reward is
    ``RegexReward(r"<think>.*?</think>\\s*<answer>.*?</answer>")`` (DOTALL by default)."""

    pattern: str
    full: bool = True
    flags: int = re.DOTALL
    value: float = 1.0
    strip: bool = True  # ignore surrounding whitespace

    def __post_init__(self):
        try:
            re.compile(self.pattern, self.flags)
        except re.error as e:
            raise ValueError(f"RegexReward.pattern is not a valid regex ({e}): {self.pattern!r}") from None

    @property
    def __name__(self) -> str:
        return "regex_format"

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
        rx = re.compile(self.pattern, self.flags)
        match = rx.fullmatch if self.full else rx.search
        return [self.value if match(c.strip() if self.strip else c) else 0.0 for c in completions]


@dataclasses.dataclass(frozen=True)
class TagFormatReward:
    """Tag-structure reward for ``<tag>...</tag>`` sections in order (default
    ``think``, ``answer``).

    ``strict=True``: 1.0 when the whole completion is exactly the sections in order
    (whitespace between them allowed, each tag once, each section with some non-whitespace
    content), else 0. ``strict=False``: partial credit, ``1 / (2 n)`` for each opening and each
    closing tag that occurs exactly once, plus nothing for order (the "tag count" shaping used by
    open-r1 style recipes), so a model can climb towards the format. Empty sections
    (``<answer></answer>``, whitespace only) earn nothing in either mode: tags without content
    are a format hack, not the format (open-r1's ``format_reward`` accepts them; we are stricter).
    """

    tags: tuple[str, ...] = ("think", "answer")
    strict: bool = True

    def __post_init__(self):
        if not self.tags or any(not re.fullmatch(r"[A-Za-z_][\w-]*", t) for t in self.tags):
            raise ValueError(f"TagFormatReward.tags must be non-empty tag names, got {self.tags!r}")

    @property
    def __name__(self) -> str:
        return "tag_format"

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
        if self.strict:  # each section: after its leading whitespace (taken whole), content up to the closing tag
            body = r"\s*".join(rf"<{t}>\s*+(?!</{t}>)(?:(?!</?{t}>).)+</{t}>" for t in self.tags)
            rx = re.compile(rf"\s*{body}\s*", re.DOTALL)
            return [1.0 if rx.fullmatch(c) else 0.0 for c in completions]
        unit = 1.0 / (2 * len(self.tags))
        out = []
        for c in completions:
            s = 0.0
            for t in self.tags:
                empty = re.search(rf"<{t}>\s*</{t}>", c) is not None
                s += 0.0 if empty else unit * (c.count(f"<{t}>") == 1) + unit * (c.count(f"</{t}>") == 1)
            out.append(s)
        return out


@dataclasses.dataclass(frozen=True)
class OverlongReward:
    """DAPO's soft overlong punishment as a reward function (see
    :func:`jaxrl_llm.core.overlong_penalty`): 0 up to ``max_length - buffer_length`` tokens,
    then falling linearly to ``-penalty_factor`` at ``max_length``. Reads the
    ``completion_lengths`` column (token counts) that the RL loop passes."""

    max_length: int
    buffer_length: int
    penalty_factor: float = 1.0

    def __post_init__(self):
        if not 0 < self.buffer_length <= self.max_length:
            raise ValueError(f"OverlongReward.buffer_length must be in (0, max_length={self.max_length}], "
                             f"got {self.buffer_length}")

    @property
    def __name__(self) -> str:
        return "overlong"

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], *,
                 completion_lengths: Sequence[int], **_: Any) -> list[float]:
        lengths = np.asarray(completion_lengths, np.float32)
        return np.asarray(shaping.overlong_penalty(lengths, self.max_length, self.buffer_length,
                                                   self.penalty_factor)).tolist()


@dataclasses.dataclass(frozen=True)
class KimiLengthReward:
    """Kimi k1.5's group length reward (see :func:`jaxrl_llm.core.kimi_length_reward`):
    within each prompt group, shorter correct answers earn up to +0.5 and longer ones down to
    -0.5; wrong answers only the negative part. ``correct`` is a reward function whose
    value > 0.5 means correct (e.g. :func:`~jaxrl_llm.rewards.math_reward`). Reads the
    ``completion_lengths`` and ``group_ids`` columns that the RL loop passes."""

    correct: Callable[..., Sequence[float]]

    @property
    def __name__(self) -> str:
        return "kimi_length"

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], *, completion_lengths: Sequence[int],
                 group_ids: Sequence[int], **columns: Any) -> list[float]:
        ok = np.asarray(self.correct(prompts, completions, completion_lengths=completion_lengths,
                                     group_ids=group_ids, **columns), np.float32) > 0.5
        dense, num_groups = stats.dense_group_ids(group_ids)
        return np.asarray(shaping.kimi_length_reward(np.asarray(completion_lengths, np.float32), ok, dense,
                                                     num_groups=num_groups)).tolist()

"""Word-list formatting: reorder a few words and reply in an exact tag format.

Prompt (``mode="sort"``)::

    Sort these words alphabetically: pear, apple, fig. Reply with only the words,
    separated by commas, inside <answer></answer> tags.

Modes: ``"sort"`` (alphabetical), ``"sort_desc"`` (reverse alphabetical), ``"reverse"``
(the given order reversed). The words are distinct, lowercase, drawn from a fixed
vocabulary of common nouns; for the sort modes the shown order is never already the
answer. ``solution``: ``<answer>apple, fig, pear</answer>``.

Difficulty knobs
    ``num_words=(lo, hi)``: the number of words (uniform in the inclusive range), ``modes``:
    the instructions drawn from (uniformly).

Verifier (``score``)
    - 1.0: the completion, apart from surrounding whitespace, is exactly one
      ``<answer>...</answer>`` and its content split on commas (items stripped of
      whitespace) equals the expected words in order, case-sensitive.
    - ``partial_credit`` (default 0.5; set 0.0 for a strict 0/1 reward): the format is not
      exact but the words are right and in the right order, where the words are the
      alphabetic tokens (lowercased) of the last ``<answer>`` tag's content if any tag is
      present, else of the last non-empty line. Examples: no tags (``apple, fig, pear``),
      text around the tags, a different separator (``apple fig pear``), capitals.
    - 0.0: anything else, in particular the right words in the wrong order, a missing or
      extra word.

Split
    Canonical key: ``(mode, words)`` with the words sorted for the sort modes (every
    shown order of one word set is one problem) and in shown order for ``"reverse"``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from jaxrl_llm.tasks.base import Task

__all__ = ["Formatting", "FORMATTING_MODES", "VOCABULARY"]

FORMATTING_MODES = ("sort", "sort_desc", "reverse")

VOCABULARY: tuple[str, ...] = tuple(
    """
    apple banana cherry grape lemon mango melon olive peach pear plum fig kiwi lime
    bear camel deer eagle fox goat horse lion mouse otter panda rabbit sheep tiger whale
    zebra wolf owl crab duck frog
    red blue green yellow purple orange black white silver golden
    chair table lamp window door garden river mountain forest island desert ocean cloud
    storm bridge castle tower village market school library kitchen basket candle mirror
    pencil paper book letter ticket wallet ladder hammer needle button pocket jacket boot
    hat scarf glove ring coin key bell drum flute piano violin guitar rocket planet comet
    star moon sun rain snow wind stone sand shell pearl
    """.split()
)
assert len(set(VOCABULARY)) == len(VOCABULARY)

_INSTRUCTIONS = {
    "sort": "Sort these words alphabetically",
    "sort_desc": "Sort these words in reverse alphabetical order",
    "reverse": "Write these words in reverse order",
}
_FORMAT = "Reply with only the words, separated by commas, inside <answer></answer> tags."
_EXACT_RE = re.compile(r"\s*<answer>([^<>]*)</answer>\s*")
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)


def _expected(mode: str, words: list[str]) -> list[str]:
    if mode == "sort":
        return sorted(words)
    if mode == "sort_desc":
        return sorted(words, reverse=True)
    return list(reversed(words))


@dataclass(frozen=True)
class Formatting(Task):
    """Reorder a word list and answer as ``<answer>w1, w2, ...</answer>`` (module docstring).

    Args:
        num_words: inclusive ``(lo, hi)`` range of the number of words (``2 <= lo``).
        modes: instructions to draw from, a subset of ``("sort", "sort_desc", "reverse")``.
        partial_credit: score of a right answer in the wrong format (0.0..1.0).

    Rows: ``prompt``, ``answer`` (list of str, the expected order), ``solution``,
    ``words`` (list of str, the shown order), ``mode``.
    """

    num_words: tuple[int, int] = (3, 5)
    modes: tuple[str, ...] = ("sort",)
    partial_credit: float = 0.5

    name: ClassVar[str] = "formatting"
    required_columns: ClassVar[tuple[str, ...]] = ("answer",)
    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "sort3": dict(num_words=(3, 3), modes=("sort",)),
        "sort5": dict(num_words=(5, 5), modes=("sort",)),
        "mixed": dict(num_words=(3, 6), modes=FORMATTING_MODES),
    }

    def __post_init__(self) -> None:
        nw = self.num_words
        if isinstance(nw, int) and not isinstance(nw, bool):
            nw = (nw, nw)
        try:
            lo, hi = (int(x) for x in nw)
        except (TypeError, ValueError):
            raise ValueError(f"num_words must be an int or a pair (lo, hi), got {self.num_words!r}") from None
        if not 2 <= lo <= hi <= len(VOCABULARY):
            raise ValueError(f"num_words must satisfy 2 <= lo <= hi <= {len(VOCABULARY)}, got {self.num_words!r}")
        object.__setattr__(self, "num_words", (lo, hi))
        modes = (self.modes,) if isinstance(self.modes, str) else tuple(self.modes)
        bad = [m for m in modes if m not in FORMATTING_MODES]
        if not modes or bad or len(set(modes)) != len(modes):
            raise ValueError(f"modes must be distinct modes from {FORMATTING_MODES}, got {self.modes!r}")
        object.__setattr__(self, "modes", modes)
        if not 0.0 <= float(self.partial_credit) <= 1.0:
            raise ValueError(f"partial_credit must be in [0, 1], got {self.partial_credit!r}")

    # ------------------------------------------------------------------ generator

    def _propose(self, rng: random.Random) -> tuple[Hashable, Any]:
        mode = rng.choice(self.modes)
        words = rng.sample(VOCABULARY, rng.randint(*self.num_words))
        key = (mode, tuple(sorted(words)) if mode != "reverse" else tuple(words))
        return key, (mode, words)

    def _realize(self, key: Hashable, payload: Any, rng: random.Random) -> dict | None:
        mode, words = payload
        words = list(words)
        expected = _expected(mode, words)
        while mode != "reverse" and words == expected:  # never show an already sorted list
            rng.shuffle(words)
        return {
            "prompt": f"{_INSTRUCTIONS[mode]}: {', '.join(words)}. {_FORMAT}",
            "answer": expected,
            "solution": f"<answer>{', '.join(expected)}</answer>",
            "words": words,
            "mode": mode,
        }

    def problem_key(self, row: Mapping[str, Any]) -> Hashable:
        mode, words = row["mode"], list(row["words"])
        return (mode, tuple(sorted(words)) if mode != "reverse" else tuple(words))

    # ------------------------------------------------------------------ verifier

    def score(self, completion: str, row: Mapping[str, Any]) -> float:
        """1.0 exact format and order; ``partial_credit`` right order, loose format; else 0.0."""
        expected = [str(w) for w in row["answer"]]
        m = _EXACT_RE.fullmatch(completion)
        if m is not None and [s.strip() for s in m.group(1).split(",")] == expected:
            return 1.0
        tags = _ANSWER_TAG_RE.findall(completion)
        if tags:
            region = tags[-1]
        else:
            lines = [ln for ln in completion.splitlines() if ln.strip()]
            region = lines[-1] if lines else ""
        if re.findall(r"[a-z]+", region.lower()) == [w.lower() for w in expected]:
            return float(self.partial_credit)
        return 0.0

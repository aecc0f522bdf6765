"""Shared rules of the shipped environments: held-out split of episode seeds, answer parsing.

Split rule (the task modules' rule, applied to episodes)
    Every episode seed determines its *problem*, and each environment family names a
    canonical key of it (the grid world: the layout; guess-the-number: range and target;
    ...). A problem is in ``"eval"`` iff ``stable_hash("split", family name, key) %
    eval_modulus == 0`` (``eval_modulus = 5``: about 20% of the problems), else in
    ``"train"``. :func:`split_seeds` draws seeds from a stream seeded by
    ``stable_hash("env-seeds", name, split, seed)`` and keeps those whose problem is on the
    requested side, so train and eval never share a problem, let alone a seed, and
    ``split_seeds(name, key_of, split, m, seed)`` is a prefix of the call with ``n >= m``.

    Within one call the problems are distinct while the split has unused ones. A split is
    exhausted after ``max_draws`` consecutive draws without a new problem: ``"train"`` then
    starts a new pass (problems repeat, seeds never do), ``"eval"`` raises a ``ValueError``
    naming ``n`` and the number found (eval problems never repeat).
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable, Hashable, Sequence

from jaxrl_llm.tasks.base import SPLITS, stable_hash

__all__ = ["EVAL_MODULUS", "split_of", "split_seeds", "seed_splitter", "answers_of", "extract_answer", "normalize_answer",
           "first_word", "EpisodeOver"]

EVAL_MODULUS = 5
_SEED_SPACE = 2**31


class EpisodeOver(RuntimeError):
    """``step`` was called after the episode ended (call ``reset`` first)."""


def split_of(name: str, key: Hashable, eval_modulus: int = EVAL_MODULUS) -> str:
    """``"eval"`` or ``"train"``: the side of the problem ``key`` of environment family ``name``."""
    return "eval" if stable_hash("split", name, key) % eval_modulus == 0 else "train"


def _check_int(what: str, v: object) -> int:
    try:
        import numpy as np

        if isinstance(v, np.integer):
            return int(v)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{what} must be an int, got {v!r}")
    return v


def split_seeds(name: str, key_of: Callable[[int], Hashable], split: str, n: int, seed: int = 0, *,
                eval_modulus: int = EVAL_MODULUS, max_draws: int = 2000) -> list[int]:
    """``n`` episode seeds of ``split`` for family ``name`` whose problem is ``key_of(seed)``
    (see the module docstring for the rule)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    n, seed = _check_int("n", n), _check_int("seed", seed)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(stable_hash("env-seeds", name, split, seed))
    out: list[int] = []
    used_seeds: set[int] = set()
    seen: set[Hashable] = set()
    misses = 0
    while len(out) < n:
        s = rng.randrange(_SEED_SPACE)
        key = key_of(s) if s not in used_seeds else None
        if s in used_seeds or key in seen or split_of(name, key, eval_modulus) != split:
            misses += 1
            if misses < max_draws:
                continue
            if split == "eval" or not seen:
                raise ValueError(
                    f"environment {name!r}: the {split!r} split has only about {len(seen)} distinct problems "
                    f"(found by sampling), cannot give n={n} seeds ({split!r} problems never repeat); "
                    f"ask for fewer episodes or use a larger configuration")
            seen.clear()  # train: a new pass over the problems
            misses = 0
            continue
        misses = 0
        out.append(s)
        used_seeds.add(s)
        seen.add(key)
    return out


def seed_splitter(name: str, key_of: Callable[[int], Hashable], *, eval_modulus: int = EVAL_MODULUS,
                  max_draws: int = 2000) -> Callable[[str, int, int], list[int]]:
    """``split_seeds(split, n, seed)`` for :class:`~jaxrl_llm.agents.EnvSpec` (:func:`split_seeds`)."""

    def fn(split: str, n: int, seed: int = 0) -> list[int]:
        return split_seeds(name, key_of, split, n, seed, eval_modulus=eval_modulus, max_draws=max_draws)

    fn.__name__ = f"{name}_split_seeds"
    return fn


_ANSWER_RE = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.S | re.I)


# a tool call the policy writes, or a tool's response block it writes itself (the environment's own
# responses are observations, never part of an action); an unclosed block runs to the end
_TOOL_BLOCK_RE = re.compile(r"<(tool_call|tool_response)>.*?(?:</\1>|\Z)", re.S | re.I)


def answers_of(text: str) -> list[str]:
    """Contents of every ``<answer>...</answer>`` of the reply in ``text`` (a final unclosed
    ``<answer>`` takes the rest: generation often stops at the closing tag), stripped. Tags
    inside ``<tool_call>`` or ``<tool_response>`` blocks are not the reply's: an answer put in a
    tool's input or in a made-up tool output does not count."""
    return [h.strip() for h in _ANSWER_RE.findall(_TOOL_BLOCK_RE.sub(" ", text))]


def extract_answer(text: str) -> str | None:
    """The last of :func:`answers_of` ``text``, or None without an answer tag in the reply."""
    hits = answers_of(text)
    return hits[-1] if hits else None


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's exact-match normalisation: lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def first_word(text: str, words: Sequence[str] | dict[str, object]) -> str | None:
    """The first of ``words`` (whole word, case-insensitive, longest alternative first) in
    ``text``, as spelled in ``words``; None when there is none."""
    opts = sorted(words, key=len, reverse=True)
    if not opts:
        return None
    m = re.search(r"(?<![A-Za-z0-9_])(" + "|".join(re.escape(w) for w in opts) + r")(?![A-Za-z0-9_])",
                  text, re.I)
    if m is None:
        return None
    found = m.group(1).lower()
    return next(w for w in opts if w.lower() == found)

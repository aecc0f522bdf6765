"""Answer clusterers: which sampled completions of a prompt give the same answer, as a
registered part, ``recipe.clusterer=<name>``.

Methods that reason about the *distribution of answers* in a group (SEED-GRPO's semantic
entropy, EMPO's cluster-frequency reward, COPO's consistency) read the loop's ``answer_ids``
input: one int per row, equal for rows of one prompt whose completions fall in one cluster. The
loop decodes the completions and calls the recipe's clusterer, ``fn(completions: list[str],
**params) -> list[Hashable | None]``: a key per completion, ``None`` when no answer can be
extracted (such a completion is its own cluster: it agrees with nothing).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from jaxrl_llm.algorithms.registry import Part, new_registry

__all__ = ["CLUSTERERS", "answer_key", "cluster_ids"]

CLUSTERERS = new_registry("answer clusterer", "recipe.clusterer",
                          "fn(completions: list[str], **params) -> list[Hashable | None]")


def answer_key(answer: str | None) -> Hashable | None:
    """A canonical key of an extracted answer: numbers by value (``3``, ``3.0`` and ``+3``
    agree; ``1,234`` and ``1234`` too), anything else by its text without spaces and case."""
    if answer is None:
        return None
    a = answer.strip().strip("$").replace(",", "")
    try:
        x = float(a)
        return ("num", round(x, 9)) if np.isfinite(x) else ("text", a.lower())
    except ValueError:
        return ("text", "".join(a.split()).lower())


def final_answer(completions: Sequence[str], *, methods: Sequence[str] = ("boxed", "hash", "tag", "number")
                 ) -> list[Hashable | None]:
    """The completion's final answer (:func:`jaxrl_llm.rewards.math.extract_answer`: last boxed,
    ``####``, ``<answer>`` tag, else the last number), canonicalised by :func:`answer_key`."""
    from jaxrl_llm.rewards.math import extract_answer  # the verifiers' extraction (a layer up; used at run time)

    return [answer_key(extract_answer(c, tuple(methods))) for c in completions]


def exact_text(completions: Sequence[str]) -> list[Hashable | None]:
    """The whole completion, whitespace-normalised (for tasks whose answer is the text)."""
    return [" ".join(c.split()) for c in completions]


CLUSTERERS.register(Part("answer", final_answer, paper="", note="equal extracted final answers (boxed, ####, "
                                                               "<answer> tag, last number); numbers by value",
                         tests="tests/training/test_group_estimators.py"))
CLUSTERERS.register(Part("text", exact_text, note="equal whitespace-normalised completions",
                         tests="tests/training/test_group_estimators.py"))


def cluster_ids(keys: Sequence[Hashable | None], group_ids: Sequence[int]) -> np.ndarray:
    """``[N]`` int32 cluster ids in ``[0, N)``: rows share an id exactly when they have the same
    group and the same non-``None`` key; a ``None`` key is a cluster of its own. Ids are given
    in order of first appearance."""
    table: dict = {}
    out = np.empty(len(keys), np.int32)
    for i, (k, g) in enumerate(zip(keys, group_ids)):
        key = (int(g), k) if k is not None else ("none", i)
        out[i] = table.setdefault(key, len(table))
    return out

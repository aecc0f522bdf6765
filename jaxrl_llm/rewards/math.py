"""Math final-answer verification: extract the model's final answer, decide equivalence with
``math-verify`` (Hugging Face's sympy-based checker), not a home-made parser.

Extraction (:func:`extract_answer`), in order, the first marker that is present:

1. ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces handled): the convention of MATH-style
   prompts;
2. the text after ``####`` (GSM8K's format) up to the end of its line;
3. the content of an ``<answer>...</answer>`` tag;
4. the last number in the text (``-1,234.5``; thousands separators dropped; a trailing
   period is not part of it).

Closed against the hacks a policy finds (``tests/rewards/test_verifier_hacks.py``):

- **several different final answers** (``\\boxed{3} or maybe \\boxed{4}``): when a marker
  occurs more than once with answers that are not all equivalent, the answer is all of them
  (``3, 4``), which equals a gold answer only if that is the same set. This is math-verify's
  reading (``parse`` of several boxes gives the set); verl's ``last_boxed_only_string`` takes the
  last box and credits the hedge. Repeating one answer, or equivalent forms of it, is fine.
- **a hedge inside one answer** (``\\boxed{3 \\text{ or } 4}``, ``4 (or maybe 3)``): math-verify
  reads it as a set or takes one of its numbers. :func:`math_equal` refuses a prediction with two
  or more different numbers and a word offering alternatives (or, maybe, perhaps, possibly,
  either, probably, likely), and when the prediction is not equivalent as a whole it falls back
  to a number only when the prediction holds exactly one after its last ``=`` (``18 eggs``,
  ``x = 3``; ``3, 4`` is not 4). Stricter than math-verify.
- **an empty box** (``The answer is 12. \\boxed{}``): a marker whose every occurrence is empty
  means no answer. There is no fallback to a later method, where math-verify falls back to the
  last number; an empty box beside a filled one (the instruction restated) is ignored.
- **an answer copied from the prompt** (``math_reward`` passes the prompt): an answer whose text
  lies inside a passage of 20 or more characters copied verbatim from the prompt (a worked example,
  the question restated) is not the policy's answer. The number method then takes the last number
  outside such passages; a marker's answer is dropped. Neither verl nor math-verify sees the prompt.

Equivalence (:func:`math_equal`): both sides are parsed by ``math_verify.parse`` as the
content of a ``\\boxed{}`` (so ``0.5``, ``1/2``, ``\\frac{1}{2}`` and ``\\dfrac12`` agree,
as do ``1,234`` and ``1234``, ``3.0`` and ``3``, ``10^{3}`` and ``1000``), then compared by
``math_verify.verify`` (numbers to 6 decimals, symbolic simplification, sets, intervals,
equations ``x=3`` vs ``3``). If that fails and the prediction carries words around one number
(``18 eggs``), that number is compared. ``math-verify`` uses ``signal.alarm`` for its own timeouts, which
only works in the main thread: off the main thread (our reward threads) its timeout is
switched off and the caller's timeout (:class:`~jaxrl_llm.rewards.Rewards`) bounds it.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["last_boxed", "extract_answer", "copied_spans", "math_equal", "math_reward", "gsm8k_gold", "NUMBER_RE"]

NUMBER_RE = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_HASH_RE = re.compile(r"####\s*([^\n]*)")
_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# words that offer alternatives: with two or more different numbers, a hedge
_HEDGE_RE = re.compile(r"\b(?:or|maybe|perhaps|possibly|either|probably|likely)\b", re.IGNORECASE)


def _boxed_spans(text: str) -> list[tuple[str, int, int]]:
    """Every ``\\boxed{...}`` / ``\\fbox{...}`` (and ``\\boxed 5``) as ``(content, start, end)``
    of its content, in order."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)(?![A-Za-z])\s*", text):
        i = m.end()
        if text[i:i + 1] == "{":
            depth = 0
            for j in range(i, len(text)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    out.append((text[i + 1:j], i + 1, j))
                    break
        else:
            tok = re.match(r"[^\s$}]+", text[i:])
            if tok and m.end() > m.start() + len(m.group(0).rstrip()):  # "\boxed 5" needs the space
                out.append((tok.group(0), i, i + tok.end()))
    return out


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (``\\boxed 5`` too), or None."""
    spans = _boxed_spans(text)
    return spans[-1][0].strip() if spans else None


def _spans(text: str, how: str) -> list[tuple[str, int, int]]:
    """The answers of one extraction method in ``text``, as ``(content, start, end)``."""
    if how == "boxed":
        return _boxed_spans(text)
    if how == "hash":
        return [(m.group(1), m.start(1), m.end(1)) for m in _HASH_RE.finditer(text)]
    if how == "tag":
        return [(m.group(1), m.start(1), m.end(1)) for m in _TAG_RE.finditer(text)]
    if how == "number":
        return [(m.group(0).replace(",", ""), m.start(), m.end()) for m in NUMBER_RE.finditer(text)]
    raise ValueError(f"unknown extraction method {how!r}; use 'boxed', 'hash', 'tag' or 'number'")


def copied_spans(prompt: str, completion: str, min_chars: int = 20) -> list[tuple[int, int]]:
    """The ``(start, end)`` spans of ``completion`` copied verbatim from ``prompt``: common
    passages of at least ``min_chars`` characters (``difflib``'s matching blocks)."""
    import difflib

    if not prompt or len(completion) < min_chars:
        return []
    blocks = difflib.SequenceMatcher(None, prompt, completion, autojunk=False).get_matching_blocks()
    return [(b.b, b.b + b.size) for b in blocks if b.size >= min_chars]


def extract_answer(text: str, methods: Sequence[str] = ("boxed", "hash", "tag", "number"), *,
                   prompt: str = "") -> str | None:
    """The final answer in ``text`` by the first method whose marker is present (see the module
    docstring: several different answers give all of them, an empty marker gives None), or None
    when there is none. ``prompt``: answers inside passages copied from it are not counted."""
    copied = copied_spans(prompt, text) if prompt else []

    def own(span) -> bool:
        return not any(a <= span[1] and span[2] <= b for a, b in copied)

    for how in methods:
        found = _spans(text, how)
        if how == "number":
            mine = [x for x in found if own(x)]
            if mine:
                return mine[-1][0]
            continue
        if not found:
            continue
        answers = [x[0].strip() for x in found if own(x) and x[0].strip()]
        if not answers:  # only empty markers (or copied ones): no answer, and no fallback
            return None
        distinct = list(dict.fromkeys(answers))
        if len(distinct) == 1 or all(math_equal(a, distinct[-1]) for a in distinct[:-1]):
            return distinct[-1]
        return ", ".join(distinct)  # several different final answers: all of them (a set, as math-verify reads it)
    return None


def _parse(s: str, in_main: bool):
    from math_verify import parse

    return parse("\\boxed{" + s + "}", parsing_timeout=5 if in_main else None)


def math_equal(pred: str | None, gold: Any) -> bool:
    """Whether the extracted answer ``pred`` equals ``gold`` (a string or number)."""
    if pred is None or gold is None:
        return False
    from math_verify import verify

    gold = str(gold).strip()
    pred = pred.strip()
    if not gold or not pred:
        return False
    if _HEDGE_RE.search(pred) and len({n.replace(",", "") for n in NUMBER_RE.findall(pred)}) > 1:
        return False  # "4 (or maybe 3)": math-verify would take one of them
    in_main = threading.current_thread() is threading.main_thread()
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every timeout-less call
    g = _parse(gold, in_main)
    if not g:
        return False
    if verify(g, _parse(pred, in_main), timeout_seconds=5 if in_main else None):
        return True
    # words around one number ("18 eggs", "x = 3"): that number; several ("3 or 4"): a hedge, no answer
    nums = {n.replace(",", "") for n in NUMBER_RE.findall(pred.rsplit("=", 1)[-1])}
    if len(nums) == 1 and (num := nums.pop()) != pred.replace(",", ""):
        return bool(verify(g, _parse(num, in_main), timeout_seconds=5 if in_main else None))
    return False


def gsm8k_gold(answer: str) -> str:
    """The final answer of a GSM8K ``answer`` field (the text after ``####``, commas removed)."""
    hits = _HASH_RE.findall(answer)
    if not hits:
        raise ValueError(f"GSM8K answer has no '####' final answer: {answer[-80:]!r}")
    return hits[-1].strip().replace(",", "")


def math_reward(prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[Any],
                **_: Any) -> list[float]:
    """1.0 when a completion's final answer (:func:`extract_answer`, passages copied from its
    prompt left out) equals ``answer`` (:func:`math_equal`), else 0.0. The reward-function
    protocol: ``answer`` is the dataset column of gold answers."""
    if len(prompts) != len(completions) or len(answer) != len(completions):
        raise ValueError(f"math_reward: {len(prompts)} prompts, {len(completions)} completions and {len(answer)} "
                         f"answers; one of each per row")
    return [float(math_equal(extract_answer(c, prompt=p), a)) for p, c, a in zip(prompts, completions, answer)]

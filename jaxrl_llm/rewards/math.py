"""Math final-answer verification: extract the model's final answer, decide equivalence with
``math-verify`` (Hugging Face's sympy-based checker), not a home-made parser.

Extraction (:func:`extract_answer`), in order, the first that is present:

1. the **last** ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces handled): the convention of
   MATH-style prompts; with several boxed answers the final one is the answer (verl's
   ``last_boxed_only_string`` does the same);
2. the text after the last ``####`` (GSM8K's format) up to the end of its line;
3. the content of the last ``<answer>...</answer>`` tag;
4. the last number in the text (``-1,234.5``; thousands separators dropped; a trailing
   period is not part of it).

Equivalence (:func:`math_equal`): both sides are parsed by ``math_verify.parse`` as the
content of a ``\\boxed{}`` (so ``0.5``, ``1/2``, ``\\frac{1}{2}`` and ``\\dfrac12`` agree,
as do ``1,234`` and ``1234``, ``3.0`` and ``3``, ``10^{3}`` and ``1000``), then compared by
``math_verify.verify`` (numbers to 6 decimals, symbolic simplification, sets, intervals,
equations ``x=3`` vs ``3``). If that fails and the prediction carries words (``18 eggs``), its
last number is compared. ``math-verify`` uses ``signal.alarm`` for its own timeouts, which
only works in the main thread: off the main thread (our reward threads) its timeout is
switched off and the caller's timeout (:class:`~jaxrl_llm.rewards.Rewards`) bounds it.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["last_boxed", "extract_answer", "math_equal", "math_reward", "gsm8k_gold", "NUMBER_RE"]

NUMBER_RE = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_HASH_RE = re.compile(r"####\s*([^\n]*)")
_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (``\\boxed 5`` too), or None."""
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)(?![A-Za-z])\s*", text):
        i = m.end()
        if text[i:i + 1] == "{":
            depth = 0
            for j in range(i, len(text)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    best = text[i + 1:j]
                    break
        else:
            tok = re.match(r"[^\s$}]+", text[i:])
            if tok and m.end() > m.start() + len(m.group(0).rstrip()):  # "\boxed 5" needs the space
                best = tok.group(0)
    return best.strip() if best is not None else None


def _last_number(text: str) -> str | None:
    nums = NUMBER_RE.findall(text)
    return nums[-1].replace(",", "") if nums else None


def extract_answer(text: str, methods: Sequence[str] = ("boxed", "hash", "tag", "number")) -> str | None:
    """The final answer in ``text`` by the first applicable method (see the module docstring),
    or None when there is none."""
    for how in methods:
        if how == "boxed":
            ans = last_boxed(text)
        elif how == "hash":
            hits = _HASH_RE.findall(text)
            ans = hits[-1].strip() if hits else None
        elif how == "tag":
            hits = _TAG_RE.findall(text)
            ans = hits[-1].strip() if hits else None
        elif how == "number":
            ans = _last_number(text)
        else:
            raise ValueError(f"unknown extraction method {how!r}; use 'boxed', 'hash', 'tag' or 'number'")
        if ans:
            return ans
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
    in_main = threading.current_thread() is threading.main_thread()
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every timeout-less call
    g = _parse(gold, in_main)
    if not g:
        return False
    if verify(g, _parse(pred, in_main), timeout_seconds=5 if in_main else None):
        return True
    num = _last_number(pred)
    if num is not None and num != pred.replace(",", ""):
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
    """1.0 when a completion's final answer (:func:`extract_answer`) equals ``answer``
    (:func:`math_equal`), else 0.0. The reward-function protocol: ``answer`` is the dataset
    column of gold answers."""
    return [float(math_equal(extract_answer(c), a)) for c, a in zip(completions, answer)]

"""Integer arithmetic with configurable operations and operand sizes.

Prompt (``answer_format="plain"``, the default)::

    What is 37 + 5? Answer with the number only.

``answer_format="tag"`` asks for ``<answer>42</answer>`` and ``"boxed"`` for ``\\boxed{42}``
(the ``solution`` column follows the same format); ``instruction=`` replaces the sentence
after the question with any text.

Difficulty knobs
    ``ops``: a tuple of ``"+"``, ``"-"``, ``"*"`` and ``"/"`` (exact division: the problem is
    ``(a*b) / b`` so the answer is the integer ``a``; ``b`` is never 0). A problem draws its
    operation uniformly from ``ops``, then each operand uniformly from its range.
    ``digits=(da, db)``: digit counts of the left and right operand (1 digit is 0..9,
    ``d >= 2`` digits is ``10**(d-1) .. 10**d - 1``; for ``"/"`` the left range is the
    quotient, the right the divisor). ``operand_ranges=((lo_a, hi_a), (lo_b, hi_b))``
    overrides ``digits`` with inclusive ranges (negative bounds allowed; a negative right
    operand is shown in parentheses). ``allow_negative=False`` drops problems with a
    negative answer (e.g. ``3 - 5``).

    For SmolLM2-135M-Instruct (greedy) the presets are roughly: ``add1`` ~75% correct,
    ``sub`` ~40%, ``mul`` ~25%, ``add2x1`` ~10%: ``sub``/``mul`` sit in the 10-40% band
    where GRPO gets a learning signal.

Verifier (:func:`parse_final_number`)
    The final answer is taken from the first source that is present, in this order: the
    ``<answer>...</answer>`` tags, else the ``\\boxed{...}`` contents, else the whole
    completion. An explicit answer (a tag or a box) must be one answer: its one number after its
    last ``=`` (``<answer>9 + 7 = 16</answer>`` is 16), the same in every tag or box; several
    different numbers (``<answer>3 or 4</answer>``, ``\\boxed{3, 4}``, two tags with 3 and 4)
    are a hedge and score 0. In the whole completion the last number counts, as worked steps
    come before it.
    Numbers may have a sign (``-7``, ``−7``; a ``-`` directly after a digit, letter or ``)``
    is a binary minus), thousands separators (``1,234``) and decimals (``5.0`` equals 5, a
    trailing period as in ``5.`` is punctuation). Score 1.0 iff the number equals the
    integer answer exactly, else 0.0 (also when no number is found). Fractions are not
    parsed as one number (in ``1/2`` the last number is 2) and neither is scientific notation.

Split
    The canonical key is ``(op, a, b)`` with the operands sorted for the commutative ``+``
    and ``*`` (``3 + 5`` and ``5 + 3`` are one problem, on the same side of the split) and
    ``("/", a*b, b)`` for division. Spaces of at most 50,000 problems are counted exactly,
    so e.g. ``add1`` (55 distinct problems, ~11 in eval) repeats in train and raises a
    ``ValueError`` for more than its eval size.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

from jaxrl_llm.tasks.base import Task

__all__ = ["Arithmetic", "parse_final_number", "find_numbers", "ARITHMETIC_OPS"]

ARITHMETIC_OPS = ("+", "-", "*", "/")
ANSWER_FORMATS = ("plain", "tag", "boxed")
_INSTRUCTIONS = {
    "plain": "Answer with the number only.",
    "tag": "Put the final answer (the number only) inside <answer></answer> tags.",
    "boxed": "Put the final answer (the number only) in \\boxed{}.",
}
_ENUMERATE_LIMIT = 50_000

# A number: optional sign (only when not directly after a word character or ')', so that
# "5-3" is a subtraction), digits with optional thousands separators, optional decimals.
_NUMBER_RE = re.compile(
    r"(?:(?<![\w)])[-−])?(?<![\d.])(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
)
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)


def find_numbers(text: str) -> list[Fraction]:
    """All numbers in ``text`` in order, as exact fractions (see the module docstring)."""
    out = []
    for m in _NUMBER_RE.finditer(text):
        out.append(Fraction(m.group(0).replace("−", "-").replace(",", "")))
    return out


def _boxed_all(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` (nested braces allowed; an unclosed last box takes the rest)."""
    out, start = [], text.find("\\boxed{")
    while start >= 0:
        i = start + len("\\boxed{")
        depth, end = 1, len(text)
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                end = j
                break
        out.append(text[i:end])
        start = text.find("\\boxed{", end)
    return out


def _explicit_number(answer: str) -> Fraction | None:
    """The one number of an explicit answer (after its last ``=``), or None when it has none or
    several different ones (a hedge)."""
    nums = set(find_numbers(answer.rsplit("=", 1)[-1]))
    return nums.pop() if len(nums) == 1 else None


def parse_final_number(completion: str) -> Fraction | None:
    """The final numeric answer of ``completion``, or None if there is none (see the module
    docstring): the ``<answer>`` tags' if any, else the ``\\boxed{}`` contents' if any, each
    of them one and the same number; else the last number of the whole text."""
    explicit = _ANSWER_TAG_RE.findall(completion) or _boxed_all(completion)
    if explicit:
        values = {_explicit_number(a) for a in explicit}
        return values.pop() if len(values) == 1 else None
    nums = find_numbers(completion)
    return nums[-1] if nums else None


def _digit_range(d: int) -> tuple[int, int]:
    return (0, 9) if d == 1 else (10 ** (d - 1), 10**d - 1)


def _fmt(x: int) -> str:
    return f"({x})" if x < 0 else str(x)


@dataclass(frozen=True)
class Arithmetic(Task):
    """Integer arithmetic problems ``a op b`` (see the module docstring).

    Args:
        ops: operations, a tuple drawn from ``("+", "-", "*", "/")``.
        digits: ``(left, right)`` operand digit counts (an int means both).
        operand_ranges: inclusive ``((lo_a, hi_a), (lo_b, hi_b))``; overrides ``digits``.
        allow_negative: keep problems whose answer is negative.
        answer_format: ``"plain"`` (number only), ``"tag"`` (``<answer>``) or ``"boxed"``;
            sets the default instruction and the ``solution`` text. The verifier accepts
            every format.
        instruction: text after the question; ``None`` means the format's default.

    Rows: ``prompt``, ``answer`` (int), ``solution``, ``op``, ``a``, ``b`` (the displayed
    operands; for ``"/"`` ``a`` is the dividend).
    """

    ops: tuple[str, ...] = ("+",)
    digits: tuple[int, int] = (1, 1)
    operand_ranges: tuple[tuple[int, int], tuple[int, int]] | None = None
    allow_negative: bool = False
    answer_format: str = "plain"
    instruction: str | None = None

    name: ClassVar[str] = "arithmetic"
    required_columns: ClassVar[tuple[str, ...]] = ("answer",)
    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "add1": dict(ops=("+",), digits=(1, 1)),
        "sub": dict(ops=("-",), operand_ranges=((5, 20), (0, 5))),
        "mul": dict(ops=("*",), operand_ranges=((2, 12), (2, 12))),
        "div": dict(ops=("/",), operand_ranges=((2, 12), (2, 12))),
        "add2x1": dict(ops=("+",), digits=(2, 1)),
        "add2": dict(ops=("+",), digits=(2, 2)),
        "add3": dict(ops=("+",), digits=(3, 3)),
        "mixed1": dict(ops=("+", "-", "*"), digits=(1, 1)),
    }

    def __post_init__(self) -> None:
        ops = self.ops
        if isinstance(ops, str):
            ops = (ops,)
        ops = tuple(ops)
        if not ops:
            raise ValueError("ops must contain at least one operation")
        bad = [o for o in ops if o not in ARITHMETIC_OPS]
        if bad:
            raise ValueError(f"ops: unknown operation(s) {bad}; allowed: {ARITHMETIC_OPS}")
        if len(set(ops)) != len(ops):
            raise ValueError(f"ops must not repeat an operation, got {ops}")
        object.__setattr__(self, "ops", ops)

        digits = self.digits
        if isinstance(digits, int):
            digits = (digits, digits)
        digits = tuple(digits)
        if len(digits) != 2 or any(isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 18 for d in digits):
            raise ValueError(f"digits must be an int or a pair of ints in 1..18, got {self.digits!r}")
        object.__setattr__(self, "digits", digits)

        if self.operand_ranges is not None:
            try:
                ranges = tuple((int(lo), int(hi)) for lo, hi in self.operand_ranges)
            except (TypeError, ValueError):
                raise ValueError(
                    f"operand_ranges must be ((lo_a, hi_a), (lo_b, hi_b)), got {self.operand_ranges!r}"
                ) from None
            if len(ranges) != 2 or any(lo > hi for lo, hi in ranges):
                raise ValueError(
                    f"operand_ranges must be two inclusive (lo, hi) ranges with lo <= hi, got {self.operand_ranges!r}"
                )
            object.__setattr__(self, "operand_ranges", ranges)

        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {self.answer_format!r}")
        if self.instruction is not None and not isinstance(self.instruction, str):
            raise ValueError(f"instruction must be a string or None, got {self.instruction!r}")

        (la, ha), (lb, hb) = self.ranges
        for op in ops:
            if op == "/" and lb == hb == 0:
                raise ValueError("ops contains '/' but the divisor range is {0}: no valid problem")
            # the result is bilinear in the operands, so its maximum is at a corner of the ranges
            corners = [self._result(op, x, y) for x in (la, ha) for y in (lb, hb) if not (op == "/" and y == 0)]
            if not self.allow_negative and max(corners) < 0:
                raise ValueError(
                    f"with allow_negative=False, operation {op!r} has no problem with a non-negative "
                    f"answer for operand ranges {self.ranges}"
                )

    # ------------------------------------------------------------------ problem space

    @property
    def ranges(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """The inclusive operand ranges in use (``operand_ranges`` or derived from ``digits``)."""
        if self.operand_ranges is not None:
            return self.operand_ranges  # type: ignore[return-value]
        return (_digit_range(self.digits[0]), _digit_range(self.digits[1]))

    @staticmethod
    def _result(op: str, a: int, b: int) -> int:
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        return a  # "/": a is the quotient of (a*b) / b

    @staticmethod
    def _key(op: str, a: int, b: int) -> tuple:
        """Canonical key of the problem with left operand ``a`` (quotient for "/") and ``b``."""
        if op in ("+", "*"):
            return (op, min(a, b), max(a, b))
        if op == "/":
            return (op, a * b, b)
        return (op, a, b)

    def _valid(self, op: str, a: int, b: int) -> bool:
        if op == "/" and b == 0:
            return False
        return self.allow_negative or self._result(op, a, b) >= 0

    def _propose(self, rng: random.Random) -> tuple[Hashable, Any]:
        op = rng.choice(self.ops)
        (la, ha), (lb, hb) = self.ranges
        a, b = rng.randint(la, ha), rng.randint(lb, hb)
        return self._key(op, a, b), (op, a, b)

    def _realize(self, key: Hashable, payload: Any, rng: random.Random) -> dict | None:
        op, a, b = payload
        if not self._valid(op, a, b):
            return None
        answer = self._result(op, a, b)
        left = a * b if op == "/" else a
        question = f"{_fmt(left)} {op} {_fmt(b)}"
        instruction = _INSTRUCTIONS[self.answer_format] if self.instruction is None else self.instruction
        prompt = f"What is {question}?" + (f" {instruction}" if instruction else "")
        if self.answer_format == "tag":
            solution = f"<answer>{answer}</answer>"
        elif self.answer_format == "boxed":
            solution = f"\\boxed{{{answer}}}"
        else:
            solution = str(answer)
        return {"prompt": prompt, "answer": answer, "solution": solution, "op": op, "a": left, "b": b}

    def problem_key(self, row: Mapping[str, Any]) -> Hashable:
        op, a, b = row["op"], int(row["a"]), int(row["b"])
        return self._key(op, a // b if op == "/" else a, b)

    def _split_size(self, split: str) -> int | None:
        sizes = _split_sizes(self)
        return None if sizes is None else sizes[split]

    def space_size(self) -> int | None:
        """Number of distinct problems (all splits), or None if larger than 50,000 operand pairs."""
        sizes = _split_sizes(self)
        return None if sizes is None else sizes["train"] + sizes["eval"]

    # ------------------------------------------------------------------ verifier

    def score(self, completion: str, row: Mapping[str, Any]) -> float:
        """1.0 iff the final number of ``completion`` (:func:`parse_final_number`) equals ``row["answer"]``."""
        pred = parse_final_number(completion)
        return 1.0 if pred is not None and pred == int(row["answer"]) else 0.0


@functools.lru_cache(maxsize=128)
def _split_sizes(task: Arithmetic) -> dict[str, int] | None:
    (la, ha), (lb, hb) = task.ranges
    pairs = (ha - la + 1) * (hb - lb + 1)
    if pairs * len(task.ops) > _ENUMERATE_LIMIT:
        return None
    keys = set()
    for op in task.ops:
        for a in range(la, ha + 1):
            for b in range(lb, hb + 1):
                if task._valid(op, a, b):
                    keys.add(task._key(op, a, b))
    sizes = {"train": 0, "eval": 0}
    for k in keys:
        sizes[task.split_of(k)] += 1
    return sizes


@dataclass(frozen=True)
class ArithmeticMix(Task):
    """Problems of several :class:`Arithmetic` presets mixed, each row labelled with its preset
    in the ``level`` column: a task whose difficulty varies and is known (curricula such as
    ``recipe.selector=sec`` with ``column=level`` choose among the levels).

    Args:
        levels: preset names of :class:`Arithmetic`, drawn uniformly for each problem.
        answer_format, instruction: as :class:`Arithmetic`, for every level.

    Rows: those of :class:`Arithmetic` plus ``level``. A problem's key is ``(level, key)``; the
    train/eval split hashes it, so a level's eval problems are never trained on. A level whose
    eval problems run out stops appearing in the eval stream (the small ones first).
    """

    levels: tuple[str, ...] = ("add1", "add2x1", "add2", "add3")
    answer_format: str = "plain"
    instruction: str | None = None

    name: ClassVar[str] = "arithmetic_mix"
    required_columns: ClassVar[tuple[str, ...]] = ("answer",)
    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "add_levels": dict(levels=("add1", "add2x1", "add2", "add3")),
        "four_ops": dict(levels=("add1", "sub", "mul", "div")),
        "add_three": dict(levels=("add1", "add2x1", "add2")),
    }

    def __post_init__(self) -> None:
        levels = (self.levels,) if isinstance(self.levels, str) else tuple(self.levels)
        if not levels:
            raise ValueError("levels must name at least one Arithmetic preset")
        bad = [lv for lv in levels if lv not in Arithmetic.PRESETS]
        if bad:
            raise ValueError(f"levels: unknown Arithmetic preset(s) {bad}; known: {sorted(Arithmetic.PRESETS)}")
        if len(set(levels)) != len(levels):
            raise ValueError(f"levels must not repeat a preset, got {levels}")
        object.__setattr__(self, "levels", levels)
        # validates answer_format / instruction
        Arithmetic.create(levels[0], answer_format=self.answer_format, instruction=self.instruction)

    @functools.cached_property
    def _tasks(self) -> dict[str, Arithmetic]:
        return {lv: Arithmetic.create(lv, answer_format=self.answer_format, instruction=self.instruction)
                for lv in self.levels}

    def _propose(self, rng: random.Random) -> tuple[Hashable, Any]:
        lv = rng.choice(self.levels)
        key, payload = self._tasks[lv]._propose(rng)
        return (lv, key), (lv, payload)

    def _realize(self, key: Hashable, payload: Any, rng: random.Random) -> dict | None:
        lv, inner = payload
        row = self._tasks[lv]._realize(key[1], inner, rng)
        return None if row is None else {**row, "level": lv}

    def problem_key(self, row: Mapping[str, Any]) -> Hashable:
        return (row["level"], self._tasks[row["level"]].problem_key(row))

    def score(self, completion: str, row: Mapping[str, Any]) -> float:
        """1.0 iff the final number of ``completion`` equals ``row["answer"]``."""
        pred = parse_final_number(completion)
        return 1.0 if pred is not None and pred == int(row["answer"]) else 0.0

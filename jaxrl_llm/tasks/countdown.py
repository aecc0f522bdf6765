"""Countdown and Game-24: reach a target with the given numbers and ``+ - * /``.

Prompt (TinyZero convention)::

    Using the numbers [7, 3, 12, 5], create an expression that equals 44. You can use
    +, -, *, / and parentheses, and each number must be used exactly once. Show the final
    expression (without "= 44") inside <answer></answer> tags, for example
    <answer>(1 + 2) * 3</answer>.

``solution`` is one correct expression, minimally parenthesised, inside the tags, e.g.
``<answer>7 * 5 + 12 - 3</answer>``.

Difficulty knobs
    ``num_numbers`` (2..6), the number range ``min_number..max_number``, the ``ops`` allowed,
    ``target_range`` (random targets) or a fixed ``target`` (Game-24: ``Countdown.game24()``,
    four numbers 1..13, target 24), ``use_all`` (each number exactly once, the default, or
    at most once).

Generator (always solvable)
    Random target: draw the numbers uniformly, then build a random expression tree over
    all of them with random operations, evaluated exactly with :class:`fractions.Fraction`
    (intermediate fractions allowed); keep it when the value is an integer inside
    ``target_range``, and that expression is the solution. Fixed target: draw numbers and
    keep those an exhaustive search (:func:`solve`) can bring to the target (``num_numbers
    <= 5``). Numbers are shown in random order.

Verifier
    Expression extraction (:func:`extract_expression`): the content of the last
    ``<answer>...</answer>`` tag if any; else the expression directly left of the last
    ``= <target>`` in the text; else the last line that consists only of an expression
    (an ``= target`` part is dropped). ``×``, ``·``, ``÷``, ``−`` and LaTeX ``\\times``,
    ``\\cdot``, ``\\div`` are read as ``*``, ``/``, ``-``. Evaluation
    (:func:`evaluate_expression`) never calls ``eval``: the text must consist of digits,
    ``+ - * / ( )`` and spaces only (at most 300 characters), is parsed with :mod:`ast`, and
    only integer literals, binary ``+ - * /``, unary minus and parentheses are accepted
    (no names, calls, ``**``, ``//``, floats). Score 1.0 iff the multiset of literals equals
    the given numbers (``use_all=True``) or is a sub-multiset of them (``use_all=False``) and
    the exact value equals the target; division by zero, a parse failure or anything else
    scores 0.0.

Split
    Canonical key: ``(sorted numbers, target)``; the order the numbers are shown in and
    the solution do not matter.
"""

from __future__ import annotations

import ast
import functools
import operator
import random
import re
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, NamedTuple

from jaxrl_llm.tasks.base import Task

__all__ = ["Countdown", "solve", "evaluate_expression", "extract_expression", "COUNTDOWN_OPS"]

COUNTDOWN_OPS = ("+", "-", "*", "/")
_MAX_EXPR_CHARS = 300
_FIXED_TARGET_MAX_NUMBERS = 5
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3
_APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_AST_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_EXPR_RE = re.compile(r"[\d\s+\-*/()]+")
_EXPR_SUFFIX_RE = re.compile(r"[\d\s+\-*/()]*$")
_REPLACEMENTS = (
    ("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"), ("\\left", ""), ("\\right", ""),
    ("×", "*"), ("·", "*"), ("⋅", "*"), ("∗", "*"), ("÷", "/"), ("−", "-"), ("–", "-"),
)


class _Expr(NamedTuple):
    value: Fraction
    text: str
    prec: int  # precedence of the top-level operation (_ATOM for a literal)


def _combine(x: _Expr, op: str, y: _Expr) -> _Expr:
    """``x op y`` with the minimal parentheses (``-`` and ``/`` are not associative)."""
    p = _PREC[op]
    left = f"({x.text})" if x.prec < p else x.text
    right = f"({y.text})" if y.prec < p or (y.prec == p and op in "-/") else y.text
    return _Expr(_APPLY[op](x.value, y.value), f"{left} {op} {right}", p)


def _atom(n: int) -> _Expr:
    return _Expr(Fraction(n), str(n), _ATOM)


# ---------------------------------------------------------------------- solver


def solve(numbers: Sequence[int], target: int, ops: Sequence[str] = COUNTDOWN_OPS, use_all: bool = True) -> str | None:
    """An expression over ``numbers`` equal to ``target`` (exact arithmetic), or None.

    Exhaustive search over pairs to combine (exponential: meant for up to ~5 numbers).
    ``use_all=False`` also accepts expressions over a subset of the numbers.
    """
    return _solve_cached(tuple(sorted(int(n) for n in numbers)), int(target), tuple(ops), bool(use_all))


# Pools of values (sorted tuples) known not to reach a goal, per (target, ops, use_all):
# shared across calls, since sub-pools recur across instances (bounded, cleared when full).
_FAILED: dict[tuple, set[tuple[Fraction, ...]]] = {}
_FAILED_MAX = 1 << 20


@functools.lru_cache(maxsize=1 << 16)
def _solve_cached(numbers: tuple[int, ...], target: int, ops: tuple[str, ...], use_all: bool) -> str | None:
    goal = Fraction(target)
    failed = _FAILED.setdefault((target, ops, use_all), set())
    if len(failed) > _FAILED_MAX:
        failed.clear()

    def search(pool: list[_Expr]) -> str | None:
        if not use_all:
            for e in pool:
                if e.value == goal:
                    return e.text
        if len(pool) == 1:
            return pool[0].text if pool[0].value == goal else None
        state = tuple(sorted(e.value for e in pool))
        if state in failed:
            return None
        for i in range(len(pool)):
            for j in range(i + 1, len(pool)):
                rest = [pool[k] for k in range(len(pool)) if k != i and k != j]
                x, y = pool[i], pool[j]
                cands = []
                for op in ops:
                    if op in "+*":
                        cands.append((x, op, y))
                    else:
                        cands.append((x, op, y))
                        cands.append((y, op, x))
                for a, op, b in cands:
                    if op == "/" and b.value == 0:
                        continue
                    found = search(rest + [_combine(a, op, b)])
                    if found is not None:
                        return found
        failed.add(state)
        return None

    return search([_atom(n) for n in numbers])


# ---------------------------------------------------------------------- verifier


def _normalize(text: str) -> str:
    for a, b in _REPLACEMENTS:
        text = text.replace(a, b)
    return text


def _drop_equation(expr: str, target: int) -> str:
    """``"(1 + 2) * 8 = 24"`` -> ``"(1 + 2) * 8"`` (also ``"24 = ..."``)."""
    if "=" not in expr:
        return expr.strip()
    parts = [p.strip() for p in expr.split("=")]
    others = [p for p in parts if p and p != str(target)]
    return others[0] if len(others) == 1 else parts[0]


def extract_expression(completion: str, target: int) -> str | None:
    """The candidate expression of ``completion`` (rules in the module docstring), or None."""
    text = _normalize(completion)
    tags = _ANSWER_TAG_RE.findall(text)
    if tags:
        return _drop_equation(tags[-1], target).rstrip(".").strip()
    eqs = list(re.finditer(rf"=\s*{int(target)}(?![\d.]*\d)", text))
    if eqs:
        before = text[: eqs[-1].start()]
        cand = _EXPR_SUFFIX_RE.search(before).group(0).strip()  # type: ignore[union-attr]
        if cand:
            return cand
    for line in reversed(text.splitlines()):
        cand = _drop_equation(line.strip().rstrip("."), target)
        if cand and _EXPR_RE.fullmatch(cand) and re.search(r"\d", cand) and re.search(r"[+\-*/]", cand):
            return cand
    return None


class _Reject(Exception):
    pass


def evaluate_expression(expr: str) -> tuple[Fraction, list[int]] | None:
    """``(exact value, integer literals used)`` of a safe arithmetic expression, else None.

    Accepts only digits, ``+ - * / ( )`` and whitespace (at most 300 characters), parsed
    with :mod:`ast`: integer literals, binary ``+ - * /``, unary minus. Anything else
    (names, calls, ``**``, ``//``, floats) and division by zero give None. Never evaluates
    Python code.
    """
    expr = expr.strip()
    if not expr or len(expr) > _MAX_EXPR_CHARS or not _EXPR_RE.fullmatch(expr):
        return None
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    used: list[int] = []

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPS:
            return _AST_OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise _Reject

    try:
        value = ev(tree.body)
    except (_Reject, ZeroDivisionError, RecursionError):
        return None
    return value, used


# ---------------------------------------------------------------------- task


@dataclass(frozen=True)
class Countdown(Task):
    """Countdown / Game-24 (see the module docstring).

    Args:
        num_numbers: how many numbers are given (2..6; at most 5 with a fixed ``target``).
        min_number, max_number: inclusive range of the given numbers (``>= 1``).
        target_range: inclusive range of random targets (``>= 1``); unused when ``target``
            is set.
        target: a fixed target for every problem (Game-24: 24), or None for random targets.
        use_all: every number exactly once (True) or at most once (False).
        ops: allowed operations, a subset of ``("+", "-", "*", "/")``.

    Rows: ``prompt``, ``answer`` (= ``target``, int), ``solution``, ``numbers`` (list of
    int, in the order shown), ``target`` (int).
    """

    num_numbers: int = 4
    min_number: int = 1
    max_number: int = 20
    target_range: tuple[int, int] = (1, 100)
    target: int | None = None
    use_all: bool = True
    ops: tuple[str, ...] = COUNTDOWN_OPS

    name: ClassVar[str] = "countdown"
    required_columns: ClassVar[tuple[str, ...]] = ("numbers", "target")
    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "game24": dict(num_numbers=4, min_number=1, max_number=13, target=24),
        "countdown3": dict(num_numbers=3, min_number=1, max_number=50, target_range=(1, 100)),
        "countdown4": dict(num_numbers=4, min_number=1, max_number=99, target_range=(1, 100)),
    }

    @classmethod
    def game24(cls, **overrides: Any) -> Countdown:
        """Game-24: four numbers in 1..13, target 24, each number used exactly once."""
        return cls.preset("game24", **overrides)  # type: ignore[return-value]

    def __post_init__(self) -> None:
        for f in ("num_numbers", "min_number", "max_number"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{f} must be an int, got {v!r}")
        if not 2 <= self.num_numbers <= 6:
            raise ValueError(f"num_numbers must be in 2..6, got {self.num_numbers}")
        if self.min_number < 1 or self.max_number < self.min_number:
            raise ValueError(
                f"need 1 <= min_number <= max_number, got min_number={self.min_number}, max_number={self.max_number}"
            )
        try:
            lo, hi = (int(x) for x in self.target_range)
        except (TypeError, ValueError):
            raise ValueError(f"target_range must be a pair (lo, hi), got {self.target_range!r}") from None
        if not 1 <= lo <= hi:
            raise ValueError(f"target_range must satisfy 1 <= lo <= hi, got {self.target_range!r}")
        object.__setattr__(self, "target_range", (lo, hi))
        if self.target is not None:
            if isinstance(self.target, bool) or not isinstance(self.target, int) or self.target < 1:
                raise ValueError(f"target must be a positive int or None, got {self.target!r}")
            if self.num_numbers > _FIXED_TARGET_MAX_NUMBERS:
                raise ValueError(
                    f"a fixed target needs num_numbers <= {_FIXED_TARGET_MAX_NUMBERS} (exhaustive solver), "
                    f"got num_numbers={self.num_numbers}"
                )
        ops = (self.ops,) if isinstance(self.ops, str) else tuple(self.ops)
        bad = [o for o in ops if o not in COUNTDOWN_OPS]
        if not ops or bad or len(set(ops)) != len(ops):
            raise ValueError(f"ops must be distinct operations from {COUNTDOWN_OPS}, got {self.ops!r}")
        object.__setattr__(self, "ops", ops)

    # ------------------------------------------------------------------ generator

    def _construct(self, nums: list[int], rng: random.Random) -> _Expr | None:
        """A random expression tree over all ``nums`` (None if it divided by zero)."""
        pool = [_atom(n) for n in nums]
        while len(pool) > 1:
            i, j = rng.sample(range(len(pool)), 2)
            x, y = pool[i], pool[j]
            op = rng.choice(self.ops)
            if op == "/" and y.value == 0:
                return None
            pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [_combine(x, op, y)]
        return pool[0]

    def _propose(self, rng: random.Random) -> tuple[Hashable, Any]:
        if self.target is not None:
            nums = [rng.randint(self.min_number, self.max_number) for _ in range(self.num_numbers)]
            return (tuple(sorted(nums)), self.target), None
        lo, hi = self.target_range
        for _ in range(2000):
            nums = [rng.randint(self.min_number, self.max_number) for _ in range(self.num_numbers)]
            for _ in range(20):
                e = self._construct(nums, rng)
                if e is not None and e.value.denominator == 1 and lo <= e.value <= hi:
                    return (tuple(sorted(nums)), int(e.value)), e.text
        raise ValueError(
            f"{self!r}: could not construct a problem with a target in {self.target_range}; "
            f"widen target_range or change the number range"
        )

    def _realize(self, key: Hashable, payload: Any, rng: random.Random) -> dict | None:
        nums_sorted, target = key  # type: ignore[misc]
        solution = payload
        if solution is None:
            solution = solve(nums_sorted, target, self.ops, self.use_all)
            if solution is None:
                return None
        shown = list(nums_sorted)
        rng.shuffle(shown)
        return {
            "prompt": self._prompt(shown, target),
            "answer": target,
            "solution": f"<answer>{solution}</answer>",
            "numbers": shown,
            "target": target,
        }

    def _prompt(self, numbers: list[int], target: int) -> str:
        ops_txt = ", ".join(self.ops)
        rule = "each number must be used exactly once" if self.use_all else "each number can be used at most once"
        return (
            f"Using the numbers {numbers}, create an expression that equals {target}. "
            f"You can use {ops_txt} and parentheses, and {rule}. "
            f'Show the final expression (without "= {target}") inside <answer></answer> tags, '
            f"for example <answer>(1 + 2) * 3</answer>."
        )

    def problem_key(self, row: Mapping[str, Any]) -> Hashable:
        return (tuple(sorted(int(n) for n in row["numbers"])), int(row["target"]))

    # ------------------------------------------------------------------ verifier

    def score(self, completion: str, row: Mapping[str, Any]) -> float:
        """1.0 iff the extracted expression uses the numbers correctly and equals the target."""
        target = int(row["target"] if "target" in row else row["answer"])
        expr = extract_expression(completion, target)
        if expr is None:
            return 0.0
        res = evaluate_expression(expr)
        if res is None:
            return 0.0
        value, used = res
        given, got = Counter(int(n) for n in row["numbers"]), Counter(used)
        ok_numbers = got == given if self.use_all else (bool(used) and not (got - given))
        return 1.0 if ok_numbers and value == target else 0.0

"""Multi-digit arithmetic with tools: the policy may call a calculator or Python, then answers.

The episode of a seed is one problem ``a op b`` (``random.Random(stable_hash(...))``; each
operand drawn uniformly from its ``digits`` range as in :mod:`jaxrl_llm.tasks.arithmetic`,
``op`` uniformly from ``ops``; a subtraction with a negative result is redrawn)::

    What is 482 * 371? Use a tool if it helps, then give the final answer as <answer>number</answer>.

Turns follow :mod:`jaxrl_llm.agents.envs._toolqa`: tool calls get ``<tool_response>``
observations (the :class:`~jaxrl_llm.agents.tools.ToolRegistry` of ``tools``, within the
episode's :class:`~jaxrl_llm.agents.tools.ToolBudget`); ``<answer>...</answer>`` ends the
episode with reward 1 iff its last number equals the result
(:func:`jaxrl_llm.tasks.arithmetic.parse_final_number`: ``1,234`` and ``1234.0`` count).

Split key: ``(op, a, b)`` with the operands sorted for ``+`` and ``*`` (as the arithmetic
task). Scripted solver: one calculator call, then the answer.
"""

from __future__ import annotations

import random
from collections.abc import Hashable

from jaxrl_llm.agents.env import EnvSpec
from jaxrl_llm.agents.envs._common import seed_splitter
from jaxrl_llm.agents.envs._toolqa import ToolQuestionEnv
from jaxrl_llm.agents.tools import ToolRegistry, calculator_tool, format_tool_call, python_tool
from jaxrl_llm.tasks.arithmetic import parse_final_number
from jaxrl_llm.tasks.base import stable_hash

__all__ = ["ToolArithmetic", "tool_arith", "solve_tool_arith", "arith_registry"]

_NAME = "tool_arith"
_OPS = ("+", "-", "*")
_TOOLS = ("calculator", "python")


def arith_registry(tools: tuple[str, ...] = _TOOLS) -> ToolRegistry:
    """A registry with the named tools, from ``"calculator"`` and ``"python"`` (none: the no-tool
    baseline, where the policy must answer from its own arithmetic)."""
    bad = [t for t in tools if t not in _TOOLS]
    if bad:
        raise ValueError(f"tool_arith: tools must be a subset of {_TOOLS}, got {tools!r}")
    makers = {"calculator": calculator_tool, "python": python_tool}
    return ToolRegistry([makers[t]() for t in tools])


def _problem(ops: tuple[str, ...], digits: tuple[int, int], seed: int) -> tuple[str, int, int]:
    rng = random.Random(stable_hash(_NAME, ops, digits, int(seed)))
    ranges = [(0, 9) if d == 1 else (10 ** (d - 1), 10**d - 1) for d in digits]
    while True:
        op = rng.choice(ops)
        a, b = rng.randint(*ranges[0]), rng.randint(*ranges[1])
        if op != "-" or a >= b:
            return op, a, b


def _key(op: str, a: int, b: int) -> Hashable:
    return (op, min(a, b), max(a, b)) if op in ("+", "*") else (op, a, b)


class ToolArithmetic(ToolQuestionEnv):
    """Arithmetic with tools (see the module docstring).

    Args:
      ops: operations from ``"+"``, ``"-"``, ``"*"``.
      digits: ``(left, right)`` operand digit counts, each 1..18.
      registry: the tools (default :func:`arith_registry`: calculator and python).
      max_turns, max_calls, max_tool_seconds, invalid_penalty: see
        :class:`~jaxrl_llm.agents.envs._toolqa.ToolQuestionEnv`.
    """

    def __init__(self, ops: tuple[str, ...] = ("*",), digits: tuple[int, int] = (3, 3),
                 registry: ToolRegistry | None = None, *, max_turns: int = 4, max_calls: int | None = 4,
                 max_tool_seconds: float | None = 30.0, invalid_penalty: float = 0.0):
        ops = (ops,) if isinstance(ops, str) else tuple(ops)
        if not ops or any(o not in _OPS for o in ops):
            raise ValueError(f"ToolArithmetic: ops must be a non-empty tuple drawn from {_OPS}, got {ops!r}")
        digits = (digits, digits) if isinstance(digits, int) else tuple(digits)
        if len(digits) != 2 or any(isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 18 for d in digits):
            raise ValueError(f"ToolArithmetic: digits must be an int or a pair of ints in 1..18, got {digits!r}")
        if ops == ("-",) and digits[0] < digits[1]:
            raise ValueError(f"ToolArithmetic: with ops=('-',) and digits={digits} every answer is negative; "
                             f"give the left operand at least as many digits as the right one")
        super().__init__(registry if registry is not None else arith_registry(), max_turns=max_turns,
                         max_calls=max_calls, max_tool_seconds=max_tool_seconds, invalid_penalty=invalid_penalty)
        self.ops, self.digits = ops, digits
        self.op, self.a, self.b, self.result, self.expression = "+", 0, 0, 0, ""

    def problem(self, seed: int) -> tuple[str, int, int]:
        """``(op, a, b)`` of episode ``seed``."""
        return _problem(self.ops, self.digits, seed)

    def _load(self, seed: int) -> None:
        self.op, self.a, self.b = self.problem(seed)
        self.result = {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op]
        self.expression = f"{self.a} {self.op} {self.b}"
        if len(self.registry):
            self.question = (f"What is {self.expression}? Use a tool if it helps, then give the final answer as "
                             f"<answer>number</answer>.")
        else:  # the no-tool baseline of the same problems
            self.question = f"What is {self.expression}? Give the final answer as <answer>number</answer>."
        self.answer = str(self.result)

    def is_correct(self, answer: str) -> bool:
        pred = parse_final_number(answer)
        return pred is not None and pred == self.result

    def gold_calls(self) -> list[dict]:
        """The scripted solver's call (:func:`solve_tool_arith`): the calculator, else python."""
        if "calculator" in self.registry:
            return [{"name": "calculator", "arguments": {"expression": self.expression}}]
        if "python" in self.registry:
            return [{"name": "python", "arguments": {"code": f"print({self.expression})"}}]
        return []


def solve_tool_arith(env: ToolArithmetic) -> list[str]:
    """Scripted solver: a calculator call (python if there is no calculator), then the answer; with
    no tools at all, the answer directly."""
    if not len(env.registry):
        return [f"<answer>{env.answer}</answer>"]
    if "calculator" in env.registry:
        call = format_tool_call("calculator", {"expression": env.expression})
    else:
        call = format_tool_call("python", {"code": f"print({env.expression})"})
    return [call, f"<answer>{env.answer}</answer>"]


def tool_arith(ops: tuple[str, ...] = ("*",), digits: tuple[int, int] = (3, 3),
               tools: tuple[str, ...] = _TOOLS, *, max_turns: int = 4, max_calls: int | None = 4,
               max_tool_seconds: float | None = 30.0, invalid_penalty: float = 0.0) -> EnvSpec:
    """:class:`~jaxrl_llm.agents.EnvSpec` of :class:`ToolArithmetic`; the episodes share one
    registry of ``tools`` (its system prompt lists them)."""
    registry = arith_registry(tuple(tools))
    kwargs = dict(ops=ops, digits=digits, registry=registry, max_turns=max_turns, max_calls=max_calls,
                  max_tool_seconds=max_tool_seconds, invalid_penalty=invalid_penalty)
    probe = ToolArithmetic(**kwargs)
    return EnvSpec(
        name=_NAME,
        make=lambda: ToolArithmetic(**kwargs),
        split_seeds=seed_splitter(_NAME, lambda s: _key(*probe.problem(s))),
        system_prompt=(f"{registry.describe()}\n" if len(registry) else "")
        + "Give the final answer as <answer>number</answer>.",
        solve=solve_tool_arith,
    )

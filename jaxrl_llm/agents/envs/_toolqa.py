"""The episode shape shared by the tool-using question environments (tool_arith, search_qa).

An episode is one question. On each turn the policy either

- gives a final answer ``<answer>...</answer>`` (a final unclosed tag takes the rest of the
  turn; tags inside ``<tool_call>`` / ``<tool_response>`` blocks do not count): the episode
  ends (``terminated``) with reward 1 if the subclass's :meth:`ToolQuestionEnv.is_correct`
  accepts every answer tag of the turn, else 0: several different answers are a hedge, not an
  answer (``info["hedged"]``). Tool calls in the same turn are not run;
- or calls tools (``<tool_call>`` blocks, see :mod:`jaxrl_llm.agents.tools`): the
  observation is one ``<tool_response>`` block per call, errors included (malformed calls,
  unknown tools, calls past the episode's :class:`~jaxrl_llm.agents.tools.ToolBudget`);
  reward 0;
- or does neither: the observation says what to send, the reward is ``-invalid_penalty``.

When one turn is left the observation ends with a reminder to answer. After ``max_turns``
turns without an answer the episode is ``truncated`` (reward 0). ``info`` carries
``success``, ``tool_calls`` / ``tool_errors`` (call blocks of this turn / those answered with
an error: malformed, unknown tool, bad arguments, a failing tool, past the budget; the rollout
sums them per episode), ``tool_calls_total`` (calls run so far), ``tool_refused`` (calls past
the budget) and ``invalid``.

``reset`` returns ``info["answer"]``: the gold final answer as the policy should write it
(``<answer>...</answer>``), for methods that score the policy's belief in it (IGPO).

State key: ``(question, turns so far, the tool calls so far)``, each call canonical
(``(name, arguments as sorted JSON)``, or the parse error). The tools are deterministic given
their calls, so equal keys are equal environment states: the first turn of every episode of a
question, and later turns of episodes that made the same calls whatever their wording.
"""

from __future__ import annotations

import json
from collections.abc import Hashable

from jaxrl_llm.agents.envs._common import EpisodeOver, answers_of
from jaxrl_llm.agents.tools import ToolBudget, ToolCall, ToolRegistry, format_tool_response, parse_tool_calls

__all__ = ["ToolQuestionEnv"]

_NOTHING = ("No tool call and no answer found: call a tool with <tool_call>{\"name\": ..., \"arguments\": {...}}"
            "</tool_call> or give the final answer as <answer>...</answer>.")
_LAST = "\nOne turn left: give your final answer as <answer>...</answer>."


class ToolQuestionEnv:
    """Base class: subclasses set ``question`` and ``answer`` in :meth:`_load` and implement
    :meth:`is_correct`."""

    def __init__(self, registry: ToolRegistry, *, max_turns: int = 4, max_calls: int | None = 4,
                 max_tool_seconds: float | None = 30.0, invalid_penalty: float = 0.0):
        if not isinstance(registry, ToolRegistry):
            raise TypeError(f"{type(self).__name__}: registry must be a ToolRegistry, got {type(registry).__name__}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"{type(self).__name__}: max_turns must be an int >= 1, got {max_turns!r}")
        self.registry, self.max_turns = registry, max_turns
        self.budget = ToolBudget(max_calls=max_calls, max_seconds=max_tool_seconds)
        self.invalid_penalty = float(invalid_penalty)
        self.question, self.answer = "", ""
        self.turns, self.done = 0, True
        self.history: list[tuple] = []

    # subclass hooks ------------------------------------------------------------------
    def _load(self, seed: int) -> None:
        raise NotImplementedError

    def is_correct(self, answer: str) -> bool:
        raise NotImplementedError

    def prompt(self) -> str:
        return self.question

    # protocol ------------------------------------------------------------------------
    def reset(self, seed: int) -> tuple[str, dict]:
        self._load(int(seed))
        self.budget.reset()
        self.turns, self.done, self.history = 0, False, []
        return self.prompt(), {"answer": f"<answer>{self.answer}</answer>", "gold_calls": self.gold_calls()}

    def gold_calls(self) -> list[dict]:
        """The tool calls of a reference solution of the loaded episode (``{"name", "arguments"}``
        each), MatchTIR's matching targets; none by default."""
        return []

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self.done:
            raise EpisodeOver(f"{type(self).__name__}.step: the episode is over; call reset(seed) first")
        self.turns += 1
        info: dict = {"success": False, "invalid": False, "hedged": False}
        answers = answers_of(action)
        reward = 0.0
        if answers:
            info["hedged"] = len(set(answers)) > 1
            ok = all(self.is_correct(a) for a in answers)
            info["success"] = ok
            reward = 1.0 if ok else 0.0
            obs, terminated = ("Correct." if ok else "Incorrect."), True
        else:
            terminated = False
            calls = parse_tool_calls(action)
            if not calls:
                info["invalid"] = True
                reward -= self.invalid_penalty
                obs = _NOTHING
            else:
                results = [self.registry.call(c, self.budget) for c in calls]
                info["tool_calls"] = len(calls)
                # the turn's well-formed calls (MatchTIR matches them to the gold calls); a malformed one counts as
                # a call that matches nothing
                info["calls"] = [{"name": c.name, "arguments": dict(c.arguments)} if isinstance(c, ToolCall)
                                 else {"name": "", "arguments": {}} for c in calls]
                info["tool_errors"] = sum(r.startswith("error: ") for r in results)
                obs = "\n".join(format_tool_response(r) for r in results)
                self.history.extend(
                    (c.name, json.dumps(c.arguments, sort_keys=True, default=str)) if isinstance(c, ToolCall)
                    else ("error", c.message) for c in calls)
        truncated = not terminated and self.turns >= self.max_turns
        if not terminated and not truncated and self.turns == self.max_turns - 1:
            obs += _LAST
        info.setdefault("tool_calls", 0)
        info.setdefault("tool_errors", 0)
        info["tool_calls_total"], info["tool_refused"] = self.budget.calls, self.budget.refused
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, info

    def state_key(self) -> Hashable:
        return (self.question, self.turns, tuple(self.history))

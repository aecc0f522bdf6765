"""MatchTIR's turn rewards: the policy's tool calls matched to the gold tool calls of the task.

Paper: Qu, Dai, Cai, Xu, Wang and Yin, "MatchTIR: Fine-Grained Supervision for Tool-Integrated
Reasoning via Bipartite Matching", arXiv:2601.10712; code ``quchangle1/MatchTIR`` @f614ce1
(``Code/verl/utils/reward_score/tool.py``).

- :func:`call_similarity`: 0 unless the tool names are equal (case-insensitive); else
  ``(1 + J + V) / (2 + |gold arguments|)`` with ``J`` the Jaccard index of the two argument-name
  multisets (1 when both are equal lists, 0 when either is empty) and ``V`` the number of gold
  arguments whose value the call gives exactly. In ``[0, 1]``; 1 for the gold call itself.
- :func:`match_calls`: every call of the episode against every gold call (one matching over the
  whole trajectory). ``assignment="hungarian"`` is the maximum-weight bipartite matching the
  paper states (``scipy.optimize.linear_sum_assignment``); ``"greedy"`` is what the authors'
  release runs under that name (pairs by decreasing similarity, each call and gold call used once).
  A matched call earns its similarity; an extra or unmatched call earns 0 (the released
  training setting; ``unmatched`` sets another value); a missing gold call costs nothing.
- :func:`turn_rewards`: a turn with calls earns the mean of its calls' rewards; a turn without
  calls keeps the environment's own reward for it (the answer turn's outcome).

The soft (optimal transport) assignment of the paper is not provided.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["call_similarity", "match_calls", "turn_rewards", "ASSIGNMENTS"]

ASSIGNMENTS = ("hungarian", "greedy")


def _name(call: Mapping[str, Any]) -> str:
    return str(call.get("name", "")).strip().lower()


def _args(call: Mapping[str, Any]) -> dict:
    a = call.get("arguments", {})
    return a if isinstance(a, Mapping) else {}


def call_similarity(pred: Mapping[str, Any], gold: Mapping[str, Any]) -> float:
    """Similarity of a predicted call and a gold call (``{"name": str, "arguments": dict}``)."""
    if _name(pred) != _name(gold):
        return 0.0
    pa, ga = _args(pred), _args(gold)
    pk, gk = list(pa), list(ga)
    if sorted(pk) == sorted(gk):
        jac = 1.0
    elif not pk or not gk:
        jac = 0.0
    else:
        inter = sum((Counter(pk) & Counter(gk)).values())
        jac = inter / (len(pk) + len(gk) - inter)
    values = sum(1 for k, v in ga.items() if k in pa and pa[k] == v)
    return (1.0 + jac + values) / (2.0 + len(ga))


def match_calls(pred: Sequence[Mapping[str, Any]], gold: Sequence[Mapping[str, Any]], *,
                assignment: str = "hungarian", unmatched: float = 0.0) -> np.ndarray:
    """``[len(pred)]`` reward of each predicted call: its similarity to the gold call it is
    matched with, ``unmatched`` when it has none (see the module docstring)."""
    if assignment not in ASSIGNMENTS:
        raise ValueError(f"assignment must be one of {ASSIGNMENTS}, got {assignment!r}")
    out = np.full(len(pred), float(unmatched))
    if not pred or not gold:
        return out
    s = np.array([[call_similarity(p, g) for g in gold] for p in pred], np.float64)
    if assignment == "hungarian":
        from scipy.optimize import linear_sum_assignment

        rows, cols = linear_sum_assignment(s, maximize=True)
        pairs = [(r, c) for r, c in zip(rows, cols) if s[r, c] > 0]
    else:
        order = sorted(((s[r, c], r, c) for r in range(len(pred)) for c in range(len(gold))),
                       key=lambda x: (-x[0], x[1], x[2]))
        used_r, used_c, pairs = set(), set(), []
        for v, r, c in order:
            if v > 0 and r not in used_r and c not in used_c:
                used_r.add(r), used_c.add(c), pairs.append((r, c))
    for r, c in pairs:
        out[r] = s[r, c]
    return out


def turn_rewards(turn_calls: Sequence[Sequence[Mapping[str, Any]]], gold: Sequence[Mapping[str, Any]],
                 env_rewards: Sequence[float], *, assignment: str = "hungarian", unmatched: float = 0.0
                 ) -> list[float]:
    """Per turn: the mean reward of the turn's calls (one matching over all the episode's calls),
    or the environment's reward for a turn without calls."""
    if len(turn_calls) != len(env_rewards):
        raise ValueError(f"turn_calls has {len(turn_calls)} turns but env_rewards {len(env_rewards)}")
    flat = [c for calls in turn_calls for c in calls]
    r = match_calls(flat, gold, assignment=assignment, unmatched=unmatched)
    out, i = [], 0
    for calls, env_r in zip(turn_calls, env_rewards):
        n = len(calls)
        out.append(float(np.mean(r[i:i + n])) if n else float(env_r))
        i += n
    return out

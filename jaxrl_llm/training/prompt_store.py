"""Per-prompt statistics across a run: the store loop-level methods read.

Every RL step the loop reports each sampled group (the prompt's key, the responses' reward
totals and lengths) to a :class:`PromptStore`. Per prompt it keeps exact running sums (pass
count, reward sum and sum of squares, length sum), the shortest passing response, the step it
was first and last sampled at, the last visit's sample count, pass rate and mean reward and,
when a part asks for it (``recent_window``), the pass/fail outcomes of its last samples
(``recent``: a string of ``0`` and ``1``, oldest first). Parts of a recipe
read it two ways:

* **estimators and losses** through inputs of the estimator protocol (``requires``):
  ``prompt_seen`` (samples of the prompt before this step), ``prompt_pass_rate``,
  ``prompt_reward_mean``, ``prompt_reward_var``, ``prompt_length_mean``,
  ``prompt_last_step`` (-1: never sampled) -- ``[N]`` per row, each row its group's prompt,
  **as the store was when the step began** (this step's own samples are not in them, so an
  estimator never sees its own outcome twice);
* **stateful parts** (HAPO's history, a tracker of a method) keep their per-prompt state in a
  named slot (:meth:`PromptStore.slot`), saved and restored with the rest.

The loop updates the store after the step's update (:meth:`observe`), so within a step every
reader sees the same state. The store is JSON in the checkpoint record (exact: integers and
Python floats round-trip), so a resumed run continues bit for bit.

Prompt keys are the data's source positions (``file:line``, ``task:index``; a budget variant of
HBPO's adds ``#budget=b``): a prompt seen again in a later epoch is the same prompt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["PromptStore", "STORE_INPUTS", "prompt_keys"]

#: the store's estimator inputs and what each is (per row, from the state at the step's start)
STORE_INPUTS = {
    "prompt_seen": "samples of the row's prompt scored before this step (0: never sampled)",
    "prompt_pass_rate": "fraction of those samples that passed (reward total >= data.pass_threshold); 0 if unseen",
    "prompt_reward_mean": "mean reward total of those samples (failed, NaN rewards left out); 0 if none",
    "prompt_reward_var": "population variance of those reward totals; 0 if fewer than two",
    "prompt_length_mean": "mean response length in tokens; 0 if unseen",
    "prompt_last_step": "the iteration the prompt was last sampled at; -1 if never",
}

_FIELDS = ("visits", "samples", "scored", "passes", "reward_sum", "reward_sq", "length_sum", "min_pass_length", "first_step",
           "last_step", "last_pass_rate", "last_reward_mean", "last_samples")


def prompt_keys(where: Sequence[str], columns: dict[str, list] | None = None) -> list[str]:
    """The store keys of a batch's prompts: the source position, plus the budget of a budget
    variant (``data.budgets``), so the variants of one question are distinct prompts."""
    budgets = (columns or {}).get("budget")
    if budgets is None:
        return [str(w) for w in where]
    return [f"{w}#budget={int(b)}" for w, b in zip(where, budgets)]


class PromptStore:
    """Running statistics per prompt key (see the module docstring).

    Args:
      pass_threshold: a sample passes when its reward total is ``>=`` this.
      recent_window: keep the pass/fail outcomes of each prompt's last this many samples (0:
        none; Knapsack RL's estimate reads them).
    """

    def __init__(self, pass_threshold: float = 1.0, recent_window: int = 0):
        if not math.isfinite(pass_threshold):
            raise ValueError(f"data.pass_threshold must be a finite number, got {pass_threshold!r}")
        if isinstance(recent_window, bool) or not isinstance(recent_window, int) or recent_window < 0:
            raise ValueError(f"PromptStore: recent_window must be an int >= 0, got {recent_window!r}")
        self.pass_threshold = float(pass_threshold)
        self.recent_window = recent_window
        self.records: dict[str, dict[str, Any]] = {}
        self.slots: dict[str, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self.records)

    # ------------------------------------------------------------------------------ update

    def observe(self, step: int, keys: Sequence[str], scores, lengths, group_ids) -> None:
        """Add one sampling round: ``keys[g]`` is group ``g``'s prompt; ``scores``,
        ``lengths``, ``group_ids`` are ``[N]`` per response (reward totals before shaping)."""
        scores = np.asarray(scores, np.float64)
        lengths = np.asarray(lengths, np.int64)
        gid = np.asarray(group_ids, np.int64)
        if not (scores.shape == lengths.shape == gid.shape) or scores.ndim != 1:
            raise ValueError(f"PromptStore.observe: scores {scores.shape}, lengths {lengths.shape} and group_ids "
                             f"{gid.shape} must be equal [N] shapes")
        if gid.size and (gid.min() < 0 or gid.max() >= len(keys)):
            raise ValueError(f"PromptStore.observe: group ids must index the {len(keys)} keys, got "
                             f"{gid.min()}..{gid.max()}")
        for g, key in enumerate(keys):
            rows = gid == g
            n = int(rows.sum())
            if n == 0:
                continue
            s, ln = scores[rows], lengths[rows]
            ok = np.isfinite(s)
            s_ok = s[ok]
            passed = s >= self.pass_threshold  # NaN (a failed reward) never passes
            rec = self.records.get(key)
            if rec is None:
                rec = self.records[key] = {"visits": 0, "samples": 0, "scored": 0, "passes": 0, "reward_sum": 0.0, "reward_sq": 0.0,
                                           "length_sum": 0, "min_pass_length": None, "first_step": int(step),
                                           "last_step": int(step), "last_pass_rate": 0.0, "last_reward_mean": 0.0,
                                           "last_samples": 0}
            rec["visits"] += 1
            rec["samples"] += n
            rec["scored"] += int(s_ok.size)
            rec["passes"] += int(passed.sum())
            # sums in a fixed order (row order) with Python floats: the same on every host and after a resume
            for v in s_ok.tolist():
                rec["reward_sum"] += v
                rec["reward_sq"] += v * v
            rec["length_sum"] += int(ln.sum())
            if passed.any():
                shortest = int(ln[passed].min())
                old = rec["min_pass_length"]
                rec["min_pass_length"] = shortest if old is None else min(old, shortest)
            rec["last_step"] = int(step)
            rec["last_pass_rate"] = float(passed.mean())
            rec["last_reward_mean"] = float(s_ok.mean()) if s_ok.size else 0.0
            rec["last_samples"] = n
            if self.recent_window:
                outcomes = rec.get("recent", "") + "".join("1" if x else "0" for x in passed.tolist())
                rec["recent"] = outcomes[-self.recent_window:]

    def slot(self, name: str) -> dict[str, Any]:
        """The per-prompt state of a stateful part (key -> JSON-able value), created empty."""
        return self.slots.setdefault(name, {})

    # ------------------------------------------------------------------------------ read

    def lookup(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """The :data:`STORE_INPUTS` of each key (``[len(keys)]``)."""
        out = {name: np.zeros(len(keys), np.float32) for name in STORE_INPUTS}
        out["prompt_last_step"][:] = -1.0
        for i, key in enumerate(keys):
            rec = self.records.get(key)
            if rec is None or rec["samples"] == 0:
                continue
            n, k = rec["samples"], rec["scored"]
            mean = rec["reward_sum"] / k if k else 0.0
            out["prompt_seen"][i] = n
            out["prompt_pass_rate"][i] = rec["passes"] / n
            out["prompt_reward_mean"][i] = mean
            out["prompt_reward_var"][i] = max(rec["reward_sq"] / k - mean * mean, 0.0) if k > 1 else 0.0
            out["prompt_length_mean"][i] = rec["length_sum"] / n
            out["prompt_last_step"][i] = rec["last_step"]
        return out

    def summary(self) -> dict[str, float]:
        """Run-level metrics: distinct prompts seen, the fraction never passed and always passed."""
        recs = [r for r in self.records.values() if r["samples"]]
        if not recs:
            return {"prompts/distinct": 0.0}
        return {"prompts/distinct": float(len(recs)),
                "prompts/never_passed_frac": float(np.mean([r["passes"] == 0 for r in recs])),
                "prompts/always_passed_frac": float(np.mean([r["passes"] == r["samples"] for r in recs]))}

    # ------------------------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        fields = _FIELDS + (("recent",) if self.recent_window else ())
        return {"pass_threshold": self.pass_threshold, "recent_window": self.recent_window,
                "records": {k: {f: r[f] for f in fields} for k, r in self.records.items()},
                "slots": {k: dict(v) for k, v in self.slots.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if float(state["pass_threshold"]) != self.pass_threshold:
            raise ValueError(f"the checkpoint's prompt statistics count passes at reward >= "
                             f"{state['pass_threshold']} but this run's data.pass_threshold is {self.pass_threshold}")
        saved = int(state.get("recent_window", 0))
        if saved != self.recent_window:
            raise ValueError(f"the checkpoint's prompt statistics keep the last {saved} outcomes per prompt but this "
                             f"run's allocator reads {self.recent_window} (recipe.allocator.window)")
        fields = _FIELDS + (("recent",) if self.recent_window else ())
        # "last_samples" was added after the first checkpoints with a store: 0 there (no estimate reads it then)
        self.records = {k: {f: r.get(f, 0) if f == "last_samples" else r[f] for f in fields}
                        for k, r in state["records"].items()}
        self.slots = {k: dict(v) for k, v in state["slots"].items()}

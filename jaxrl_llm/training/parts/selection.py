"""Prompt selection: ``rollout.candidates`` draws candidate prompts, ``recipe.selector`` picks
the step's prompts among them (:data:`jaxrl_llm.algorithms.SELECTORS`)."""

from __future__ import annotations

import copy
import types

import numpy as np

from jaxrl_llm.algorithms.selection import SelectInputs, check_selection
from jaxrl_llm.config import ConfigError
from jaxrl_llm.training.parts.base import Clash, LoopPart, Need, loop_part
from jaxrl_llm.training.prompt_store import prompt_keys
from jaxrl_llm.training.rounds import subset

__all__ = ["Candidates", "Selector", "FEEDBACK"]

#: the store slot of the last trained step's per-prompt feedback to a selector
FEEDBACK = "selector/feedback"


@loop_part
class Candidates(LoopPart):
    """``rollout.candidates = k >= 2``: each data batch holds ``k`` candidates per trained prompt."""

    key = "rollout.candidates"
    provides = frozenset({"candidates"})
    requires = (Need("a prompt selector", "it draws candidate prompts for a selector, but the recipe has none (set "
                                          "recipe.selector, or rollout.candidates=1)"),)
    conflicts = (Clash("episodes", "the agent loop draws environment seeds, not candidate prompts"),)

    def __init__(self, k: int):
        self.name, self.k = str(k), k

    @classmethod
    def from_run(cls, run):
        k = run.candidates
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"rollout.candidates must be an int >= 1, got {k!r}")
        return cls(k) if k > 1 else None


@loop_part
class Selector(LoopPart):
    """``recipe.selector``: picks ``len(batch) // candidates`` prompts of each data batch from the
    prompt store's statistics (and a prompt value model's predictions when the selector reads
    one); its state and the feedback of the last trained step live in the store's slots."""

    key = "recipe.selector"
    phases = frozenset({"select", "observe"})
    provides = frozenset({"a prompt selector"})
    conflicts = (Clash("episodes", "prompt selectors choose among data prompts; the agent loop draws environment "
                                   "seeds (set recipe.selector=none)"),)

    def __init__(self, bound, candidates: int):
        self.bound, self.name, self.candidates = bound, bound.name, candidates
        need = [Need("candidates", "set rollout.candidates >= 2 (candidates drawn per trained prompt)")]
        if "prompt_value" in bound.part.requires:
            need.append(Need("prompt_value", "it scores candidates with a prompt value model: pass prompt_value="
                                             "Critic.create(...) (a score-head model; objective ValueObjective(None))"))
        self.requires = tuple(need)
        self._metrics: dict[str, float] = {}

    @classmethod
    def from_run(cls, run):
        sel = run.recipe.selector
        return None if sel is None else cls(sel, run.candidates)

    def select(self, ctx, batch):
        if len(batch) % self.candidates:
            raise ValueError(f"a data batch of {len(batch)} prompts is not a multiple of rollout.candidates="
                             f"{self.candidates}")
        b = len(batch) // self.candidates
        keys = prompt_keys(batch.where, batch.columns)
        store, name = ctx.store, f"selector/{self.name}"
        feedback = store.slots.get(FEEDBACK) or None
        rng = np.random.default_rng([ctx.seed, ctx.iteration, ctx.round_index, 0x5E1EC7])
        stats = store.lookup(keys)
        pv = ctx.parts.provider("prompt_value")
        predicted = None if pv is None else pv.predict(batch.prompt_ids)
        x = SelectInputs(tuple(keys), batch.columns, stats, b, ctx.iteration, rng,
                         copy.deepcopy(store.slot(name)), copy.deepcopy(feedback),
                         types.MappingProxyType(store.slots), predicted)
        idx, new_state = self.bound(x)
        idx = check_selection(self.name, idx, len(batch), b)
        store.slots[name] = dict(new_state)
        store.slots[FEEDBACK] = {}  # consumed
        seen = stats["prompt_seen"] > 0
        self._metrics = {
            "select/chosen_seen_frac": float(seen[idx].mean()),
            "select/candidates_pass_rate": float(stats["prompt_pass_rate"][seen].mean()) if seen.any() else 0.0,
            "select/chosen_pass_rate": float(stats["prompt_pass_rate"][idx][seen[idx]].mean()) if seen[idx].any()
            else 0.0}
        if predicted is not None:
            self._metrics.update({"select/predicted_chosen_mean": float(predicted[idx].mean()),
                                  "select/predicted_candidates_mean": float(predicted.mean())})
        return subset(batch, idx)

    def observe(self, ctx, step):
        """The trained groups' feedback for the next selection: per prompt key, the mean |advantage|
        of its valid rows, its pass rate and mean reward of this visit."""
        arrays, _, valid = step.rows_as_sampled()
        gid, valid = np.asarray(arrays["group_ids"]), np.asarray(valid)
        cm = arrays["completion_mask"] & valid[:, None]
        adv = np.abs(arrays["advantages"][:, step.prompt_len - 1:]) * cm
        row_abs = adv.sum(1) / np.maximum(cm.sum(1), 1)
        fb = {"step": ctx.iteration, "keys": [], "abs_adv": [], "pass_rate": [], "reward_mean": []}
        for g, key in enumerate(step.keys):
            rows = (gid == g) & valid
            if not rows.any():
                continue
            rec = ctx.store.records[key]  # this step's visit (raw rewards)
            fb["keys"].append(key)
            fb["abs_adv"].append(float(row_abs[rows].mean()))
            fb["pass_rate"].append(rec["last_pass_rate"])
            fb["reward_mean"].append(rec["last_reward_mean"])
        ctx.store.slots[FEEDBACK] = fb
        step.metrics.update(self._metrics)
        return step

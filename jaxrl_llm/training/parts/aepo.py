"""AEPO, Arbitrary Entropy Policy Optimization (METHODS.md #81), as a loop part:
``recipe.loop_part=aepo``.

AEPO holds the policy's entropy near a target with a REINFORCE regulariser on samples drawn at an
adjusted temperature. The authors' code (``597358816/AEPO`` @b353a05, an EasyR1 fork:
``ray_trainer.py``'s AEPO branch) does, every step:

1. the entropy estimate ``H``: the mean of ``-log pi(token)`` over the previous update's sampled
   tokens (0 before the first update);
2. the temperature ``T = t_high`` (1.2) if ``H <= target`` (0.5) else ``t_low`` (0.8), and a
   re-sample of the first quarter of the step's prompts at ``T``;
3. of those responses, the ones better than their group (GRPO advantage ``> 0.05``) with
   advantage ``+1``: at most ``max_rows`` (60), half as many when ``H > target``, take the place
   of rows of the batch;
4. old log-probs recomputed at temperature 1 for every row, then the ordinary clipped loss.

So the regulariser is a REINFORCE term (advantage +1) on good samples of the temperature-``T``
policy: a hotter one while the entropy is low raises it, a colder one while it is high lowers it.

This part: **resample** does 2-3 (the injected responses replace the rows of their own prompt's
group, from its last row back, never the group's first row: our choice, so that a row keeps its
prompt; the code replaces the batch's first rows, whatever their prompt); **estimate** sets the
injected rows' advantage to +1 on their response tokens; **observe** reads ``H`` from the update
(``-policy/logp_mean``). It needs ``recipe.old_logp=recompute`` (the injected rows were sampled at
``T``). Not reproduced: the group statistics of the other rows of a group that received injected
rows include them (the code computes the batch's advantages before the replacement).
Metrics: ``aepo/temperature``, ``aepo/entropy``, ``aepo/kept`` (good responses found),
``aepo/injected``.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from jaxrl_llm.algorithms.registry import Part
from jaxrl_llm.config import ConfigError
from jaxrl_llm.rewards.base import RewardOutput
from jaxrl_llm.training.parts.base import Clash, Need, loop_part
from jaxrl_llm.training.parts.options import LOOP_PART_OPTIONS, NamedLoopPart
from jaxrl_llm.training.rounds import put_result, take_rollout_rows

__all__ = ["AEPO"]


def aepo_picks(totals, hot: bool, *, max_rows: int = 60, threshold: float = 0.05) -> list[tuple[int, int]]:
    """The re-sampled responses AEPO injects, in order: ``(prompt, sample)`` of those whose GRPO
    advantage within their group (``(r - mean) / (std + 1e-6)``, unbiased std; a group of one: the
    score itself) exceeds ``threshold``, the first ``min(max_rows, found)`` of them -- half as many
    when the entropy is above its target (``hot``). ``totals``: ``[P, G]`` reward totals."""
    tot = np.nan_to_num(np.asarray(totals, np.float64), nan=0.0)
    g = tot.shape[1]
    mean = tot.mean(1, keepdims=True) if g > 1 else np.zeros_like(tot[:, :1])
    std = tot.std(1, ddof=1, keepdims=True) if g > 1 else np.ones_like(tot[:, :1])
    adv = (tot - mean) / (std + 1e-6)
    good = [(p, j) for p in range(tot.shape[0]) for j in range(g) if adv[p, j] > threshold]
    k = min(max_rows, len(good))
    return good[:k // 2 if hot else k]


@loop_part
class AEPO(NamedLoopPart):
    key = "recipe.loop_part=aepo"
    phases = frozenset({"resample", "estimate", "observe"})
    requires = (Need("old_logp=recompute", "the injected rows were sampled at another temperature: set "
                                           "recipe.old_logp=recompute"),)
    conflicts = (Clash("episodes", "it re-samples single-turn prompts; the agent loop does not run it"),
                 Clash("rollout.asynchronous", "the injected rows are sampled with the step's policy"),
                 Clash("rollout.tree_segment", "the tree sampler has no per-call temperature"))

    def attach(self, ctx) -> None:
        rec = ctx.recipe
        if rec.is_correction is not None or rec.rejection is not None:
            raise ConfigError("recipe.loop_part=aepo injects rows sampled at another temperature, whose sampler "
                              "log-probs are not the policy's: it cannot be combined with recipe.is_weights or "
                              "recipe.rejection")

    def __init__(self, *, target: float = 0.5, t_high: float = 1.2, t_low: float = 0.8, prompt_frac: float = 0.25,
                 max_rows: int = 60, threshold: float = 0.05):
        for name, v in (("target", target), ("t_high", t_high), ("t_low", t_low), ("prompt_frac", prompt_frac)):
            if not (isinstance(v, (int, float)) and v > 0):
                raise ConfigError(f"recipe.loop_part.{name} must be a number > 0, got {v!r}")
        if prompt_frac > 1:
            raise ConfigError(f"recipe.loop_part.prompt_frac must be in (0, 1], got {prompt_frac!r}")
        if not (isinstance(threshold, (int, float)) and threshold >= 0):
            raise ConfigError(f"recipe.loop_part.threshold must be a number >= 0 (a better-than-group advantage), got "
                              f"{threshold!r}")
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 0:
            raise ConfigError(f"recipe.loop_part.max_rows must be an int >= 0, got {max_rows!r}")
        self.target, self.t_high, self.t_low = float(target), float(t_high), float(t_low)
        self.prompt_frac, self.max_rows, self.threshold = float(prompt_frac), max_rows, float(threshold)
        self.entropy = 0.0  # before the first update: the code's initial value (so T = t_high)
        self.name = "aepo"
        self._forced: list[int] = []  # rows of round 0 that hold injected responses
        self._metrics: dict[str, float] = {}

    def temperature(self) -> float:
        return self.t_high if self.entropy <= self.target else self.t_low

    def resample(self, ctx, rnd):
        if rnd.index != 0:
            return rnd
        self._forced = []
        batch, roll, out = rnd.t_batch, rnd.t_roll, rnd.t_out
        g = ctx.recipe.num_samples
        n_groups = len(batch)
        take = max(1, math.ceil(self.prompt_frac * n_groups))
        temp = self.temperature()
        ids = [list(batch.prompt_ids[i]) for i in range(take)] + [list(batch.prompt_ids[0])] * (n_groups - take)
        sub = ctx.sample(rnd.params, ids, jax.random.fold_in(rnd.key, 0xAE90), temperature=temp)
        sub = take_rollout_rows(sub, np.arange(take * g))
        cols = {c: list(v)[:take] for c, v in batch.columns.items()}
        sub_out = ctx.score(list(batch.prompts)[:take], cols, sub)
        tot = np.asarray(sub_out.total, np.float64).reshape(take, g)
        picks = aepo_picks(tot, self.entropy > self.target, max_rows=self.max_rows, threshold=self.threshold)
        pidx = np.asarray(roll.prompt_index)
        free = {p: list(np.flatnonzero(pidx == p)[1:][::-1]) for p in range(take)}  # last rows first, never the first
        src, dst = [], []
        for p, j in picks:
            if free[p]:  # at most g - 1 picks per group (one row is below its mean): always a free row
                src.append(p * g + j)
                dst.append(int(free[p].pop(0)))
        good = aepo_picks(tot, False, max_rows=take * g, threshold=self.threshold)
        if src:
            sub_rows = take_rollout_rows(sub, src)._replace(prompt_index=pidx[dst].astype(np.int32))
            picked = RewardOutput(np.asarray(sub_out.total)[src], {f: np.asarray(v)[src] for f, v in sub_out.per_fn.items()},
                                  {f: np.asarray(v)[src] for f, v in sub_out.failed.items()}, sub_out.metrics)
            rnd.train_roll, rnd.train_out = put_result(roll, out, np.asarray(dst), sub_rows, picked)
            self._forced = dst
        self._metrics = {"aepo/temperature": temp, "aepo/entropy": self.entropy, "aepo/kept": float(len(good)),
                         "aepo/injected": float(len(src))}
        return rnd

    def estimate(self, ctx, step):
        if not self._forced or step.origin is None:
            return step
        rounds, groups, rows = step.origin
        forced, at, pos = set(self._forced), [], 0
        for (r, _), ix in zip(groups, rows):
            for j, row in enumerate(ix):
                if r == 0 and int(row) in forced:
                    at.append(pos + j)
            pos += len(ix)
        a = step.arrays
        for i in at:
            a["advantages"][i] = np.where(a["loss_mask"][i], 1.0, 0.0).astype(a["advantages"].dtype)
        step.metrics["aepo/forced_rows"] = float(len(at))
        return step

    def observe(self, ctx, step):
        ms = [m["policy/logp_mean"] for m in ctx.current.policy_metrics if "policy/logp_mean" in m]
        if ms:
            self.entropy = -float(np.mean(ms))
        return step

    def state_dict(self) -> dict:
        return {"entropy": self.entropy}

    def load_state_dict(self, state) -> None:
        if state:
            self.entropy = float(state["entropy"])


LOOP_PART_OPTIONS.register(Part(
    "aepo", AEPO,
    paper="Arbitrary Entropy Policy Optimization: Entropy Is Controllable in Reinforcement Fine-tuning (AEPO), "
          "arXiv:2510.08141",
    methods=(81,), verified="hand values (the authors' code's rule: 597358816/AEPO @b353a05)",
    tests="tests/training/test_aepo.py, tests/conformance/test_aepo_authors.py",
    note="a quarter of the prompts re-sampled at T = 1.2 while the entropy estimate is <= the target 0.5, else 0.8; "
         "their better-than-group responses (up to 60, half when hot) replace rows of their own group with advantage "
         "+1 (REINFORCE on the temperature-T policy); needs recipe.old_logp=recompute"))

"""Rollout budget allocators: how many of a step's ``B x G`` completions each prompt gets.

With ``recipe.allocator=<name>`` the RL loop asks the allocator, before every sampling round,
to divide the round's rollouts (``B x G``, the uniform run's) among its ``B`` prompts from
their statistics in the run's :class:`~jaxrl_llm.training.PromptStore` (as of the step's
start). The sampler then prefills each prompt once and decodes the counts it was given in the
same ``B x G`` rows, so the compiled shapes do not change; a prompt given 0 rollouts leaves the
round (it is not trained on and its statistics are not updated). Groups of different sizes go
through every estimator unchanged (group statistics are segment sums over ``group_ids``).

An allocator is ``fn(x: AllocateInputs, **params) -> (counts [B] ints >= 0 summing to
x.budget, metrics)``; the integer programs live in :mod:`jaxrl_llm.core.allocation`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np

import jaxrl_llm.core as core
from jaxrl_llm.algorithms.registry import Part, new_registry

__all__ = ["AllocateInputs", "ALLOCATORS", "check_allocation", "history_window", "knapsack_estimates", "GVM_SLOT"]

#: the prompt store slot of GVM-RAFT's statistics: key -> {"grad_norm", "accept", "step"} of its last visit
GVM_SLOT = "allocator/gvm"


@dataclasses.dataclass(frozen=True)
class AllocateInputs:
    """What an allocator sees: ``keys`` the round's prompts' store keys, ``records`` the store's
    per-prompt records (read-only; a key never sampled is absent: see
    :class:`~jaxrl_llm.training.PromptStore` for the fields), ``stats`` the store's estimator
    inputs per prompt (``[B]`` arrays), ``num_samples`` the uniform ``G``, ``budget`` the
    rollouts to divide (``B * G``), ``step`` the training iteration and ``slots`` the store's
    slots, read-only (per-prompt statistics a provider keeps for the allocator, e.g. GVM's)."""

    keys: tuple[str, ...]
    records: Mapping[str, Mapping[str, Any]]
    stats: Mapping[str, np.ndarray]
    num_samples: int
    budget: int
    step: int
    slots: Mapping[str, Any] = dataclasses.field(default_factory=dict)


ALLOCATORS = new_registry("rollout allocator", "recipe.allocator",
                          "fn(x: AllocateInputs, **params) -> (counts [B] ints >= 0 summing to x.budget, metrics)")


def check_allocation(name: str, counts, num_prompts: int, budget: int) -> np.ndarray:
    """The allocator's counts as an int array, or a clear error naming the allocator."""
    c = np.asarray(counts)
    if c.shape != (num_prompts,) or (c.size and c.dtype.kind not in "iu"):
        raise ValueError(f"recipe.allocator={name} returned {c.shape} {c.dtype} counts; expected {num_prompts} ints")
    if (c < 0).any() or int(c.sum()) != budget:
        raise ValueError(f"recipe.allocator={name} must give every prompt >= 0 rollouts summing to the budget "
                         f"{budget}, got {c.tolist()} (sum {int(c.sum())})")
    if not c.any():
        raise ValueError(f"recipe.allocator={name} gave no prompt a rollout")
    return c.astype(np.int64)


def history_window(bound) -> int:
    """How many recent pass/fail outcomes per prompt the store must keep for an allocator
    (its ``window`` argument, where it has one; 0 otherwise)."""
    if bound is None or "window" not in inspect.signature(bound.part.fn).parameters:
        return 0
    return int(dict(bound.kwargs).get("window", inspect.signature(bound.part.fn).parameters["window"].default))


def _none(x: AllocateInputs):
    return np.full(len(x.keys), x.num_samples, np.int64), {}


ALLOCATORS.register(Part("none", _none, note="every prompt gets rollout.num_samples (uniform)"))


def knapsack_estimates(x: AllocateInputs, *, min_history: int = 8, window: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Knapsack RL's per-prompt estimate: ``(valid [B], p [B])``. A prompt is valid once it has
    ``min_history`` scored samples; ``p`` is the pass rate of its last visit, or, if that visit
    had fewer than ``window`` samples, of its last ``window`` samples across visits (the authors'
    ``epoch_estimation`` with ``robust_epoch_estimation``; their rewards are 0/1, ours count a
    pass at ``data.pass_threshold``)."""
    valid = np.zeros(len(x.keys), bool)
    p = np.zeros(len(x.keys), np.float64)
    for i, key in enumerate(x.keys):
        rec = x.records.get(key)
        if rec is None or rec["samples"] < min_history:
            continue
        valid[i] = True
        if rec["last_samples"] >= window:
            p[i] = rec["last_pass_rate"]
        else:
            recent = rec["recent"][-window:]
            p[i] = recent.count("1") / len(recent)
    return valid, p


def knapsack(x: AllocateInputs, *, min_n: int = 2, max_n: int = 128, alpha: float = 0.9, negative_n: int | None = None,
             positive_n: int | None = None, fallback: bool = True, cost: str = "probability", min_history: int = 8,
             window: int = 16):
    valid, p = knapsack_estimates(x, min_history=min_history, window=window)
    counts, info = core.knapsack_allocate(valid, p, x.num_samples, budget=x.budget, min_n=min_n, max_n=max_n,
                                          alpha=alpha, negative_n=negative_n, positive_n=positive_n,
                                          fallback=fallback, cost=cost)
    eff = valid & (p > 0) & (p < 1)
    return counts, {"allocation/estimated_frac": float(valid.mean()),
                    "allocation/knapsack_prompts": float(info["effective"]),
                    "allocation/fallback": float(info["fallback"]),
                    "allocation/fallback_ratio": float(info["fallback_ratio"]),
                    "allocation/knapsack_value": float(core.knapsack_value(p[eff], counts[eff]).sum()) if eff.any()
                    else 0.0}


ALLOCATORS.register(Part(
    "knapsack", knapsack, paper="Knapsack RL (Li et al.), arXiv:2509.25849",
    core=("knapsack_allocate", "knapsack_solve", "knapsack_value"), methods=(137,),
    verified="hand values, brute force", tests="tests/core/test_allocation.py, tests/training/test_allocation_loop.py",
    note="the authors' code (liziniu/KnapsackRL @05eeb92): 2..128 rollouts for prompts with 0 < p < 1 by an exact "
         "DP, 2 at p = 0 or 1, the default G without 8 samples of history; p from the last visit (its last 16 "
         "samples if it had fewer); the surplus rule"))


def gvm(x: AllocateInputs, *, alpha: float = 1e-3, beta: float = 2.0, min_n: int = 1):
    slot = x.slots.get(GVM_SLOT, {})
    n, b = x.num_samples, len(x.keys)
    if isinstance(min_n, bool) or not isinstance(min_n, int) or not 0 <= min_n <= n:
        raise ValueError(f"recipe.allocator.min_n must be an int in [0, rollout.num_samples={n}], got {min_n!r}")
    known = np.array([k in slot for k in x.keys])
    counts = np.full(b, n, np.int64)
    metrics = {"allocation/estimated_frac": float(known.mean())}
    if not known.any():
        return counts, metrics
    g = np.array([slot[k]["grad_norm"] if k in slot else 0.0 for k in x.keys], np.float64)
    p = np.array([slot[k]["accept"] if k in slot else 0.0 for k in x.keys], np.float64)
    idx = np.flatnonzero(known)
    left = x.budget - n * int((~known).sum()) - min_n * len(idx)
    counts[idx] = min_n
    live = (g[idx] > 0) & (p[idx] > 0)
    if live.any():
        ratios = core.gvm_sample_ratios(g[idx], p[idx], alpha=alpha, beta=beta)
        counts[idx] += core.round_preserving_sum(ratios, left)
    else:  # nothing accepted among the estimated prompts: nothing to weigh by, spread evenly
        counts[idx] += left // len(idx)
        counts[idx[: left % len(idx)]] += 1
    metrics["allocation/live_frac"] = float(live.mean())
    return counts, metrics


ALLOCATORS.register(Part(
    "gvm", gvm, paper="GVM-RAFT (Yao et al.), arXiv:2505.02391",
    core=("gvm_sample_ratios", "round_preserving_sum"), methods=(109,), requires=frozenset({"gvm_stats"}),
    verified="hand values", tests="tests/core/test_allocation.py, tests/training/test_allocation_loop.py",
    note="the authors' code (RLHFlow/GVM @d640a75): n_i proportional to G_i / sqrt(p_i + alpha / p_i^(beta - 1)), "
         "alpha 1e-3, beta 2, rounded keeping the total; p_i and G_i from the prompt's last visit, G_i the "
         "gradient norm of accepted responses w.r.t. the output projection (the authors' act_params=lm_head; their "
         "default is the input embedding table, not implemented); prompts without a visit get num_samples; "
         "min_n (default 1, the authors' 0) keeps a prompt that failed once from never being sampled again"))

"""Rollout budget allocation: how many completions each prompt of a step gets.

Host-side integer programs over per-prompt statistics (NumPy, not traced: the outputs are the
shapes of the next rollout). The loop-level allocators of
:mod:`jaxrl_llm.algorithms.allocation` call them with the prompt store's estimates.

* **Knapsack RL** (Li et al., arXiv:2509.25849; the authors' ``liziniu/KnapsackRL`` @05eeb92,
  ``verl/trainer/ppo/exploration_utils.py``): every prompt is an item whose weight is its number
  of rollouts ``N`` and whose value is the probability that a GRPO group of ``N`` has a reward
  spread (a non-zero gradient) times an information gain,
  ``value(N, p) = (1 - p^N - (1 - p)^N) p (1 - p)^2``; an exact multiple-choice knapsack by
  dynamic programming spends the step's budget.
* **GVM-RAFT** (Yao et al., arXiv:2505.02391; the authors' ``RLHFlow/GVM`` @d640a75,
  ``em/stage_2_calc_sample_size.py``): samples in proportion to ``G / sqrt(p + alpha / p^(beta - 1))``
  with ``G`` the prompt's gradient norm and ``p`` its acceptance rate, rounded to integers that
  keep the total.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["knapsack_value", "knapsack_solve", "knapsack_allocate", "gvm_sample_ratios", "round_preserving_sum"]


def knapsack_value(p, n) -> np.ndarray:
    """Knapsack RL's value of ``n`` rollouts for a prompt of success rate ``p``:
    ``(1 - p^n - (1 - p)^n) * p * (1 - p)^2`` (float64; broadcasts). The first factor is the
    probability that the ``n`` rewards are not all equal (GRPO's gradient is then non-zero),
    the second the paper's information gain. ``0`` at ``p`` in ``{0, 1}``."""
    p = np.asarray(p, np.float64)
    n = np.asarray(n, np.float64)
    if np.any((p < 0) | (p > 1)) or np.any(~np.isfinite(p)):
        raise ValueError(f"knapsack_value: success rates must be in [0, 1], got {p}")
    return (1.0 - p ** n - (1.0 - p) ** n) * p * (1.0 - p) ** 2


def knapsack_solve(p, budget: int, min_n: int, max_extra: int) -> np.ndarray:
    """The exact multiple-choice knapsack of Knapsack RL over prompts that already hold
    ``min_n`` rollouts each: ``[K]`` extra rollouts (ints, summing to ``budget``).

    Item ``i`` takes ``k`` extra rollouts, ``k`` in ``0..max_extra``; ``k = 0`` is worth 0 and
    ``k >= 1`` is worth ``knapsack_value(p_i, min_n + k)`` (the authors' code scores the whole
    allocation, not the increment over ``min_n``, so it prefers giving every prompt at least one
    extra rollout). Dynamic programming over exact budgets ``dp[i][w]``; ties go to the smaller
    ``k`` (the code's strict comparisons, ``k = 0`` first). If ``budget`` exceeds what the items
    can take (``K * max_extra``) the largest feasible budget is solved and the rest is spread
    over the items uniformly (``rest // K`` each, one more for the first ``rest % K``), as the
    authors' code does (an item may then exceed ``max_extra``)."""
    p = np.asarray(p, np.float64)
    if p.ndim != 1:
        raise ValueError(f"knapsack_solve: p must be [K], got shape {p.shape}")
    for name, v in (("budget", budget), ("min_n", min_n), ("max_extra", max_extra)):
        if not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"knapsack_solve: {name} must be an int >= 0, got {v!r}")
    k_items = len(p)
    out = np.zeros(k_items, np.int64)
    if budget == 0 or k_items == 0:
        return out
    ks = np.arange(max_extra + 1)
    dp = np.full(budget + 1, -np.inf)
    dp[0] = 0.0
    choice = np.zeros((k_items, budget + 1), np.int64)
    for i in range(k_items):
        gain = _knapsack_gains(p[i], min_n, max_extra)
        w = np.arange(budget + 1)
        prev = w[:, None] - ks[None, :]  # [W + 1, K + 1]
        cand = np.where(prev >= 0, dp[np.clip(prev, 0, None)] + gain[None, :], -np.inf)
        best = np.argmax(cand, axis=1)  # first maximum: the smallest k among ties
        dp = cand[w, best]
        choice[i] = np.where(np.isfinite(dp), best, 0)
    usable = budget
    while usable > 0 and not np.isfinite(dp[usable]):
        usable -= 1
    w = usable
    for i in range(k_items - 1, -1, -1):
        out[i] = choice[i, w]
        w -= out[i]
    rest = budget - usable
    if rest:
        out += rest // k_items
        out[: rest % k_items] += 1
    return out


def _knapsack_gains(p: float, min_n: int, max_extra: int) -> np.ndarray:
    """``[max_extra + 1]`` values of ``k = 0 .. max_extra`` extra rollouts: 0 for ``k = 0``, else
    ``knapsack_value(p, min_n + k)`` computed in float32 as the authors' code does (its success
    rates are a float32 array), so near-ties resolve the same way."""
    q = np.float32(p)
    out = np.zeros(max_extra + 1, np.float64)
    if q in (0.0, 1.0):
        return out
    for k in range(1, max_extra + 1):
        m = k + min_n
        out[k] = (1 - q ** m - (1 - q) ** m) * q * ((1 - q) ** 2)
    return out


def knapsack_allocate(valid, p, n: int, *, budget: int | None = None, min_n: int = 2, max_n: int = 128,
                      alpha: float = 0.9, negative_n: int | None = None, positive_n: int | None = None,
                      fallback: bool = True, cost: str = "probability") -> tuple[np.ndarray, dict]:
    """Knapsack RL's rollouts per prompt for one step: ``([B] ints summing to budget, info)``.

    Args:
      valid: ``[B]`` bool, prompts with enough history for an estimate of ``p``; the others get
        the default ``n`` and stay out of the knapsack.
      p: ``[B]`` estimated success rates in ``[0, 1]`` (read where ``valid``).
      n: the uniform rollouts per prompt (GRPO's ``G``); budget: the step's total (default
        ``B * n``, the uniform run's).
      min_n: rollouts of a prompt with ``0 < p < 1`` before the knapsack adds ``0 ..
        max_n - min_n``; negative_n / positive_n: rollouts of a prompt at ``p = 0`` / ``p = 1``
        (default ``min_n``).
      alpha, cost: the fallback's cost of a prompt with ``0 < p < 1``, the rollouts that give a
        reward spread with probability ``alpha``: ``log(1 - alpha) / log(max(p, 1 - p))``
        (``"probability"``), or ``1 / (p (1 - p)) - 1`` (``"expectation"``), capped at ``max_n``
        and truncated to an int.
      fallback: when the prompts with ``0 < p < 1`` need fewer rollouts in total than what is
        left, the surplus goes to the prompts at ``p = 0`` (as in the authors' code, a prompt
        without an estimate counts as ``p = 0`` here), or to every prompt outside the knapsack
        if there is none, and the knapsack spends only the needed rollouts. Without any prompt
        in ``(0, 1)`` the rest goes to the ``p = 0`` prompts, or every prompt gets ``n``.

    ``info``: ``effective`` (prompts in the knapsack), ``fallback`` (whether the surplus rule
    applied) and ``fallback_ratio`` (needed / left, 1 without the fallback).

    Where the authors' code would divide by zero (the surplus rule with every prompt in the
    knapsack, so no prompt to give the surplus to) the knapsack gets the whole budget.
    """
    valid = np.asarray(valid, bool)
    p = np.where(valid, np.asarray(p, np.float64), 0.0)
    b = len(valid)
    if p.shape != valid.shape or valid.ndim != 1:
        raise ValueError(f"knapsack_allocate: valid {valid.shape} and p {np.shape(p)} must be equal [B] shapes")
    if np.any((p < 0) | (p > 1)) or not np.all(np.isfinite(p)):
        raise ValueError(f"knapsack_allocate: success rates must be in [0, 1], got {p[valid]}")
    negative_n = min_n if negative_n is None else negative_n
    positive_n = min_n if positive_n is None else positive_n
    budget = b * n if budget is None else budget
    for name, v in (("n", n), ("min_n", min_n), ("max_n", max_n), ("negative_n", negative_n),
                    ("positive_n", positive_n), ("budget", budget)):
        if not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"knapsack_allocate: {name} must be an int >= 0, got {v!r}")
    if max_n < min_n:
        raise ValueError(f"knapsack_allocate: max_n={max_n} is below min_n={min_n}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"knapsack_allocate: alpha must be in (0, 1), got {alpha}")
    if cost not in ("probability", "expectation"):
        raise ValueError(f"knapsack_allocate: cost must be 'probability' or 'expectation', got {cost!r}")
    eff = valid & (p > 0) & (p < 1)
    counts = np.where(~valid, n, np.where(eff, min_n, np.where(p == 0, negative_n, positive_n))).astype(np.int64)
    left = budget - int(counts.sum())
    if left < 0:
        raise ValueError(f"knapsack_allocate: the budget of {budget} rollouts is below the {int(counts.sum())} the "
                         f"prompts get before the knapsack (n={n} without an estimate, min_n={min_n}, "
                         f"negative_n={negative_n}, positive_n={positive_n})")
    info = {"effective": int(eff.sum()), "fallback": False, "fallback_ratio": 1.0}
    zero = np.flatnonzero(p == 0)  # includes the prompts without an estimate (their p is 0 here)
    if left > 0 and not eff.any():
        if len(zero):
            counts[zero] += _spread(left, len(zero))
        else:
            counts[:] = n
            if counts.sum() != budget:
                raise ValueError(f"knapsack_allocate: no prompt has 0 < p < 1 or p = 0, and {b} prompts x n={n} "
                                 f"is not the budget {budget}")
        return counts, info
    idx = np.flatnonzero(eff)
    pe = p[idx]
    if cost == "probability":
        need = np.log(1.0 - alpha) / np.log(np.maximum(pe, 1.0 - pe))
    else:
        need = 1.0 / (pe * (1.0 - pe)) - 1.0
    needed = int(sum(int(min(max_n, c)) for c in need))
    if fallback and needed < left:
        targets = zero if len(zero) else np.flatnonzero(~eff)
        if len(targets):
            info.update(fallback=True, fallback_ratio=needed / left)
            counts[targets] += _spread(left - needed, len(targets))
            left = needed
    counts[idx] += knapsack_solve(pe, left, min_n, max_n - min_n)
    assert counts.sum() == budget, (counts, budget)
    return counts, info


def _spread(total: int, k: int) -> np.ndarray:
    """``total`` split over ``k``: ``total // k`` each, one more for the first ``total % k``."""
    out = np.full(k, total // k, np.int64)
    out[: total % k] += 1
    return out


def gvm_sample_ratios(grad_norm, p, *, alpha: float = 1e-3, beta: float = 2.0) -> np.ndarray:
    """GVM-RAFT's share of the samples of each prompt: ``G / sqrt(p + alpha / p^(beta - 1))``
    normalised to sum 1, 0 where ``G = 0`` or ``p = 0`` (``[B]`` float64). ``G``: the prompt's
    mean gradient norm over its accepted responses; ``p``: its acceptance rate. Raises if no
    prompt has both (nothing to allocate by)."""
    g = np.asarray(grad_norm, np.float64)
    p = np.asarray(p, np.float64)
    if g.shape != p.shape or g.ndim != 1:
        raise ValueError(f"gvm_sample_ratios: grad_norm {g.shape} and p {p.shape} must be equal [B] shapes")
    if np.any(g < 0) or np.any((p < 0) | (p > 1)) or not (np.all(np.isfinite(g)) and np.all(np.isfinite(p))):
        raise ValueError("gvm_sample_ratios: grad_norm must be finite and >= 0, p in [0, 1]")
    if alpha < 0:
        raise ValueError(f"gvm_sample_ratios: alpha must be >= 0, got {alpha}")
    live = (g > 0) & (p > 0)
    if not live.any():
        raise ValueError("gvm_sample_ratios: no prompt has a positive gradient norm and acceptance rate")
    safe = np.where(live, p, 1.0)
    size = np.where(live, g / np.sqrt(safe + alpha / safe ** (beta - 1.0)), 0.0)
    return size / size.sum()


def round_preserving_sum(ratios, total: int) -> np.ndarray:
    """Integers near ``ratios * total`` that sum to ``total`` (GVM's rounding): round each, then
    move the difference onto the entries whose rounding lost (or gained) the most; ties by
    position (a stable sort)."""
    r = np.asarray(ratios, np.float64)
    if r.ndim != 1 or np.any(r < 0) or not np.all(np.isfinite(r)) or not math.isclose(r.sum(), 1.0, abs_tol=1e-9):
        raise ValueError(f"round_preserving_sum: ratios must be [B], >= 0 and sum to 1, got {r}")
    scaled = r * total
    out = np.round(scaled).astype(np.int64)
    err = total - int(out.sum())
    if err:
        resid = scaled - out
        order = np.argsort(-resid if err > 0 else resid, kind="stable")[:abs(err)]
        out[order] += int(np.sign(err))
    return out

"""Prompt selectors: which of a step's candidate prompts are sampled and trained on.

With ``recipe.selector=<name>`` the RL loop draws ``rollout.candidates`` times as many prompts
as a step trains on from the data stream (its order, epochs and checkpointed position are
unchanged) and the selector picks ``B = rollout.prompts_per_step`` of them. It sees the
candidates' keys and data columns, their per-prompt statistics from the run's
:class:`~jaxrl_llm.training.PromptStore` (as of the step's start), the feedback of the last
trained step (each trained prompt's mean absolute advantage and pass rate) and its own state,
a JSON-able dict kept in the store and checkpointed with it. Its random numbers come from a
generator seeded by ``(run seed, iteration, round)``, so a resumed run selects the same prompts.

A selector is ``fn(x: SelectInputs, **params) -> (indices [B], new_state)`` with distinct
indices into the candidates; the pure arithmetic lives in :mod:`jaxrl_llm.core.curriculum`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

import jaxrl_llm.core as core
from jaxrl_llm.algorithms.registry import Part, new_registry

__all__ = ["SelectInputs", "SELECTORS", "check_selection", "SPO_SLOT", "spo_estimates"]

#: the prompt store slot of SPO's tracker: key -> {"alpha", "beta", "response", "logp"}
SPO_SLOT = "tracker/spo"


def spo_estimates(slot: Mapping, keys, init_alpha: float = 0.5, init_beta: float = 0.5) -> np.ndarray:
    """``alpha / (alpha + beta)`` of each key in SPO's tracker (the prior for a key not in it)."""
    prior = init_alpha / (init_alpha + init_beta)
    return np.array([slot[k]["alpha"] / (slot[k]["alpha"] + slot[k]["beta"]) if k in slot else prior for k in keys],
                    np.float32)


@dataclasses.dataclass(frozen=True)
class SelectInputs:
    """What a selector sees (host values, one entry per candidate prompt).

    ``keys`` the candidates' prompt keys, ``columns`` their data columns (name -> list),
    ``stats`` the store's per-prompt inputs (:data:`~jaxrl_llm.training.prompt_store.STORE_INPUTS`,
    ``[C]`` arrays, the state before this step), ``num_select`` how many to pick (``B``),
    ``step`` the training iteration, ``rng`` a NumPy generator of this step and round,
    ``state`` the selector's own state (a copy: return the new one) and ``feedback`` the last
    trained step's groups not yet shown to the selector (``{"step", "keys", "abs_adv",
    "pass_rate", "reward_mean"}``, lists per group) or ``None``; ``slots`` the store's slots,
    read-only (a tracker's state, e.g. SPO's)."""

    keys: tuple[str, ...]
    columns: Mapping[str, list]
    stats: Mapping[str, np.ndarray]
    num_select: int
    step: int
    rng: np.random.Generator
    state: dict = dataclasses.field(default_factory=dict)
    feedback: Mapping[str, Any] | None = None
    slots: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: ``[C]`` a prompt value model's predicted pass rate of each candidate (selectors that
    #: require ``prompt_value``; ``None`` otherwise)
    predicted: np.ndarray | None = None


SELECTORS = new_registry("prompt selector", "recipe.selector",
                         "fn(x: SelectInputs, **params) -> (indices [B] into the candidates, new state)")


def check_selection(name: str, idx, num_candidates: int, num_select: int) -> np.ndarray:
    """The selector's indices as an int array, or a clear error naming the selector."""
    idx = np.asarray(idx)
    if idx.ndim != 1 or idx.shape[0] != num_select or (idx.size and idx.dtype.kind not in "iu"):
        raise ValueError(f"recipe.selector={name} returned {idx.shape} {idx.dtype} indices; expected {num_select} ints")
    if idx.size and (idx.min() < 0 or idx.max() >= num_candidates):
        raise ValueError(f"recipe.selector={name} returned indices outside the {num_candidates} candidates: "
                         f"{idx.min()}..{idx.max()}")
    if len(set(idx.tolist())) != idx.size:
        raise ValueError(f"recipe.selector={name} picked a candidate twice: {sorted(idx.tolist())}")
    return idx.astype(np.int64)


def _no_selection(x: SelectInputs):
    return np.arange(x.num_select), x.state


SELECTORS.register(Part("none", _no_selection, note="the data stream's prompts in order (rollout.candidates = 1)"))


_T = "tests/core/test_curriculum.py, tests/training/test_selectors.py"


def _weighted_without_replacement(rng: np.random.Generator, weights: np.ndarray, k: int,
                                  allowed: np.ndarray) -> list[int]:
    """``k`` distinct indices among ``allowed``, drawn one at a time with probability
    proportional to ``weights`` (uniform among the allowed if their weights are all 0)."""
    allowed = allowed.copy()
    out: list[int] = []
    for _ in range(k):
        w = np.where(allowed, np.maximum(np.asarray(weights, np.float64), 0.0), 0.0)
        if w.sum() <= 0:
            w = allowed.astype(np.float64)
        i = int(rng.choice(len(w), p=w / w.sum()))
        out.append(i)
        allowed[i] = False
    return out


def sec(x: SelectInputs, *, column: str, alpha: float = 0.5, temperature: float = 1.0, initial: float = 0.0,
        absent: str = "keep"):
    """SEC: per slot of the batch, a category drawn from ``softmax(Q / tau)`` over the categories
    that still have candidates, then one of its candidates uniformly. Before drawing, the values
    move by TD(0) towards the mean absolute advantage of each category's prompts in the last
    trained step (the feedback); ``absent="decay"`` also moves the categories without prompts in
    that step towards 0, as the authors' code does (``"keep"``: the paper's update of the arms
    played)."""
    if absent not in ("keep", "decay"):
        raise ValueError(f"recipe.selector=sec: absent must be 'keep' or 'decay', got {absent!r}")
    if column not in x.columns:
        raise ValueError(f"recipe.selector=sec: the data has no column {column!r} (columns: {sorted(x.columns)}); "
                         f"set recipe.selector.column to the problems' category")
    cats = [str(c) for c in x.columns[column]]
    q: dict[str, float] = dict(x.state.get("q", {}))
    pending: dict[str, str] = dict(x.state.get("pending", {}))  # key -> category of prompts selected, not yet scored
    fb = x.feedback
    if fb and fb.get("keys"):
        per: dict[str, list[float]] = {}
        got = dict(zip(fb["keys"], fb["abs_adv"]))
        for key, c in pending.items():  # a selected prompt that was not trained on (a group filter
            per.setdefault(c, []).append(float(got.get(key, 0.0)))  # dropped it) gave no gradient: 0
        arms = sorted(set(q) | set(per))
        new = core.td_update(jnp.array([q.get(c, initial) for c in arms]),
                             jnp.array([float(np.mean(per[c])) if c in per else 0.0 for c in arms]),
                             jnp.array([c in per or absent == "decay" for c in arms]), alpha)
        q = {c: float(v) for c, v in zip(arms, np.asarray(new))}
        pending = {}
    arms = sorted(set(cats))
    remaining = {c: [i for i, ci in enumerate(cats) if ci == c] for c in arms}
    chosen: list[int] = []
    for _ in range(x.num_select):
        avail = np.array([bool(remaining[c]) for c in arms])
        probs = np.asarray(core.boltzmann_probs(jnp.array([q.get(c, initial) for c in arms]), jnp.asarray(avail),
                                                temperature), np.float64)
        c = arms[int(x.rng.choice(len(arms), p=probs / probs.sum()))]
        i = remaining[c].pop(int(x.rng.integers(len(remaining[c]))))
        chosen.append(i)
        pending[x.keys[i]] = c
    return np.array(chosen), {"q": {c: q.get(c, initial) for c in sorted(set(q) | set(arms))}, "pending": pending}


def vas(x: SelectInputs, *, fraction: float = 0.5, outcome_weight: float = 1.0, unseen_pass_rate: float = 0.5,
        normalize: bool = True):
    """VAS: ``round(fraction B)`` prompts drawn without replacement with probability proportional
    to the variance promotion score ``p (1 - p)`` of their pass rate so far (``unseen_pass_rate``
    for a prompt never sampled), min-max normalised over the candidates as the authors' code
    does (``normalize``), the rest uniformly among the other candidates."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"recipe.selector=vas: fraction must be in [0, 1], got {fraction}")
    if not 0.0 <= unseen_pass_rate <= 1.0:
        raise ValueError(f"recipe.selector=vas: unseen_pass_rate must be in [0, 1], got {unseen_pass_rate}")
    seen = x.stats["prompt_seen"] > 0
    p = np.where(seen, x.stats["prompt_pass_rate"], unseen_pass_rate)
    score = np.asarray(core.variance_promotion_score(jnp.asarray(p), outcome_weight=outcome_weight), np.float64)
    if normalize and score.size and score.max() > score.min():
        score = (score - score.min()) / (score.max() - score.min())
    k = int(round(fraction * x.num_select))
    allowed = np.ones(len(x.keys), bool)
    first = _weighted_without_replacement(x.rng, score, k, allowed)
    allowed[first] = False
    rest = _weighted_without_replacement(x.rng, np.zeros(len(x.keys)), x.num_select - k, allowed)
    return np.array(first + rest), x.state


SELECTORS.register(Part(
    "sec", sec, paper="Self-Evolving Curriculum for LLM Reasoning (SEC), arXiv:2505.14970",
    core=("td_update", "boltzmann_probs"), methods=(229,), verified="hand values (alpha 0.5, tau 1: the authors' code)",
    tests=_T,
    note="arms: the values of a data column (recipe.selector.column); reward: mean |advantage| of the category's "
         "prompts in the last step; candidates: rollout.candidates x prompts_per_step from the data stream "
         "(the code draws from the whole dataset); absent=decay: the code's update of unplayed arms"))
SELECTORS.register(Part(
    "vas", vas, paper="MMR1: Enhancing Multimodal Reasoning with Variance-Aware Sampling and Open Resources (VAS), "
                      "arXiv:2509.21268",
    core=("variance_promotion_score",), methods=(142,), verified="hand values", tests=_T,
    note="outcome-variance term p(1 - p) from the store's pass rates of earlier steps (the code re-rolls the "
         "dataset every 4 steps; the trajectory-diversity term is not tracked); draws without replacement among "
         "the candidates (the code: with replacement over the dataset)"))


def spo_priority(x: SelectInputs, *, epsilon: float = 0.05, source: str = "tracker", init_alpha: float = 0.5,
                 init_beta: float = 0.5):
    """SPO's prioritised sampling: ``B`` candidates drawn without replacement with probability
    proportional to ``sqrt(p (1 - p)) + eps``, ``p`` the tracker's success probability
    (``source="tracker"``, with ``recipe.advantage=single_stream_po``) or the store's pass rate
    (``"pass_rate"``; 0.5 for a prompt never sampled)."""
    if source == "tracker":
        if SPO_SLOT not in x.slots:
            raise ValueError("recipe.selector=spo_priority reads SPO's tracker: use it with "
                             "recipe.advantage=single_stream_po, or set recipe.selector.source=pass_rate")
        p = spo_estimates(x.slots[SPO_SLOT], x.keys, init_alpha, init_beta)
    elif source == "pass_rate":
        p = np.where(x.stats["prompt_seen"] > 0, x.stats["prompt_pass_rate"], 0.5)
    else:
        raise ValueError(f"recipe.selector=spo_priority: source must be 'tracker' or 'pass_rate', got {source!r}")
    w = np.asarray(core.uncertainty_priority(jnp.asarray(p), epsilon=epsilon), np.float64)
    return np.array(_weighted_without_replacement(x.rng, w, x.num_select, np.ones(len(x.keys), bool))), x.state


SELECTORS.register(Part(
    "spo_priority", spo_priority, paper="Single-stream Policy Optimization (SPO), arXiv:2509.13232",
    core=("uncertainty_priority",), methods=(91,), verified="hand values (the authors' code)", tests=_T,
    note="weights sqrt(p(1 - p)) + 0.05 from SPO's tracker, drawn without replacement among the candidates (the "
         "code: 1024 of a 14000-prompt pool)"))


def pcl(x: SelectInputs, *, target: float = 0.5):
    """PCL: the ``B`` candidates whose predicted pass rate (a value model of the prompt, trained
    on the empirical mean reward of the prompts it selected) is closest to ``target`` (ties:
    the earlier candidate)."""
    if x.predicted is None:
        raise ValueError("recipe.selector=pcl needs the prompt value model's predictions (requires prompt_value)")
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"recipe.selector=pcl: target must be in [0, 1], got {target}")
    dist = np.abs(np.asarray(x.predicted, np.float64) - target)
    return np.argsort(dist, kind="stable")[:x.num_select], x.state


SELECTORS.register(Part(
    "pcl", pcl, paper="Prompt Curriculum Learning for Efficient LLM Post-Training (PCL), arXiv:2510.01135",
    methods=(249,), requires=frozenset({"prompt_value"}), verified="hand values",
    tests="tests/training/test_selectors.py",
    note="no public code: from the paper's abstract, reviews and summaries: k x B candidates (k = 4), a value model "
         "(the policy's backbone with a score head; trained after every step with a squared loss to each selected "
         "prompt's mean reward; recipe.critic_lr) scores them at the last prompt token, the B closest to 0.5 are "
         "sampled; the value model is one step behind the policy, as in the paper"))

"""RL recipes and the pieces of the RL step: rollout -> rewards -> advantages -> update.

A recipe (:class:`RLRecipe`) is a frozen config that composes core functions: a group
advantage estimator, a :class:`~jaxrl_llm.training.PolicyObjective` (policy loss, KL,
entropy, aggregation) and the update schedule (PPO epochs and mini-batches). Presets follow
their papers (:func:`recipe`).

Layout of the train batch built by :func:`build_rl_batch` from a group rollout: each row is
``left-padded prompt [P] + completion [T]``; per-token arrays are target-aligned
(``[N, P + T - 1]``, entry ``j`` belongs to token ``j + 1``), so completion token ``t`` sits at
column ``P + t - 1``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxrl_llm.core as core
from jaxrl_llm.training.objectives import PolicyObjective

__all__ = ["RLRecipe", "recipe", "RECIPES", "build_rl_batch", "compute_advantages", "to_target_aligned",
           "minibatches"]


@dataclasses.dataclass(frozen=True)
class RLRecipe:
    """A policy-optimisation recipe.

    Attributes:
      name: for logs.
      advantage: group estimator ``(scores [N], mask [N, T], group_ids [N], num_groups,
        **advantage_kwargs) -> [N, T]`` from :mod:`jaxrl_llm.core.advantages`.
      advantage_kwargs: its keyword arguments (pairs).
      objective: the loss.
      num_samples: completions per prompt (``G``).
      epochs, num_minibatches: passes over each rollout batch and optimiser steps per pass
        (``epochs = num_minibatches = 1``: strictly on-policy, one update per batch).
      old_logp: ``"sampler"`` (the sampler's log-probs; exact when sampling has no top-k /
        top-p / min-p truncation) or ``"recompute"`` (a forward pass of the current policy
        before the update, as verl does).
      paper: title and arXiv id.
    """

    name: str
    advantage: Callable[..., Any]
    objective: PolicyObjective
    advantage_kwargs: tuple[tuple[str, Any], ...] = ()
    num_samples: int = 8
    epochs: int = 1
    num_minibatches: int = 1
    old_logp: str = "sampler"
    paper: str = ""

    def __post_init__(self):
        if self.old_logp not in ("sampler", "recompute"):
            raise ValueError(f"RLRecipe.old_logp must be 'sampler' or 'recompute', got {self.old_logp!r}")
        if self.num_samples < 1 or self.epochs < 1 or self.num_minibatches < 1:
            raise ValueError("RLRecipe.num_samples, epochs and num_minibatches must be >= 1")


def _ppo(clip_low=0.2, clip_high=None):
    return core.ppo_clip_loss, (("clip_low", clip_low), ("clip_high", clip_high if clip_high is not None else clip_low))


def _make_recipes() -> dict[str, Callable[..., RLRecipe]]:
    def grpo(**kw):
        loss, lkw = _ppo(0.2)
        # DeepSeekMath used a KL penalty (beta = 0.04); TRL's default and most recent recipes
        # use none: set objective=dataclasses.replace(..., kl_coef=...) to add it
        return RLRecipe("grpo", core.grpo_advantages, PolicyObjective(loss, lkw, agg_mode="seq-mean-token-mean"),
                        paper="DeepSeekMath (Shao et al.), arXiv:2402.03300", **kw)

    def dr_grpo(**kw):
        loss, lkw = _ppo(0.2)
        return RLRecipe("dr_grpo", core.dr_grpo_advantages,
                        PolicyObjective(loss, lkw, agg_mode="seq-mean-token-sum-norm"),
                        paper="Understanding R1-Zero-Like Training (Liu et al.), arXiv:2503.20783", **kw)

    def dapo(**kw):
        loss, lkw = _ppo(0.2, 0.28)
        return RLRecipe("dapo", core.grpo_advantages, PolicyObjective(loss, lkw, agg_mode="token-mean"),
                        paper="DAPO (Yu et al.), arXiv:2503.14476", **kw)

    def gspo(**kw):
        return RLRecipe("gspo", core.grpo_advantages,
                        PolicyObjective(core.gspo_loss, (("clip_low", 3e-4), ("clip_high", 4e-4)),
                                        agg_mode="seq-mean-token-mean"),
                        paper="Group Sequence Policy Optimization (Zheng et al.), arXiv:2507.18071", **kw)

    def rloo(**kw):
        loss, lkw = _ppo(0.2)
        return RLRecipe("rloo", core.rloo_advantages, PolicyObjective(loss, lkw, agg_mode="token-mean"),
                        paper="Back to Basics: REINFORCE style optimization (Ahmadian et al.), arXiv:2402.14740",
                        **kw)

    def reinforce_pp(**kw):
        loss, lkw = _ppo(0.2)
        return RLRecipe("reinforce_pp_baseline", core.reinforce_pp_baseline_advantages,
                        PolicyObjective(loss, lkw, agg_mode="token-mean"),
                        paper="REINFORCE++ (Hu et al.), arXiv:2501.03262", **kw)

    def bnpo(**kw):
        loss, lkw = _ppo(0.2)
        return RLRecipe("bnpo", core.bnpo_advantages, PolicyObjective(loss, lkw, agg_mode="token-mean"),
                        paper="BNPO: Beta Normalization Policy Optimization (Xiao et al.), arXiv:2506.02864", **kw)

    return {"grpo": grpo, "dr_grpo": dr_grpo, "dapo": dapo, "gspo": gspo, "rloo": rloo,
            "reinforce_pp_baseline": reinforce_pp, "bnpo": bnpo}


RECIPES = _make_recipes()


def recipe(name: str, **overrides: Any) -> RLRecipe:
    """A preset recipe by name (see :data:`RECIPES`), with field overrides."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}")
    return RECIPES[name](**overrides)


def to_target_aligned(values: np.ndarray | jax.Array, prompt_len: int) -> Any:
    """``[N, T]`` completion-aligned values to ``[N, P + T - 1]`` target-aligned (zeros over
    the prompt)."""
    if prompt_len < 1:
        raise ValueError(f"prompt_len must be >= 1, got {prompt_len}")
    xp = jnp if isinstance(values, jax.Array) else np
    n = values.shape[0]
    pad = xp.zeros((n, prompt_len - 1) + values.shape[2:], values.dtype)
    return xp.concatenate([pad, values], axis=1)


def build_rl_batch(prompt_ids: Sequence[Sequence[int]], rollout: Any, prompt_len: int, pad_id: int
                   ) -> dict[str, np.ndarray]:
    """Train arrays from a group rollout (host numpy, from :class:`~jaxrl_llm.rollout.Sampler`).

    Returns ``tokens [N, P + T]`` int32, ``mask [N, P + T]``, ``loss_mask``/``old_logp``
    ``[N, P + T - 1]`` (the sampler's log-probs), ``completion_mask [N, T]`` and
    ``group_ids [N]`` (the prompt of each row).
    """
    toks, cmask = np.asarray(rollout.tokens), np.asarray(rollout.mask).astype(bool)
    n, t = toks.shape
    group = np.asarray(rollout.prompt_index).astype(np.int32)
    prompts = np.full((n, prompt_len), pad_id, np.int32)
    pmask = np.zeros((n, prompt_len), bool)
    for i, g in enumerate(group):
        p = prompt_ids[g]
        if len(p) > prompt_len:
            raise ValueError(f"prompt {g} has {len(p)} tokens > prompt_len={prompt_len}")
        prompts[i, prompt_len - len(p):] = p
        pmask[i, prompt_len - len(p):] = True
    return {
        "tokens": np.concatenate([prompts, toks.astype(np.int32)], axis=1),
        "mask": np.concatenate([pmask, cmask], axis=1),
        "loss_mask": to_target_aligned(cmask, prompt_len),
        "old_logp": to_target_aligned(np.where(cmask, np.asarray(rollout.logprobs, np.float32), 0.0), prompt_len),
        "completion_mask": cmask,
        "group_ids": group,
    }


def compute_advantages(rec: RLRecipe, scores: jax.Array, completion_mask: jax.Array, group_ids: jax.Array,
                       num_groups: int) -> jax.Array:
    """``[N, T]`` advantages of the recipe's estimator (jit-able; ``num_groups`` static)."""
    return rec.advantage(scores, completion_mask, group_ids, num_groups, **dict(rec.advantage_kwargs))


def minibatches(batch: dict, num_minibatches: int, key: jax.Array | None) -> list[dict]:
    """The rows of ``batch`` shuffled (when ``key`` is given) and split into equal parts."""
    n = next(iter(batch.values())).shape[0]
    if n % num_minibatches:
        raise ValueError(f"{n} rows are not divisible into {num_minibatches} mini-batches")
    order = np.arange(n) if key is None else np.asarray(jax.random.permutation(key, n))
    size = n // num_minibatches
    return [{k: v[order[i * size:(i + 1) * size]] for k, v in batch.items()} for i in range(num_minibatches)]

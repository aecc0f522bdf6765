"""Reward shaping, group filters (what is sampled and kept) and batch filters, as registered parts.

* ``recipe.shaping=<name>`` (:data:`SHAPING`): ``fn(x: ShapingInputs, **params) -> [N]``, a
  per-row bonus added to the reward total before advantages (host-side, after the reward
  functions ran). A part flagged ``stateful`` keeps state across steps (HAPO's per-prompt
  history): it reads ``x.state`` and returns ``(bonus, new state)``; the trainer holds the state
  (a JSON-able dict) and checkpoints it with the loop's counters.
* ``recipe.group_filter=<name>`` (:data:`GROUP_FILTERS`): ``fn(**params) -> GroupFilter``: which
  prompt groups of a sampling round are kept, and how many rounds a step may draw (DAPO's
  dynamic sampling keeps drawing until a batch of groups with a reward spread is full).
* ``recipe.batch_filter=<name>`` (:data:`BATCH_FILTERS`): ``fn(key, scores [N], **params) ->
  row indices [N]`` of a resample of the train batch after the advantages (PF-PPO).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

import jaxrl_llm.core as core
from jaxrl_llm.algorithms.registry import Part, new_registry

__all__ = ["ShapingInputs", "GroupFilter", "SHAPING", "GROUP_FILTERS", "BATCH_FILTERS", "TRUNCATIONS", "overlong_lengths",
           "metric_values"]


@dataclasses.dataclass(frozen=True)
class ShapingInputs:
    """What a shaping function sees (host numpy arrays, one entry per completion).

    ``scores [N]`` the reward total, ``lengths [N]`` completion lengths in tokens,
    ``group_ids [N]`` and ``num_groups``, ``max_new_tokens`` the sampler's budget, ``per_fn`` the
    score of each reward function (``NaN`` where a function does not apply), ``completions`` the
    decoded completions (given to parts flagged ``needs_text``, else empty; flag value ``"raw"``:
    decoded with special tokens kept, e.g. control tokens added to the vocabulary), ``prompts``
    the ``num_groups`` prompts of the groups, ``step`` the training iteration the completions
    were sampled at (0-based; a schedule's clock), ``state`` a ``stateful`` part's state (its
    slot of the run's prompt store), ``prompt_keys`` the groups' prompt keys in that store
    (the data's source positions; empty outside a run) and ``token_ids`` each completion's token
    ids (given to parts flagged ``needs_ids``, else empty)."""

    scores: np.ndarray
    lengths: np.ndarray
    group_ids: np.ndarray
    num_groups: int
    max_new_tokens: int
    per_fn: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    completions: tuple[str, ...] = ()
    prompts: tuple[str, ...] = ()
    step: int = 0
    state: Mapping | None = None
    prompt_keys: tuple[str, ...] = ()
    token_ids: tuple[np.ndarray, ...] = ()


SHAPING = new_registry("reward shaping", "recipe.shaping", "fn(x: ShapingInputs, **params) -> bonus [N]")


def overlong_lengths(max_new_tokens: int, max_length: int | None = None, buffer: int | None = None
                     ) -> tuple[int, int]:
    """``(max_length, buffer)`` of DAPO's overlong penalty: ``max_length`` defaults to the
    sampler's budget and ``buffer`` to a fifth of it (the paper's 4096 of 20480)."""
    max_len = max_new_tokens if max_length is None else int(max_length)
    buf = max(1, max_len // 5) if buffer is None else int(buffer)
    if max_len < 1 or buf < 1:
        raise ValueError(f"recipe.shaping=overlong: max_length and buffer must be >= 1, got {max_len}, {buf}")
    if buf > max_len:
        raise ValueError(f"recipe.shaping.buffer ({buf}) must be <= the overlong max length {max_len} "
                         f"(recipe.shaping.max_length, default rollout.max_new_tokens)")
    return max_len, buf


def _no_shaping(x: ShapingInputs) -> np.ndarray:
    return np.zeros_like(np.asarray(x.scores, np.float32))


def overlong(x: ShapingInputs, *, max_length: int | None = None, buffer: int | None = None,
             penalty_factor: float = 1.0) -> np.ndarray:
    """DAPO's soft overlong punishment (:func:`jaxrl_llm.core.overlong_penalty`)."""
    max_len, buf = overlong_lengths(x.max_new_tokens, max_length, buffer)
    if penalty_factor < 0:
        raise ValueError(f"recipe.shaping.penalty_factor must be >= 0, got {penalty_factor}")
    return np.asarray(core.overlong_penalty(jnp.asarray(x.lengths), max_len, buf, penalty_factor))


def kimi_length(x: ShapingInputs, *, weight: float = 1.0, metric: str | None = None,
                threshold: float = 1.0) -> np.ndarray:
    """Kimi k1.5's group length reward (:func:`jaxrl_llm.core.kimi_length_reward`) times
    ``weight``; a completion is correct when its ``metric`` (a reward function's score, or the
    total) is at least ``threshold``."""
    vals = x.scores if metric is None else np.nan_to_num(_per_fn(x, metric), nan=0.0)
    correct = np.asarray(vals) >= threshold
    r = core.kimi_length_reward(jnp.asarray(x.lengths), jnp.asarray(correct), jnp.asarray(x.group_ids), x.num_groups)
    return weight * np.asarray(r, np.float32)


def _per_fn(x: ShapingInputs, name: str) -> np.ndarray:
    if name not in x.per_fn:
        raise ValueError(f"reward function {name!r} not found; the rewards are {sorted(x.per_fn)}")
    return np.asarray(x.per_fn[name], np.float64)


SHAPING.register(Part("none", _no_shaping, note="no shaping"))
SHAPING.register(Part("overlong", overlong, paper="DAPO (Yu et al.), arXiv:2503.14476", core=("overlong_penalty",),
                      verified="verl", tests="tests/core/test_shaping_stats.py, "
                                             "tests/conformance/test_verl_conformance.py",
                      note="max_length defaults to rollout.max_new_tokens, buffer to a fifth of it"))
SHAPING.register(Part("kimi_length", kimi_length, paper="Kimi k1.5 (Kimi Team), arXiv:2501.12599",
                      core=("kimi_length_reward",), methods=(122,), verified="hand values", tests="tests/core/test_shaping_stats.py",
                      note="correct = metric >= threshold (metric: a reward function's name, default the total)"))


# ------------------------------------------------------------------------------------ group filters


@dataclasses.dataclass(frozen=True)
class GroupFilter:
    """Which prompt groups of a sampling round to keep.

    ``keep(values [N], prompt_index [N], num_prompts) -> [num_prompts] bool`` where ``values``
    are the reward total before shaping (``metric=None``) or one reward function's scores;
    ``max_rounds`` caps the sampling rounds of one step (1: no re-sampling)."""

    keep: Callable[[np.ndarray, np.ndarray, int], np.ndarray]
    max_rounds: int = 1
    metric: str | None = None

    def values(self, total: np.ndarray, per_fn: Mapping[str, np.ndarray]) -> np.ndarray:
        return metric_values(total, per_fn, self.metric, "recipe.group_filter")


def metric_values(total, per_fn: Mapping[str, np.ndarray], metric: str | None, key: str) -> np.ndarray:
    """``[N]`` the outcome a loop part reads: the reward total (``metric=None``) or one reward
    function's scores, "does not apply" (NaN) counting 0 as in the total; ``key`` names the
    config key in the error for an unknown reward function."""
    if metric is None:
        return np.asarray(total)
    if metric not in per_fn:
        raise ValueError(f"{key}.metric {metric!r} is not a reward function; the rewards are {sorted(per_fn)}")
    return np.nan_to_num(per_fn[metric], nan=0.0)


def _keep_all(values, prompt_index, num_prompts) -> np.ndarray:
    return np.ones(num_prompts, bool)


_ds_mask = jax.jit(core.dynamic_sampling_mask, static_argnums=(2, 4))


def _keep_spread(values, prompt_index, num_prompts, keep_singletons: bool = True) -> np.ndarray:
    pidx = np.asarray(prompt_index)
    rows = np.asarray(_ds_mask(jnp.asarray(values, jnp.float32), jnp.asarray(pidx), num_prompts, None,
                               keep_singletons))
    keep = np.zeros(num_prompts, bool)
    keep[pidx[rows]] = True
    return keep


def no_group_filter() -> GroupFilter:
    return GroupFilter(_keep_all, 1, None)


def dynamic_sampling(*, metric: str | None = None, max_rounds: int = 10, keep_singletons: bool = True
                     ) -> GroupFilter:
    """DAPO dynamic sampling: keep groups whose ``metric`` is not constant; draw up to
    ``max_rounds`` prompt batches per step (verl's ``max_num_gen_batches`` 10)."""
    if not isinstance(max_rounds, int) or max_rounds < 1:
        raise ValueError(f"recipe.group_filter.max_rounds must be an int >= 1, got {max_rounds!r}")
    keep = _keep_spread if keep_singletons else (lambda v, p, n: _keep_spread(v, p, n, False))
    return GroupFilter(keep, max_rounds, metric)


GROUP_FILTERS = new_registry("group filter", "recipe.group_filter", "fn(**params) -> GroupFilter")
GROUP_FILTERS.register(Part("none", no_group_filter, note="every sampled group is trained on"))
GROUP_FILTERS.register(Part("dynamic_sampling", dynamic_sampling, paper="DAPO (Yu et al.), arXiv:2503.14476",
                            core=("dynamic_sampling_mask",), verified="hand values",
                            tests="tests/core/test_shaping_stats.py, tests/training/test_rl_recipes_extra.py",
                            note="DAPO filters on accuracy: metric=<reward function name>"))


# ------------------------------------------------------------------------------------ batch filters

BATCH_FILTERS = new_registry("batch filter", "recipe.batch_filter",
                             "fn(key, scores [N], valid [N], **params) -> rows [N]")


def _no_batch_filter(key, scores, valid):
    return None


def pf_ppo(key, scores, valid, *, method: str = "pow", power: float = 2.0):
    """PF-PPO's resample (:func:`jaxrl_llm.core.pf_ppo_weights`) restricted to the valid rows (the
    fillers of dynamic sampling are never drawn): row indices ``[N]``, with replacement."""
    w = core.pf_ppo_weights(jnp.where(valid, scores, jnp.min(jnp.where(valid, scores, jnp.inf))), method, power)
    w = jnp.where(valid, w, 0.0)
    return jax.random.choice(key, w.shape[0], shape=(w.shape[0],), replace=True, p=w / jnp.sum(w))


BATCH_FILTERS.register(Part("none", _no_batch_filter, note="the batch is trained on as sampled"))
BATCH_FILTERS.register(Part("pf_ppo", pf_ppo, core=("pf_ppo_weights",),
                            paper="Policy Filtration in RLHF (PF-PPO, Zhang et al.), arXiv:2409.06957",
                            methods=(95,), verified="verl",
                            tests="tests/core/test_shaping_stats.py, tests/conformance/test_verl_conformance.py",
                            note="resamples the valid rows (with replacement) by the sequence score after the "
                                 "advantages, as verl; method pow | max_min | max_random"))




# ------------------------------------------------------------------------------------ truncations

TRUNCATIONS = new_registry("rollout truncation", "recipe.truncation",
                           "fn(x: ShapingInputs, **params) -> lengths [N] (<= the sampled lengths)")


def _no_truncation(x: ShapingInputs):
    return None


def dot(x: ShapingInputs, *, metric: str | None = None, threshold: float = 1.0, alpha: float = 3.0,
        min_cut: float = 32, success: float = 1.0) -> np.ndarray:
    """DOT's outlier truncation (:func:`jaxrl_llm.core.dot_truncation_lengths`); a row is correct
    when ``metric`` (a reward function's score, default the total) is at least ``threshold``."""
    vals = x.scores if metric is None else np.nan_to_num(_per_fn(x, metric), nan=0.0)
    return np.asarray(core.dot_truncation_lengths(jnp.asarray(x.lengths), jnp.asarray(np.asarray(vals) >= threshold),
                                                  jnp.asarray(x.group_ids), x.num_groups, alpha=alpha,
                                                  min_cut=min_cut, success=success))


def siri(x: ShapingInputs, *, low: int, high: int, compress_steps: int, expand_steps: int, shape: str = "cosine",
         block: int = 1) -> np.ndarray:
    """SIRI's interleaved length cap (:func:`jaxrl_llm.core.interleaved_length_cap`) at the
    step the responses were sampled: every response is cut at the cap and scored again, as if
    generation had stopped there (the tokens up to the cap have the same distribution; a cut
    response loses what came after, its final answer included)."""
    cap = core.interleaved_length_cap(int(x.step), low=low, high=high, compress_steps=compress_steps,
                                      expand_steps=expand_steps, shape=shape, block=block)
    return np.minimum(np.asarray(x.lengths), cap)


TRUNCATIONS.register(Part("none", _no_truncation, note="responses are trained on as sampled"))
TRUNCATIONS.register(Part(
    "dot", dot, paper="Anti-Length Shift: Dynamic Outlier Truncation for Training Efficient Reasoning Models (DOT), "
                      "arXiv:2601.03969",
    core=("dot_truncation_lengths",), methods=(189,), verified="hand values, paper identity (G < 11: no cut)",
    tests="tests/core/test_reward_shaping.py, tests/training/test_paper_losses.py",
    note="in all-correct groups, responses beyond mean + 3 std of the group's lengths are cut there and scored "
         "again (before group filters); the dot preset adds the paper's KL-Cov loss"))
TRUNCATIONS.register(Part(
    "siri", siri, paper="SIRI: Scaling Iterative Reinforcement Learning with Interleaved Compression (Wen et al.), "
                        "arXiv:2509.25176",
    core=("interleaved_length_cap",), methods=(174,), tests="tests/core/test_reward_shaping.py, "
                                                             "tests/training/test_paper_losses.py",
    verified="hand values (our construction: the paper's formulas and numbers could not be read)",
    note="the maximum rollout length oscillates between compression (towards low) and expansion (high) phases; the "
         "sampler decodes up to rollout.max_new_tokens (set it to high) and responses are cut at the step's cap and "
         "scored again, which has the distribution of generation stopped at the cap (the decode past the cap is not "
         "saved); low, high and the phase lengths have no defaults (not verifiable)"))

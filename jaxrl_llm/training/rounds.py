"""Rows of the RL loop's sampling rounds: :class:`Round` (one round's batch, rollout, rewards
and what the loop parts made of them) and the host-side helpers that take, replace and merge
rows of rollouts and reward outputs."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.data.pipeline import PromptBatch
from jaxrl_llm.rewards.base import RewardOutput
from jaxrl_llm.rollout.sampler import Rollout

__all__ = ["Round", "merge_reward_metrics", "completion_ids", "decode_completions", "take_rollout_rows", "put_result",
           "subset", "concat", "drop_unsampled", "last_scores"]


@dataclasses.dataclass
class Round:
    """One sampling round of a step. The loop fills ``batch``, ``roll``, ``out`` and ``scores``;
    the parts of each phase may change them or set the rest.

    ``index`` is the round within the step, ``key`` its sampling key, ``params`` the policy that
    samples it (a stale policy's under ``rollout.staleness``). ``ahead``: the batch and rollout
    were sampled during the last step (``rollout.asynchronous``). ``counts``: an allocator's
    rollouts per prompt. ``keys``: the prompts' keys in the prompt store. ``keep``: the groups
    the round keeps (a group filter). ``train_roll`` / ``train_out`` / ``train_batch``: what is
    trained on when a part replaced rows (replay, hints); ``roll`` / ``out`` stay as sampled.
    ``hinted``: groups a plain-context hint part sampled with a hint. ``turn_cap``: the policy
    turns of an agent round's episodes (a horizon schedule)."""

    index: int
    key: Any
    params: Any
    batch: Any = None
    roll: Any = None
    out: Any = None
    scores: Any = None
    ahead: bool = False
    counts: np.ndarray | None = None
    keys: list = dataclasses.field(default_factory=list)
    keep: np.ndarray | None = None
    train_roll: Any = None
    train_out: Any = None
    train_batch: Any = None
    hinted: frozenset = frozenset()
    turn_cap: int | None = None

    @property
    def t_batch(self):
        return self.batch if self.train_batch is None else self.train_batch

    @property
    def t_roll(self):
        return self.roll if self.train_roll is None else self.train_roll

    @property
    def t_out(self):
        return self.out if self.train_out is None else self.train_out


def merge_reward_metrics(outs: list) -> dict[str, float]:
    """The reward metrics of several rounds' :class:`~jaxrl_llm.rewards.RewardOutput` as one
    batch: means and stds over all rows, counts and seconds summed."""
    if len(outs) == 1:
        return dict(outs[0].metrics)
    merged: dict[str, float] = {}
    total = np.concatenate([o.total for o in outs]).astype(np.float64)
    for k in outs[0].metrics:
        vals = [o.metrics[k] for o in outs]
        name, _, stat = k.rpartition("/")
        if stat in ("mean", "std"):
            if name == "rewards/total":
                x = total
            elif name.startswith("rewards/") and name[len("rewards/"):] in outs[0].per_fn:
                x = np.concatenate([o.per_fn[name[len("rewards/"):]] for o in outs]).astype(np.float64)
                x = x[~np.isnan(x)]
            else:
                merged[k] = float(np.mean(vals))
                continue
            merged[k] = (float(x.mean()) if stat == "mean" else float(x.std())) if x.size else float("nan")
        elif k == "rewards/abandoned_threads":
            merged[k] = float(vals[-1])
        else:  # errors, timeouts, nonfinite, seconds, failed rows
            merged[k] = float(np.sum(vals))
    return merged


@partial(jax.jit, static_argnums=(0,))
def last_scores(graphdef, params, frozen, tokens, mask):
    """``[B]`` a score-head model's output at the last position of left-padded rows."""
    from flax import nnx

    model = nnx.merge(graphdef, params, *frozen)
    hidden, _ = model(tokens, mask)
    return model.scores(hidden[:, -1])[:, 0].astype(jnp.float32)


def put_rows(base, rows: np.ndarray, new) -> np.ndarray:
    """A copy of ``base`` with ``base[rows] = new``."""
    out = np.array(base, copy=True)
    out[rows] = np.asarray(new).astype(out.dtype)
    return out


def completion_ids(roll) -> tuple[np.ndarray, ...]:
    """Each row's sampled token ids (its tokens under the completion mask)."""
    toks, cm = np.asarray(roll.tokens), np.asarray(roll.mask).astype(bool)
    return tuple(toks[i][cm[i]] for i in range(len(toks)))


def decode_completions(roll, tokenizer, *, skip_special_tokens: bool = True) -> tuple[str, ...]:
    """Each row's completion as text."""
    return tuple(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) for ids in completion_ids(roll))


def take_rollout_rows(roll, rows=None):
    """``roll`` (a rollout NamedTuple) as host arrays, its rows ``rows`` only (all: None); fields
    that are None (a dense model's ``routes``) stay None."""
    return type(roll)(*(None if x is None else (np.asarray(x) if rows is None else np.asarray(x)[rows])
                        for x in roll))


def put_result(roll, out: RewardOutput, rows: np.ndarray, sub, sub_out: RewardOutput):
    """``(roll, out)`` with rows ``rows`` replaced by the rows of ``(sub, sub_out)``, in order.
    A mixture of experts' ``routes`` are dropped (the replaced rows were sampled from other
    prompts: the update then has no routes to replay, which the run's config checks refuse)."""
    roll = roll._replace(**{f: put_rows(getattr(roll, f), rows, getattr(sub, f))
                            for f in ("tokens", "mask", "logprobs", "lengths", "stopped")})
    if getattr(roll, "routes", None) is not None:
        roll = roll._replace(routes=None)
    out = RewardOutput(put_rows(out.total, rows, sub_out.total),
                       {k: put_rows(v, rows, sub_out.per_fn[k]) for k, v in out.per_fn.items()},
                       {k: put_rows(v, rows, sub_out.failed[k]) for k, v in out.failed.items()}, out.metrics)
    return roll, out


def subset(batch: PromptBatch, idx) -> PromptBatch:
    """The prompts ``idx`` of a batch, in that order."""
    return PromptBatch([batch.prompt_ids[i] for i in idx], [batch.prompts[i] for i in idx],
                       [batch.raw_prompts[i] for i in idx], {k: [v[i] for i in idx] for k, v in batch.columns.items()},
                       [batch.where[i] for i in idx])


def concat(batches: list[PromptBatch]) -> PromptBatch:
    """The prompts of several batches (same columns) as one batch, in order."""
    return PromptBatch([p for b in batches for p in b.prompt_ids], [p for b in batches for p in b.prompts],
                       [p for b in batches for p in b.raw_prompts],
                       {k: [v for b in batches for v in b.columns[k]] for k in batches[0].columns},
                       [w for b in batches for w in b.where])


def drop_unsampled(batch: PromptBatch, roll: Rollout, counts: np.ndarray) -> tuple[PromptBatch, Rollout]:
    """The prompts an allocator gave rollouts, and the rollout's prompt ids renumbered to them."""
    keep = np.flatnonzero(counts > 0)
    new_id = np.full(len(counts), -1, np.int64)
    new_id[keep] = np.arange(len(keep))
    pidx = new_id[np.asarray(roll.prompt_index)].astype(np.int32)
    return subset(batch, keep), roll._replace(prompt_index=pidx)

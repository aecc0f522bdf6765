"""Host-side pieces of the RL step: the train batch of a group rollout, its alignment helpers,
mini-batches, and the critic of recipes whose estimator reads values.

Layout of the train batch built by :func:`build_rl_batch` from a group rollout: each row is
``left-padded prompt [P] + completion [T]``; per-token arrays are target-aligned
(``[N, P + T - 1]``, entry ``j`` belongs to token ``j + 1``), so completion token ``t`` sits at
column ``P + t - 1``. Recipes live in :mod:`jaxrl_llm.training.recipes`, the loop in
:mod:`jaxrl_llm.training.loop`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.training.objectives import ValueObjective

__all__ = ["build_rl_batch", "outcome_token_rewards", "to_target_aligned", "minibatches", "Critic",
           "critic_params_from_policy"]

@dataclasses.dataclass
class Critic:
    """A value model and how to train it, for recipes whose estimator reads ``values`` (PPO).

    Attributes:
      graphdef: the score-head model's graph (``nnx.split`` of ``Transformer(cfg,
        head="score")`` with ``num_labels=1``).
      state: its :class:`~jaxrl_llm.training.TrainState` (own optimiser, own RNG).
      train_step: ``make_train_step(graphdef, optimizer, recipe.value_objective, ...)``.
      frozen: further state parts for ``nnx.merge`` (e.g. frozen base weights under LoRA).
    """

    graphdef: Any
    state: Any
    train_step: Callable
    frozen: tuple = ()

    @classmethod
    def create(cls, cfg: Any, optimizer: Any, objective: ValueObjective, *, policy_params: Any = None,
               seed: int = 0, mesh: Any = None, **step_kwargs: Any) -> "Critic":
        """A critic with the policy's architecture ``cfg`` and a fresh one-output score head.

        ``policy_params``: copy the policy's backbone weights into it (the usual PPO
        initialisation from the actor; ``None``: random weights). ``mesh``: create the critic
        in its shards there (parameters and optimiser state by the logical rules, like the
        policy's) and give its train step those shardings. ``step_kwargs`` go to
        :func:`~jaxrl_llm.training.make_train_step` (``num_microbatches``, ...).
        """
        from flax import nnx

        from jaxrl_llm.models import Transformer
        from jaxrl_llm.training.step import init_train_state, make_train_step, train_state_shardings

        if cfg.num_labels != 1:
            cfg = dataclasses.replace(cfg, num_labels=1)
        if mesh is None:
            graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed), head="score"))
        else:
            from jaxrl_llm.parallel.sharding import init_sharded

            graphdef, params = nnx.split(init_sharded(cfg, mesh, seed, head="score"))
        if policy_params is not None:
            params = critic_params_from_policy(policy_params, params)
        state = init_train_state(params, optimizer, seed=seed)
        if mesh is not None:
            sh = train_state_shardings(optimizer, state, mesh)
            state = jax.device_put(state, sh)
            step_kwargs.setdefault("state_shardings", sh)
        return cls(graphdef, state, make_train_step(graphdef, optimizer, objective, **step_kwargs))


def critic_params_from_policy(policy_params: Any, critic_params: Any) -> Any:
    """``critic_params`` with every leaf the policy has at the same path and shape (the
    backbone: embeddings, blocks, final norm) copied from ``policy_params``; the score head
    keeps its fresh initialisation."""
    from flax import nnx

    src = nnx.to_pure_dict(policy_params)

    def merge(dst, s):
        if isinstance(dst, dict):
            return {k: merge(v, s.get(k) if isinstance(s, dict) else None) for k, v in dst.items()}
        if s is not None and np.shape(s) == np.shape(dst):
            # a new buffer where ``dst`` lives (its sharding, on every process that holds a
            # part): the critic's train step donates its state, which must not delete the
            # policy's arrays
            return jax.device_put(jnp.array(s, dtype=dst.dtype, copy=True), dst.sharding)
        return dst

    out = jax.tree.map(lambda x: x, critic_params)  # a copy: the caller's state is untouched
    nnx.replace_by_pure_dict(out, merge(nnx.to_pure_dict(critic_params), src))
    return out


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
    out = {
        "tokens": np.concatenate([prompts, toks.astype(np.int32)], axis=1),
        "mask": np.concatenate([pmask, cmask], axis=1),
        "loss_mask": to_target_aligned(cmask, prompt_len),
        "old_logp": to_target_aligned(np.where(cmask, np.asarray(rollout.logprobs, np.float32), 0.0), prompt_len),
        "completion_mask": cmask,
        "group_ids": group,
    }
    routes = getattr(rollout, "routes", None)
    if routes is not None:  # the sampler's experts, laid out like the tokens (prompts right-aligned)
        out["routes"] = align_routes(np.asarray(routes), t, prompt_len)
    return out


def align_routes(routes: np.ndarray, completion_len: int, prompt_len: int) -> np.ndarray:
    """``[N, P_s + T, L, k]`` sampler routes (prompts left-padded to the sampler's bucket
    ``P_s``) to the train batch's ``[N, prompt_len + T, L, k]``: the prompts' real tokens are the
    last columns of both, so the prompt part is right-aligned (padding positions get expert
    routes of no consequence: they are masked out of attention and the loss)."""
    n, total = routes.shape[:2]
    p_s = total - completion_len
    if p_s < 0:
        raise ValueError(f"routes cover {total} positions, fewer than the {completion_len} completion tokens")
    prompt = routes[:, max(p_s - prompt_len, 0):p_s]
    if prompt.shape[1] < prompt_len:
        pad = np.zeros((n, prompt_len - prompt.shape[1]) + routes.shape[2:], routes.dtype)
        prompt = np.concatenate([pad, prompt], axis=1)
    return np.concatenate([prompt, routes[:, p_s:]], axis=1).astype(np.int32)


def outcome_token_rewards(scores: jax.Array, completion_mask: jax.Array) -> jax.Array:
    """``[N, T]`` token rewards: each row's score on its last completion token, 0 elsewhere
    (and 0 for a row with no completion token)."""
    m = jnp.asarray(completion_mask).astype(bool)
    t = m.shape[1]
    last = t - 1 - jnp.argmax(m[:, ::-1], axis=1)
    at_last = (jnp.arange(t)[None] == last[:, None]) & m
    return jnp.where(at_last, jnp.asarray(scores, jnp.float32)[:, None], 0.0)


def minibatches(batch: dict, num_minibatches: int, key: jax.Array | None, *, whole_groups: bool = False
                ) -> list[dict]:
    """The rows of ``batch`` shuffled (when ``key`` is given) and split into equal parts.

    ``whole_groups``: shuffle and split whole prompt groups (``batch["group_ids"]``, groups of
    equal size) instead of rows, and number the groups of each part densely ``0, 1, ...``, for a loss that compares the rows of one prompt (DisCO); the number of groups
    must be divisible by ``num_minibatches``."""
    n = next(iter(batch.values())).shape[0]
    if n % num_minibatches:
        raise ValueError(f"{n} rows are not divisible into {num_minibatches} mini-batches")
    size = n // num_minibatches
    if not whole_groups:
        order = np.arange(n) if key is None else np.asarray(jax.random.permutation(key, n))
        return [{k: v[order[i * size:(i + 1) * size]] for k, v in batch.items()} for i in range(num_minibatches)]
    gid = np.asarray(batch["group_ids"])
    groups = np.unique(gid)
    if len(groups) % num_minibatches:
        raise ValueError(f"{len(groups)} prompt groups are not divisible into {num_minibatches} mini-batches (the "
                         f"loss compares the rows of one prompt, so a mini-batch holds whole groups)")
    perm = groups if key is None else groups[np.asarray(jax.random.permutation(key, len(groups)))]
    rank = np.empty(int(gid.max()) + 1, np.int64)
    rank[perm] = np.arange(len(perm))
    order = np.argsort(rank[gid], kind="stable")
    per = len(groups) // num_minibatches
    out = []
    for i in range(num_minibatches):
        rows = order[rank[gid[order]] // per == i]
        mb = {k: v[rows] for k, v in batch.items()}
        _, mb["group_ids"] = np.unique(mb["group_ids"], return_inverse=True)
        mb["group_ids"] = mb["group_ids"].astype(np.int32)
        out.append(mb)
    if len({len(next(iter(m.values()))) for m in out}) > 1:
        raise ValueError("prompt groups of different sizes cannot be split into equal mini-batches")
    return out

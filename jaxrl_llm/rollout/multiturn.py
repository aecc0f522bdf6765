"""Multi-turn sampling with the KV cache carried across turns.

An episode alternates policy turns and observations (an environment's or a tool's reply). A
re-encoding rollout would run the whole history through the model again before each turn;
here the cache of the previous turns stays on the device and only the new observation tokens
are prefilled onto it (:func:`extend_and_decode`), then the next turn is decoded from there.

Two jitted functions, both pure in ``(params, tokens, key, config)``:

:func:`prefill_and_decode`
    prefills ``B`` left-padded first prompts once, repeats the cache rows for the ``G``
    episodes of each prompt and decodes the first turn (as :func:`~jaxrl_llm.rollout.generate`,
    with a cache of ``context_len`` slots instead of ``P + T``).
:func:`extend_and_decode`
    appends each live episode's observation tokens (left-padded ``[N, O]``; rows of finished
    episodes are all padding) to the cache and decodes the next turn of the live episodes.

The cache is one buffer of ``context_len`` slots shared by the batch: every call advances its
write index by the padded observation width plus the decoded steps, padding slots are marked
invalid, and rope positions count real tokens only. So each episode's attention sees exactly
its own real tokens in order, and the log-probabilities of its policy tokens equal a teacher-
forced pass over the compacted sequence (prompt, turn, observation, turn, ...) to float
tolerance (tested). **Context budget**: before a turn, if the cache has no room for the padded
observations plus a full turn (``max_new_tokens``), the episodes still running are truncated
(they end before that observation; ``context_truncated`` in the episode record).

:class:`MultiTurnSampler` is the host-side driver (bucketing, host copies, the cache index);
:mod:`jaxrl_llm.agents.rollout` runs environments with it.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models.transformer import init_cache, unstack_layers
from jaxrl_llm.rollout.sampler import _repeat_rows, decode
from jaxrl_llm.rollout.sampling import SamplingConfig, sampling_model
from jaxrl_llm.shapes import bucket, pad_prompts

__all__ = ["Turn", "prefill_and_decode", "extend_and_decode", "MultiTurnSampler"]


class Turn(NamedTuple):
    """One policy turn of ``N`` episodes (rows prompt-major, as :class:`~jaxrl_llm.rollout.Rollout`)."""

    tokens: Any  # [N, T] int32, pad after the end and for episodes that were not live
    mask: Any  # [N, T] bool: sampled tokens (the stop token included)
    logprobs: Any  # [N, T] float32 sampler log-probs (full temperature-scaled distribution), 0 off the mask
    lengths: Any  # [N] int32
    stopped: Any  # [N] bool: ended with a stop token (False: budget spent, or not live)


def _layers(model, unroll: bool):
    return unstack_layers(nnx.state(model)) if unroll else None


def _turn(out, live) -> tuple[Turn, Any]:
    lengths = jnp.sum(out.mask, axis=-1).astype(jnp.int32)
    return Turn(out.tokens, out.mask, out.logprobs, lengths, out.done & live), out.cache


@partial(jax.jit, static_argnums=(0, 5, 6), static_argnames=("unroll_layers",))
def prefill_and_decode(graphdef: nnx.GraphDef, params: Any, prompt_tokens: jax.Array, prompt_mask: jax.Array,
                       key: jax.Array, config: SamplingConfig, context_len: int, *others: Any,
                       unroll_layers: bool = False) -> tuple[Turn, Any]:
    """First turn: ``config.num_samples`` episodes per left-padded prompt ``[B, P]``; returns the
    turn (``N = B * G`` rows) and the cache (``context_len`` slots) to continue from."""
    model = sampling_model(graphdef, params, others, config)
    layers = _layers(model, unroll_layers)
    b = prompt_tokens.shape[0]
    n = b * config.num_samples
    cache = init_cache(model.cfg, b, context_len, per_layer=layers is not None)
    valid, index = jax.lax.optimization_barrier((cache.valid, cache.index))  # see generate: no constant folding
    cache = cache._replace(valid=valid, index=index)
    h, cache = model(prompt_tokens, prompt_mask, cache=cache, layers=layers)
    logits = jnp.repeat(model.logits(h[:, -1]), config.num_samples, axis=0)
    cache = _repeat_rows(cache, config.num_samples)
    out = decode(model, layers, logits, cache, jnp.zeros((n,), bool), key, config)
    return _turn(out, jnp.ones((n,), bool))


@partial(jax.jit, static_argnums=(0, 7), static_argnames=("unroll_layers",), donate_argnums=(2,))
def extend_and_decode(graphdef: nnx.GraphDef, params: Any, cache: Any, obs_tokens: jax.Array, obs_mask: jax.Array,
                      live: jax.Array, key: jax.Array, config: SamplingConfig, *others: Any,
                      unroll_layers: bool = False) -> tuple[Turn, Any]:
    """Next turn: prefill the observations ``[N, O]`` (left-padded; a row that is not ``live``
    is all padding) onto ``cache`` and decode the live rows. The cache is donated."""
    model = sampling_model(graphdef, params, others, config)
    layers = _layers(model, unroll_layers)
    h, cache = model(obs_tokens, obs_mask & live[:, None], cache=cache, layers=layers)
    out = decode(model, layers, model.logits(h[:, -1]), cache, ~live, key, config)
    return _turn(out, live)


class MultiTurnSampler:
    """Host driver of the two jitted turns, with bucketed shapes and the cache between calls.

    ``start(params, prompts, key)`` returns the first :class:`Turn` (host numpy) of ``G``
    episodes per prompt and keeps the cache; ``extend(params, observations, key)`` appends
    ``observations[i]`` (token ids, or ``None`` for a finished episode) and returns the next
    turn. ``room(width)`` says whether observations of ``width`` tokens plus a full turn still
    fit in the cache. Prompts are left-padded to a length bucket, observations to an
    observation bucket, so a run compiles each function once per bucket.

    ``unroll_layers``: as :class:`~jaxrl_llm.rollout.Sampler` (per-layer buffers; the weights are
    split per call, i.e. once per turn). Single-device (no mesh) in this version.
    """

    def __init__(self, graphdef: nnx.GraphDef, config: SamplingConfig, *, context_len: int,
                 length_buckets: Sequence[int] = (32, 64, 128, 256, 512, 1024, 2048),
                 obs_buckets: Sequence[int] = (8, 16, 32, 64, 128, 256, 512), unroll_layers: bool = True):
        if context_len < min(length_buckets) + config.max_new_tokens:
            raise ValueError(f"context_len={context_len} has no room for a prompt of the smallest length bucket "
                             f"({min(length_buckets)}) plus one turn of max_new_tokens={config.max_new_tokens}")
        self.graphdef, self.config, self.context_len = graphdef, config, int(context_len)
        self.length_buckets, self.obs_buckets = tuple(sorted(length_buckets)), tuple(sorted(obs_buckets))
        self.unroll_layers = bool(unroll_layers)
        self.cache: Any = None
        self.index = 0
        self.compiled_shapes: set[tuple[str, int, int]] = set()

    def _host(self, turn: Turn, n: int) -> Turn:
        return Turn(*(np.asarray(x)[:n] for x in turn))

    def start(self, params: Any, prompts: Sequence[Sequence[int]], key: jax.Array, *others: Any) -> Turn:
        length = bucket(max(len(p) for p in prompts), self.length_buckets)
        if length + self.config.max_new_tokens > self.context_len:
            raise ValueError(f"prompts of {max(len(p) for p in prompts)} tokens (bucket {length}) plus one turn of "
                             f"{self.config.max_new_tokens} tokens exceed context_len={self.context_len}")
        tokens, mask = pad_prompts(prompts, length, len(prompts), self.config.pad_token_id)
        self.compiled_shapes.add(("prefill", len(prompts), length))
        turn, self.cache = prefill_and_decode(self.graphdef, params, tokens, mask, key, self.config, self.context_len,
                                              *others, unroll_layers=self.unroll_layers)
        self.index = int(self.cache.index)
        return self._host(turn, len(prompts) * self.config.num_samples)

    def obs_width(self, observations: Sequence[Sequence[int] | None]) -> int:
        longest = max((len(o) for o in observations if o is not None), default=1)
        return bucket(max(longest, 1), self.obs_buckets)

    def room(self, width: int) -> bool:
        """Whether observations padded to ``width`` plus a full turn fit in the cache."""
        return self.index + width + self.config.max_new_tokens <= self.context_len

    def extend(self, params: Any, observations: Sequence[Sequence[int] | None], key: jax.Array, *others: Any) -> Turn:
        if self.cache is None:
            raise RuntimeError("MultiTurnSampler.extend before start")
        width = self.obs_width(observations)
        if not self.room(width):
            raise ValueError(f"no room in the cache: index {self.index} + observations {width} + a turn of "
                             f"{self.config.max_new_tokens} > context_len {self.context_len} (check room() first)")
        live = np.array([o is not None for o in observations])
        for i, o in enumerate(observations):
            if o is not None and len(o) == 0:
                raise ValueError(f"observation {i} has no tokens: a live episode needs at least one token to continue "
                                 f"from (None ends it)")
        pad = [self.config.pad_token_id]  # finished episodes: one placeholder, masked off in the jitted turn
        tokens, mask = pad_prompts([o if o is not None else pad for o in observations], width, len(observations),
                                   self.config.pad_token_id)
        self.compiled_shapes.add(("extend", len(observations), width))
        turn, self.cache = extend_and_decode(self.graphdef, params, self.cache, tokens, mask, jnp.asarray(live), key,
                                             self.config, *others, unroll_layers=self.unroll_layers)
        self.index = int(self.cache.index)
        return self._host(turn, len(observations))

    def release(self) -> None:
        """Drop the cache (its device memory) between rollouts."""
        self.cache, self.index = None, 0

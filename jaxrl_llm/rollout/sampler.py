"""The jitted sampler: a pure function of (params, prompts, key, config).

:func:`generate` prefills each prompt once, repeats its KV-cache rows for the ``G`` samples
of the prompt (a memory copy; no ``G``-fold prefill compute), then decodes inside one
``lax.while_loop`` that stops as soon as every row has emitted a stop token or the budget
is spent. The cache lives in the loop carry and is updated in place.

:class:`Sampler` wraps it for training loops: prompts are left-padded to a length bucket and
the batch to a batch bucket, so a run compiles the sampler at most once per
``(batch bucket, length bucket)`` pair; on a mesh, the batch is split over the data axes
and the heads over ``tensor`` (parameters keep their logical shardings).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models.transformer import init_cache, unstack_layers
from jaxrl_llm.parallel.multihost import gather
from jaxrl_llm.parallel.sharding import (active_rules, constrain, decode_rules, logical_rules, logical_sharding,
                                         state_shardings)
from jaxrl_llm.rollout.sampling import SamplingConfig, sample_tokens, sampling_model
from jaxrl_llm.shapes import bucket, pad_prompts  # re-exported: their home was here

__all__ = ["Rollout", "generate", "decode", "Sampler", "bucket", "pad_prompts"]


class Rollout(NamedTuple):
    """Completions of ``B`` prompts x ``G`` samples, rows prompt-major (row ``b * G + g``)."""

    tokens: jax.Array  # [N, T] int32, pad_token_id after the end
    mask: jax.Array  # [N, T] bool: generated tokens, the stop token included
    logprobs: jax.Array  # [N, T] float32 log_softmax(logits / temperature)[token], 0 off the mask
    lengths: jax.Array  # [N] int32 number of generated tokens
    stopped: jax.Array  # [N] bool: finish reason is a stop token (False: max_new_tokens)
    prompt_index: jax.Array  # [N] int32 prompt of each row (the group id)
    # mixture of experts: [N, P + T, L, k] int32 experts of every token (prompt, left-padded to
    # the bucket P, then completion), for routing replay in the update; None for dense models
    routes: Any = None


class _Loop(NamedTuple):
    step: jax.Array
    logits: jax.Array
    cache: Any
    done: jax.Array
    tokens: jax.Array
    mask: jax.Array
    logprobs: jax.Array


def _repeat_rows(cache, g: int):
    if g == 1:
        return cache
    rep = lambda x, axis: jnp.repeat(x, g, axis=axis)  # noqa: E731
    if cache.routes is not None:
        cache = cache._replace(routes=rep(cache.routes, 0))
    if cache.ring_valid is not None:
        cache = cache._replace(ring_valid=rep(cache.ring_valid, 0))
    if isinstance(cache.k, tuple):  # per layer: [B, K, Dh, S] / [B, K, S, Dh] each
        return cache._replace(k=tuple(rep(c, 0) for c in cache.k), v=tuple(rep(c, 0) for c in cache.v),
                              valid=rep(cache.valid, 0), next_position=rep(cache.next_position, 0))
    return cache._replace(k=rep(cache.k, 1), v=rep(cache.v, 1), valid=rep(cache.valid, 0),
                          next_position=rep(cache.next_position, 0))


def _take_rows(cache, rows: jax.Array):
    """The cache rows ``rows`` (``[N]`` indices into the prompts): a prompt's prefill shared by
    the rows that continue it, however many each prompt has."""
    take = lambda x, axis: jnp.take(x, rows, axis=axis)  # noqa: E731
    if cache.routes is not None:
        cache = cache._replace(routes=take(cache.routes, 0))
    if cache.ring_valid is not None:
        cache = cache._replace(ring_valid=take(cache.ring_valid, 0))
    if isinstance(cache.k, tuple):
        return cache._replace(k=tuple(take(c, 0) for c in cache.k), v=tuple(take(c, 0) for c in cache.v),
                              valid=take(cache.valid, 0), next_position=take(cache.next_position, 0))
    return cache._replace(k=take(cache.k, 1), v=take(cache.v, 1), valid=take(cache.valid, 0),
                          next_position=take(cache.next_position, 0))


def generate(graphdef: nnx.GraphDef, params: Any, prompt_tokens: jax.Array, prompt_mask: jax.Array,
             key: jax.Array, config: SamplingConfig, *others: Any, unroll_layers: bool = False,
             row_prompt: jax.Array | None = None) -> Rollout:
    """Sample ``config.num_samples`` completions of each left-padded prompt (or, with
    ``row_prompt``, a number per prompt).

    Args:
      graphdef, params, *others: the split model (``nnx.split``), LM head.
      prompt_tokens: ``[B, P]`` int, left-padded (the last column is a real token of every
        row). prompt_mask: ``[B, P]`` bool.
      key: PRNG key; the same key gives the same completions.
      config: static :class:`SamplingConfig`.
      unroll_layers: static. True: split the stacked layer weights into per-layer buffers
        once, before decoding, and run the layers unrolled over them and over a per-layer KV
        cache. XLA cannot alias a slice of a buffer, so the scanned layers copy every layer's
        weights and cache slice out of the stacks at every decode step; unrolled, each step
        reads them in place (much faster on XLA:CPU, same tokens; tested) at the price of a
        compile time that grows with depth.
      row_prompt: optional ``[B * G]`` int32, the prompt each row continues (non-decreasing:
        a prompt's rows are contiguous): variable samples per prompt within the same number of
        rows (a rollout budget allocator). Each prompt is still prefilled once.

    Returns:
      :class:`Rollout` with ``N = B * G`` rows and ``T = config.max_new_tokens`` columns.
    """
    model = sampling_model(graphdef, params, others, config)
    cfg = model.cfg
    layers = None
    if unroll_layers:
        layers = unstack_layers(nnx.state(model))
    b, p = prompt_tokens.shape
    g, t = config.num_samples, config.max_new_tokens
    n = b * g
    if config.shared_prompt_kv and g > 1 and row_prompt is None:
        return _generate_shared(model, layers, prompt_tokens, prompt_mask, key, config)
    cache = init_cache(cfg, b, prefill_slots(p) + t, per_layer=layers is not None)
    # The empty cache's `valid` (all False) and `index` (0) are trace-time constants. Seen as
    # constants, they make the prefill's scores over the cached slots a constant block of
    # _NEG (scanned layers), and XLA constant-folds the softmax max over it at compile time:
    # seconds per compile for SmolLM2 ("slow_operation_alarm ... Constant folding an
    # instruction is taking > 1s"). The barrier hides their values from the compiler only;
    # the same numbers are computed at run time.
    valid, index = jax.lax.optimization_barrier((cache.valid, cache.index))
    cache = cache._replace(valid=valid, index=index)
    cache = _constrain_kv(cache)
    h, cache = prefill(model, layers, prompt_tokens, prompt_mask, cache)
    if row_prompt is None:
        logits = jnp.repeat(model.logits(h[:, -1]), g, axis=0)
        cache = _repeat_rows(cache, g)
        row_prompt = jnp.repeat(jnp.arange(b, dtype=jnp.int32), g)
    else:
        if row_prompt.shape != (n,):
            raise ValueError(f"generate: row_prompt must be [{n}] (B * num_samples), got {row_prompt.shape}")
        row_prompt = row_prompt.astype(jnp.int32)
        logits = jnp.take(model.logits(h[:, -1]), row_prompt, axis=0)
        cache = _take_rows(cache, row_prompt)
    out = decode(model, layers, logits, cache, jnp.zeros((n,), bool), key, config)
    lengths = jnp.sum(out.mask, axis=-1).astype(jnp.int32)
    return Rollout(out.tokens, out.mask, out.logprobs, lengths, out.done, row_prompt, out.cache.routes)


class _Mixture:
    """Two models of one architecture decoding side by side (Nash-MD's geometric mixture): the
    hidden states are concatenated on the feature axis and ``logits`` are ``(1 - coef) z_a +
    coef z_b``, so :func:`prefill` and :func:`decode` run unchanged over the pair of caches."""

    def __init__(self, a: Any, b: Any, coef: float):
        self.a, self.b, self.coef, self.cfg = a, b, coef, a.cfg

    def __call__(self, tokens, mask, cache=None, layers=None, prefix=None):
        ha, ca = self.a(tokens, mask, cache=cache[0], layers=None)
        hb, cb = self.b(tokens, mask, cache=cache[1], layers=None)
        return jnp.concatenate([ha, hb], axis=-1), (ca, cb)

    def logits(self, h):
        d = h.shape[-1] // 2
        return (1.0 - self.coef) * self.a.logits(h[..., :d]) + self.coef * self.b.logits(h[..., d:])


def generate_mixture(graphdef: nnx.GraphDef, params: Any, other_params: Any, prompt_tokens: jax.Array,
                     prompt_mask: jax.Array, key: jax.Array, config: SamplingConfig, *others: Any,
                     coef: float) -> Rollout:
    """:func:`generate` from the geometric mixture of two policies of one architecture:
    next-token logits ``(1 - coef) z(params) + coef z(other_params)`` (then the config's
    temperature and truncation), i.e. ``pi^(1 - coef) pi_other^coef`` renormalised. The
    log-probs are the mixture's. Nash-MD samples its opponents so (``other_params``: the
    reference policy)."""
    a = sampling_model(graphdef, params, others, config)
    b = sampling_model(graphdef, other_params, others, config)
    cfg = a.cfg
    bsz, p = prompt_tokens.shape
    g, t = config.num_samples, config.max_new_tokens
    caches = []
    for _ in range(2):
        c = init_cache(cfg, bsz, prefill_slots(p) + t)
        valid, index = jax.lax.optimization_barrier((c.valid, c.index))  # see generate
        caches.append(c._replace(valid=valid, index=index))
    mix = _Mixture(a, b, coef)
    h, caches = prefill(mix, None, prompt_tokens, prompt_mask, tuple(caches))
    logits = jnp.repeat(mix.logits(h[:, -1]), g, axis=0)
    caches = tuple(_repeat_rows(c, g) for c in caches)
    out = decode(mix, None, logits, caches, jnp.zeros((bsz * g,), bool), key, config)
    lengths = jnp.sum(out.mask, axis=-1).astype(jnp.int32)
    return Rollout(out.tokens, out.mask, out.logprobs, lengths, out.done, jnp.repeat(jnp.arange(bsz, dtype=jnp.int32), g),
                   None)


#: prompts longer than this are prefilled in chunks of this many tokens
PREFILL_CHUNK = 2048


def prefill(model: Any, layers: Any, tokens: jax.Array, mask: jax.Array, cache: Any, chunk: int = PREFILL_CHUNK):
    """``(hidden of the last position [B, 1, D], cache)`` after writing ``tokens [B, P]`` into
    ``cache`` from slot 0. Up to ``chunk`` tokens: one call. Longer: chunks of ``chunk`` tokens in a
    ``lax.scan`` (each attends to the cache so far and to itself), so the activations of one pass
    hold ``chunk`` tokens, not ``P``; the prompt is first left-padded to a multiple of ``chunk``
    (more invalid leading slots: the cache must have room for them, :func:`prefill_slots`)."""
    b, p = tokens.shape
    if p <= chunk:
        h, cache = model(tokens, mask, cache=cache, layers=layers)
        return h[:, -1:], cache
    pad = (-p) % chunk
    tokens = jnp.pad(tokens, ((0, 0), (pad, 0)))
    mask = jnp.pad(mask, ((0, 0), (pad, 0)))
    n = (p + pad) // chunk
    xs = (tokens.reshape(b, n, chunk).swapaxes(0, 1), mask.reshape(b, n, chunk).swapaxes(0, 1))

    def body(c, x):
        h, c = model(x[0], x[1], cache=c, layers=layers)
        return c, h[:, -1:]

    cache, hs = jax.lax.scan(body, cache, xs)
    return hs[-1], cache


def prefill_slots(p: int, chunk: int = PREFILL_CHUNK) -> int:
    """Cache slots :func:`prefill` uses for a ``p``-token prompt."""
    return p if p <= chunk else p + (-p) % chunk


def _constrain_kv(kv):
    """A KV cache or shared prefix with its keys/values laid out by the logical rules (batch
    over the data axes, KV heads over ``tensor``): stacked ``[L, B, K, ., .]`` or per-layer tuples."""
    names = ("act_batch", "act_kv_heads", None, None)
    if isinstance(kv.k, tuple):
        return kv._replace(k=tuple(constrain(c, names) for c in kv.k), v=tuple(constrain(c, names) for c in kv.v))
    return kv._replace(k=constrain(kv.k, (None,) + names), v=constrain(kv.v, (None,) + names))


def _generate_shared(model, layers, prompt_tokens, prompt_mask, key, config: SamplingConfig) -> Rollout:
    """:func:`generate` with ``config.shared_prompt_kv``: each prompt's keys/values are kept
    once (a :class:`~jaxrl_llm.models.transformer.SharedPrefix`) and its ``G`` rows read them
    in place; the cache holds only the generated tokens."""
    cfg = model.cfg
    b = prompt_tokens.shape[0]
    g, t = config.num_samples, config.max_new_tokens
    n = b * g
    h, prefix = model.encode_prefix(prompt_tokens, prompt_mask)
    if layers is not None:  # the unrolled layers read a per-layer prefix, sliced once here (not at every step)
        prefix = prefix._replace(k=tuple(prefix.k[i] for i in range(cfg.num_layers)),
                                 v=tuple(prefix.v[i] for i in range(cfg.num_layers)))
    prefix = _constrain_kv(prefix)
    cache = _constrain_kv(init_cache(cfg, n, t, per_layer=layers is not None))
    cache = cache._replace(next_position=jnp.repeat(prefix.next_position, g))
    logits = jnp.repeat(model.logits(h[:, -1]), g, axis=0)
    out = decode(model, layers, logits, cache, jnp.zeros((n,), bool), key, config, prefix=prefix)
    lengths = jnp.sum(out.mask, axis=-1).astype(jnp.int32)
    return Rollout(out.tokens, out.mask, out.logprobs, lengths, out.done,
                   jnp.repeat(jnp.arange(b, dtype=jnp.int32), g))


def decode(model: Any, layers: Any, logits: jax.Array, cache: Any, done: jax.Array, key: jax.Array,
           config: SamplingConfig, prefix: Any = None) -> _Loop:
    """The decode loop of :func:`generate` (and of the multi-turn rollout): from the next-token
    ``logits [N, V]`` and a ``cache`` holding everything before them, sample up to
    ``config.max_new_tokens`` tokens per row inside one ``lax.while_loop`` that stops when every
    row is ``done`` (rows done at the start emit only padding and write no valid cache slot).
    Step ``s`` draws with ``fold_in(key, s)``. ``prefix``: the rows continue these shared
    prompts (``model(..., cache=, prefix=)``; the cache then holds only the rows' own tokens).
    Returns the final loop state (``tokens``, ``mask``, ``logprobs`` ``[N, T]``, ``done`` =
    stopped by a stop token, ``cache``)."""
    n, t = logits.shape[0], config.max_new_tokens
    stop = jnp.asarray(config.stop_token_ids or (-1,), jnp.int32)

    def cond(s: _Loop):
        return (s.step < t) & ~jnp.all(s.done)

    def body(s: _Loop):
        tok, lp = sample_tokens(s.logits, jax.random.fold_in(key, s.step), config)
        live = ~s.done
        tok = jnp.where(live, tok, config.pad_token_id)
        tokens = jax.lax.dynamic_update_slice(s.tokens, tok[:, None], (0, s.step))
        mask = jax.lax.dynamic_update_slice(s.mask, live[:, None], (0, s.step))
        logprobs = jax.lax.dynamic_update_slice(s.logprobs, jnp.where(live, lp, 0.0)[:, None], (0, s.step))
        done = s.done | (live & jnp.isin(tok, stop))
        hh, cache = model(tok[:, None], live[:, None], cache=s.cache, layers=layers, prefix=prefix)
        return _Loop(s.step + 1, model.logits(hh[:, 0]), cache, done, tokens, mask, logprobs)

    init = _Loop(jnp.zeros((), jnp.int32), logits, cache, done,
                 jnp.full((n, t), config.pad_token_id, jnp.int32), jnp.zeros((n, t), bool),
                 jnp.zeros((n, t), jnp.float32))
    return jax.lax.while_loop(cond, body, init)


UNROLL_MAX_BYTES = 128 * 2**20


def resolve_unroll(unroll_layers: bool | str, params: Any, *others: Any, max_bytes: int = UNROLL_MAX_BYTES) -> bool:
    """The ``unroll_layers`` choice of :class:`Sampler` for these weights: ``"auto"`` unrolls
    unless the model is float32 and larger than ``max_bytes`` (see :class:`Sampler`)."""
    if unroll_layers != "auto":
        return bool(unroll_layers)
    leaves = [x for x in jax.tree.leaves((params, others)) if hasattr(x, "dtype")]
    size = sum(x.size * x.dtype.itemsize for x in leaves)
    all_f32 = all(x.dtype == jnp.float32 for x in leaves if jnp.issubdtype(x.dtype, jnp.floating))
    return size <= max_bytes or not all_f32


class Sampler:
    """Bucketed, optionally sharded sampler for training loops and evaluation.

    ``sampler(params, prompts, key)`` left-pads ``prompts`` (lists of token ids) to the
    smallest length bucket, pads the batch to the smallest batch bucket, runs the jitted
    :func:`generate` and returns the :class:`Rollout` of the real prompts only, as host numpy
    arrays (completions go to reward functions on the host next; trimming on the host also
    keeps the jitted sampler the only thing that compiles). The number
    of compilations is bounded by the number of bucket pairs used (``compiled_shapes``).

    With ``mesh``, parameters must already carry their shardings (e.g. from
    :func:`jaxrl_llm.parallel.state_shardings`); the prompt batch is split over the data axes
    and activations and the KV cache follow the logical rules. With several processes every
    process calls the sampler with the same prompts and key (it is one SPMD program over the
    whole mesh) and gets every row back.

    ``param_rules`` (with a mesh): the sampler's own layout of the weights, e.g.
    :data:`jaxrl_llm.parallel.SAMPLER_RULES` (split over ``tensor`` only). Each call then
    reshards the trainer's weights into it (``jax.device_put`` between the two shardings:
    each device receives only the pieces its new shard lacks, never a whole copy per
    device unless the layout is replicated) and frees that copy when it returns. Trades one
    gather per rollout and a weights copy for the per-token FSDP all-gathers of decoding.

    ``unroll_layers`` (see :func:`generate`): ``"auto"`` (default) runs the layer scan for
    float32 models of more than ``UNROLL_MAX_BYTES`` (128 MiB) of weights (``params`` and
    ``others``) and unrolls everything else. Measured on this project's 2-core CPU, same runs,
    8 rows (one-off A/B scripts, not kept in ``benchmarks/``): the 8.7M model, 27 + 64 tokens, 0.20 s unrolled vs 0.25 s scanned; float32
    SmolLM2-135M 4.01 vs 3.75 s at 27 + 64 tokens and 8.3-8.5 vs 7.4-7.5 s at 64 + 128, and
    after an unrolled SmolLM2 rollout the next train step ran 0.3-0.7 s slower (its per-layer
    weight copies; not after a scanned one). SmolLM2 in bfloat16 decoded in 8.7 s scanned in
    ``benchmarks/rollout_vs_hf.py`` (batch 8, 64 + 128) against 5.3 s unrolled in that
    benchmark's earlier run, so 16-bit models stay unrolled. The rule is a heuristic from these
    few points: pass ``True`` / ``False`` to choose. Later runs (``benchmarks/rollout_vs_hf.py``,
    docs/benchmarks.md) found float32 SmolLM2 faster unrolled at 64 + 128 tokens: 7.3 against 10.4 s
    for 4 x 8 rows, 7.8 against 10.7 s for 32 distinct prompts; the rule is kept so that existing
    runs keep their rounding (``rollout.unroll_layers`` chooses in a run's config).
    """

    UNROLL_MAX_BYTES = UNROLL_MAX_BYTES

    def __init__(self, graphdef: nnx.GraphDef, config: SamplingConfig, *,
                 length_buckets: Sequence[int] = (32, 64, 128, 256, 512, 1024, 2048),
                 batch_buckets: Sequence[int] | None = None, mesh=None, unroll_layers: bool | str = "auto",
                 param_rules: Sequence | None = None):
        if unroll_layers not in (True, False, "auto"):
            raise ValueError(f"Sampler: unroll_layers must be True, False or 'auto', got {unroll_layers!r}")
        if param_rules is not None and mesh is None:
            raise ValueError("Sampler: param_rules (a sampler layout of the weights) needs a mesh")
        self.graphdef, self.config, self.mesh = graphdef, config, mesh
        self.param_rules = None if param_rules is None else tuple(param_rules)
        self.length_buckets = tuple(sorted(length_buckets))
        self.batch_buckets = None if batch_buckets is None else tuple(sorted(batch_buckets))
        self.compiled_shapes: set[tuple[int, int]] = set()
        self._fn = jax.jit(generate, static_argnums=(0, 5), static_argnames=("unroll_layers",))
        self._mix_fn = jax.jit(generate_mixture, static_argnums=(0, 6), static_argnames=("coef",))
        self.unroll_layers = unroll_layers

    def _unroll(self, params: Any, *others: Any) -> bool:
        wd = self.config.weight_dtype
        if self.unroll_layers == "auto" and wd is not None and wd != "float32":
            return True  # decoded in 16 bits: as a 16-bit model (see the class docstring)
        return resolve_unroll(self.unroll_layers, params, *others, max_bytes=self.UNROLL_MAX_BYTES)

    def _rows(self, b: int) -> int:
        return b if self.batch_buckets is None else bucket(b, self.batch_buckets)

    def __call__(self, params: Any, prompts: Sequence[Sequence[int]], key: jax.Array, *others: Any,
                 counts: Sequence[int] | None = None, temperature: float | None = None,
                 mixture: tuple[Any, float] | None = None) -> Rollout:
        """Completions of ``prompts``: ``num_samples`` each, or ``counts[i]`` of prompt ``i``
        (ints >= 0 summing to ``len(prompts) * num_samples``: the same rows, divided unevenly;
        a prompt with 0 is prefilled but gets no row). Rows are grouped by prompt, in order.
        ``temperature``: this call samples at another temperature than the config's (its
        log-probs are then of that distribution; a new compilation per temperature).
        ``mixture=(other_params, coef)``: sample from the geometric mixture of ``params`` and
        ``other_params`` (:func:`generate_mixture`; one device, no ``counts``)."""
        config = self.config
        if temperature is not None and float(temperature) != config.temperature:
            if not float(temperature) > 0:
                raise ValueError(f"Sampler: temperature must be > 0, got {temperature!r}")
            config = dataclasses.replace(config, temperature=float(temperature))
        b = len(prompts)
        rows, length = self._rows(b), bucket(max(len(p) for p in prompts), self.length_buckets)
        tokens, mask = pad_prompts(prompts, length, rows, self.config.pad_token_id)
        self.compiled_shapes.add((rows, length))
        kw = {}
        if counts is not None:
            c = np.asarray(counts)
            g = self.config.num_samples
            if c.shape != (b,) or (c.size and c.dtype.kind not in "iu") or (c < 0).any() or int(c.sum()) != b * g:
                raise ValueError(f"Sampler: counts must be {b} ints >= 0 summing to {b * g} (prompts x num_samples), "
                                 f"got {c.tolist()}")
            # padded batch rows (batch buckets) continue the padding prompts, as without counts
            kw["row_prompt"] = np.concatenate([np.repeat(np.arange(b), c), np.repeat(np.arange(b, rows), g)]
                                              ).astype(np.int32)
        if mixture is not None:
            if self.mesh is not None or counts is not None:
                raise ValueError("Sampler: a mixture is sampled on one device, without counts")
            other, coef = mixture
            if not 0.0 <= float(coef) <= 1.0:
                raise ValueError(f"Sampler: the mixture coefficient must be in [0, 1], got {coef!r}")
            out = self._mix_fn(self.graphdef, params, other, tokens, mask, key, config, *others, coef=float(coef))
        elif self.mesh is None:
            out = self._fn(self.graphdef, params, tokens, mask, key, config, *others,
                           unroll_layers=self._unroll(params, *others), **kw)
        else:
            # rows split over the context axis too: decoding has no sequence to split
            rules = decode_rules(active_rules())
            sh = logical_sharding(("batch", None), self.mesh, rules, shape=tokens.shape)
            tokens, mask = jax.device_put(tokens, sh), jax.device_put(mask, sh)
            if self.param_rules is not None:  # the sampler's own layout, for this call only
                params, others = jax.device_put((params, others), state_shardings((params, others), self.mesh,
                                                                                  self.param_rules))
            with jax.set_mesh(self.mesh), logical_rules(rules):
                out = self._fn(self.graphdef, params, tokens, mask, key, config, *others,
                               unroll_layers=self._unroll(params, *others), **kw)
        n = b * self.config.num_samples
        # gather: every process gets every row (multi-host)
        return Rollout(*(None if x is None else x[:n] for x in gather(out)))

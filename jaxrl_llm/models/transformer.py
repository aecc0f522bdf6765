"""Decoder-only transformer in Flax NNX: one implementation for Llama, Mistral, Qwen2/2.5,
Qwen3, GPT-2, Gemma 2/3 (post-norms, soft-capping, per-layer rope bases) and Qwen3-MoE (a
mixture of experts in every layer: :class:`MoE`).

Layout. Layer parameters are *stacked* (leading layer axis, created with ``nnx.vmap``) and
the layers run in a ``lax.scan``, so compile time does not grow with depth. Every parameter
carries ``logical_axes`` metadata (``"embed"``, ``"heads"``, ``"mlp"`` ...) that
:mod:`jaxrl_llm.parallel.sharding` maps to mesh axes. Kernels are stored in the layout the
einsums use: q ``[D, H, Dh]``, k/v ``[D, K, Dh]``, o ``[H, Dh, D]``, MLP ``[D, F]``/``[F, D]``.

Attention takes left- or right-padded batches (``mask``), derives rope positions from the
mask (``cumsum(mask) - 1``, as HF ``generate`` does) unless ``positions`` are given, and
handles packed sequences (``segment_ids``: tokens attend only within their segment,
positions restart per segment) and per-layer sliding windows (Mistral, Qwen2). Softmax,
norms and logits run in float32 whatever the compute dtype.

KV cache. :func:`init_cache` allocates ``[L, B, S, K, Dh]`` buffers; calling the model with
``cache=`` writes the new keys/values at slot ``cache.index`` and attends over all valid
slots. Each layer reads its cache slice as a scan input and attends over two parts (the
cached keys and the new ones) with one softmax, so nothing is rewritten inside a layer; one
``dynamic_update_slice`` after the scan writes the new keys/values, so a jitted step that
donates the cache updates it in place. Keys are stored transposed, ``[L, B, K, Dh, S]`` (values
``[L, B, K, S, Dh]``): the decode scores then accumulate over ``Dh`` with vectors along the
slots, 2.5x faster on XLA:CPU than reducing over the innermost ``Dh``. The same call serves prefill (``T = prompt length``) and
decoding (``T = 1``).

Functional boundary (the library's convention): ``graphdef, params = nnx.split(model)``;
jitted code takes ``params`` and calls :func:`apply`, which merges inside.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any, Iterable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.core import stats as core_stats
from jaxrl_llm.models.attn import attention, softcap_logits, target_platform
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.parallel.sharding import DEFAULT_RULES, constrain, constrain_lookup, state_shardings

__all__ = [
    "LoRAParam",
    "KVCache",
    "MoE",
    "RouterStats",
    "load_balancing_loss",
    "router_mismatch",
    "softcap_logits",
    "SharedPrefix",
    "Transformer",
    "init_cache",
    "unstack_layers",
    "apply",
    "positions_from_mask",
    "positions_from_segments",
    "attention",
    "trainable",
    "init_sharded",
]

class LoRAParam(nnx.Variable):
    """LoRA adapter weights: with LoRA on, these are the only trainable variables."""


def trainable(cfg: ModelConfig):
    """NNX filter of the trained variables: the LoRA adapters when ``cfg.lora`` is set, else
    every ``nnx.Param``. ``graphdef, train, frozen = nnx.split(model, trainable(cfg), ...)``
    separates what the optimiser updates and checkpoints from the frozen base weights."""
    return LoRAParam if cfg.lora is not None else nnx.Param


class KVCache(NamedTuple):
    k: jax.Array  # [L, B, K, Dh, S]: keys transposed (decode scores accumulate over Dh along S)
    v: jax.Array  # [L, B, K, S, Dh]
    valid: jax.Array  # [B, S] bool: slot holds a real (non-padding) token
    index: jax.Array  # [] int32: next slot to write
    next_position: jax.Array  # [B] int32: rope position of the next real token of each row
    routes: Any = None  # mixture of experts: [B, S, L, k] int32 experts each slot's token was routed to
    # per-layer caches of sliding-window layers as rings of W slots (init_cache(ring=...)):
    ring_slots: Any = None  # [W] int32: the cache slot each ring position holds (-1: empty)
    ring_valid: Any = None  # [B, W] bool: the ring position holds a real token


class SharedPrefix(NamedTuple):
    """Every layer's keys/values of ``U`` prompts, each shared by ``r`` rows of a batch
    (:meth:`Transformer.encode_prefix`; the Prefix Grouper layout, arXiv 2506.05433).

    A call ``model(suffix_tokens [U * r, T], suffix_mask, prefix=prefix)`` runs only the
    suffixes: row ``i`` continues prompt ``i // r``, its queries attend to that prompt's keys
    (read once per prompt, never copied per row) and causally to its own suffix, at the slots
    and rope positions the concatenated sequence would have. Gradients flow back into the
    prompt's keys and values, so a loss on the suffixes trains the prompt positions too.
    """

    k: jax.Array  # [L, U, K, Dh, P]
    v: jax.Array  # [L, U, K, P, Dh]
    valid: jax.Array  # [U, P] bool: real prompt tokens
    next_position: jax.Array  # [U] int32: rope position of the first suffix token


RING_FAMILIES = ("gemma2", "gemma3")

class _Unroll(threading.local):
    def __init__(self):
        self.stack: list[bool] = []  # unrolled_layer_scan(): the planner's cost of every layer


_UNROLL = _Unroll()


class unrolled_layer_scan:  # noqa: N801 (a context manager)
    """``with unrolled_layer_scan():`` -- models traced inside (in this thread) unroll their layer
    scan (the same program without the loop). The planner compiles 1- and 2-layer copies this way:
    XLA's cost analysis counts a loop's body once, an unrolled program's every layer."""

    def __enter__(self):
        _UNROLL.stack.append(True)

    def __exit__(self, *exc):
        _UNROLL.stack.pop()


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype: Any | None = None,
               per_layer: bool = False, ring: bool | None = None) -> KVCache:
    """Empty cache for ``batch`` rows of up to ``max_len`` tokens (prompt + generated).

    ``per_layer=True``: ``k`` and ``v`` are tuples of ``L`` separate ``[B, K, S, Dh]``
    buffers, for the unrolled path (``model(..., layers=unstack_layers(...))``).

    ``ring`` (per-layer caches only): the sliding-window layers keep a ring of ``W`` slots (the
    window) instead of ``max_len``: their cache does not grow beyond the window. ``None``: on for
    the families of :data:`RING_FAMILIES` (Gemma), whose local layers are most of the model; off
    for the others (their decoding keeps its rounding: the attention then sums over fewer
    masked slots, equal to float rounding, not bit for bit).
    """
    dt = jnp.dtype(dtype or cfg.dtype)
    rows = (jnp.zeros((batch, max_len), bool), jnp.zeros((), jnp.int32), jnp.zeros((batch,), jnp.int32))
    routes = (jnp.zeros((batch, max_len, cfg.num_layers, cfg.num_experts_per_tok), jnp.int32)  # for routing replay
              if cfg.is_moe else None)
    kshape = (batch, cfg.num_kv_heads, cfg.head_dim, max_len)
    vshape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
    if per_layer:
        windows = cfg.layer_windows()
        w = int(windows.max())
        use_ring = (cfg.family in RING_FAMILIES if ring is None else bool(ring)) and 0 < w < max_len
        if use_ring and len(set(int(x) for x in windows if x > 0)) > 1:
            raise ValueError("init_cache(ring=True) needs one window size for all sliding-window layers")

        def size(i):
            return w if use_ring and windows[i] > 0 else max_len

        ring_rows = (jnp.full((w,), -1, jnp.int32), jnp.zeros((batch, w), bool)) if use_ring else (None, None)
        return KVCache(tuple(jnp.zeros(kshape[:-1] + (size(i),), dt) for i in range(cfg.num_layers)),
                       tuple(jnp.zeros(vshape[:2] + (size(i), cfg.head_dim), dt) for i in range(cfg.num_layers)),
                       *rows, routes, *ring_rows)
    if ring:
        raise ValueError("init_cache(ring=True) needs per_layer=True (the stacked cache has one length for all layers)")
    return KVCache(jnp.zeros((cfg.num_layers,) + kshape, dt), jnp.zeros((cfg.num_layers,) + vshape, dt), *rows,
                   routes)


def unstack_layers(params: Any) -> list[Any]:
    """Per-layer block states (separate buffers) from a model state's stacked ``blocks``.

    It costs one copy of the layer weights: call it once (outside a decode loop), not per
    step.
    """
    blocks = params["blocks"]
    n = jax.tree.leaves(blocks)[0].shape[0]
    return [jax.tree.map(lambda x, i=i: x[i], blocks) for i in range(n)]


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """Rope positions ``[B, T]`` of a padded batch: ``cumsum(mask) - 1``, 0 at leading pads."""
    m = jnp.asarray(mask).astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(m, axis=-1) - 1, 0)


def positions_from_segments(segment_ids: jax.Array) -> jax.Array:
    """Positions that restart at 0 at every new segment of a packed row ``[B, T]``."""
    seg = jnp.asarray(segment_ids)
    t = jnp.arange(seg.shape[-1])
    start = jnp.concatenate([jnp.ones_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], axis=-1)
    first = jax.lax.cummax(jnp.where(start, t, 0), axis=seg.ndim - 1)
    return (t - first).astype(jnp.int32)


def _write(buf: jax.Array, new: jax.Array, index: tuple) -> jax.Array:
    """``dynamic_update_slice`` that stays in place for 16-bit float buffers.

    XLA:CPU's float normalisation performs a bfloat16 ``dynamic_update_slice`` in float32:
    it converts the whole buffer (a layer's KV cache) to float32 and back on every decode
    step. On the bits (uint16, a free bitcast) the update is a plain in-place write.
    """
    new = new.astype(buf.dtype)
    # (XLA:CPU only: on TPU and GPU a 16-bit update is native, and the bitcasts made the TPU compiler
    # keep a second copy of a stacked cache)
    if buf.dtype in (jnp.bfloat16, jnp.float16) and target_platform() == "cpu":
        out = jax.lax.dynamic_update_slice(jax.lax.bitcast_convert_type(buf, jnp.uint16),
                                           jax.lax.bitcast_convert_type(new, jnp.uint16), index)
        return jax.lax.bitcast_convert_type(out, buf.dtype)
    return jax.lax.dynamic_update_slice(buf, new, index)


def _act(name: str):
    return {"silu": jax.nn.silu, "relu": jax.nn.relu, "gelu": lambda x: jax.nn.gelu(x, approximate=False),
            "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}[name]


def _normal(rngs: nnx.Rngs, shape, std, dtype):
    return (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)


def dense(x: jax.Array, w: jax.Array, n_in: int = 1, out_dtype: Any = jnp.float32) -> jax.Array:
    """``x . w`` contracting the last ``n_in`` axes of ``x`` with the first ``n_in`` of ``w``,
    accumulated in float32, computed as one 2-D matmul ``[M, K] x [K, N]``.

    Same numbers as the N-d ``lax.dot_general``; the 2-D form matters for the backward pass on
    XLA:CPU: for a ``[B, T, K]`` input it lays out the weight gradient ``dW = x^T dy`` (a
    contraction over the batch and sequence axes) by transposing ``dy``, and fuses the layer's
    elementwise backward (SiLU, the gating product) into that transposing loop, which ran at a
    fraction of memory speed. On SmolLM2-135M the gradient of the GRPO loss took 4.8-4.9 s with
    the N-d form and 4.1-4.4 s with this one (``benchmarks/backward_ab.py``, interleaved).

    ``out_dtype``: the product's dtype (the accumulation stays float32 on TPU and GPU; there a
    16-bit output halves the ``[tokens, features]`` buffers the layer keeps and recomputes).
    """
    k_shape, n_shape = w.shape[:n_in], w.shape[n_in:]
    if tuple(x.shape[x.ndim - n_in:]) != tuple(k_shape):
        raise ValueError(f"dense: the last {n_in} axes of x {x.shape} do not match the first of w {w.shape}")
    lead = x.shape[:x.ndim - n_in]
    k, n = math.prod(k_shape), math.prod(n_shape)
    y = jax.lax.dot_general(x.reshape(-1, k), w.reshape(k, n), (((1,), (0,)), ((), ())),
                            preferred_element_type=out_dtype)
    return y.reshape(tuple(lead) + tuple(n_shape))


def with_compute_dtype(model: nnx.Module, dtype: Any) -> nnx.Module:
    """``model`` (merged, e.g. inside a jitted function) set to compute in ``dtype``: every
    module's matmul-input / output dtype and ``model.cfg.dtype`` (the KV cache's dtype). The
    weights are not touched: cast them before merging (:func:`cast_floating`) to also store them
    in ``dtype``. Norms and softmaxes still compute in float32; matmuls accumulate in float32."""
    dt = jnp.dtype(dtype)
    for _, m in nnx.iter_modules(model):
        if isinstance(getattr(m, "dtype", None), jnp.dtype):
            m.dtype = dt
        cfg = getattr(m, "cfg", None)
        if isinstance(cfg, ModelConfig):
            m.cfg = dataclasses.replace(cfg, dtype=dt.name)
    return model


def cast_floating(tree: Any, dtype: Any) -> Any:
    """Every floating-point array leaf of ``tree`` cast to ``dtype`` (others unchanged)."""
    dt = jnp.dtype(dtype)
    return jax.tree.map(lambda x: x.astype(dt) if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)
                        else x, tree)


class Proj(nnx.Module):
    """``y = x . W (+ b)`` contracting the last ``len(in_shape)`` axes of ``x``, plus LoRA.

    LoRA (when ``target`` is in ``cfg.lora.targets``): ``y += s (x . A) . B`` with ``A`` of
    shape ``in_shape + (r,)`` ~ N(0, 1/fan_in), ``B`` of shape ``(r,) + out_shape`` zero.
    Matmuls take ``cfg.dtype`` inputs and accumulate in float32.
    """

    def __init__(self, in_shape, out_shape, in_axes, out_axes, *, bias: bool, cfg: ModelConfig,
                 rngs: nnx.Rngs, target: str | None = None, std: float = 0.02):
        pdt = jnp.dtype(cfg.param_dtype)
        self.n_in = len(in_shape)
        self.dtype = jnp.dtype(cfg.dtype)
        self.kernel = nnx.Param(_normal(rngs, tuple(in_shape) + tuple(out_shape), std, pdt),
                                logical_axes=tuple(in_axes) + tuple(out_axes))
        self.bias = nnx.Param(jnp.zeros(out_shape, pdt), logical_axes=tuple(out_axes)) if bias else None
        lora = cfg.lora
        if lora is not None and target in lora.targets:
            fan_in = int(np.prod(in_shape))
            self.lora_a = LoRAParam(_normal(rngs, tuple(in_shape) + (lora.rank,), 1.0 / math.sqrt(fan_in), pdt),
                                    logical_axes=tuple(in_axes) + ("lora_rank",))
            self.lora_b = LoRAParam(jnp.zeros((lora.rank,) + tuple(out_shape), pdt),
                                    logical_axes=("lora_rank",) + tuple(out_axes))
            self.lora_scale = float(lora.scale)
        else:
            self.lora_a = self.lora_b = None
            self.lora_scale = 0.0

    def _dot(self, x, w, narrow: bool = False):
        # ``narrow``: with a 16-bit compute dtype on an accelerator, the product leaves the matmul
        # unit in that dtype (accumulated in float32 inside it); otherwise, and on CPU always,
        # float32 (the same numbers as before)
        narrow = narrow and self.dtype.itemsize < 4 and target_platform() != "cpu"
        return dense(x.astype(self.dtype), w.astype(self.dtype), self.n_in, self.dtype if narrow else jnp.float32)

    def __call__(self, x):
        # rounded to the compute dtype once: in the matmul when nothing is added to it, else after
        y = self._dot(x, self.kernel[...], narrow=self.bias is None and self.lora_a is None)
        if self.bias is not None:
            y = y + self.bias[...].astype(jnp.float32)
        if self.lora_a is not None:
            xa = self._dot(x, self.lora_a[...])
            dims = (((xa.ndim - 1,), (0,)), ((), ()))
            y = y + self.lora_scale * jax.lax.dot_general(xa.astype(self.dtype), self.lora_b[...].astype(self.dtype),
                                                          dims, preferred_element_type=jnp.float32)
        return y.astype(self.dtype)

    def merged_kernel(self) -> jax.Array:
        """``W + s A B`` (float32): the kernel to export with the adapter folded in."""
        w = self.kernel[...].astype(jnp.float32)
        if self.lora_a is None:
            return w
        a, b = self.lora_a[...].astype(jnp.float32), self.lora_b[...].astype(jnp.float32)
        return w + self.lora_scale * jnp.tensordot(a, b, axes=1)


class Norm(nnx.Module):
    """RMSNorm (``x / sqrt(mean x^2 + eps) * w``) or LayerNorm, computed in float32."""

    def __init__(self, dim: int, cfg: ModelConfig, axis_name: str = "norm"):
        pdt = jnp.dtype(cfg.param_dtype)
        self.kind, self.eps, self.dtype = cfg.norm, float(cfg.norm_eps), jnp.dtype(cfg.dtype)
        self.offset = float(cfg.norm_offset)  # Gemma: (1 + w), weights stored around 0
        self.scale = nnx.Param(jnp.full((dim,), 1.0 - self.offset, pdt), logical_axes=(axis_name,))
        self.bias = nnx.Param(jnp.zeros((dim,), pdt), logical_axes=(axis_name,)) if cfg.norm == "layer" else None

    def __call__(self, x):
        x = x.astype(jnp.float32)
        if self.kind == "rms":
            y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps)
            w = self.scale[...].astype(jnp.float32)
            if self.offset:
                return (y * (self.offset + w)).astype(self.dtype)
            return (w * y).astype(self.dtype)
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
        y = (x - mu) * jax.lax.rsqrt(var + self.eps)
        return (y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)).astype(self.dtype)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos + rot * sin).astype(x.dtype)


class RouterStats(NamedTuple):
    """What a mixture-of-experts layer's router did, per layer (stacked ``[L, ...]`` from the model).

    ``choice [.., B, T, k]``: the experts the router's own top-k picks for each token (also under
    routing replay, where the replayed experts compute instead: comparing the two gives the
    mismatch rate). ``counts [.., E]``: own top-k assignments per expert over the real tokens;
    ``prob_sum [.., E]``: router probabilities summed over the real tokens (differentiable);
    ``tokens [..]``: the number of real tokens. The load-balancing loss is built from these
    (:func:`load_balancing_loss`). ``dropped [..]``: (real token, expert) assignments that
    skipped their expert for lack of capacity (0 when dropless)."""

    choice: jax.Array
    counts: jax.Array
    prob_sum: jax.Array
    tokens: jax.Array
    dropped: Any = 0.0


class MoE(nnx.Module):
    """Mixture of experts (Qwen3-MoE): a linear router, softmax in float32, top-k, optional
    renormalisation of the k weights (``norm_topk_prob``), and ``E`` gated experts stored stacked
    (gate/up ``[E, D, I]``, down ``[E, I, D]``) along the logical ``"expert"`` axis, which the
    sharding rules map to the ``expert`` mesh axis (expert parallelism).

    Two ways to compute the experts (``cfg.moe_capacity_factor``):

    - ``None``, dropless (the default; HF's semantics): every token reaches its k experts. The
      token-expert pairs are sorted by expert and each expert multiplies its contiguous rows
      (``jax.lax.ragged_dot``): grouped-matmul kernels on TPU and GPU compute only the k chosen
      experts' FLOPs. XLA:CPU lowers ``ragged_dot`` to a masked dense product, ``E / k`` times
      the FLOPs (right, but slow for large ``E``).
    - a capacity factor ``c``: in each sequence of ``T`` tokens, each expert takes at most
      ``C = ceil(c * T * k / E)`` of them (in token order; a token over capacity skips that
      expert, its other experts and the residual still count) into a ``[B, E, C, D]`` buffer,
      and the experts run as one batched matmul per projection, sharded over the ``expert``
      mesh axis (GShard-style expert parallelism: the buffer moves from the batch's devices to
      the experts' and back; XLA inserts the exchanges). ``c >= E / k`` never drops. Padding
      positions take no capacity (and get no expert output). A decode step (``T = 1``) never
      drops, while a training forward over a whole sequence may: with drops, the sampler's and
      the trainer's log-probs differ by more than rounding (``moe/dropped_fraction`` shows it). The
      dropless path's sort runs over the whole batch at once, which XLA does not split over
      devices: at scale, with an expert axis, use a capacity.

    ``replay [B, T, k]``: use these experts instead of the router's choice (routing replay);
    their weights are the router's probabilities at those experts, normalised as usual.
    """

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, e, f = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
        pdt = jnp.dtype(cfg.param_dtype)
        self.k, self.e, self.norm_topk = int(cfg.num_experts_per_tok), int(e), bool(cfg.norm_topk_prob)
        self.dtype, self.act = jnp.dtype(cfg.dtype), cfg.activation
        self.capacity_factor = cfg.moe_capacity_factor
        self.router = Proj((d,), (e,), ("embed",), ("expert_router",), bias=False, cfg=cfg, rngs=rngs)
        self.gate = nnx.Param(_normal(rngs, (e, d, f), 0.02, pdt), logical_axes=("expert", "embed", "mlp"))
        self.up = nnx.Param(_normal(rngs, (e, d, f), 0.02, pdt), logical_axes=("expert", "embed", "mlp"))
        self.down = nnx.Param(_normal(rngs, (e, f, d), 0.02, pdt), logical_axes=("expert", "mlp", "embed"))

    def __call__(self, x, mask, replay=None):
        b, t, d = x.shape
        n, k = b * t, self.k
        xf = x.reshape(n, d)
        probs = jax.nn.softmax(self.router(xf).astype(jnp.float32), axis=-1)  # [n, E]
        top_w, top_i = jax.lax.top_k(probs, k)
        if replay is None:
            chosen, w = top_i, top_w
        else:
            chosen = jnp.asarray(replay, jnp.int32).reshape(n, k)
            w = jnp.take_along_axis(probs, chosen, axis=-1)
        if self.norm_topk:
            w = w / jnp.sum(w, axis=-1, keepdims=True)
        real = jnp.asarray(mask).reshape(n).astype(jnp.float32)
        if self.capacity_factor is None:
            out, dropped = self._dropless(xf, chosen, w).reshape(b, t, d), jnp.zeros((), jnp.float32)
        else:
            out, dropped = self._capacity(x, chosen.reshape(b, t, k), w.reshape(b, t, k), real.reshape(b, t))
        counts = jnp.bincount(top_i.reshape(-1), weights=jnp.repeat(real, k), length=self.e)
        stats = RouterStats(top_i.reshape(b, t, k), counts, jnp.sum(probs * real[:, None], axis=0), jnp.sum(real),
                            dropped)
        return out, stats

    def _dropless(self, xf, chosen, w):
        """``[n, D]``: the token-expert pairs sorted by expert, each expert's rows multiplied by its
        weights (``ragged_dot``), weighted, summed back per token."""
        n, d = xf.shape
        k, dt = self.k, self.dtype
        flat = chosen.reshape(-1)
        order = jnp.argsort(flat, stable=True)
        sizes = jnp.bincount(flat, length=self.e).astype(jnp.int32)
        xs = jnp.take(xf, order // k, axis=0).astype(dt)

        def rdot(a, wt):
            return jax.lax.ragged_dot(a, wt.astype(dt), sizes, preferred_element_type=jnp.float32)

        hid = (_act(self.act)(rdot(xs, self.gate[...])) * rdot(xs, self.up[...])).astype(dt)
        return self._combine(rdot(hid, self.down[...]).astype(dt), order, w)

    def _combine(self, y, order, w):
        """Expert outputs ``y [n * k, D]`` in expert-sorted ``order``: weighted by the routing
        weights ``w [n, k]``, back in token order and summed over each token's k experts."""
        k, dt = self.k, self.dtype
        y = y * jnp.take(w.reshape(-1), order).astype(dt)[:, None]
        y = jnp.zeros_like(y).at[order].set(y).reshape(-1, k, y.shape[-1])
        return jnp.sum(y.astype(jnp.float32), axis=1).astype(dt)

    def _capacity(self, x, chosen, w, real):
        """``([B, T, D], dropped)``: per sequence, each expert takes at most
        ``C = ceil(c * T * k / E)`` of its tokens (in token order) into a ``[B, E, C, D]`` buffer
        (built where the rows are: split over the batch axes), which moves to the experts'
        devices (split over ``expert``) for one batched matmul per projection, and back."""
        b, t, d = x.shape
        e, k, dt = self.e, self.k, self.dtype
        cap = max(1, min(t * k, math.ceil(self.capacity_factor * t * k / e)))

        def dispatch(xr, er, rr):  # one sequence: xr [T, D], er [T, k], rr [T] real tokens
            # padding sorts last (key E) and takes no capacity: real tokens keep their places
            flat = jnp.where(jnp.repeat(rr > 0, k), er.reshape(-1), e)
            order = jnp.argsort(flat, stable=True)
            expert = jnp.take(flat, order)
            sizes = jnp.bincount(flat, length=e + 1)
            pos = jnp.arange(t * k, dtype=jnp.int32) - jnp.take(jnp.cumsum(sizes) - sizes, expert)
            keep = (expert < e) & (pos < cap)
            slot = jnp.where(keep, expert * cap + pos, e * cap)  # e * cap: out of range, dropped
            rows = jnp.take(xr, order // k, axis=0).astype(dt)
            buf = jnp.zeros((e * cap, d), dt).at[slot].set(rows, mode="drop").reshape(e, cap, d)
            return buf, order, slot, keep

        buf, order, slot, keep = jax.vmap(dispatch)(x, chosen, real)
        # expert-major on the experts' devices: [E, B, C, D]
        buf = constrain(buf.transpose(1, 0, 2, 3), ("act_expert", "act_batch_no_expert", None, "act_embed"))

        def bdot(a, wt, spec):
            return jnp.einsum(spec, a, wt.astype(dt), preferred_element_type=jnp.float32)

        hid = (_act(self.act)(bdot(buf, self.gate[...], "ebcd,edf->ebcf"))
               * bdot(buf, self.up[...], "ebcd,edf->ebcf")).astype(dt)
        hid = constrain(hid, ("act_expert", "act_batch_no_expert", None, "act_mlp"))
        out = bdot(hid, self.down[...], "ebcf,efd->ebcd").astype(dt)
        out = constrain(out.transpose(1, 0, 2, 3), ("act_batch", None, None, "act_embed"))

        def combine(o, order_r, slot_r, w_r):
            return self._combine(jnp.take(o.reshape(e * cap, d), slot_r, axis=0, mode="fill", fill_value=0),
                                 order_r, w_r)

        y = jax.vmap(combine)(out, order, slot, w)
        lost = jnp.where(keep, 0.0, jnp.take_along_axis(real, order // k, axis=1))
        return y, jnp.sum(lost)


def load_balancing_loss(stats: RouterStats) -> jax.Array:
    """Switch-Transformer load-balancing loss of a model's stacked :class:`RouterStats`, as HF's
    ``load_balancing_loss_func`` (transformers 5) computes it over all layers:
    ``E * sum_e f_e P_e`` with ``f_e`` = assignments to expert ``e`` per real token and ``P_e``
    its mean router probability, both pooled over layers and real tokens."""
    rows = jnp.maximum(jnp.sum(stats.tokens), 1.0)
    f = jnp.sum(stats.counts, axis=0) / rows
    p = jnp.sum(stats.prob_sum, axis=0) / rows
    return stats.counts.shape[-1] * jnp.sum(f * p)


def router_mismatch(stats: RouterStats, replayed: jax.Array, mask: jax.Array) -> jax.Array:
    """Fraction of (real token, layer) pairs whose router's own top-k expert set differs from
    the replayed one. ``replayed [B, T, L, k]`` (the batch layout), ``mask [B, T]``."""
    own = jnp.sort(jnp.moveaxis(stats.choice, 0, 2), axis=-1)  # [B, T, L, k]
    rep = jnp.sort(jnp.asarray(replayed, jnp.int32), axis=-1)
    differ = jnp.any(own != rep, axis=-1).astype(jnp.float32)  # [B, T, L]
    return core_stats.masked_mean(differ, jnp.broadcast_to(jnp.asarray(mask, bool)[:, :, None], differ.shape))


class Block(nnx.Module):
    """One pre-norm decoder layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``; with
    ``cfg.post_norms`` (Gemma) the attention and MLP outputs are normalised too before their
    residual adds; with ``cfg.num_experts`` the MLP is a :class:`MoE`."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, h, kh, dh, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
        p = dict(cfg=cfg, rngs=rngs)
        self.attn_norm = Norm(d, cfg)
        self.q = Proj((d,), (h, dh), ("embed",), ("heads", "head_dim"), bias=cfg.qkv_bias, target="q", **p)
        self.k = Proj((d,), (kh, dh), ("embed",), ("kv_heads", "head_dim"), bias=cfg.qkv_bias, target="k", **p)
        self.v = Proj((d,), (kh, dh), ("embed",), ("kv_heads", "head_dim"), bias=cfg.qkv_bias, target="v", **p)
        self.o = Proj((h, dh), (d,), ("heads", "head_dim"), ("embed",), bias=cfg.o_bias, target="o", **p)
        self.q_norm = Norm(dh, cfg) if cfg.qk_norm else None
        self.k_norm = Norm(dh, cfg) if cfg.qk_norm else None
        self.post_attn_norm = Norm(d, cfg) if cfg.post_norms else None
        self.mlp_norm = Norm(d, cfg)
        self.post_mlp_norm = Norm(d, cfg) if cfg.post_norms else None
        self.moe = MoE(cfg, rngs) if cfg.is_moe else None
        dense = not cfg.is_moe
        self.gate = Proj((d,), (f,), ("embed",), ("mlp",), bias=cfg.mlp_bias, target="gate", **p) \
            if cfg.gated_mlp and dense else None
        self.up = Proj((d,), (f,), ("embed",), ("mlp",), bias=cfg.mlp_bias, target="up", **p) if dense else None
        self.down = Proj((f,), (d,), ("mlp",), ("embed",), bias=cfg.mlp_bias, target="down", **p) if dense else None
        self.act = cfg.activation
        self.rope = cfg.position == "rope"
        self.attn_scale = None if cfg.query_pre_attn_scalar is None else cfg.attn_scale
        self.attn_softcap = cfg.attn_softcap
        # the attention implementation (models/attn.py) and what it needs to know statically
        # (a tuple of pairs: a module's static attributes are part of its hashable graph)
        self.attn_impl = (("impl", cfg.attention), ("block_q", cfg.attention_block),
                          ("block_k", cfg.attention_block), ("static_window", cfg.sliding_window))

    def __call__(self, x, cos, sin, kv_parts, moe_mask=None, replay=None, **attn_kw):
        hn = self.attn_norm(x)
        q = constrain(self.q(hn), ("act_batch", "act_seq", "act_heads", None))
        k = constrain(self.k(hn), ("act_batch", "act_seq", "act_kv_heads", None))
        v = constrain(self.v(hn), ("act_batch", "act_seq", "act_kv_heads", None))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            q, k = _rotate(q, cos[:, :, None], sin[:, :, None]), _rotate(k, cos[:, :, None], sin[:, :, None])
        if self.attn_scale is not None:
            attn_kw["scale"] = self.attn_scale
        if self.attn_softcap is not None:
            attn_kw["softcap"] = self.attn_softcap
        a = attention(q, kv_parts(k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)), **attn_kw, **dict(self.attn_impl))
        a = self.o(a)
        if self.post_attn_norm is not None:
            a = self.post_attn_norm(a)
        x = constrain(x + a, ("act_batch", "act_seq", "act_embed"))
        hn = self.mlp_norm(x)
        if self.moe is not None:
            m, stats = self.moe(hn, moe_mask, replay)
            if self.post_mlp_norm is not None:
                m = self.post_mlp_norm(m)
            return constrain(x + m, ("act_batch", "act_seq", "act_embed")), stats
        u = self.up(hn)
        u = _act(self.act)(self.gate(hn)) * u if self.gate is not None else _act(self.act)(u)
        u = constrain(u, ("act_batch", "act_seq", "act_mlp"))
        m = self.down(u)
        if self.post_mlp_norm is not None:
            m = self.post_mlp_norm(m)
        return constrain(x + m, ("act_batch", "act_seq", "act_embed"))


class Transformer(nnx.Module):
    """Decoder-only transformer with an LM head (``head="lm"``) or a score head
    (``head="score"``: ``[D, num_labels]``, the value / reward head of HF
    ``*ForSequenceClassification`` models).

    ``__call__`` returns ``(hidden [B, T, D], cache)``: the final-norm hidden states, so that
    callers choose what to compute from them -- :meth:`logits` for a few positions,
    :func:`jaxrl_llm.models.logprobs.token_logprobs` for chunked log-probs of given tokens
    (never the whole ``[B, T, V]``), :meth:`scores` for the score head.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, head: str = "lm"):
        if head not in ("lm", "score"):
            raise ValueError(f"argument 'head' must be 'lm' or 'score', got {head!r}")
        self.cfg = cfg
        self.head = head
        pdt = jnp.dtype(cfg.param_dtype)
        self.embed = nnx.Param(_normal(rngs, (cfg.vocab_size, cfg.hidden_size), 0.02, pdt),
                               logical_axes=("vocab", "embed"))
        self.pos_embed = nnx.Param(_normal(rngs, (cfg.max_position_embeddings, cfg.hidden_size), 0.01, pdt),
                                   logical_axes=("positions", "embed")) if cfg.position == "learned" else None

        @nnx.split_rngs(splits=cfg.num_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make_blocks(r):
            return Block(cfg, r)

        self.blocks = make_blocks(rngs)
        self.final_norm = Norm(cfg.hidden_size, cfg)
        self.lm_head = Proj((cfg.hidden_size,), (cfg.vocab_size,), ("embed",), ("vocab",), bias=False, cfg=cfg,
                            rngs=rngs) if head == "lm" and not cfg.tie_embeddings else None
        self.score = Proj((cfg.hidden_size,), (cfg.num_labels,), ("embed",), ("labels",), bias=False, cfg=cfg,
                          rngs=rngs) if head == "score" else None

    # ------------------------------------------------------------------ forward
    def encode_prefix(self, tokens, mask=None) -> tuple[jax.Array, SharedPrefix]:
        """Final-norm hidden states ``[U, P, D]`` of ``U`` (left-padded) prompts and their
        :class:`SharedPrefix` (every layer's keys/values), for ``model(suffix, prefix=...)``."""
        return self(tokens, mask, _collect_prefix=True)

    def __call__(self, tokens, mask=None, positions=None, segment_ids=None, cache: KVCache | None = None,
                 layers: Sequence[Any] | None = None, prefix: SharedPrefix | None = None,
                 _collect_prefix: bool = False, routes: jax.Array | None = None, return_routing: bool = False,
                 exit_layer: jax.Array | int | None = None):
        """Final-norm hidden states ``[B, T, D]`` and the updated cache.

        ``exit_layer``: the residual stream after the first ``exit_layer`` decoder layers instead,
        without the final norm, as Hugging Face's ``hidden_states[exit_layer]`` (an internal
        layer's policy, BuPO; a scalar, may be traced: the later layers run as the identity and
        get no gradient; ``exit_layer >= num_layers``: the ordinary normed output, like HF's last
        entry). Only without a cache, a shared
        prefix, packed segments or ``layers=``.

        Mixture of experts: ``routes [B, T, L, k]`` replays these experts instead of the
        routers' choices (routing replay: the experts the sampler used); ``return_routing=True``
        returns a third value, the stacked :class:`RouterStats` ``[L, ...]`` (choices, and the
        load-balancing statistics). A cache records every token's experts (``cache.routes``).

        ``prefix``: the rows continue shared prompts (:class:`SharedPrefix`, ``B`` a multiple of
        its ``U`` prompts); the second return value is then ``None``. With ``cache=`` too, the
        rows decode continuations of those prompts: the cache holds only each row's own tokens
        (its slots follow the prompt's ``P`` slots, its ``next_position`` counts the prompt), and
        every layer reads a prompt's keys once for its rows (``layers=`` then takes a per-layer
        prefix, tuples of ``k`` / ``v``).

        ``layers``: per-layer block states (:func:`unstack_layers`) to run the layers as an
        unrolled Python loop over separate buffers instead of the scan over the stacked
        parameters; the cache must then be per-layer too (``init_cache(..., per_layer=True)``).
        Same numbers; on XLA:CPU it avoids copying every layer's weights out of the stack at
        every step (XLA cannot alias a slice of a buffer), which dominates decoding there.
        """
        cfg = self.cfg
        tokens = jnp.asarray(tokens)
        if tokens.ndim != 2:
            raise ValueError(f"argument 'tokens' must be [B, T] ints, got shape {tokens.shape}")
        b, t = tokens.shape
        mask = jnp.ones((b, t), bool) if mask is None else jnp.asarray(mask).astype(bool)
        if mask.shape != (b, t):
            raise ValueError(f"argument 'mask' must have shape {(b, t)} (tokens'), got {mask.shape}")
        if segment_ids is not None and cache is not None:
            raise ValueError("segment_ids (packed sequences) cannot be combined with a KV cache")
        if prefix is not None:
            if segment_ids is not None:
                raise ValueError("prefix= (shared prompts) cannot be combined with segment_ids=")
            if layers is not None and cache is None:
                raise ValueError("prefix= with layers= (unrolled) needs cache= (decoding continuations of the prompts)")
            n_pre = prefix.valid.shape[0]
            if b % n_pre:
                raise ValueError(f"prefix= holds {n_pre} prompts, which must divide the {b} rows of 'tokens'")
            rows_per_prefix = b // n_pre
        if positions is None:
            if cache is not None:  # with prefix=: the cache's rope positions already count the prompt
                positions = cache.next_position[:, None] + positions_from_mask(mask) * mask
            elif prefix is not None:
                positions = (jnp.repeat(prefix.next_position, rows_per_prefix)[:, None]
                             + positions_from_mask(mask) * mask)
            elif segment_ids is not None:
                positions = positions_from_segments(segment_ids)
            else:
                positions = positions_from_mask(mask)
        positions = jnp.asarray(positions, jnp.int32)
        dt = jnp.dtype(cfg.dtype)
        emb = jnp.take(self.embed[...], tokens, axis=0)
        if cfg.embed_scale:  # Gemma: sqrt(hidden) in the embedding's dtype, as HF
            emb = emb * jnp.asarray(cfg.hidden_size ** 0.5, emb.dtype)
        x = constrain_lookup(emb.astype(dt))
        x = constrain(x, ("act_batch", "act_seq", "act_embed"))
        cos = sin = None
        if cfg.position == "learned":
            x = x + jnp.take(self.pos_embed[...], positions, axis=0).astype(dt)
        else:
            inv, att = cfg.rope()
            freqs = positions[..., None].astype(jnp.float32) * jnp.asarray(inv)
            emb = jnp.concatenate([freqs, freqs], axis=-1)
            cos, sin = (jnp.cos(emb) * att).astype(dt), (jnp.sin(emb) * att).astype(dt)
            local_inv = cfg.local_rope()
            if local_inv is not None:  # Gemma 3: the sliding-window layers have their own base
                lf = positions[..., None].astype(jnp.float32) * jnp.asarray(local_inv)
                lemb = jnp.concatenate([lf, lf], axis=-1)
                cos, sin = jnp.stack([cos, jnp.cos(lemb).astype(dt)]), jnp.stack([sin, jnp.sin(lemb).astype(dt)])

        slots = jnp.arange(t)
        seg = None if segment_ids is None else jnp.asarray(segment_ids)
        attn_kw = dict(q_seg=seg, q_valid=mask)
        # slots of the cache follow the shared prompt's P slots when both are given
        p_len = prefix.valid.shape[1] if prefix is not None else 0

        def after_prefix(x):  # the same program as before when there is no prefix
            return p_len + x if p_len else x

        if cache is None:  # static slots (an int start): what lets splash attention build its masks
            attn_kw["q_slot"] = p_len
        else:
            attn_kw["q_slot"] = after_prefix(cache.index + slots)
            per_layer = isinstance(cache.k, (tuple, list))
            old_slots = jnp.arange(cache.valid.shape[1] if per_layer else cache.v.shape[3])
            new_valid = jax.lax.dynamic_update_slice(cache.valid, mask, (0, cache.index))
            if cache.ring_slots is not None:  # sliding-window layers' rings: the last m new tokens go in
                ring_w = cache.ring_slots.shape[0]
                ring_m = min(t, ring_w)
                ring_abs = cache.index + t - ring_m + jnp.arange(ring_m, dtype=jnp.int32)
                ring_pos = ring_abs % ring_w
                new_ring_slots = cache.ring_slots.at[ring_pos].set(ring_abs)
                new_ring_valid = cache.ring_valid.at[:, ring_pos].set(mask[:, t - ring_m:])

        if exit_layer is not None and (cache is not None or prefix is not None or layers is not None
                                       or segment_ids is not None or _collect_prefix):
            raise ValueError("exit_layer= (an internal layer's output) runs the stacked layers without a cache, "
                             "a shared prefix, packed segments or layers=")
        if layers is not None and cache is not None and not isinstance(cache.k, (tuple, list)):
            raise ValueError("layers= (unrolled) needs a per-layer cache: init_cache(..., per_layer=True)")
        if layers is None and cache is not None and isinstance(cache.k, (tuple, list)):
            raise ValueError("a per-layer cache needs layers=unstack_layers(...)")
        windows = cfg.layer_windows()
        two_ropes = cfg.position == "rope" and cfg.local_rope_theta is not None
        if routes is not None:
            if not cfg.is_moe:
                raise ValueError("routes= (routing replay) needs a mixture-of-experts model (cfg.num_experts > 0)")
            want = (b, t, cfg.num_layers, cfg.num_experts_per_tok)
            if tuple(routes.shape) != want:
                raise ValueError(f"argument 'routes' must have shape [B, T, L, k] = {want}, got {tuple(routes.shape)}")
        replay_xs = None if routes is None else jnp.moveaxis(jnp.asarray(routes, jnp.int32), 2, 0)  # [L, B, T, k]

        def run_block(block, h, win, extra, layer_k, layer_v, pre_k=None, pre_v=None):
            new = []

            def kv_parts(k, v):  # k: [B, K, Dh, T], v: [B, K, T, Dh]
                if prefix is not None and cache is None:  # layer_k / layer_v: this layer's prompt keys/values
                    return [(layer_k, layer_v, 0, prefix.valid, None, rows_per_prefix), (k, v, p_len, mask, None)]
                # decoding continuations of shared prompts: the prompt part, read once per prompt
                shared = [] if prefix is None else [(pre_k, pre_v, jnp.arange(p_len), prefix.valid, None,
                                                     rows_per_prefix)]
                if _collect_prefix:
                    new.extend([k, v])
                if cache is None:
                    return [(k, v, 0, mask, seg)]
                k, v = k.astype(layer_k.dtype), v.astype(layer_v.dtype)
                if per_layer and cache.ring_slots is not None and win > 0:
                    # a sliding-window layer's ring of W slots (slot s at position s % W)
                    if t == 1:  # decoding: write first (in place), then read the ring, the new token included
                        k = _write(layer_k, k, (0, 0, 0, ring_pos[0]))
                        v = _write(layer_v, v, (0, 0, ring_pos[0], 0))
                        new.extend([k, v])
                        return shared + [(k, v, after_prefix(new_ring_slots), new_ring_valid, None)]
                    # several tokens: the ring as it was and the new keys, then the last W go in
                    new.extend([layer_k.at[..., ring_pos].set(k[..., t - ring_m:]),
                                layer_v.at[:, :, ring_pos, :].set(v[:, :, t - ring_m:, :])])
                    return shared + [(layer_k, layer_v, after_prefix(cache.ring_slots), cache.ring_valid, None),
                                     (k, v, after_prefix(cache.index + slots), mask, None)]
                if per_layer:
                    # separate buffers: write first, then read the updated buffer, so the update
                    # is the buffer's only user and XLA does it in place (no per-step copy)
                    k = _write(layer_k, k, (0, 0, 0, cache.index))
                    v = _write(layer_v, v, (0, 0, cache.index, 0))
                    new.extend([k, v])
                    return shared + [(k, v, after_prefix(old_slots), new_valid, None)]
                new.extend([k, v])
                # stacked: cached slots (those before cache.index are valid) + the new tokens
                return shared + [(layer_k, layer_v, after_prefix(old_slots),
                                  cache.valid & (old_slots < cache.index)[None], None),
                                 (k, v, after_prefix(cache.index + slots), mask, None)]

            c, sn = cos, sin
            if two_ropes:  # sliding-window layers take the local rope table
                if isinstance(win, (int, np.integer)):  # unrolled: chosen in Python
                    c, sn = (cos[1], sin[1]) if win > 0 else (cos[0], sin[0])
                else:
                    c, sn = jnp.where(win > 0, cos[1], cos[0]), jnp.where(win > 0, sin[1], sin[0])
            stats = None
            attn_win = None if cfg.sliding_window is None else win  # no window: every layer attends causally
            if cfg.is_moe:
                h, stats = block(h, c, sn, kv_parts, window=attn_win, moe_mask=mask, replay=extra.get("replay"),
                                 **attn_kw)
            else:
                h = block(h, c, sn, kv_parts, window=attn_win, **attn_kw)
            return h, ((tuple(new) if cache is not None or _collect_prefix else None), stats)

        if layers is None:
            gd, layer_state = nnx.split(self.blocks)

            def body(h, xs):
                st, win, extra, *layer_kv = xs
                out, rest = run_block(nnx.merge(gd, st), h, win, extra, *layer_kv)
                if exit_layer is not None:  # layers from exit_layer on: the identity
                    out = jnp.where(extra["index"] < exit_layer, out, h)
                return out, rest

            if cfg.remat != "none":
                policy = None if cfg.remat == "full" else jax.checkpoint_policies.dots_with_no_batch_dims_saveable
                body = jax.checkpoint(body, policy=policy)
            cache_xs = (cache.k, cache.v) if cache is not None else (
                (prefix.k, prefix.v) if prefix is not None else (None, None))
            if cache is not None and prefix is not None:
                cache_xs += (prefix.k, prefix.v)
            # The cache enters the scan as per-layer inputs, is only read inside a layer, and
            # the new [L, B, K, T, Dh] keys/values come out; one update below writes them.
            extra = {} if replay_xs is None else {"replay": replay_xs}
            if exit_layer is not None:
                extra["index"] = jnp.arange(cfg.num_layers, dtype=jnp.int32)
            h, (new_kv, router) = jax.lax.scan(body, x, (layer_state, jnp.asarray(windows), extra) + cache_xs,
                                               unroll=bool(_UNROLL.stack and _UNROLL.stack[-1]))
        else:
            if len(layers) != cfg.num_layers:
                raise ValueError(f"argument 'layers' must hold {cfg.num_layers} layer states, got {len(layers)}")
            gd = nnx.graphdef(self.blocks)
            h, new_k, new_v, per_stats = x, [], [], []
            for i, st in enumerate(layers):
                lk, lv = (cache.k[i], cache.v[i]) if cache is not None else (None, None)
                pk, pv = (prefix.k[i], prefix.v[i]) if prefix is not None else (None, None)
                extra = {} if replay_xs is None else {"replay": replay_xs[i]}
                h, (kv, st_i) = run_block(nnx.merge(gd, st), h, int(windows[i]), extra, lk, lv, pk, pv)
                per_stats.append(st_i)
                if kv is not None:
                    new_k.append(kv[0])
                    new_v.append(kv[1])
            new_kv = (new_k, new_v) if cache is not None else None
            router = jax.tree.map(lambda *xs: jnp.stack(xs), *per_stats) if cfg.is_moe else None
        if exit_layer is None:
            h = self.final_norm(h)
        else:  # every layer: the ordinary (normed) output, as the last of HF's hidden_states
            h = jnp.where(exit_layer >= cfg.num_layers, self.final_norm(h), h)
        new_cache = None
        if _collect_prefix:
            if layers is not None or cache is not None:
                raise ValueError("encode_prefix runs the stacked layers without a cache")
            return h, SharedPrefix(new_kv[0], new_kv[1], mask, jnp.sum(mask, axis=-1).astype(jnp.int32))
        if cache is not None:
            if layers is None:
                ck = _write(cache.k, new_kv[0], (0, 0, 0, 0, cache.index))
                cv = _write(cache.v, new_kv[1], (0, 0, 0, cache.index, 0))
            else:  # already updated inside the layers
                ck, cv = tuple(new_kv[0]), tuple(new_kv[1])
            new_routes = cache.routes
            if cache.routes is not None and router is not None:
                new_routes = jax.lax.dynamic_update_slice(
                    cache.routes, jnp.moveaxis(router.choice, 0, 2).astype(jnp.int32), (0, cache.index, 0, 0))
            rings = (new_ring_slots, new_ring_valid) if cache.ring_slots is not None else (None, None)
            new_cache = KVCache(ck, cv, new_valid, cache.index + t,
                                cache.next_position + jnp.sum(mask, axis=-1).astype(jnp.int32), new_routes, *rings)
        if return_routing:
            if router is None:
                raise ValueError("return_routing=True needs a mixture-of-experts model (cfg.num_experts > 0)")
            return h, new_cache, router
        return h, new_cache

    # ------------------------------------------------------------------ heads
    def unembedding(self) -> jax.Array:
        """``[D, V]`` output projection (the transposed embedding when tied)."""
        if self.head != "lm":
            raise ValueError("this model has a score head, not an LM head")
        if self.lm_head is None:
            return self.embed[...].T
        return self.lm_head.merged_kernel() if self.lm_head.lora_a is not None else self.lm_head.kernel[...]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """float32 logits ``[..., V]`` of final hidden states (use on few positions only),
        soft-capped when ``cfg.final_softcap`` is set."""
        w = self.unembedding()
        dt = jnp.dtype(self.cfg.dtype)
        z = jnp.einsum("...d,dv->...v", hidden.astype(dt), w.astype(dt), preferred_element_type=jnp.float32)
        return softcap_logits(z, self.cfg.final_softcap)

    @property
    def final_softcap(self) -> float | None:
        """The output logits' soft-cap (Gemma 2), for code that forms logits from
        :meth:`unembedding` itself (pass it as ``token_logprobs(..., softcap=)``)."""
        return self.cfg.final_softcap

    def scores(self, hidden: jax.Array) -> jax.Array:
        """float32 score-head outputs ``[..., num_labels]`` (value per token, or pool first)."""
        if self.score is None:
            raise ValueError("this model has no score head (create it with head='score')")
        return self.score(hidden).astype(jnp.float32)


def apply(graphdef: nnx.GraphDef, params: Any, tokens, mask=None, positions=None, segment_ids=None,
          cache: KVCache | None = None, *others: Any, layers: Sequence[Any] | None = None):
    """Functional forward: ``nnx.merge(graphdef, params, *others)(tokens, ...)``.

    ``others`` are further state parts of the split (e.g. the frozen base weights when
    ``params`` holds only the LoRA adapters).
    """
    model = nnx.merge(graphdef, params, *others)
    return model(tokens, mask=mask, positions=positions, segment_ids=segment_ids, cache=cache, layers=layers)


def init_sharded(cfg: ModelConfig, mesh: jax.sharding.Mesh, seed: int = 0,
                 rules: Iterable[tuple[str, Any]] = DEFAULT_RULES, *, head: str = "lm") -> Transformer:
    """A freshly initialised ``Transformer(cfg, head=head)`` whose variables are created directly in
    their shards on ``mesh`` (one jitted initialiser with ``out_shardings``): no device ever
    holds a whole unsharded copy, which is what lets a model larger than one device start.
    The values of ``Transformer(cfg, rngs=nnx.Rngs(seed))`` up to float rounding: the
    jitted initialiser differs from the eager one in the last bit (<= 7.5e-9 measured on
    ``preset("tiny")``), so a run is reproducible against itself, not against an eager init.

    Also importable as ``jaxrl_llm.parallel.init_sharded`` (its former home)."""

    def build():
        return nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed), head=head))[1]

    gd, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(seed), head=head)))
    state = jax.jit(build, out_shardings=state_shardings(abstract, mesh, rules))()
    return nnx.merge(gd, state)

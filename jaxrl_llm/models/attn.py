"""Attention: one call, several implementations.

The model calls :func:`attention` once per layer with its queries, the key/value *parts* it
attends to (its own keys, a shared prompt's keys, a KV cache) and a description of the mask
(slots for causality, validity, segment ids, a sliding window, a soft-cap). No
``[B, H, T, S]`` mask is ever built by the caller. The implementation is a name:

- ``"dense"``: the scores of every part at once, one joint softmax (the model's original
  computation, kept bit for bit). Memory ``O(B H T S)``.
- ``"blockwise"``: pure JAX, on every backend. Online softmax over key blocks (the
  FlashAttention recurrence: a running maximum, a running sum and a rescaled accumulator),
  one query block at a time, and a hand-written backward pass (``jax.custom_vjp``) that
  recomputes each block's probabilities from the saved log-sum-exp instead of storing them.
  Memory ``O(B H (block_q block_k + T Dh))`` in both passes. Blocks that the causal order, the
  window, the keys' validity or the segment ids rule out entirely are skipped at run time.
- ``"splash"``: Pallas TPU splash attention
  (``jax.experimental.pallas.ops.tpu.splash_attention``): lazy causal / local masks, segment ids,
  grouped-query heads through its multi-query kernel, soft-capping. Under a mesh it runs inside
  ``shard_map`` over the batch and head axes (a Pallas kernel is not partitioned automatically).
  Parts with run-time slots (a KV cache) use ``blockwise``. On CPU it runs in Pallas interpret
  mode (tests only: it is slow).
- ``"cudnn"``: ``jax.nn.dot_product_attention(implementation="cudnn")`` on GPU, for one part
  of own keys without soft-cap or segment ids (its API has neither); each row's contiguous
  run of real tokens is moved to the front so that the padding is expressed by sequence
  lengths. Other calls use ``blockwise``.
- ``"auto"``: ``splash`` on TPU, ``cudnn`` on GPU, on CPU ``dense`` while the keys number at
  most :data:`AUTO_DENSE_MAX_KEYS` (so every run at the lengths recorded so far keeps its numbers)
  or the call's scores are few (a decode step of a few rows), ``blockwise`` above; a call the
  platform's kernel cannot take (decoding over a KV cache, packed rows or float32 under cuDNN) by
  the CPU rule.

Conventions shared by all implementations (those of the model's KV cache): ``q [B, T, H, Dh]``,
query head ``k * G + g`` reads key head ``k``; a part is ``(k, v, k_slot, k_valid, k_seg[,
rows])`` with keys transposed ``k [B', K, Dh, S]``, values ``v [B', K, S, Dh]``; ``k_slot`` is a
``[S]`` int array or a static ``int`` (the slots ``start, start + 1, ...``, what lets ``splash``
build its masks at trace time); ``rows > 1`` marks keys shared by that many consecutive query
rows (``B' = B / rows``). A key is visible to a query when ``k_slot <= q_slot``, the key is
valid, its segment equals the query's (when segment ids are given) and, with a window ``W >
0``, ``k_slot > q_slot - W`` (HF's ``sliding_window``).

References: Dao et al., "FlashAttention" (arXiv 2205.14135) and "FlashAttention-2" (arXiv
2307.08691) for the blockwise recurrence and its backward pass; Rabe and Staats,
"Self-attention Does Not Need O(n^2) Memory" (arXiv 2112.05682); the splash kernel as MaxText's
``attention_op`` and tunix's model code call it.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["IMPLEMENTATIONS", "AUTO_DENSE_MAX_KEYS", "Part", "attention", "dense_attention", "blockwise_attention",
           "splash_attention", "cudnn_attention", "cudnn_supports", "resolve_implementation", "check_implementation",
           "compile_for", "splash_interpret", "target_platform", "context_axes", "softcap_logits"]

IMPLEMENTATIONS = ("auto", "dense", "blockwise", "splash", "cudnn")
#: ``auto`` on CPU: ``dense`` up to this many keys (all parts together), or while the call's
#: scores fit :data:`AUTO_SCORE_ELEMS`; ``blockwise`` above both
AUTO_DENSE_MAX_KEYS = 2048
DEFAULT_BLOCK = 512
#: ``auto``'s budget of float32 scores (64 MiB): a call whose ``B H T S`` scores fit it runs
#: ``dense`` on CPU even above :data:`AUTO_DENSE_MAX_KEYS` (a decode step of a few rows: SmolLM2
#: decoded 4,096 tokens in 126 s dense, 187 s with 512-key blocks; docs/benchmarks.md), and
#: ``auto``'s blockwise calls take key blocks as large as keep one block's scores within it
AUTO_SCORE_ELEMS = 1 << 24

_NEG = -1e30  # additive mask value: finite, so fully masked rows stay NaN-free


def softcap_logits(z: jax.Array, cap: float | None) -> jax.Array:
    """``cap * tanh(z / cap)`` (Gemma 2's attention and final-logit soft-capping), or ``z`` when
    ``cap`` is None."""
    if cap is None:
        return z
    if not cap > 0:
        raise ValueError(f"softcap_logits: cap must be > 0 or None, got {cap!r}")
    return cap * jnp.tanh(z / cap)


class Part(NamedTuple):
    """Keys and values one attention call reads (see the module docstring)."""

    k: jax.Array  # [B', K, Dh, S]
    v: jax.Array  # [B', K, S, Dh]
    slots: Any  # [S] int array, or a static int start
    valid: jax.Array  # [B', S] bool
    seg: Any = None  # [B', S] int or None
    rows: int = 1  # query rows per key row


def _part(p: Sequence[Any]) -> Part:
    return p if isinstance(p, Part) else Part(*p)


def _slots(s: Any, n: int) -> jax.Array:
    """``[n]`` int32 slots of a static start or an array."""
    if isinstance(s, (int, np.integer)):
        return jnp.arange(int(s), int(s) + n)
    return jnp.asarray(s)


class _Local(threading.local):
    """Per-thread settings (the asynchronous sampler traces in its own thread)."""

    def __init__(self):
        self.target: list[str] = []  # compile_for(): the platform being compiled for, innermost last
        self.interpret: list[bool] = []  # splash_interpret(): run splash in Pallas interpret mode


_LOCAL = _Local()


class _Stack:
    def __init__(self, name: str, value: Any):
        self.name, self.value = name, value

    def __enter__(self):
        getattr(_LOCAL, self.name).append(self.value)
        return self.value

    def __exit__(self, *exc):
        getattr(_LOCAL, self.name).pop()


def compile_for(platform: str) -> _Stack:
    """``with compile_for("tpu"):`` -- trace for that platform although JAX's default backend is
    another (the planner compiling for a TPU topology on a CPU host): ``"auto"`` resolves for it
    and ``splash`` builds the real kernel, not its interpreter."""
    return _Stack("target", str(platform).lower())


def splash_interpret() -> _Stack:
    """``with splash_interpret():`` -- ``splash`` runs in Pallas interpret mode (on CPU: tests)."""
    return _Stack("interpret", True)


def target_platform() -> str:
    """The platform traced for: :func:`compile_for`'s, else JAX's default backend (``"cuda"`` and
    ``"rocm"`` read as ``"gpu"``)."""
    p = _LOCAL.target[-1] if _LOCAL.target else jax.default_backend()
    return "gpu" if p in ("cuda", "rocm") else p


def check_implementation(name: str) -> None:
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation must be one of {IMPLEMENTATIONS}, got {name!r}")


def resolve_implementation(name: str, platform: str | None = None, num_keys: int | None = None,
                           score_elems: int | None = None) -> str:
    """The implementation ``"auto"`` stands for on ``platform`` (``"tpu"``, ``"gpu"``/``"cuda"``,
    ``"cpu"``; default: JAX's default backend) for a call over ``num_keys`` keys whose scores have
    ``score_elems`` elements (``B H T S``); other names are returned as they are. On CPU without
    ``num_keys``: ``"auto"`` stays (decided per call)."""
    check_implementation(name)
    if name != "auto":
        return name
    platform = (platform or target_platform()).lower()
    if platform == "tpu":
        return "splash"
    if platform in ("gpu", "cuda", "rocm"):
        return "cudnn"
    if num_keys is None:
        return "auto"
    small = num_keys <= AUTO_DENSE_MAX_KEYS or (score_elems is not None and score_elems <= AUTO_SCORE_ELEMS)
    return "dense" if small else "blockwise"


# ----------------------------------------------------------------------------------------- dense
def dense_attention(q, parts, *, q_slot, window=None, q_seg=None, scale=None, softcap=None, **_):
    """All scores at once and one softmax (``[B, H, T, S]`` float32). See :func:`attention`."""
    b, t, h, dh = q.shape
    parts = [_part(p) for p in parts]
    kh = parts[0].k.shape[1]
    g = h // kh
    scale = dh ** -0.5 if scale is None else scale
    q_slot = _slots(q_slot, t)
    qg = q.reshape(b, t, kh, g, dh).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * t, dh)
    scores, sizes = [], []
    for part in parts:
        k, k_valid, k_seg, r = part.k, part.valid, part.seg, part.rows
        k_slot = _slots(part.slots, k.shape[3])
        if r == 1:
            sc = jnp.einsum("bkqd,bkds->bkqs", qg, k, preferred_element_type=jnp.float32) * scale
        else:  # one key row per r query rows: the queries of those rows meet it in one product
            sc = jnp.einsum("urkqd,ukds->urkqs", qg.reshape(b // r, r, kh, g * t, dh), k,
                            preferred_element_type=jnp.float32).reshape(b, kh, g * t, -1) * scale
            k_valid = jnp.repeat(k_valid, r, axis=0)
        sc = softcap_logits(sc, softcap)
        allowed = (k_slot[None, None, :] <= q_slot[None, :, None]) & k_valid[:, None, :]  # [B, T, S]
        if window is not None:
            win = jnp.asarray(window)
            allowed &= (win <= 0) | (k_slot[None, None, :] > q_slot[None, :, None] - win)
        if q_seg is not None:
            allowed &= q_seg[:, :, None] == k_seg[:, None, :]
        allowed = jnp.broadcast_to(allowed[:, None, None], (b, 1, g, t, k.shape[3])).reshape(b, 1, g * t, -1)
        scores.append(jnp.where(allowed, sc, _NEG))
        sizes.append(k.shape[3])
    p = jax.nn.softmax(jnp.concatenate(scores, axis=-1) if len(scores) > 1 else scores[0], axis=-1)
    out, start = None, 0
    for part, size in zip(parts, sizes):
        v, r = part.v, part.rows
        ps = p[..., start:start + size].astype(v.dtype)
        if r == 1:
            pv = jnp.einsum("bkqs,bksd->bkqd", ps, v, preferred_element_type=jnp.float32)
        else:
            pv = jnp.einsum("urkqs,uksd->urkqd", ps.reshape(b // r, r, kh, g * t, size), v,
                            preferred_element_type=jnp.float32).reshape(b, kh, g * t, dh)
        out = pv if out is None else out + pv
        start += size
    return out.reshape(b, kh, g, t, dh).transpose(0, 3, 1, 2, 4).reshape(b, t, h, dh).astype(parts[0].v.dtype)


# ------------------------------------------------------------------------------------- blockwise
class _Static(NamedTuple):
    """Hashable settings of one blockwise call (custom_vjp's non-differentiable argument)."""

    t: int  # query positions (unpadded)
    bq: int  # query block
    sizes: tuple[int, ...]  # keys per part (unpadded)
    bks: tuple[int, ...]  # key block per part
    rows: tuple[int, ...]  # query rows per key row, per part
    scale: float
    softcap: float | None
    has_seg: bool
    mm: str  # matmul input dtype (accumulation is float32)


def _dot(spec, a, b, st):
    """``einsum(spec, a, b)`` with inputs in the call's matmul dtype, accumulated in float32."""
    dt = jnp.dtype(st.mm)
    return jnp.einsum(spec, a.astype(dt), b.astype(dt), preferred_element_type=jnp.float32)


def _pad_axis(x, axis, size, value):
    pad = size - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)


def _pad_edge(x, size):
    """A ``[n]`` slot vector padded to ``size`` by repeating its last entry (so block ranges
    stay those of the real slots; the padded keys are invalid, the padded queries dropped)."""
    pad = size - x.shape[0]
    return x if pad == 0 else jnp.concatenate([x, jnp.broadcast_to(x[-1:], (pad,))])


def _block_allowed(qs, q_seg, ks, kval, kseg, window, r):
    """``[U, r, 1, 1, bq, bk]`` visibility of one query block against one key block.

    qs ``[bq]``, q_seg ``[U * r, bq]`` or None, ks ``[bk]``, kval ``[U, bk]``, kseg ``[U, bk]`` or None."""
    allowed = ks[None, :] <= qs[:, None]  # [bq, bk]
    allowed = allowed & ((window <= 0) | (ks[None, :] > qs[:, None] - window))
    u = kval.shape[0]
    allowed = allowed[None, None] & kval[:, None, None, :]  # [U, 1, bq, bk]
    if q_seg is not None and kseg is not None:
        qsr = q_seg.reshape(u, r, -1)
        allowed = allowed & (qsr[:, :, :, None] == kseg[:, None, None, :])  # [U, r, bq, bk]
    return allowed[:, :, None, None]


def _block_live(qs, q_seg, ks, kval, kseg, window, r):
    """Whether any (query, key) pair of the two blocks can be visible: a cheap range test on the
    slots, the window, the keys' validity and (packed rows) the segment ranges."""
    live = (jnp.min(ks) <= jnp.max(qs)) & jnp.any(kval)
    live = live & ((window <= 0) | (jnp.max(ks) > jnp.min(qs) - window))
    if q_seg is not None and kseg is not None:
        u = kval.shape[0]
        big = jnp.iinfo(jnp.int32).max
        qsr = q_seg.reshape(u, -1)
        kmin = jnp.min(jnp.where(kval, kseg, big), axis=-1)
        kmax = jnp.max(jnp.where(kval, kseg, -big), axis=-1)
        overlap = (jnp.min(qsr, axis=-1) <= kmax) & (kmin <= jnp.max(qsr, axis=-1))
        live = live & jnp.any(overlap)
    return live


def _loop(n, body, init):
    """``fori_loop(0, n, body, init)`` as a ``while_loop``: never turned into a scan, so partial
    evaluation (the scanned, rematerialised layers' backward pass) cannot hoist per-iteration
    values out of it and stack them (which rebuilt the whole score matrix)."""
    def cond(c):
        return c[0] < n

    def step(c):
        return (c[0] + 1, body(c[0], c[1]))

    return jax.lax.while_loop(cond, step, (jnp.asarray(0, jnp.int32), init))[1]


def _grouped(x, u, r):
    """``[B, ...]`` -> ``[U, r, ...]``."""
    return x.reshape((u, r) + x.shape[1:])


def _fwd_impl(st: _Static, q, kvs, metas, q_slot, q_seg, window):
    """Padded canonical forward: ``(out [B, K, G, Tp, Dh] f32, lse [B, K, G, Tp] f32)``."""
    b, kh, g, tp, dh = q.shape
    nq = tp // st.bq

    def q_block(i):
        qb = jax.lax.dynamic_slice_in_dim(q, i * st.bq, st.bq, axis=3)
        qs = jax.lax.dynamic_slice_in_dim(q_slot, i * st.bq, st.bq)
        qsegb = None if q_seg is None else jax.lax.dynamic_slice_in_dim(q_seg, i * st.bq, st.bq, axis=1)
        m = jnp.full((b, kh, g, st.bq), _NEG, jnp.float32)
        lsum = jnp.zeros((b, kh, g, st.bq), jnp.float32)
        acc = jnp.zeros((b, kh, g, st.bq, dh), jnp.float32)
        for (k, v), (ks_all, kval_all, kseg_all), bk, r in zip(kvs, metas, st.bks, st.rows):
            u = k.shape[0]
            nk = k.shape[3] // bk

            def k_step(j, carry, k=k, v=v, ks_all=ks_all, kval_all=kval_all, kseg_all=kseg_all, bk=bk, r=r, u=u):
                ks = jax.lax.dynamic_slice_in_dim(ks_all, j * bk, bk)
                kval = jax.lax.dynamic_slice_in_dim(kval_all, j * bk, bk, axis=1)
                kseg = None if kseg_all is None else jax.lax.dynamic_slice_in_dim(kseg_all, j * bk, bk, axis=1)

                def compute(c):
                    m, lsum, acc = c
                    kb = jax.lax.dynamic_slice_in_dim(k, j * bk, bk, axis=3)
                    vb = jax.lax.dynamic_slice_in_dim(v, j * bk, bk, axis=2)
                    s = _dot("urkgqd,ukds->urkgqs", _grouped(qb, u, r), kb, st) * st.scale
                    s = softcap_logits(s, st.softcap)
                    allowed = _block_allowed(qs, qsegb, ks, kval, kseg, window, r)
                    s = jnp.where(allowed, s, _NEG)
                    mg, lg, ag = _grouped(m, u, r), _grouped(lsum, u, r), _grouped(acc, u, r)
                    m_new = jnp.maximum(mg, jnp.max(s, axis=-1))
                    p = jnp.where(allowed, jnp.exp(s - m_new[..., None]), 0.0)
                    corr = jnp.exp(mg - m_new)
                    l_new = lg * corr + jnp.sum(p, axis=-1)
                    a_new = ag * corr[..., None] + _dot("urkgqs,uksd->urkgqd", p.astype(v.dtype), vb, st)
                    return m_new.reshape(m.shape), l_new.reshape(lsum.shape), a_new.reshape(acc.shape)

                live = _block_live(qs, qsegb, ks, kval, kseg, window, r)
                return jax.lax.cond(live, compute, lambda c: c, carry)

            m, lsum, acc = _loop(nk, k_step, (m, lsum, acc))
        out = acc / jnp.where(lsum > 0, lsum, 1.0)[..., None]
        lse = jnp.where(lsum > 0, m + jnp.log(jnp.where(lsum > 0, lsum, 1.0)), 0.0)
        return out, lse

    def q_step(i, c):
        out, lse = c
        ob, lb = q_block(i)
        return (jax.lax.dynamic_update_slice_in_dim(out, ob, i * st.bq, axis=3),
                jax.lax.dynamic_update_slice_in_dim(lse, lb, i * st.bq, axis=3))

    return _loop(nq, q_step, (jnp.zeros((b, kh, g, tp, dh), jnp.float32), jnp.zeros((b, kh, g, tp), jnp.float32)))


def _bwd_impl(st: _Static, q, kvs, metas, q_slot, q_seg, window, out, lse, dout):
    """Gradients of the padded canonical forward: ``(dq, ((dk, dv), ...))`` in float32."""
    b, kh, g, tp, dh = q.shape
    nq = tp // st.bq
    delta = jnp.sum(dout * out, axis=-1)  # [B, K, G, Tp]
    dks = [jnp.zeros(k.shape, jnp.float32) for k, _ in kvs]
    dvs = [jnp.zeros(v.shape, jnp.float32) for _, v in kvs]
    dq_all = jnp.zeros(q.shape, jnp.float32)

    def q_step(i, carry):
        dq_all, dks, dvs = carry
        qb = jax.lax.dynamic_slice_in_dim(q, i * st.bq, st.bq, axis=3)
        dob = jax.lax.dynamic_slice_in_dim(dout, i * st.bq, st.bq, axis=3)
        lseb = jax.lax.dynamic_slice_in_dim(lse, i * st.bq, st.bq, axis=3)
        deltab = jax.lax.dynamic_slice_in_dim(delta, i * st.bq, st.bq, axis=3)
        qs = jax.lax.dynamic_slice_in_dim(q_slot, i * st.bq, st.bq)
        qsegb = None if q_seg is None else jax.lax.dynamic_slice_in_dim(q_seg, i * st.bq, st.bq, axis=1)
        dq = jnp.zeros(qb.shape, jnp.float32)
        new_dks, new_dvs = [], []
        for (k, v), (ks_all, kval_all, kseg_all), bk, r, dk_all, dv_all in zip(kvs, metas, st.bks, st.rows, dks, dvs):
            u = k.shape[0]
            nk = k.shape[3] // bk

            def k_step(j, c, k=k, v=v, ks_all=ks_all, kval_all=kval_all, kseg_all=kseg_all, bk=bk, r=r, u=u):
                dq, dk_all, dv_all = c
                ks = jax.lax.dynamic_slice_in_dim(ks_all, j * bk, bk)
                kval = jax.lax.dynamic_slice_in_dim(kval_all, j * bk, bk, axis=1)
                kseg = None if kseg_all is None else jax.lax.dynamic_slice_in_dim(kseg_all, j * bk, bk, axis=1)

                def compute(_):
                    kb = jax.lax.dynamic_slice_in_dim(k, j * bk, bk, axis=3)
                    vb = jax.lax.dynamic_slice_in_dim(v, j * bk, bk, axis=2)
                    qg, dog = _grouped(qb, u, r), _grouped(dob, u, r)
                    s = _dot("urkgqd,ukds->urkgqs", qg, kb, st) * st.scale
                    th = None
                    if st.softcap is not None:
                        th = jnp.tanh(s / st.softcap)
                        s = st.softcap * th
                    allowed = _block_allowed(qs, qsegb, ks, kval, kseg, window, r)
                    p = jnp.where(allowed, jnp.exp(s - _grouped(lseb, u, r)[..., None]), 0.0)
                    dv = _dot("urkgqs,urkgqd->uksd", p.astype(v.dtype), dog.astype(v.dtype), st)
                    dp = _dot("urkgqd,uksd->urkgqs", dog.astype(v.dtype), vb, st)
                    ds = p * (dp - _grouped(deltab, u, r)[..., None])
                    if th is not None:
                        ds = ds * (1.0 - jnp.square(th))
                    ds = (ds * st.scale).astype(k.dtype)
                    dqb = _dot("urkgqs,ukds->urkgqd", ds, kb, st)
                    dk = _dot("urkgqs,urkgqd->ukds", ds, qg.astype(k.dtype), st)
                    return dqb.reshape(dq.shape), dk, dv

                def skip(_):
                    return (jnp.zeros(dq.shape, jnp.float32), jnp.zeros(k.shape[:3] + (bk,), jnp.float32),
                            jnp.zeros(v.shape[:2] + (bk, v.shape[3]), jnp.float32))

                live = _block_live(qs, qsegb, ks, kval, kseg, window, r)
                dqb, dk, dv = jax.lax.cond(live, compute, skip, None)
                dk_all = jax.lax.dynamic_update_slice_in_dim(
                    dk_all, jax.lax.dynamic_slice_in_dim(dk_all, j * bk, bk, axis=3) + dk, j * bk, axis=3)
                dv_all = jax.lax.dynamic_update_slice_in_dim(
                    dv_all, jax.lax.dynamic_slice_in_dim(dv_all, j * bk, bk, axis=2) + dv, j * bk, axis=2)
                return dq + dqb, dk_all, dv_all

            dq, dk_all, dv_all = _loop(nk, k_step, (dq, dk_all, dv_all))
            new_dks.append(dk_all)
            new_dvs.append(dv_all)
        dq_all = jax.lax.dynamic_update_slice_in_dim(dq_all, dq, i * st.bq, axis=3)
        return dq_all, new_dks, new_dvs

    dq_all, dks, dvs = _loop(nq, q_step, (dq_all, dks, dvs))
    return dq_all, tuple(zip(dks, dvs))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blockwise_core(st, q, kvs, metas, q_slot, q_seg, window):
    return _fwd_impl(st, q, kvs, metas, q_slot, q_seg, window)[0]


def _core_fwd(st, q, kvs, metas, q_slot, q_seg, window):
    out, lse = _fwd_impl(st, q, kvs, metas, q_slot, q_seg, window)
    return out, (q, kvs, metas, q_slot, q_seg, window, out, lse)


def _core_bwd(st, res, dout):
    q, kvs, metas, q_slot, q_seg, window, out, lse = res
    dq, dkvs = _bwd_impl(st, q, kvs, metas, q_slot, q_seg, window, out, lse, dout.astype(jnp.float32))
    dkvs = tuple((dk.astype(k.dtype), dv.astype(v.dtype)) for (dk, dv), (k, v) in zip(dkvs, kvs))
    zero_meta = jax.tree.map(lambda x: None, metas, is_leaf=lambda x: x is None)
    return (dq.astype(q.dtype), dkvs, zero_meta, None, None, None)


_blockwise_core.defvjp(_core_fwd, _core_bwd)


def _block_size(n: int, block: int) -> int:
    return max(1, min(int(block), int(n)))


def blockwise_attention(q, parts, *, q_slot, window=None, q_seg=None, scale=None, softcap=None,
                        block_q: int = DEFAULT_BLOCK, block_k: int = DEFAULT_BLOCK, **_):
    """Online-softmax attention over key blocks with a recomputing backward pass. See
    :func:`attention`; ``block_q`` / ``block_k`` are the query and key block sizes (each capped at
    the length it blocks)."""
    b, t, h, dh = q.shape
    parts = [_part(p) for p in parts]
    kh = parts[0].k.shape[1]
    g = h // kh
    bq = _block_size(t, block_q)
    tp = -(-t // bq) * bq
    qc = q.reshape(b, t, kh, g, dh).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, Dh]
    qc = _pad_axis(qc, 3, tp, 0)
    qsl = _pad_edge(_slots(q_slot, t).astype(jnp.int32), tp)
    has_seg = q_seg is not None and all(p.seg is not None for p in parts)
    qsg = _pad_axis(jnp.asarray(q_seg, jnp.int32), 1, tp, -1) if has_seg else None
    kvs, metas, sizes, bks, rows = [], [], [], [], []
    for p in parts:
        s = p.k.shape[3]
        bk = _block_size(s, block_k)
        sp = -(-s // bk) * bk
        kvs.append((_pad_axis(p.k, 3, sp, 0), _pad_axis(p.v, 2, sp, 0)))
        metas.append((_pad_edge(_slots(p.slots, s).astype(jnp.int32), sp),
                      _pad_axis(jnp.asarray(p.valid, bool), 1, sp, False),
                      _pad_axis(jnp.asarray(p.seg, jnp.int32), 1, sp, -2) if has_seg else None))
        sizes.append(s)
        bks.append(bk)
        rows.append(int(p.rows))
    win = jnp.asarray(0 if window is None else window, jnp.int32)
    # XLA:CPU computes 16-bit matmuls no faster than float32 and one of its dot kernels rejects
    # bf16 x bf16 -> f32 inside these loops: float32 inputs there
    mm = jnp.dtype(parts[0].k.dtype)
    if mm.itemsize < 4 and target_platform() == "cpu":
        mm = jnp.dtype(jnp.float32)
    st = _Static(t, bq, tuple(sizes), tuple(bks), tuple(rows), float(dh ** -0.5 if scale is None else scale),
                 None if softcap is None else float(softcap), has_seg, mm.name)
    out = _blockwise_core(st, qc, tuple(kvs), tuple(metas), qsl, qsg, win)
    out = out[:, :, :, :t]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, dh).astype(parts[0].v.dtype)


# ---------------------------------------------------------------------------------------- splash
def _static_layout(q_slot, parts) -> tuple[int, int] | None:
    """``(q_start, k_start)`` when the query slots and the parts' key slots are static and the
    parts' slots follow each other (one contiguous key range); None otherwise."""
    if not isinstance(q_slot, (int, np.integer)):
        return None
    starts = [p.slots for p in parts]
    if not all(isinstance(s, (int, np.integer)) for s in starts):
        return None
    pos = int(starts[0])
    for p in parts:
        if int(p.slots) != pos:
            return None
        pos += p.k.shape[3]
    return int(q_slot), int(starts[0])


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _splash_block(n: int, block: int) -> int:
    """The largest multiple of 128 (the kernel's lane width) up to ``block`` that divides ``n``."""
    block = max(128, block // 128 * 128)
    for b in range(block, 127, -128):
        if n % b == 0:
            return b
    return 128


def _mesh_axes_for(names):
    """The mesh axes the active logical rules map the activation axes ``names`` to (tuples),
    restricted to the current mesh; empty tuples without a mesh."""
    from jaxrl_llm.parallel.sharding import _rules_dict, active_rules

    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return None
    table = _rules_dict(active_rules())
    return mesh, [tuple(a for a in table.get(n, ()) if a in mesh.shape and mesh.shape[a] > 1) for n in names]


def splash_attention(q, parts, *, q_slot, window=None, q_seg=None, scale=None, softcap=None, q_valid=None,
                     static_window: int | None = None, block_q: int = DEFAULT_BLOCK, block_k: int = DEFAULT_BLOCK,
                     interpret: bool | None = None, _manual: bool = False, **kw):
    """Pallas TPU splash attention over the parts joined into one key range (shared-prefix parts
    repeated per row). Needs static slots: a call with run-time slots (a KV cache) is computed
    by :func:`blockwise_attention`. ``window`` may be traced (the scanned layers of Gemma): the
    local kernel (``static_window`` keys) and the global one are both built and selected per
    layer. ``interpret``: Pallas interpret mode (default: :func:`splash_interpret`'s; off, and an
    error when not tracing for a TPU)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    parts = [_part(p) for p in parts]
    layout = _static_layout(q_slot, parts)
    if layout is None:
        return blockwise_attention(q, parts, q_slot=q_slot, window=window, q_seg=q_seg, scale=scale,
                                   softcap=softcap, block_q=block_q, block_k=block_k)
    q_start, k_start = layout
    b, t, h, dh = q.shape
    kh = parts[0].k.shape[1]
    g = h // kh
    scale = dh ** -0.5 if scale is None else scale
    if interpret is None:
        interpret = bool(_LOCAL.interpret) and _LOCAL.interpret[-1]
        if not interpret and target_platform() != "tpu":
            raise ValueError(f"model.attention=splash is a TPU kernel; on {target_platform()} it runs only in Pallas "
                             "interpret mode (tests: `with jaxrl_llm.models.attn.splash_interpret():`), use "
                             "blockwise (or auto)")
    # one key range: [B, K, S, Dh]; shared parts repeated to the query rows
    ks, vs, kseg = [], [], []
    for p in parts:
        k, v, valid, seg = p.k, p.v, jnp.asarray(p.valid, bool), p.seg
        if p.rows > 1:
            k, v, valid = (jnp.repeat(x, p.rows, axis=0) for x in (k, v, valid))
            seg = None if seg is None else jnp.repeat(seg, p.rows, axis=0)
        ks.append(jnp.swapaxes(k, 2, 3))
        vs.append(v)
        s_ids = jnp.ones(valid.shape, jnp.int32) if (seg is None or q_seg is None) else jnp.asarray(seg, jnp.int32)
        kseg.append(jnp.where(valid, s_ids, 0))
    k = jnp.concatenate(ks, axis=2) if len(ks) > 1 else ks[0]
    v = jnp.concatenate(vs, axis=2) if len(vs) > 1 else vs[0]
    kseg = jnp.concatenate(kseg, axis=1) if len(kseg) > 1 else kseg[0]
    s = k.shape[2]
    if q_seg is not None:
        qseg = jnp.asarray(q_seg, jnp.int32)
    elif q_valid is not None:
        qseg = jnp.asarray(q_valid, bool).astype(jnp.int32)
    else:
        qseg = jnp.ones((b, t), jnp.int32)
    # lengths to multiples of the kernel's blocks: padded queries are dropped, padded keys are
    # segment -1 (visible to nobody)
    tp, sp = _round_up(t, 128), _round_up(s, 128)
    bq, bk = _splash_block(tp, block_q), _splash_block(sp, block_k)
    tp, sp = _round_up(tp, bq), _round_up(sp, bk)
    qc = (q.astype(jnp.float32) * scale).astype(q.dtype).reshape(b, t, kh, g, dh).transpose(0, 2, 3, 1, 4)
    qc = _pad_axis(qc, 3, tp, 0)
    k, v = _pad_axis(k, 2, sp, 0), _pad_axis(v, 2, sp, 0)
    qseg = _pad_axis(qseg, 1, tp, -1)
    kseg = _pad_axis(kseg, 1, sp, -2)
    offset = q_start - k_start
    sizes = sk.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq, block_kv_dkv=bk,
                          block_kv_dkv_compute=bk, block_q_dq=bq, block_kv_dq=bk)

    def kernel_for(mask):
        return sk.make_splash_mqa_single_device(sm.MultiHeadMask([mask] * g), block_sizes=sizes,
                                                attn_logits_soft_cap=None if softcap is None else float(softcap),
                                                interpret=bool(interpret))

    global_k = kernel_for(sm.CausalMask((tp, sp), offset=offset))
    local_k = None
    win_static = window if isinstance(window, (int, np.integer)) else None
    if window is not None and (win_static is None or win_static > 0):
        w = int(win_static if win_static is not None else (static_window or 0))
        if w <= 0:
            raise ValueError("splash attention with a run-time window needs static_window (the model's "
                             "sliding_window)")
        local_k = kernel_for(sm.LocalMask((tp, sp), window_size=(w - 1, 0), offset=offset))

    def run(qc, k, v, qseg, kseg, use_local):
        def one(qh, kh_, vh, qs, ksg):  # [G, Tp, Dh], [Sp, Dh], [Sp, Dh], [Tp], [Sp]
            ids = sk.SegmentIds(q=qs, kv=ksg)
            if local_k is None:
                return global_k(qh, kh_, vh, segment_ids=ids)
            if win_static is not None:
                return local_k(qh, kh_, vh, segment_ids=ids)
            return jax.lax.cond(use_local, lambda: local_k(qh, kh_, vh, segment_ids=ids),
                                lambda: global_k(qh, kh_, vh, segment_ids=ids))

        per_head = jax.vmap(one, in_axes=(0, 0, 0, None, None))  # over kv heads
        return jax.vmap(per_head, in_axes=(0, 0, 0, 0, 0))(qc, k, v, qseg, kseg)  # over rows

    use_local = jnp.asarray(False) if window is None else (jnp.asarray(window) > 0)
    found = None if _manual else _mesh_axes_for(("act_batch", "act_kv_heads"))
    if found is None:
        out = run(qc, k, v, qseg, kseg, use_local)
    else:
        mesh, (batch_axes, head_axes) = found
        bsz = math.prod(mesh.shape[a] for a in batch_axes) if batch_axes else 1
        hsz = math.prod(mesh.shape[a] for a in head_axes) if head_axes else 1
        batch_axes = batch_axes if b % bsz == 0 else ()
        head_axes = head_axes if kh % hsz == 0 else ()
        P = jax.sharding.PartitionSpec
        bspec = (batch_axes or None) if len(batch_axes) != 1 else batch_axes[0]
        hspec = (head_axes or None) if len(head_axes) != 1 else head_axes[0]
        fn = jax.shard_map(run, mesh=mesh,
                           in_specs=(P(bspec, hspec), P(bspec, hspec), P(bspec, hspec), P(bspec), P(bspec), P()),
                           out_specs=P(bspec, hspec), check_vma=False)
        out = fn(qc, k, v, qseg, kseg, use_local)
    out = out[:, :, :, :t]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, dh).astype(parts[0].v.dtype)


# ----------------------------------------------------------------------------------------- cudnn
def cudnn_supports(q, parts, *, q_slot, q_seg=None, softcap=None, window=None, kernel: bool = True
                   ) -> str | None:
    """Why :func:`cudnn_attention` cannot take this call (None: it can). ``kernel``: also the
    kernel's own limits (16-bit inputs, head sizes), not only what the call's mapping expresses."""
    parts = [_part(p) for p in parts]
    if kernel and jnp.dtype(q.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"cuDNN's fused attention takes bfloat16 or float16, not {jnp.dtype(q.dtype).name}"
    if kernel and (q.shape[-1] % 8 or q.shape[-1] > 256):
        return f"cuDNN's fused attention takes head sizes that are multiples of 8 up to 256, not {q.shape[-1]}"
    if window is not None and not isinstance(window, (int, np.integer)):
        return "a window that is a traced value (the scanned layers of a model with local and global layers)"
    if len(parts) != 1 or parts[0].rows != 1:
        return "it takes one part of the rows' own keys (no shared prompt, no KV cache)"
    if q_seg is not None:
        return "jax.nn.dot_product_attention has no segment ids (packed rows)"
    if softcap is not None:
        return "jax.nn.dot_product_attention has no soft-cap"
    if not (isinstance(q_slot, (int, np.integer)) and isinstance(parts[0].slots, (int, np.integer))
            and int(q_slot) == int(parts[0].slots) and q.shape[1] == parts[0].k.shape[3]):
        return "it takes self-attention over static slots (queries and keys the same tokens)"
    return None


def cudnn_attention(q, parts, *, q_slot, window=None, q_seg=None, scale=None, softcap=None, q_valid=None,
                    implementation: str = "cudnn", **kw):
    """``jax.nn.dot_product_attention`` (cuDNN's fused kernel on GPU) for self-attention over one
    part. Each row's real tokens must be one contiguous run (left-padded prompt, completion,
    right padding: the RL and SFT batches); the run is moved to the front of the row, the
    padding expressed by sequence lengths, and the output moved back. A row whose real tokens
    are not contiguous gets NaN outputs (never silently wrong numbers). ``implementation="xla"``
    runs the same call through XLA (how the CPU tests check the mapping)."""
    parts = [_part(p) for p in parts]
    why = cudnn_supports(q, parts, q_slot=q_slot, q_seg=q_seg, softcap=softcap, window=window,
                         kernel=implementation == "cudnn")
    if why is not None:
        raise ValueError(f"model.attention=cudnn cannot take this call: {why}")
    p = parts[0]
    b, t, h, dh = q.shape
    valid = jnp.asarray(p.valid, bool)
    n = jnp.sum(valid, axis=1).astype(jnp.int32)  # [B]
    first = jnp.argmax(valid, axis=1).astype(jnp.int32)
    idx = jnp.arange(t)
    contiguous = jnp.all(valid == ((idx[None] >= first[:, None]) & (idx[None] < (first + n)[:, None])), axis=1)
    src = (idx[None] + first[:, None]) % t  # row-wise roll left by `first`

    def take(x, axis):  # [B, ..., T, ...] gathered along `axis` by src
        return jnp.take_along_axis(x, src.reshape((b,) + (1,) * (axis - 1) + (t,) + (1,) * (x.ndim - axis - 1)),
                                   axis=axis)

    qr = take(q, 1)
    kr = take(jnp.swapaxes(p.k, 2, 3).transpose(0, 2, 1, 3), 1)  # [B, T, K, Dh]
    vr = take(p.v.transpose(0, 2, 1, 3), 1)
    win = None
    if window is not None:
        if not isinstance(window, (int, np.integer)):
            raise ValueError("model.attention=cudnn needs a static window (layers unrolled or one window for all)")
        win = (int(window) - 1, 0) if int(window) > 0 else None
    out = jax.nn.dot_product_attention(qr, kr, vr, scale=dh ** -0.5 if scale is None else scale, is_causal=True,
                                       query_seq_lengths=jnp.maximum(n, 1), key_value_seq_lengths=jnp.maximum(n, 1),
                                       local_window_size=win, implementation=implementation)
    back = (idx[None] - first[:, None]) % t  # undo the roll
    out = jnp.take_along_axis(out, back[:, :, None, None], axis=1)
    out = jnp.where(contiguous[:, None, None, None], out, jnp.nan)
    return out.astype(p.v.dtype)


# ---------------------------------------------------------------------------- context parallel
def _spec(axes):
    """A PartitionSpec entry of a tuple of mesh axes."""
    return None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))


def context_axes() -> tuple[Any, tuple[str, ...]] | None:
    """``(mesh, axes)`` the active rules split a row's tokens (``act_seq``) over, when a mesh is
    set and one of them is larger than 1; None otherwise."""
    found = _mesh_axes_for(("act_seq",))
    if found is None or not found[1][0]:
        return None
    return found[0], found[1][0]


def _context_parallel(impl, q, parts, *, q_slot, window, q_seg, scale, softcap, q_valid, static_window, block_q,
                      block_k, interpret, found):
    """Attention with the queries' tokens split over the context axis: each device all-gathers
    the keys and values of the rows' own tokens over that axis (the keys of a shared prompt are
    whole on every device) and attends with its own queries, whose slots start at its shard
    (``splash``: one kernel per shard position, chosen by the axis index). Values and gradients
    are the single-device ones; the gradient of the gather is a reduce-scatter."""
    mesh, ctx = found
    b, t, h, dh = q.shape
    csize = math.prod(mesh.shape[a] for a in ctx)
    if t % csize:
        raise ValueError(f"context parallelism: the context axis ({csize} ways) must divide the sequence length "
                         f"{t}")
    t_loc = t // csize
    _, (batch_axes, head_axes) = _mesh_axes_for(("act_batch", "act_kv_heads"))
    kh = parts[0].k.shape[1]
    bsz = math.prod(mesh.shape[a] for a in batch_axes) if batch_axes else 1
    hsz = math.prod(mesh.shape[a] for a in head_axes) if head_axes else 1
    own = [p.rows == 1 and p.k.shape[3] == t and int(p.slots) == int(q_slot) for p in parts]
    rows_ok = all((p.k.shape[0] % bsz == 0) for p in parts)
    batch_axes = batch_axes if (b % bsz == 0 and rows_ok) else ()
    head_axes = head_axes if kh % hsz == 0 else ()
    P = jax.sharding.PartitionSpec
    bs, hs, cs = _spec(batch_axes), _spec(head_axes), _spec(ctx)
    has_seg = q_seg is not None
    q_start = int(q_slot)

    def body(q, kvs, qseg, qval, win):
        i = jax.lax.axis_index(ctx)
        local = []
        for p, (k, v, valid, seg), mine in zip(parts, kvs, own):
            if mine:  # this row's own tokens: gather every shard's keys
                k = jax.lax.all_gather(k, ctx, axis=3, tiled=True)
                v = jax.lax.all_gather(v, ctx, axis=2, tiled=True)
                valid = jax.lax.all_gather(valid, ctx, axis=1, tiled=True)
                seg = None if seg is None else jax.lax.all_gather(seg, ctx, axis=1, tiled=True)
            local.append(Part(k, v, p.slots, valid, seg, p.rows))
        kw = dict(window=None if window is None else win, q_seg=qseg if has_seg else None, scale=scale,
                  softcap=softcap)
        if impl == "splash":  # static slots per branch (the parts are closed over: their ints stay static)
            def branch(j):
                return lambda: splash_attention(
                    q, local, q_slot=q_start + j * t_loc, q_valid=qval, static_window=static_window, block_q=block_q,
                    block_k=block_k, interpret=interpret, _manual=True, **kw)
            return jax.lax.switch(i, [branch(j) for j in range(csize)])
        slot = q_start + i * t_loc + jnp.arange(t_loc)
        if impl == "dense":
            return dense_attention(q, local, q_slot=slot, **kw)
        return blockwise_attention(q, local, q_slot=slot, block_q=block_q, block_k=block_k, **kw)

    kv_args, kv_specs = [], []
    for p, mine in zip(parts, own):
        sdim = cs if mine else None
        kv_args.append((p.k, p.v, jnp.asarray(p.valid, bool), p.seg))
        kv_specs.append((P(bs, hs, None, sdim), P(bs, hs, sdim, None), P(bs, sdim),
                         None if p.seg is None else P(bs, sdim)))
    qseg = jnp.asarray(q_seg, jnp.int32) if has_seg else jnp.zeros((b, t), jnp.int32)
    qval = jnp.ones((b, t), bool) if q_valid is None else jnp.asarray(q_valid, bool)
    win = jnp.asarray(0 if window is None else window, jnp.int32)
    fn = jax.shard_map(body, mesh=mesh, in_specs=(P(bs, cs, hs, None), kv_specs, P(bs, cs), P(bs, cs), P()),
                       out_specs=P(bs, cs, hs, None), check_vma=False)
    return fn(q, kv_args, qseg, qval, win)


def _context_parallel_applies(q, parts, q_slot) -> bool:
    """Static self-attention over more than one token (training and log-prob passes, a prefill
    without a cache) is split over the context axis; decoding (run-time slots) is not."""
    if q.shape[1] < 2 or not isinstance(q_slot, (int, np.integer)):
        return False
    if not all(isinstance(p.slots, (int, np.integer)) for p in parts):
        return False
    return any(p.rows == 1 and p.k.shape[3] == q.shape[1] and int(p.slots) == int(q_slot) for p in parts)


# ------------------------------------------------------------------------------------- dispatch
def attention(q, parts, *, q_slot, window=None, q_seg=None, scale=None, softcap=None, impl: str = "dense",
              q_valid=None, static_window: int | None = None, block_q: int = DEFAULT_BLOCK,
              block_k: int = DEFAULT_BLOCK, interpret: bool | None = None):
    """Grouped-query attention of ``q`` over one or more key/value *parts*, one joint softmax.

    Args:
      q: ``[B, T, H, Dh]``; query head ``k * G + g`` uses key head ``k`` (``G = H / K``).
      parts: sequence of :class:`Part` (or tuples ``(k, v, k_slot, k_valid, k_seg[, rows])``):
        keys transposed ``k [B', K, Dh, S]``, values ``v [B', K, S, Dh]``, ``k_slot`` ``[S]`` ints or
        a static start, ``k_valid [B', S]``, ``k_seg [B', S]`` or None, ``rows`` query rows per key
        row (a shared prefix: ``B' = B / rows``, query row ``i`` reads key row ``i // rows``).
      q_slot: ``[T]`` ints or a static start. window: scalar int (0 or None: none), may be traced.
      q_seg: ``[B, T]`` segment ids (packed rows) or None. scale: default ``Dh ** -0.5``.
      softcap: scores ``c tanh(s / c)`` after scaling, before masking (Gemma 2), or None.
      impl: one of :data:`IMPLEMENTATIONS` (``"auto"`` is resolved here by the backend and the
        number of keys).
      q_valid: ``[B, T]`` the queries' own validity (lets ``splash`` give padding queries a segment
        of their own). static_window: the model's sliding window, for ``splash`` when ``window``
        is traced. block_q, block_k: block sizes of ``blockwise`` / ``splash``. interpret: Pallas
        interpret mode for ``splash`` (default: on unless on TPU).

    Returns:
      ``[B, T, H, Dh]`` in the values' dtype. Queries with no visible key (padding) get finite
      values that callers mask (they differ between implementations).
    """
    check_implementation(impl)
    parts = [_part(p) for p in parts]
    kw = dict(q_slot=q_slot, window=window, q_seg=q_seg, scale=scale, softcap=softcap)
    if impl == "auto":
        keys = sum(p.k.shape[3] for p in parts)
        elems = q.shape[0] * q.shape[1] * q.shape[2] * keys
        impl = resolve_implementation("auto", num_keys=keys, score_elems=elems)
        # a call the platform's kernel cannot take (decoding over a cache, packed rows under cuDNN, ...):
        # the CPU rule (dense while the keys or the scores are few, blockwise above)
        fallback = resolve_implementation("auto", "cpu", num_keys=keys, score_elems=elems)
        if impl == "cudnn" and cudnn_supports(q, parts, q_slot=q_slot, q_seg=q_seg, softcap=softcap,
                                              window=window) is not None:
            impl = fallback
        if impl == "splash" and _static_layout(q_slot, parts) is None:
            impl = fallback
        if impl == "blockwise":
            b, t, h = q.shape[:3]
            rows = b * h * min(t, block_q)
            block_k = max(block_k, (AUTO_SCORE_ELEMS // rows) // block_k * block_k)
    found = context_axes()
    if found is not None and _context_parallel_applies(q, parts, q_slot):
        if impl == "cudnn":  # per shard the queries start past the keys: not cuDNN's causal layout
            impl = "blockwise"
        return _context_parallel(impl, q, parts, q_valid=q_valid, static_window=static_window, block_q=block_q,
                                 block_k=block_k, interpret=interpret, found=found, **kw)
    if impl == "dense":
        return dense_attention(q, parts, **kw)
    if impl == "blockwise":
        return blockwise_attention(q, parts, block_q=block_q, block_k=block_k, **kw)
    if impl == "splash":
        return splash_attention(q, parts, q_valid=q_valid, static_window=static_window, block_q=block_q,
                                block_k=block_k, interpret=interpret, **kw)
    if target_platform() != "gpu":
        raise ValueError(f"model.attention=cudnn needs a GPU (tracing for {target_platform()}); use blockwise "
                         "(or auto)")
    if cudnn_supports(q, parts, q_slot=q_slot, q_seg=q_seg, softcap=softcap, window=window) is not None:
        return blockwise_attention(q, parts, block_q=block_q, block_k=block_k, **kw)
    return cudnn_attention(q, parts, q_valid=q_valid, **kw)

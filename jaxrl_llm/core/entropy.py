"""Token entropy and logprobs from logits, chunked over the sequence.

``[B, T, V]`` logits of a real vocabulary are large (8 x 4096 x 152k float32 is 20 GB); the
functions here walk over the sequence in chunks of ``chunk_size`` positions in a
``fori_loop``, upcasting only one ``[B, chunk, V]`` slice to float32 at a time (the compiled
temporary memory is measured in ``tests/core/test_kl_entropy_value.py``). No paper: these
are the standard softmax identities; verl's ``entropy_from_logits`` and
``calculate_sum_pi_squared_from_logits`` compute the same values (tested).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.core import _checks

__all__ = ["entropy_from_logits", "sum_pi_squared_from_logits", "chunked_entropy", "chunked_sum_pi_squared",
           "chunked_logprobs_and_entropy"]


def _check_logits(logits):
    if np.ndim(logits) < 1:
        raise ValueError(f"argument 'logits' must have a vocabulary axis (rank >= 1), got shape {np.shape(logits)}")
    _checks.check_float("logits", logits)


def entropy_from_logits(logits: jnp.ndarray) -> jnp.ndarray:
    """Shannon entropy ``H = logsumexp(z) - sum softmax(z) z`` over the last axis, float32.

    Logits of ``-inf`` (banned tokens) are allowed: they contribute 0, in value and gradient
    (verl's ``entropy_from_logits`` returns NaN there, from ``0 * -inf``).
    """
    _check_logits(logits)
    return _entropy(logits)


# -inf logits (banned tokens) are raised to this finite floor before ``p * z`` so that the
# product is 0 * finite, not 0 * inf = NaN; ``maximum`` routes no gradient to the floor and,
# unlike a select, fuses into the reduction (no extra [B, chunk, V] temporary).
_LOGIT_FLOOR = -1e30


def _entropy(logits):
    z = jnp.maximum(logits.astype(jnp.float32), _LOGIT_FLOOR)
    lse = jax.nn.logsumexp(z, axis=-1)
    p = jnp.exp(z - lse[..., None])
    return lse - jnp.sum(p * z, axis=-1)


def sum_pi_squared_from_logits(logits: jnp.ndarray, temperature: float = 1.0) -> jnp.ndarray:
    """Collision probability ``sum_v softmax(z / temperature)_v^2`` over the last axis, float32.

    Computed stably as ``exp(logsumexp(2 z) - 2 logsumexp(z))`` (verl's
    ``calculate_sum_pi_squared_from_logits``). It is the ``sum pi^2`` term of the Optimal
    Token Baseline's gradient-norm proxy (:func:`~jaxrl_llm.core.advantages.optimal_token_baseline_advantages`).
    """
    _check_logits(logits)
    _checks.check_positive("temperature", temperature)
    return _sum_pi_squared(logits, temperature)


def _sum_pi_squared(logits, temperature):
    z = logits.astype(jnp.float32) / temperature
    return jnp.exp(jax.nn.logsumexp(2.0 * z, axis=-1) - 2.0 * jax.nn.logsumexp(z, axis=-1))


def _map_chunks(fn, arrays, chunk: int, n_out: int):
    """Apply ``fn`` to ``[B, c, ...]`` slices of ``arrays`` along axis 1 and stitch the ``[B, c]``
    results back into ``n_out`` float32 ``[B, T]`` arrays.

    Slices are taken from the original arrays with ``dynamic_slice`` inside a ``fori_loop``,
    so no transposed or padded copy of the (large) input is made. When ``T`` is not a
    multiple of ``chunk`` the last slice is shifted left to end at ``T`` and overlaps the
    previous one (the overlap is recomputed identically).
    """
    arrays = [jnp.asarray(a) for a in arrays]
    b, t = arrays[0].shape[:2]
    c = min(chunk, t)
    # 16-bit floats travel through the loop as their raw bits: XLA:CPU otherwise widens a
    # bf16 loop operand to float32 as a whole (its float normalisation), i.e. a full copy.
    dtypes = [a.dtype for a in arrays]
    arrays = [jax.lax.bitcast_convert_type(a, jnp.uint16) if a.dtype in (jnp.bfloat16, jnp.float16) else a
              for a in arrays]
    n = -(-t // c)
    outs = tuple(jnp.zeros((b, t), jnp.float32) for _ in range(n_out))

    def body(i, outs):
        start = jnp.minimum(i * c, t - c)
        # the barrier stops XLA from hoisting the float32 upcast of the whole input out of
        # the loop (convert(slice(x)) -> slice(convert(x))), which would defeat the chunking
        parts = jax.lax.optimization_barrier([jax.lax.dynamic_slice_in_dim(a, start, c, axis=1) for a in arrays])
        parts = [jax.lax.bitcast_convert_type(p, d) if d in (jnp.bfloat16, jnp.float16) else p
                 for p, d in zip(parts, dtypes)]
        ys = fn(*parts)
        return tuple(jax.lax.dynamic_update_slice_in_dim(o, y, start, axis=1) for o, y in zip(outs, ys))

    return jax.lax.fori_loop(0, n, body, outs)


def chunked_entropy(logits: jnp.ndarray, chunk_size: int = 128) -> jnp.ndarray:
    """Per-token entropy ``[B, T]`` of ``[B, T, V]`` logits, float32, chunked over ``T``.

    Peak extra memory is one ``[B, chunk_size, V]`` float32 slice.
    """
    _checks.check_rank("logits", logits, 3)
    _check_logits(logits)
    _checks.check_static_int("chunk_size", chunk_size)
    (ent,) = _map_chunks(lambda z: (_entropy(z),), (logits,), chunk_size, 1)
    return ent


def chunked_sum_pi_squared(logits: jnp.ndarray, chunk_size: int = 128, temperature: float = 1.0) -> jnp.ndarray:
    """Per-token ``sum_v pi(v)^2`` ``[B, T]`` of ``[B, T, V]`` logits, float32, chunked over ``T``.

    Peak extra memory is one ``[B, chunk_size, V]`` float32 slice.
    """
    _checks.check_rank("logits", logits, 3)
    _check_logits(logits)
    _checks.check_static_int("chunk_size", chunk_size)
    _checks.check_positive("temperature", temperature)
    (out,) = _map_chunks(lambda z: (_sum_pi_squared(z, temperature),), (logits,), chunk_size, 1)
    return out


def chunked_logprobs_and_entropy(logits: jnp.ndarray, tokens: jnp.ndarray, chunk_size: int = 128,
                                 temperature: float = 1.0) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Logprobs of ``tokens: [B, T]`` under ``logits: [B, T, V] / temperature`` and entropies.

    ``logits[:, t]`` must be the distribution that produced ``tokens[:, t]`` (shift outside).
    Returns ``(logp [B, T], entropy [B, T])`` in float32; gradients flow to the logits.
    """
    _checks.check_rank("logits", logits, 3)
    _checks.check_rank("tokens", tokens, 2)
    if tokens.shape != logits.shape[:2]:
        raise ValueError(f"argument 'tokens' must have shape {logits.shape[:2]} (logits' [B, T]), got {tokens.shape}")
    _check_logits(logits)
    _checks.check_int("tokens", tokens)
    _checks.check_positive("temperature", temperature)
    _checks.check_static_int("chunk_size", chunk_size)

    def one(z, tok):
        z = jnp.maximum(z.astype(jnp.float32) / temperature, _LOGIT_FLOOR)
        lse = jax.nn.logsumexp(z, axis=-1)
        picked = jnp.take_along_axis(z, tok[..., None], axis=-1)[..., 0]
        p = jnp.exp(z - lse[..., None])
        return picked - lse, lse - jnp.sum(p * z, axis=-1)

    return _map_chunks(one, (logits, tokens), chunk_size, 2)

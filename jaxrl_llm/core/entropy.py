"""Token entropy and logprobs from logits, chunked over the sequence.

``[B, T, V]`` logits of a real vocabulary are large (8 x 4096 x 152k float32 is 20 GB); the
functions here walk over the sequence in chunks of ``chunk_size`` positions with
``lax.map``, upcasting only one ``[B, chunk, V]`` slice to float32 at a time. (The forward
pass in ``jaxrl_llm.models`` goes one step further and never materialises the logits.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks

__all__ = ["entropy_from_logits", "chunked_entropy", "chunked_logprobs_and_entropy"]


def entropy_from_logits(logits: jnp.ndarray) -> jnp.ndarray:
    """Shannon entropy ``H = logsumexp(z) - sum softmax(z) z`` over the last axis, float32."""
    z = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(z, axis=-1)
    p = jnp.exp(z - lse[..., None])
    return lse - jnp.sum(p * z, axis=-1)


def _chunks(x: jnp.ndarray, chunk: int):
    b, t = x.shape[:2]
    n = -(-t // chunk)
    pad = n * chunk - t
    if pad:
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape((b, n, chunk) + x.shape[2:])
    return jnp.moveaxis(x, 1, 0), t


def chunked_entropy(logits: jnp.ndarray, chunk_size: int = 128) -> jnp.ndarray:
    """Per-token entropy ``[B, T]`` of ``[B, T, V]`` logits, float32, chunked over ``T``.

    Peak extra memory is one ``[B, chunk_size, V]`` float32 slice.
    """
    _checks.check_rank("logits", logits, 3)
    xs, t = _chunks(logits, chunk_size)
    ys = jax.lax.map(entropy_from_logits, xs)  # [n, B, chunk]
    return jnp.moveaxis(ys, 0, 1).reshape(logits.shape[0], -1)[:, :t]


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
    _checks.check_positive("temperature", temperature)
    xs, t = _chunks(logits, chunk_size)
    ts, _ = _chunks(tokens, chunk_size)

    def one(args):
        z, tok = args
        z = z.astype(jnp.float32) / temperature
        lse = jax.nn.logsumexp(z, axis=-1)
        picked = jnp.take_along_axis(z, tok[..., None], axis=-1)[..., 0]
        p = jnp.exp(z - lse[..., None])
        return picked - lse, lse - jnp.sum(p * z, axis=-1)

    lp, ent = jax.lax.map(one, (xs, ts))
    b = logits.shape[0]
    return (jnp.moveaxis(lp, 0, 1).reshape(b, -1)[:, :t], jnp.moveaxis(ent, 0, 1).reshape(b, -1)[:, :t])

"""Per-token log-probabilities and entropies of given tokens, from final hidden states.

The logits of a real vocabulary are the largest activation of RL training (``[B, T, V]``
float32 is 20 GB for 8 x 4096 x 152k). Here they exist one ``[B, chunk, V]`` slice at a
time: the sequence is walked in chunks inside a ``lax.scan``, and each chunk has a hand-written
backward pass (``jax.custom_vjp``) that recomputes its logits instead of storing them and
forms ``d loss / d logits`` in one elementwise pass (``onehot(target) - p`` for the log-prob,
``-p (z - E_p[z])`` for the entropy), with no scatter for the gathered target. Peak logits
memory is ``B * chunk * V * 4`` bytes in both passes (measured in
``benchmarks/logprobs_memory.py``); against autodiff of the same rematerialised chunk it cut
the GRPO loss gradient of SmolLM2-135M from 4.1-4.4 s to 3.3-3.5 s on this CPU
(``benchmarks/backward_ab.py``). First-order reverse
mode only (no ``jax.jvp`` / forward-mode through it).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks
from jaxrl_llm.models.attn import context_axes
from jaxrl_llm.parallel.sharding import constrain

__all__ = ["token_logprobs", "token_mean_logprobs", "sequence_logprobs", "shared_prefix_logprobs"]


def token_logprobs(hidden: jax.Array, unembedding: jax.Array, targets: jax.Array, *, chunk_size: int = 128,
                   temperature: float = 1.0, with_entropy: bool = True, compute_dtype: Any = None,
                   softcap: float | None = None) -> tuple[jax.Array, jax.Array | None]:
    """``log softmax(h W / temperature)[target]`` and the entropy of that distribution.

    Args:
      hidden: ``[B, T, D]`` final hidden states (position ``t`` predicts ``targets[:, t]``).
      unembedding: ``[D, V]`` output projection (``model.unembedding()``).
      targets: ``[B, T]`` int token ids.
      chunk_size: sequence positions per logits slice (``T`` is padded up to a multiple).
      temperature: the sampler's temperature (logprobs of the *sampling* distribution).
      compute_dtype: matmul input dtype (default: ``hidden``'s); accumulation is float32.
      softcap: the model's final-logit soft-cap (Gemma 2: ``z -> c tanh(z / c)`` before the
        temperature; ``model.final_softcap``), or None.

    Returns:
      ``(logp [B, T], entropy [B, T] or None)`` float32; gradients flow to ``hidden`` and
      ``unembedding``.
    """
    _checks.check_rank("hidden", hidden, 3)
    _checks.check_rank("unembedding", unembedding, 2)
    _checks.check_rank("targets", targets, 2)
    _checks.check_int("targets", targets)
    _checks.check_static_int("chunk_size", chunk_size)
    _checks.check_positive("temperature", temperature)
    if softcap is not None:
        _checks.check_positive("softcap", softcap)
        softcap = float(softcap)
    b, t, d = hidden.shape
    if targets.shape != (b, t):
        raise ValueError(f"argument 'targets' must have shape {(b, t)} (hidden's [B, T]), got {targets.shape}")
    if unembedding.shape[0] != d:
        raise ValueError(f"argument 'unembedding' must be [D={d}, V], got {unembedding.shape}")
    dt = jnp.dtype(compute_dtype or hidden.dtype)
    # the projection keeps its parameter layout through the chunk loop, and so does its gradient
    # there (summed over chunks in FSDP shards; the identity without a mesh)
    unembedding = constrain(unembedding, ("embed", "vocab"))
    found = context_axes()
    if found is not None:  # context parallelism: every device walks its own part of the sequence
        return _context_chunks(hidden, unembedding, targets, chunk_size, temperature, with_entropy, dt, softcap,
                               math.prod(found[0].shape[a] for a in found[1]))
    c = min(chunk_size, t)
    n = -(-t // c)
    pad = n * c - t
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, n, c, d).swapaxes(0, 1)
    y = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n, c).swapaxes(0, 1)

    def body(_, xs):
        return None, _chunk(xs[0], unembedding, xs[1], temperature, bool(with_entropy), dt, softcap)

    _, (lp, ent) = jax.lax.scan(body, None, (h, y))
    lp = lp.swapaxes(0, 1).reshape(b, n * c)[:, :t]
    ent = ent.swapaxes(0, 1).reshape(b, n * c)[:, :t]
    return lp, (ent if with_entropy else None)


def _context_chunks(hidden, unembedding, targets, chunk_size, temperature, with_entropy, dt, softcap, ways):
    """:func:`token_logprobs` with the sequence split over ``ways`` devices (the context axis):
    position ``p`` of shard ``s`` is walked at step ``p // c`` of the scan, so each step computes
    one chunk of every shard at once, each on its own device (no gather of the hidden states,
    no repeated work)."""
    b, t, d = hidden.shape
    c = max(1, min(chunk_size, -(-t // ways)))
    n = -(-t // (ways * c))  # steps per shard
    pad = ways * n * c - t
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, ways, n, c, d)
    y = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, ways, n, c)
    h = jnp.moveaxis(h, 2, 0).reshape(n, b, ways * c, d)  # step, row, (shard, position)
    y = jnp.moveaxis(y, 2, 0).reshape(n, b, ways * c)

    def body(_, xs):
        hc = constrain(xs[0], ("act_batch", "act_seq", None))
        yc = constrain(xs[1], ("act_batch", "act_seq"))
        return None, _chunk(hc, unembedding, yc, temperature, bool(with_entropy), dt, softcap)

    _, (lp, ent) = jax.lax.scan(body, None, (h, y))

    def back(x):  # [n, B, ways * c] -> [B, T]
        return jnp.moveaxis(x.reshape(n, b, ways, c), 0, 2).reshape(b, ways * n * c)[:, :t]

    return back(lp), (back(ent) if with_entropy else None)


def _chunk_forward(h, w, y, temperature, dt, softcap=None):
    z = jnp.einsum("bcd,dv->bcv", h.astype(dt), w.astype(dt), preferred_element_type=jnp.float32)
    z = constrain(z, ("act_batch", "act_seq", "act_vocab"))
    cap_grad = None
    if softcap is not None:  # c tanh(z / c); its derivative 1 - tanh^2 for the backward pass
        th = jnp.tanh(z / softcap)
        z, cap_grad = softcap * th, 1.0 - jnp.square(th)
    z = z / temperature
    lse = jax.nn.logsumexp(z, axis=-1)
    lp = jnp.take_along_axis(z, y[..., None], axis=-1)[..., 0] - lse
    return z, lse, lp, cap_grad


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _chunk(h, w, y, temperature, with_entropy, dt, softcap=None):
    """``(logp, entropy)`` of one ``[B, c]`` slice; the backward pass recomputes the logits."""
    return _chunk_fwd(h, w, y, temperature, with_entropy, dt, softcap)[0]


def _chunk_fwd(h, w, y, temperature, with_entropy, dt, softcap=None):
    z, lse, lp, _ = _chunk_forward(h, w, y, temperature, dt, softcap)
    if with_entropy:
        ent = lse - jnp.sum(jnp.exp(z - lse[..., None]) * z, axis=-1)
    else:
        ent = jnp.zeros_like(lp)
    return (lp, ent), (h, w, y, temperature, lse, ent)  # the [B, c, V] logits are not kept


def _chunk_bwd(with_entropy, dt, softcap, res, g):
    """d logp / dz = onehot(y) - p; d entropy / dz = -p (z - E_p[z]); both over temperature
    (and times ``1 - tanh^2`` under a soft-cap). One fused elementwise pass and two matmuls (no
    scatter for the gathered target)."""
    h, w, y, temperature, lse, ent = res
    g_lp, g_ent = g
    z, _, _, cap_grad = _chunk_forward(h, w, y, temperature, dt, softcap)
    p = jnp.exp(z - lse[..., None])
    hit = jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1) == y[..., None]
    dz = g_lp[..., None] * (jnp.where(hit, 1.0, 0.0) - p)
    if with_entropy:  # d(entropy)/dz = -p (z - E_p[z]),  E_p[z] = lse - entropy
        dz = dz - g_ent[..., None] * p * (z - (lse - ent)[..., None])
    dz = dz / temperature
    if cap_grad is not None:
        dz = dz * cap_grad
    dz = constrain(dz, ("act_batch", "act_seq", "act_vocab")).astype(dt)
    dh = jnp.einsum("bcv,dv->bcd", dz, w.astype(dt), preferred_element_type=jnp.float32)
    dw = jnp.einsum("bcd,bcv->dv", h.astype(dt), dz, preferred_element_type=jnp.float32)
    # split like the parameter (FSDP): summed over the chunks in shards, never a whole float32 [D, V]
    # per device (the identity without a mesh)
    dw = constrain(dw, ("embed", "vocab"))
    return dh.astype(h.dtype), dw.astype(w.dtype), None, None  # targets, temperature: no gradient


_chunk.defvjp(_chunk_fwd, _chunk_bwd)


def token_mean_logprobs(hidden: jax.Array, unembedding: jax.Array, *, chunk_size: int = 128,
                        temperature: float = 1.0, compute_dtype: Any = None, softcap: float | None = None
                        ) -> jax.Array:
    """``[B, T]`` mean over the vocabulary of ``log softmax(h W / temperature)`` at each position:
    ``mean_v z_v - logsumexp(z)`` (the value of the position under a uniform policy whose action
    values are the log-probs: ROVER's ``sum_log_softmax / V``), without gradient, in chunks of
    ``chunk_size`` positions (never ``[B, T, V]`` at once). Same arguments as :func:`token_logprobs`."""
    _checks.check_rank("hidden", hidden, 3)
    _checks.check_rank("unembedding", unembedding, 2)
    _checks.check_static_int("chunk_size", chunk_size)
    _checks.check_positive("temperature", temperature)
    b, t, d = hidden.shape
    if unembedding.shape[0] != d:
        raise ValueError(f"argument 'unembedding' must be [D={d}, V], got {unembedding.shape}")
    if softcap is not None:
        _checks.check_positive("softcap", softcap)
        softcap = float(softcap)
    dt = jnp.dtype(compute_dtype or hidden.dtype)
    hidden, unembedding = jax.lax.stop_gradient(hidden), jax.lax.stop_gradient(unembedding)
    unembedding = constrain(unembedding, ("embed", "vocab"))  # kept in its parameter layout (FSDP)
    c = min(chunk_size, t)
    n = -(-t // c)
    h = jnp.pad(hidden, ((0, 0), (0, n * c - t), (0, 0))).reshape(b, n, c, d).swapaxes(0, 1)

    def body(_, hc):
        z = jnp.einsum("bcd,dv->bcv", hc.astype(dt), unembedding.astype(dt), preferred_element_type=jnp.float32)
        if softcap is not None:
            z = softcap * jnp.tanh(z / softcap)
        z = z / temperature
        return None, jnp.mean(z, axis=-1) - jax.nn.logsumexp(z, axis=-1)

    _, out = jax.lax.scan(body, None, h)
    return out.swapaxes(0, 1).reshape(b, n * c)[:, :t]


def sequence_logprobs(model, tokens: jax.Array, mask: jax.Array, *, chunk_size: int = 128,
                      temperature: float = 1.0, with_entropy: bool = True, positions=None, segment_ids=None
                      ) -> tuple[jax.Array, jax.Array | None]:
    """Teacher-forced log-probs of ``tokens[:, 1:]`` under ``model`` (an LM-head Transformer).

    Returns ``[B, L - 1]`` arrays: entry ``t`` is the log-prob of ``tokens[:, t + 1]`` given
    the tokens before it (multiply by ``mask[:, 1:]`` and a response mask as needed).
    """
    hidden, _ = model(tokens, mask, positions=positions, segment_ids=segment_ids)
    return token_logprobs(hidden[:, :-1], model.unembedding(), tokens[:, 1:], chunk_size=chunk_size,
                          temperature=temperature, with_entropy=with_entropy, softcap=model.final_softcap)


def shared_prefix_logprobs(model, tokens: jax.Array, mask: jax.Array, prompt_len: int, rows_per_prompt: int, *,
                           chunk_size: int = 128, temperature: float = 1.0, with_entropy: bool = True
                           ) -> tuple[jax.Array, jax.Array | None]:
    """:func:`sequence_logprobs` of rows that share their prompts, encoding each prompt once.

    ``tokens [N, P + T]``: consecutive blocks of ``rows_per_prompt`` rows hold the same
    (left-padded) prompt in their first ``P = prompt_len`` columns, followed by each row's own
    completion (the RL batch layout). The prompts are encoded once per block
    (:meth:`~jaxrl_llm.models.transformer.Transformer.encode_prefix`), the completions attend
    to their prompt's keys/values (Prefix Grouper, arXiv 2506.05433), and log-probs are
    computed for the completion targets only: entry ``t`` of the ``[N, P + T - 1]`` result is
    the log-prob of ``tokens[:, t + 1]`` for ``t >= P - 1``, and 0 over the prompt's own
    targets (``t < P - 1``, which an RL loss masks). On those completion targets the values and
    the gradients equal :func:`sequence_logprobs`'s up to float rounding, for ``P * (r - 1)``
    fewer token positions through every layer and ``(P - 1) * N`` fewer through the output
    projection. Nothing checks that the prompts of a block are equal: that is the caller's
    contract (the RL loop checks it on the host).
    """
    n, length = tokens.shape
    r, p = int(rows_per_prompt), int(prompt_len)
    if r < 1 or n % r:
        raise ValueError(f"rows_per_prompt={r} must be >= 1 and divide the {n} rows")
    if not 1 <= p < length:
        raise ValueError(f"prompt_len={p} must be in [1, {length}) (the tokens have {length} columns)")
    u = n // r
    mask = mask.astype(bool)
    hp, prefix = model.encode_prefix(tokens.reshape(u, r, length)[:, 0, :p], mask.reshape(u, r, length)[:, 0, :p])
    hs, _ = model(tokens[:, p:], mask[:, p:], prefix=prefix)
    # the completion's first token is predicted from the prompt's last position (shared per block)
    h = jnp.concatenate([jnp.repeat(hp[:, -1:], r, axis=0), hs[:, :-1]], axis=1)
    lp, ent = token_logprobs(h, model.unembedding(), tokens[:, p:], chunk_size=chunk_size, temperature=temperature,
                             with_entropy=with_entropy, softcap=model.final_softcap)
    pad = jnp.zeros((n, p - 1), jnp.float32)
    return (jnp.concatenate([pad, lp], axis=1),
            jnp.concatenate([pad, ent], axis=1) if with_entropy else None)

"""Sampling rules: pure functions from next-token logits ``[N, V]`` to tokens.

The order and semantics follow ``transformers``' logits warpers, so that a configuration
means the same thing here and in HF ``generate``: forbidden tokens are removed, then
temperature, top-k (ties with the k-th value kept), top-p (nucleus: the smallest set of
most likely tokens whose mass reaches ``p``; the most likely token always stays) and min-p
(tokens below ``min_p`` times the top probability are removed).

Top-k and top-p find their per-row threshold by bisection over the float32 values' bit
patterns (exact, 32 passes over the vocabulary) instead of sorting; the kept sets equal HF's
(tested against its warpers), up to float summation order at an exact top-p boundary.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

__all__ = ["SamplingConfig", "first_argmax", "process_logits", "sample_tokens"]

_NEG = -jnp.inf


WEIGHT_DTYPES = ("float32", "bfloat16", "float16")  # SamplingConfig.weight_dtype's choices besides None


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How completions are drawn (hashable: a static argument of the jitted sampler).

    Attributes:
      max_new_tokens: completion budget ``T``.
      num_samples: completions per prompt ``G`` (the prompt is prefilled once).
      greedy: argmax decoding (temperature and truncation are ignored).
      temperature, top_k (0 = off), top_p (1 = off), min_p (0 = off): HF semantics.
      stop_token_ids: a row is done after emitting any of them (it is kept in the mask).
      forbidden_token_ids: never sampled (their logits are set to -inf).
      pad_token_id: fills completions after they end.
      weight_dtype: the dtype the sampler decodes in (``None``: the model's own; any other value
        is a cast, even one that happens to equal the model's dtype). With
        ``"bfloat16"`` the weights are cast once per rollout (the training weights stay as they
        are), matmuls take bfloat16 inputs and accumulate in float32, and the KV cache is
        bfloat16: half the bytes a decode step streams. The sampled tokens' log-probs are then
        those of the cast model; a trainer corrects the mismatch with recomputed old log-probs
        and importance weights (``recipe.old_logp=recompute``, ``recipe.is_weights``).
      shared_prompt_kv: with ``num_samples > 1``, keep each prompt's keys/values once and let
        its ``G`` rows read them in place while decoding (the Prefix Grouper layout of the
        update, applied to the KV cache), instead of copying the prompt's cache into every
        row. The cache then holds ``B * P + B * G * T`` slots instead of ``B * G * (P + T)``
        and each decode step reads that much less. Same distribution; the attention sums its
        parts in another order, so the numbers agree to float rounding, not bit for bit
        (hence off by default). Ignored (the copy is used) when a call divides the rows
        unevenly (``Sampler(..., counts=...)``).
    """

    max_new_tokens: int = 128
    num_samples: int = 1
    greedy: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    forbidden_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    weight_dtype: str | None = None
    shared_prompt_kv: bool = False

    def __post_init__(self):
        def need(ok, field, msg):
            if not ok:
                raise ValueError(f"SamplingConfig.{field} {msg}, got {getattr(self, field)!r}")

        need(isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1, "max_new_tokens", "must be an int >= 1")
        need(isinstance(self.num_samples, int) and self.num_samples >= 1, "num_samples", "must be an int >= 1")
        need(self.greedy or self.temperature > 0, "temperature", "must be > 0 (use greedy=True for argmax)")
        need(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", "must be an int >= 0 (0 = off)")
        need(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        need(0 <= self.min_p < 1, "min_p", "must be in [0, 1)")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "forbidden_token_ids", tuple(int(t) for t in self.forbidden_token_ids))
        need(not set(self.stop_token_ids) & set(self.forbidden_token_ids), "forbidden_token_ids",
             "must not contain a stop token")
        need(self.weight_dtype is None or self.weight_dtype in WEIGHT_DTYPES, "weight_dtype",
             f"must be None or one of {WEIGHT_DTYPES}")
        need(isinstance(self.shared_prompt_kv, bool), "shared_prompt_kv", "must be a bool")


def sampling_model(graphdef, params, others: tuple, config: SamplingConfig):
    """The merged model a sampler decodes with: as given (``config.weight_dtype`` None), or with
    its floating-point weights cast to ``config.weight_dtype`` and computing in it."""
    from flax import nnx

    from jaxrl_llm.models.transformer import cast_floating, with_compute_dtype

    if config.weight_dtype is None:
        return nnx.merge(graphdef, params, *others)
    params, others = cast_floating((params, others), config.weight_dtype)
    return with_compute_dtype(nnx.merge(graphdef, params, *others), config.weight_dtype)


def _order_keys(z: jax.Array) -> jax.Array:
    """uint32 keys with the order of the float32 values (-inf lowest)."""
    bits = jax.lax.bitcast_convert_type(z.astype(jnp.float32), jnp.uint32)
    neg = (bits >> 31) == 1
    return jnp.where(neg, ~bits, bits | jnp.uint32(0x80000000))


def _bisect(pred, n: int) -> jax.Array:
    """Per row, the largest uint32 ``t`` with ``pred(t)`` true, for a predicate that is true
    at 0 and monotone (true up to some point, false after): 32 exact halvings of the key
    space, each a pass over ``[N, V]`` -- much cheaper on CPU than a sort or ``top_k``."""
    def body(_, lohi):
        lo, hi = lohi
        mid = lo + ((hi - lo) >> 1) + ((hi - lo) & 1)
        ok = pred(mid)
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid - 1)

    lo, _ = jax.lax.fori_loop(0, 32, body, (jnp.zeros((n,), jnp.uint32), jnp.full((n,), 0xFFFFFFFF, jnp.uint32)))
    return lo


def process_logits(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """The (unnormalised) log-weights tokens are drawn from: float32 ``[N, V]``, -inf where
    a token cannot be drawn."""
    z = logits.astype(jnp.float32)
    if cfg.forbidden_token_ids:
        z = z.at[..., jnp.asarray(cfg.forbidden_token_ids)].set(_NEG)
    if cfg.greedy:
        return z
    z = z / cfg.temperature
    if cfg.top_k and cfg.top_k < z.shape[-1]:
        u = _order_keys(z)
        kth = _bisect(lambda t: jnp.sum(u >= t[:, None], axis=-1) >= cfg.top_k, z.shape[0])
        z = jnp.where(u < kth[:, None], _NEG, z)  # keeps ties with the k-th value, as HF
    if cfg.top_p < 1.0:
        u = _order_keys(z)
        p = jax.nn.softmax(z, axis=-1)
        # HF removes a token when the ascending cumulative mass through it is <= 1 - top_p,
        # i.e. every token below the smallest value whose mass at-or-below exceeds 1 - top_p
        mass_le = lambda t: jnp.sum(jnp.where(u <= t[:, None], p, 0.0), axis=-1)  # noqa: E731
        tau = _bisect(lambda t: mass_le(t - 1) <= 1.0 - cfg.top_p, z.shape[0])
        z = jnp.where(u < tau[:, None], _NEG, z)
    if cfg.min_p > 0.0:
        p = jax.nn.softmax(z, axis=-1)
        z = jnp.where(p < cfg.min_p * jnp.max(p, axis=-1, keepdims=True), _NEG, z)
    return z


def first_argmax(z: jax.Array) -> jax.Array:
    """``jnp.argmax(z, axis=-1)`` as int32 (the first index of the row's maximum; of its first NaN
    if it has one, as numpy) as a max and a min over ``z``: XLA:CPU runs argmax's value-and-index reduction
    element by element, at ~1.2 ms per ``[32, 16384]`` float32 row block (18% of a greedy decode
    step of an 8.7M model), and these two plain reductions vectorise."""
    zmax = jnp.max(z, axis=-1, keepdims=True)  # NaN if the row has one (max propagates NaN)
    hit = (z == zmax) | jnp.isnan(z)
    idx = jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1)
    return jnp.min(jnp.where(hit, idx, z.shape[-1]), axis=-1)


def sample_tokens(logits: jax.Array, key: jax.Array, cfg: SamplingConfig) -> tuple[jax.Array, jax.Array]:
    """Draw one token per row. Returns ``(tokens [N] int32, logprobs [N] float32)``.

    The log-prob is that of the temperature-scaled full distribution,
    ``log_softmax(logits / temperature)[token]`` (temperature 1 when greedy): the quantity a
    trainer recomputes with :func:`jaxrl_llm.models.token_logprobs` (no truncation, no
    forbidden-token mask), so importance ratios start at exactly 1.
    """
    z = process_logits(logits, cfg)
    t = 1.0 if cfg.greedy else cfg.temperature
    zt = logits.astype(jnp.float32) / t
    if cfg.greedy:
        tok = first_argmax(z)
        lse = jax.nn.logsumexp(zt, axis=-1)
    else:
        # inverse-CDF draw: one uniform per row (a Gumbel draw needs one per vocabulary entry,
        # which dominated the step on CPU); tokens of zero probability are never chosen
        zmax = jnp.max(z, axis=-1, keepdims=True)
        c = jnp.cumsum(jnp.exp(z - zmax), axis=-1)
        u = jax.random.uniform(key, (z.shape[0], 1), jnp.float32) * c[:, -1:]
        tok = jnp.minimum(jnp.sum(c <= u, axis=-1), z.shape[-1] - 1)
        untruncated = not (cfg.forbidden_token_ids or cfg.top_k or cfg.top_p < 1.0 or cfg.min_p > 0.0)
        # without truncation z == zt, so the normaliser is already in the cumulative sum
        lse = (zmax[:, 0] + jnp.log(c[:, -1])) if untruncated else jax.nn.logsumexp(zt, axis=-1)
    lp = jnp.take_along_axis(zt, tok[:, None], axis=-1)[:, 0] - lse
    return tok.astype(jnp.int32), lp

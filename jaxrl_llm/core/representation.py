"""Statistics of a response's hidden states: the effective rank and its dynamics (VERL, METHODS.md
#166), the exploration bonus built from them, and the capped advantage shaping that uses it.

VERL ("Beyond the Exploration-Exploitation Trade-off: A Hidden State Approach for LLM Reasoning",
arXiv:2509.23808) measures each response's final-norm hidden states ``H [T, D]`` (one row per
response token: the state whose next-token distribution sampled it):

* the **effective rank** ``ER(H) = exp(-sum_i p_i log(p_i + 1e-8))``, ``p_i = s_i / (sum s + 1e-8)``
  over the singular values ``s`` of the row-centred ``H`` (singular values, not their squares);
* its **velocity** ``ERV`` and **acceleration** ``ERA``: at checkpoints ``t_j = s, 2s, ... < L`` (the
  stride ``s``; the response's last ``max_len`` tokens), ``ER_j = ER(H[:t_j + 1])`` over the growing
  prefix, ``ERV_j = ER_j - mean(ER_0 .. ER_{j-1})`` (``j >= 1``), ``ERA_j = ERV_j - ERV_{j-1}``
  (``j >= 2``); a response's ``ERV`` / ``ERA`` are the means over its checkpoints (0 without any).

The sources are the authors' code (hf618/VERL @3de68f1: ``verl/trainer/metrics_utils.py``
``compute_single_effective_rank`` and ``calculate_diffs_for_single_sample_optimized``,
``metrics_calculator.py``'s ``_aggregate_diffs``, ``reward_manager_versions.py``'s ``PlanB``
signal, ``ppo/ray_trainer.py``'s ``compute_advantage``); ``tests/conformance/test_verl_er_authors.py``
transcribes them. The whole-response rank uses every response token (the code truncates only the
dynamics to ``max_len``). The code keeps ranks and rewards in bfloat16; these functions compute in
float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

__all__ = ["effective_rank", "effective_rank_dynamics", "effective_rank_bonus", "capped_bonus_advantages"]

_EPS = 1e-8


def _er_of_singular_values(s: jax.Array) -> jax.Array:
    p = s / (jnp.sum(s) + _EPS)
    return jnp.exp(-jnp.sum(p * jnp.log(p + _EPS)))


def _row_effective_rank(h: jax.Array, m: jax.Array) -> jax.Array:
    w = m.astype(jnp.float32)
    k = jnp.sum(w)
    mean = jnp.sum(h * w[:, None], 0) / jnp.maximum(k, 1.0)
    c = (h - mean) * w[:, None]  # rows outside the mask: zero rows add zero singular values
    s = jnp.linalg.svd(c, compute_uv=False)
    return jnp.where(k >= 2, _er_of_singular_values(s), 0.0)


def effective_rank(hidden: jax.Array, mask: jax.Array) -> jax.Array:
    """``[N]`` effective rank of each row's masked hidden states ``hidden [N, T, D]`` (``mask
    [N, T]``): ``exp`` of the entropy of the normalised singular values of the row-centred states
    (0 for a row with fewer than 2 states). Rows are computed one at a time (``lax.map``)."""
    h = jnp.asarray(hidden, jnp.float32)
    m = jnp.asarray(mask).astype(bool)
    return jax.lax.map(lambda hm: _row_effective_rank(*hm), (h, m))


def _row_dynamics(h: jax.Array, m: jax.Array, stride: int, max_len: int) -> tuple[jax.Array, jax.Array]:
    t_len = h.shape[0]
    width = min(t_len, max_len)  # the kept states fit here, whatever the batch's padding
    r = jnp.cumsum(m) - 1  # index among the row's valid states
    n = jnp.sum(m)
    start = jnp.maximum(n - max_len, 0)  # the last max_len valid states
    kept = n - start
    q = jnp.where(m & (r >= start), r - start, width)  # slot in the buffer; `width`: dropped
    src = jnp.zeros(width + 1, jnp.int32).at[q].set(jnp.arange(t_len, dtype=jnp.int32))[:width]
    pos = jnp.arange(width)
    valid = (pos < kept).astype(jnp.float32)
    hk = h[src] * valid[:, None]
    n_ck = max(1, math.ceil(width / stride))
    ts = stride * (jnp.arange(n_ck) + 1)

    def rank_at(t):  # ER of the prefix (slots <= t): singular values of its centred states
        win = valid * (pos <= t)
        mean = jnp.sum(hk * win[:, None], 0) / jnp.maximum(jnp.sum(win), 1.0)
        # the slots outside the prefix are zero rows: zero singular values, which add nothing
        # (the SVD's rounding is relative to the largest singular value, not its square, as the
        # Gram matrix's eigenvalues would be: float32 resolves the small ones)
        return _er_of_singular_values(jnp.linalg.svd((hk - mean) * win[:, None], compute_uv=False))

    ers = jax.vmap(rank_at)(ts)
    ok = (ts < kept) & (kept >= 2 * stride) & (kept >= 2)
    okf = ok.astype(jnp.float32)
    j = jnp.arange(n_ck)
    before = jnp.cumsum(ers * okf) - ers * okf  # sum of ER_0 .. ER_{j-1}
    erv = ers - before / jnp.maximum(j, 1)
    v1 = ok & (j >= 1)
    era = erv - jnp.concatenate([jnp.zeros(1), erv[:-1]])
    v2 = ok & (j >= 2)
    mean_erv = jnp.sum(jnp.where(v1, erv, 0.0)) / jnp.maximum(jnp.sum(v1), 1)
    mean_era = jnp.sum(jnp.where(v2, era, 0.0)) / jnp.maximum(jnp.sum(v2), 1)
    return mean_erv, mean_era


def effective_rank_dynamics(hidden: jax.Array, mask: jax.Array, *, stride: int = 40, max_len: int = 512
                            ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(er, erv, era)``, each ``[N]``: the effective rank of each row's masked hidden states and
    its velocity and acceleration over growing prefixes (module docstring), with the authors'
    released stride (40) and window (the last 512 states for the dynamics).

    A row's states are its masked positions in order (``mask`` need not be a prefix); rows with
    ``<= 2 * stride`` kept states have ``erv = era = 0``, as in the code. The kept states are
    gathered into a ``[min(T, max_len), D]`` buffer first (the cost does not grow with the batch's
    padding). Every rank comes from singular values: the code's fast path takes the prefixes' from
    the eigenvalues of their Gram matrices, the same numbers in exact arithmetic, but in float32
    those resolve only singular values above about ``3e-4`` of the largest (the rounding is
    relative to the largest eigenvalue, a squared singular value)."""
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"stride must be an int >= 1, got {stride!r}")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
        raise ValueError(f"max_len must be an int >= 2, got {max_len!r}")
    h = jnp.asarray(hidden, jnp.float32)
    m = jnp.asarray(mask).astype(bool)
    er = effective_rank(h, m)
    erv, era = jax.lax.map(lambda hm: _row_dynamics(hm[0], hm[1], stride, max_len), (h, m))
    return er, erv, era


def effective_rank_bonus(er: jax.Array, erv: jax.Array, era: jax.Array, baseline: jax.Array, *, gain: float = 2.0,
                         weight: float = 1.0, explore: Sequence[float] = (0.0, 0.0, 1.0),
                         exploit: Sequence[float] = (0.0, 1.0, 0.0), clip: float = 5.0) -> jax.Array:
    """``[N]`` VERL's auxiliary signal (the code's ``PlanB``): the relative deviation of each
    indicator ``x = (era, erv, er)`` from its running baseline ``b [3]``,
    ``rel = clip((x - b) / (|b| + 1e-8), -clip, clip)``; the exploration tendency
    ``tau = sigmoid(gain * rel_era)`` mixes two weight profiles over the indicators
    ``w = tau * explore + (1 - tau) * exploit``; the signal is ``weight * sum_k w_k tanh(rel_k)``.
    With the defaults (the released ones): ``tau tanh(rel_er) + (1 - tau) tanh(rel_erv)``: a
    response whose rank accelerates is paid for its rank, one that does not for its velocity."""
    for name, w in (("explore", explore), ("exploit", exploit)):
        if len(w) != 3 or any(not (isinstance(v, (int, float)) and v >= 0) for v in w):
            raise ValueError(f"argument {name!r} must be 3 weights >= 0 (on era, erv, er), got {w!r}")
    if not clip > 0:
        raise ValueError(f"argument 'clip' must be > 0, got {clip!r}")
    x = jnp.stack([jnp.asarray(era, jnp.float32), jnp.asarray(erv, jnp.float32), jnp.asarray(er, jnp.float32)], -1)
    b = jnp.asarray(baseline, jnp.float32)
    rel = jnp.clip((x - b) / (jnp.abs(b) + _EPS), -clip, clip)
    tau = jax.nn.sigmoid(gain * rel[..., 0])
    w = tau[..., None] * jnp.asarray(explore, jnp.float32) + (1.0 - tau[..., None]) * jnp.asarray(exploit, jnp.float32)
    return weight * jnp.sum(jnp.tanh(rel) * w, -1)


def capped_bonus_advantages(advantages: jax.Array, bonus: jax.Array, mask: jax.Array, *, kappa: float = 2.0,
                            at: str = "last") -> jax.Array:
    """``A + min(relu(bonus), |A| / kappa)``: VERL's advantage shaping, a non-negative bonus capped
    at ``1 / kappa`` of the advantage's magnitude, on each row's last masked token (``at="last"``:
    the code, whose bonus is a reward on that token) or on every masked token (``at="all"``).
    ``advantages [N, T]``, ``bonus [N]``, ``mask [N, T]``; elsewhere the advantages are unchanged."""
    if at not in ("last", "all"):
        raise ValueError(f"at must be 'last' or 'all', got {at!r}")
    if not kappa > 0:
        raise ValueError(f"kappa must be > 0, got {kappa!r}")
    adv = jnp.asarray(advantages, jnp.float32)
    m = jnp.asarray(mask).astype(bool)
    if at == "last":
        t = m.shape[-1]
        last = t - 1 - jnp.argmax(m[..., ::-1], axis=-1)
        m = m & (jnp.arange(t) == last[..., None])
    add = jnp.minimum(jax.nn.relu(jnp.asarray(bonus, jnp.float32))[..., None], jnp.abs(adv) / kappa)
    return jnp.where(m, adv + add, adv)

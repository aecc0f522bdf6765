"""Segment-level credit from Monte-Carlo values at cut points inside a response.

A response of ``T`` tokens is cut before some tokens; ``cuts [B, T]`` marks token ``t`` when the
prefix ``y_{<t}`` is a cut point (``t = 0``: the prompt alone), and ``cut_values [B, T]`` holds
the value estimate ``V(y_{<t})`` there (the mean reward of continuations sampled from that prefix;
the loop's ``mc_values`` input). The tokens between two cut points form a segment; its advantage
compares the values at its two ends, and the last segment ends at the response's own score.

Shapes and conventions as :mod:`jaxrl_llm.core.advantages`: ``mask [B, T]`` the response tokens,
``old_logp [B, T]`` the sampling policy's log-probs, outputs ``[B, T]`` float32 without gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks
from jaxrl_llm.core.stats import masked_whiten

__all__ = ["spo_cut_points", "spo_chain_advantages", "pav_advantages", "best_of_k_value"]

sg = jax.lax.stop_gradient


def spo_cut_points(old_logp: jnp.ndarray, mask: jnp.ndarray, *, threshold: float = 0.9, interval: int = 5
                   ) -> jnp.ndarray:
    """SPO-chain's cut points: before every ``interval``-th low-probability token.

    Token ``t`` is a candidate when the sampling policy gave it probability below ``threshold``
    (``exp(old_logp) < threshold``): the prefix before an uncertain token is where the outcome can
    still change. Candidates are kept every ``interval``-th (the first, the ``interval + 1``-th, ...).

    Paper: "Segment Policy Optimization: Effective Segment-Level Credit Assignment in RL for Large
    Language Models" (SPO), arXiv:2505.23564; code ``AIFrameResearch/SPO`` @b9fc6a2
    (``_create_value_estimation_requests``): threshold 0.9 (hard-coded there), interval 5 (the
    "int5" configuration).

    Args:
      old_logp: ``[B, T]``. mask: ``[B, T]``. threshold: probability below which a token is uncertain.
      interval: keep every ``interval``-th candidate (>= 1).

    Returns:
      ``[B, T]`` bool cut points (``cuts[b, t]``: a cut before token ``t``).
    """
    _checks.check_token_args(old_logp=old_logp, mask=mask)
    _checks.check_static_int("interval", interval)
    m = _checks.as_mask(mask) > 0
    p = jnp.exp(_checks.zero_outside(_checks.as_float(old_logp), m.astype(jnp.float32)))
    cand = m & (p < threshold)
    rank = jnp.cumsum(cand.astype(jnp.int32), axis=1) - 1
    return cand & (rank % interval == 0)


def _segment_ends(scores, cut_values, cuts, m):
    """Per token: ``(value at the segment's start, value at its end, has a start)``: the start is
    the latest cut at or before the token, the end the next cut after it or the response's score."""
    b, t = m.shape
    pos = jnp.arange(t)[None]
    c = cuts & m
    prev = jax.lax.cummax(jnp.where(c, pos, -1), axis=1)
    nxt_incl = jax.lax.cummin(jnp.where(c, pos, t), axis=1, reverse=True)
    nxt = jnp.concatenate([nxt_incl[:, 1:], jnp.full((b, 1), t)], axis=1)   # the first cut strictly after
    v = _checks.zero_outside(_checks.as_float(cut_values), c.astype(jnp.float32))
    start = jnp.take_along_axis(v, jnp.clip(prev, 0, t - 1), axis=1)
    end = jnp.where(nxt < t, jnp.take_along_axis(v, jnp.clip(nxt, 0, t - 1), axis=1),
                    _checks.as_float(scores)[:, None])
    return start, end, prev >= 0


def _prep_segments(scores, cut_values, cuts, mask, old_logp):
    """Checks; ``(mask, sampling probabilities, segment start values, end values, has a start)``."""
    b, _ = _checks.check_token_args(cut_values=cut_values, old_logp=old_logp, mask=mask)
    _checks.check_same_shape("mask", mask, cuts=cuts)
    _checks.check_seq_args(b, scores=scores)
    m = _checks.as_mask(mask) > 0
    p = jnp.exp(_checks.zero_outside(_checks.as_float(old_logp), m.astype(jnp.float32)))
    return (m, p) + _segment_ends(scores, cut_values, jnp.asarray(cuts).astype(bool), m)


def _finish(adv, m, p, threshold, prob_mask, whiten):
    keep = m & (p < threshold) if prob_mask else m
    adv = jnp.where(keep, adv, 0.0)
    if whiten:
        stat = jnp.where(jnp.any(keep), keep, m).astype(jnp.float32)   # an empty probability mask: the response mask
        adv = masked_whiten(adv, stat) * keep
    return sg(adv.astype(jnp.float32)), keep


def spo_chain_advantages(scores: jnp.ndarray, cut_values: jnp.ndarray, cuts: jnp.ndarray, mask: jnp.ndarray,
                         old_logp: jnp.ndarray, *, threshold: float = 0.9, prob_mask: bool = True,
                         whiten: bool = True) -> tuple[jnp.ndarray, jnp.ndarray]:
    """SPO-chain: segment advantages from Monte-Carlo values at the cut points.

    With cut points ``t_0 < t_1 < ...`` (:func:`spo_cut_points`) and values ``V(t_j)``, every token of
    the segment ``[t_j, t_{j+1})`` gets ``V(t_{j+1}) - V(t_j)`` and the last segment ``[t_last, T)``
    gets ``score - V(t_last)``; tokens before the first cut get 0 (so a response without a cut
    point gets no advantage, not GRPO's). With ``prob_mask`` only the low-probability tokens
    (``exp(old_logp) < threshold``) keep their advantage and stay in the loss (the returned mask);
    ``whiten`` normalises over them (unbiased variance, eps 1e-8; the response mask when none).
    Along a response the segment advantages telescope to ``score - V(t_0)``.

    Paper: "Segment Policy Optimization: Effective Segment-Level Credit Assignment in RL for Large
    Language Models" (SPO), arXiv:2505.23564; code ``AIFrameResearch/SPO`` @b9fc6a2
    (``_compute_token_advantages``, ``ppo_trainer.py`` ``use_prob_mask``, ``whiten_advantages``).

    Args:
      scores: ``[B]`` outcome rewards. cut_values: ``[B, T]`` value estimates at the cut points
      (read only there). cuts: ``[B, T]`` bool. mask: ``[B, T]``. old_logp: ``[B, T]``.
      threshold: the probability mask's threshold. prob_mask: apply it. whiten: whiten the result.

    Returns:
      ``(advantages [B, T], loss_mask [B, T] bool)``.
    """
    m, p, start, end, has = _prep_segments(scores, cut_values, cuts, mask, old_logp)
    adv = jnp.where(has & m, end - start, 0.0)
    return _finish(adv, m, p, threshold, prob_mask, whiten)


def best_of_k_value(v: jnp.ndarray, k: int) -> jnp.ndarray:
    """``1 - (1 - v)^k``: the success probability of the best of ``k`` independent attempts for a
    0/1 reward with success probability ``v`` (the Best-of-K prover's value, PAV)."""
    _checks.check_static_int("k", k)
    x = jnp.clip(_checks.as_float(v), 0.0, 1.0)
    return 1.0 - (1.0 - x) ** k


def pav_advantages(scores: jnp.ndarray, cut_values: jnp.ndarray, cuts: jnp.ndarray, mask: jnp.ndarray,
                   old_logp: jnp.ndarray, *, alpha: float = 5.0, k: int = 4, threshold: float = 0.9,
                   prob_mask: bool = True, whiten: bool = True) -> tuple[jnp.ndarray, jnp.ndarray]:
    """PAV: the step's value under the policy plus its progress under a Best-of-K prover.

    For the segment ``[t_j, t_{j+1})`` with values ``V`` at its start and ``V'`` at its end (the next
    cut or the score): ``A = V' + alpha (BoK(V') - BoK(V))`` on its tokens, ``BoK(v) = 1 - (1 - v)^k``
    (:func:`best_of_k_value`): the policy's Q-value plus ``alpha`` times the progress the step makes
    for a stronger prover, which the paper shows is the effective process reward. Tokens before the
    first cut get 0; the probability mask and whitening as :func:`spo_chain_advantages`.

    Paper: "Rewarding Progress: Scaling Automated Process Verifiers for LLM Reasoning" (PAV,
    Setlur et al.), arXiv:2410.08146. The authors' code is not public: ``A = Q^pi + alpha A^mu``
    is the paper's; ``alpha = 5``, the Best-of-4 prover from the policy's own Monte-Carlo values and
    the step segmentation are those of the SPO authors' PAV baseline (``AIFrameResearch/SPO``
    @b9fc6a2, ``use_pav.jsonnet``), here on SPO-chain's cut points. ``alpha = 0``: the MC Q-value.

    Returns:
      ``(advantages [B, T], loss_mask [B, T] bool)``.
    """
    m, p, start, end, has = _prep_segments(scores, cut_values, cuts, mask, old_logp)
    adv = end + alpha * (best_of_k_value(end, k) - best_of_k_value(start, k))
    adv = jnp.where(has & m, adv, 0.0)
    return _finish(adv, m, p, threshold, prob_mask, whiten)

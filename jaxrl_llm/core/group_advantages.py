"""Group-relative advantage estimators of recent papers: re-weightings and re-centrings of GRPO.

Each function takes the outcome convention of :mod:`jaxrl_llm.core.advantages`: ``scores [B]``
sequence rewards, ``mask [B, T]`` the response tokens, ``group_ids [B]`` in ``[0, num_groups)``
(static ``num_groups``; any row order), optional ``valid [B]`` (rows outside it take no part in
any statistic and get advantage 0), plus the per-row signal the method needs (a metric, an
answer cluster, a stratum). Outputs are ``[B, T]`` float32, broadcast over the response and zero
outside it, without gradient. Where a paper and its authors' released code differ, the docstring
says which one is followed and how to get the other.

"GRPO(r)" below is :func:`~jaxrl_llm.core.grpo_advantages`: ``(r - mean_g r) / (std_g r + eps)``
with the unbiased std and verl's one-sample convention (mean 0, std 1).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks
from jaxrl_llm.core.advantages import _broadcast, _prep_outcome, grpo_advantages
from jaxrl_llm.core.stats import group_stats, group_sum, masked_whiten, safe_divide

__all__ = [
    "agrae_advantages",
    "canon_advantages",
    "stratified_advantages",
    "seed_grpo_advantages",
    "semantic_entropy",
    "hapo_token_group_advantages",
    "riskpo_advantages",
    "adora_advantages",
    "drop_small_advantages",
    "hicra_advantages",
    "copo_advantages",
    "low_probability_confidence",
    "arm_advantages",
    "aspo_advantages",
    "max_variance_subset",
    "d3s_mask",
    "treepo_advantages",
    "brpo_advantages",
    "brpo_budget_prior",
    "xrpo_novelty_advantages",
    "r3_entropy_rank_rewards",
    "decs_token_rewards",
    "decs_advantages",
]


def _row_adv(adv_tok: jnp.ndarray) -> jnp.ndarray:
    """``[B]`` the (constant) advantage of each row from a broadcast ``[B, T]`` one (0 for an
    empty row)."""
    return jnp.sum(adv_tok, axis=1) / jnp.maximum(jnp.sum(adv_tok != 0, axis=1), 1)


def _grpo_row(s, m, group_ids, num_groups, v, *, scale_by_std=True, epsilon=1e-6, unbiased=True):
    """``[B]`` GRPO advantage per row (no broadcast), the same numbers as grpo_advantages."""
    st = group_stats(s, group_ids, num_groups, v, unbiased=unbiased)
    single = st.count <= 1
    mean = jnp.where(single, 0.0, st.mean)
    std = jnp.where(single, 1.0, st.std)
    adv = safe_divide(s - mean, std + epsilon) if scale_by_std else s - mean
    return jnp.where(v > 0, adv, 0.0), st


def _group_present(v, group_ids, num_groups):
    """``[num_groups]`` whether a group has a valid row."""
    return group_sum(v, group_ids, num_groups) > 0


# ----------------------------------------------------------------------------------------- A-GRAE


def agrae_advantages(scores: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                     alpha_s: float = 1.0, scale_by_std: bool = True, epsilon: float = 1e-6,
                     valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """A-GRAE: asymmetric group-relative advantages driven by the batch accuracy.

    With ``Â = GRPO(r)``, ``p_q = mean_g r`` the group's accuracy and ``p̄`` the mean of ``p_q``
    over the batch's groups (each group once, a training-progress proxy)::

        A_diff = Â / 2 / (sqrt(p_q) + eps),   A_easy = Â / 2 / (1 - sqrt(p_q) + eps)
        A      = (1 - p̄) A_easy + p̄ A_diff,   and where A > 0:  A *= min(1, p̄ / alpha_s)

    Early in training (small ``p̄``) easy prompts dominate and positive advantages are damped
    (exploration); as accuracy rises the weight moves to hard prompts.

    Paper: "Unveiling Implicit Advantage Symmetry: Why GRPO Struggles with Exploration and
    Difficulty Adaptation", arXiv:2602.05548. Formula from the authors' code (``Yu7-code/A-GRAE``
    @5f129ef, ``compute_grpo_outcome_advantage``, branch ``grpo_weight == 2.0``); note that the
    released trainer anneals ``grpo_weight`` below 2 from the first step, so its scripts never
    take that branch and train plain GRPO; we implement the method the paper describes.
    Defaults: ``alpha_s = 1`` (the code's value for math; 0.5 for geometry / medical), eps 1e-6.

    Choices where the code is undefined: scores must be accuracies in ``[0, 1]`` (``p_q`` is
    clipped to ``[0, 1]`` before the square roots); a one-sample group gets 0 (verl's convention
    would give ``0.5 r / 1e-6``, a blow-up); a group with ``p_q`` of 0 or 1 has ``Â = 0``.

    Args:
      scores: ``[B]`` accuracies in ``[0, 1]``. mask: ``[B, T]``. group_ids: ``[B]``; num_groups static.
      alpha_s: accuracy at which positive advantages stop being damped. scale_by_std: GRPO's std
        division (verl's ``norm_adv_by_std_in_grpo``). epsilon: 1e-6. valid: optional ``[B]``.

    Returns:
      ``[B, T]`` float32 advantages.
    """
    _checks.check_positive("alpha_s", alpha_s)
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    a, st = _grpo_row(s, m, group_ids, num_groups, v, scale_by_std=scale_by_std, epsilon=epsilon)
    present = _group_present(v, group_ids, num_groups)
    p_g = jnp.clip(safe_divide(group_sum(s * v, group_ids, num_groups), group_sum(v, group_ids, num_groups)), 0.0, 1.0)
    p_bar = safe_divide(jnp.sum(jnp.where(present, p_g, 0.0)), jnp.sum(present.astype(jnp.float32)))
    sq = jnp.sqrt(p_g)[group_ids]
    a_diff = 0.5 * a / (sq + epsilon)
    a_easy = 0.5 * a / (1.0 - sq + epsilon)
    adv = (1.0 - p_bar) * a_easy + p_bar * a_diff
    adv = jnp.where(adv > 0, adv * jnp.minimum(1.0, p_bar / alpha_s), adv)
    adv = jnp.where(st.count > 1, adv, 0.0)
    return _broadcast(adv, m, v)


# ----------------------------------------------------------------------------------------- CANON


def _rank_in_group(metric, group_ids, v, num_groups):
    """``[B]`` the 0-based rank of each valid row within its group by ascending ``metric``, ties
    in row order (a stable sort); invalid rows rank after every valid one."""
    b = metric.shape[0]
    gkey = jnp.where(v > 0, group_ids, num_groups)  # invalid rows sort into a group of their own
    order = jnp.lexsort((jnp.arange(b), metric, gkey))
    pos = jnp.zeros(b, jnp.int32).at[order].set(jnp.arange(b, dtype=jnp.int32))
    counts = jax.ops.segment_sum(jnp.ones(b, jnp.int32), gkey, num_groups + 1)
    start = jnp.cumsum(counts) - counts
    return pos - start[gkey]


def canon_advantages(scores: jnp.ndarray, metric: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray,
                     num_groups: int, *, mu: float = 1.0, alpha: float = 1.0, beta: float = 0.0,
                     normalizer: float = 1.0, variant: str = "length",
                     valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """CANON: conditional advantages from a split of each group by a metric.

    Each group is sorted by ``metric`` (ascending; ties keep row order) and split into the lower
    ``S`` (``floor(G/2)`` rows) and the upper ``L`` (the rest), with mean rewards ``R_S``, ``R_L``.
    The inter-group term compares a row with the other half, the intra-group term with its own::

        i in L:  A_i = [ mu (alpha r_i - R_S + beta) + (1 - mu)(r_i - R_L) ] / normalizer
        i in S:  A_i = [ mu (r_i - alpha R_L - beta) + (1 - mu)(r_i - R_S) ] / normalizer

    (``variant="entropy"``: the authors' entropy variant moves ``alpha`` to the other reward,
    ``i in L: mu (r_i - alpha R_S + beta) ...``, ``i in S: mu (alpha r_i - R_L - beta) ...``;
    with ``alpha = 1, beta = 0`` both variants agree.)

    Identity (paper): with ``mu = 1/2, alpha = 1, beta = 0`` and an even group size this is
    Dr.GRPO, ``r_i - mean_g r`` (the mean of the two halves' baselines is the group mean; for an
    odd size it is not).

    Paper: "Conditional Advantage Estimation for Reinforcement Learning in Large Reasoning Models",
    arXiv:2509.23962. Formulas from the authors' code (``biuboomc/CANON`` @7d6f814,
    ``compute_dr_length_on_mean_group_outcome_advantage`` and the entropy variant). Defaults are
    the code's signature: ``mu = 1`` (pure inter-group), ``alpha = 1``, ``beta = 0``; the code's
    normaliser is the maximum response length under ``seq-mean-token-sum`` aggregation and 1
    otherwise (``normalizer``). A one-sample group has ``R_S = R_L = 0`` (the code's convention).
    The schedules of ``mu`` in the code (annealed by batch accuracy, cosine restarts) are a
    loop concern: pass the scheduled value.

    Args:
      scores: ``[B]``. metric: ``[B]`` the split metric (response length, or the mean token
        entropy of the sampling policy). mask, group_ids, num_groups, valid: as usual.
      mu, alpha, beta: the weights above. normalizer: divides every advantage (> 0).
      variant: ``"length"`` or ``"entropy"`` (where ``alpha`` sits).

    Returns:
      ``[B, T]`` float32.
    """
    _checks.check_choice("variant", variant, ("length", "entropy"))
    _checks.check_positive("normalizer", normalizer)
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    _checks.check_seq_args(s.shape[0], metric=metric)
    x = _checks.zero_outside(_checks.as_float(metric), v)
    cnt = group_sum(v, group_ids, num_groups)
    rank = _rank_in_group(x, group_ids, v, num_groups)
    half = jnp.floor(cnt / 2.0)[group_ids]
    in_s = (rank < half) & (v > 0)
    in_l = (~in_s) & (v > 0)
    fs, fl = in_s.astype(jnp.float32), in_l.astype(jnp.float32)
    r_s = safe_divide(group_sum(s * fs, group_ids, num_groups), group_sum(fs, group_ids, num_groups))[group_ids]
    r_l = safe_divide(group_sum(s * fl, group_ids, num_groups), group_sum(fl, group_ids, num_groups))[group_ids]
    single = cnt[group_ids] <= 1
    r_s, r_l = jnp.where(single, 0.0, r_s), jnp.where(single, 0.0, r_l)
    if variant == "length":
        inter_l, inter_s = alpha * s - r_s + beta, s - alpha * r_l - beta
    else:
        inter_l, inter_s = s - alpha * r_s + beta, alpha * s - r_l - beta
    adv_l = mu * inter_l + (1.0 - mu) * (s - r_l)
    adv_s = mu * inter_s + (1.0 - mu) * (s - r_s)
    adv = jnp.where(in_l, adv_l, adv_s) / normalizer
    return _broadcast(adv, m, v)


# ----------------------------------------------------------------------------------------- Stratified


def stratified_advantages(scores: jnp.ndarray, strata: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray,
                          num_groups: int, *, alpha: float, num_strata: int, epsilon: float = 1e-6,
                          unbiased_std: bool = False, valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """Stratified GRPO: advantages normalised within structural strata, blended with the group's.

    The rows of a prompt group are split by a structural property ``strata`` (the paper's
    search agents: the number of search calls). With ``k`` the stratum of row ``i`` within its
    group::

        A^S_i = (R_i - mean_k R) / (std_k R + eps)      (stratified advantage normalisation, SAN)
        A^G_i = (R_i - mean_g R) / (std_g R + eps)      (the usual group normalisation)
        A_i   = alpha A^S_i + (1 - alpha) A^G_i

    A one-row stratum has ``A^S = 0``; one stratum per group gives GRPO; ``alpha = 0`` gives
    GRPO (with this std), ``alpha = 1`` pure SAN. The paper's decomposition (Prop. 1):
    ``R_i - mean_g R = (R_i - mean_k R) + (mean_k R - mean_g R)``, the second term the
    cross-stratum bias SAN removes.

    Paper: "Stratified GRPO: Handling Structural Heterogeneity in Reinforcement Learning of LLM
    Search Agents" (Zhu et al.), arXiv:2510.06214. No public code was found; the formulas are the
    paper's (as quoted by reviews). ``alpha`` has no default (the paper's value was not found);
    the population std (``unbiased_std=False``) is our reading of the paper's "unit variance
    within each stratum".

    Args:
      scores: ``[B]``. strata: ``[B]`` int in ``[0, num_strata)``. mask, group_ids, num_groups,
        valid: as usual. alpha: blend weight of SAN in ``[0, 1]``. num_strata: static bound.
      epsilon: 1e-6. unbiased_std: Bessel's correction at both levels.

    Returns:
      ``[B, T]`` float32.
    """
    _checks.check_static_int("num_strata", num_strata)
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    _checks.check_seq_args(s.shape[0], strata=strata)
    _checks.check_int("strata", strata)
    k = jnp.clip(jnp.asarray(strata, jnp.int32), 0, num_strata - 1)
    pair = jnp.asarray(group_ids, jnp.int32) * num_strata + k
    st_k = group_stats(s, pair, num_groups * num_strata, v, unbiased=unbiased_std)
    a_s = jnp.where(st_k.count > 1, safe_divide(s - st_k.mean, st_k.std + epsilon), 0.0)
    st_g = group_stats(s, group_ids, num_groups, v, unbiased=unbiased_std)
    a_g = jnp.where(st_g.count > 1, safe_divide(s - st_g.mean, st_g.std + epsilon), 0.0)
    return _broadcast(alpha * a_s + (1.0 - alpha) * a_g, m, v)


# ----------------------------------------------------------------------------------------- SEED-GRPO


def semantic_entropy(answer_ids: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                     seq_logp: jnp.ndarray | None = None, valid: jnp.ndarray | None = None
                     ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Per-group semantic entropy of the sampled answers and its maximum, broadcast to rows.

    ``SE(q) = -(1/K) sum_k log p(C_k | q)`` over the ``K`` answer clusters of the group (Kuhn et
    al.'s Monte-Carlo estimator), with ``p(C_k | q) = |C_k| / G`` (the cluster's share of the
    group) or, given ``seq_logp``, the cluster's share of the group's probability mass
    ``sum_{i in C_k} exp(seq_logp_i) / sum_{i in g} exp(seq_logp_i)`` (computed in log space).
    ``SE_max = log G`` (every answer distinct). Groups of one have ``SE = SE_max = 0``.

    Args:
      answer_ids: ``[B]`` int cluster ids in ``[0, B)``; rows with equal ids must be in the same
        group (the loop's ``answer_ids`` input). group_ids, num_groups, valid: as usual.
      seq_logp: optional ``[B]`` sequence log-probabilities under the sampling policy.

    Returns:
      ``(se [B], se_max [B])`` float32.
    """
    b = _checks._shape(answer_ids)[0] if _checks._shape(answer_ids) else 0
    _checks.check_rank("answer_ids", answer_ids, 1)
    _checks.check_int("answer_ids", answer_ids)
    _checks.check_groups(group_ids, num_groups, b)
    v = jnp.ones((b,), jnp.float32) if valid is None else _checks.as_mask(valid)
    ids = jnp.clip(jnp.asarray(answer_ids, jnp.int32), 0, b - 1)
    cnt_g = group_sum(v, group_ids, num_groups)
    if seq_logp is None:
        w = v
    else:
        _checks.check_seq_args(b, seq_logp=seq_logp)
        lp = jnp.where(v > 0, _checks.as_float(seq_logp), -jnp.inf)
        mx = jax.ops.segment_max(lp, group_ids, num_groups)
        w = jnp.where(v > 0, jnp.exp(lp - mx[group_ids]), 0.0)
    mass_c = jax.ops.segment_sum(w, ids, b)                     # [B] by cluster id
    mass_g = group_sum(w, group_ids, num_groups)
    first = (v > 0) & (jax.ops.segment_min(jnp.where(v > 0, jnp.arange(b), b), ids, b)[ids] == jnp.arange(b))
    p = safe_divide(mass_c[ids], mass_g[group_ids])            # the row's cluster probability
    term = jnp.where(first, -jnp.log(jnp.where(first & (p > 0), p, 1.0)), 0.0)   # once per cluster
    k = group_sum(first.astype(jnp.float32), group_ids, num_groups)
    se = safe_divide(group_sum(term, group_ids, num_groups), k)
    se_max = jnp.log(jnp.maximum(cnt_g, 1.0))
    return jax.lax.stop_gradient(se[group_ids]), se_max[group_ids]


def seed_grpo_advantages(scores: jnp.ndarray, answer_ids: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray,
                         num_groups: int, *, alpha: float = 1.0, modulation: str = "linear", gamma: float = 2.0,
                         seq_logp: jnp.ndarray | None = None, epsilon: float = 1e-6,
                         valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """SEED-GRPO: GRPO advantages scaled down on prompts whose answers disagree.

    ``A_i = GRPO(r)_i * f(alpha * SE(q) / SE_max(q))`` with the group's semantic entropy
    (:func:`semantic_entropy`, ``SE_max = log G``) and a decreasing ``f`` with ``f(0) = 1``:
    ``"linear"`` ``1 - x``, ``"exponential"`` ``exp(-x)``, ``"focal"`` ``(1 - x)^gamma``. Prompts
    where the model is uncertain (many distinct answers) get smaller updates; unanimous groups
    keep their advantage.

    Paper: "SEED-GRPO: Semantic Entropy Enhanced GRPO for Uncertainty-Aware Policy Optimization"
    (Chen et al.), arXiv:2505.12346. The authors' code was not released; the entropy estimator,
    ``SE_max = log G`` and the family of ``f`` are the paper's, the exact forms of ``f`` above and
    the default ``alpha = 1`` are our reading (parameters, not constants). The cluster
    probabilities are frequencies unless ``seq_logp`` is given.

    Args:
      scores: ``[B]``. answer_ids: ``[B]`` cluster ids (see :func:`semantic_entropy`).
      mask, group_ids, num_groups, valid: as usual. alpha: strength in ``[0, 1]``.
      modulation: ``"linear"``, ``"exponential"`` or ``"focal"``; gamma: the focal exponent.
      seq_logp: optional ``[B]``, probability-weighted clusters. epsilon: GRPO's 1e-6.

    Returns:
      ``[B, T]`` float32.
    """
    _checks.check_choice("modulation", modulation, ("linear", "exponential", "focal"))
    base = grpo_advantages(scores, mask, group_ids, num_groups, epsilon=epsilon, valid=valid)
    se, se_max = semantic_entropy(answer_ids, group_ids, num_groups, seq_logp=seq_logp, valid=valid)
    x = jnp.clip(alpha * safe_divide(se, se_max), 0.0, 1.0)
    if modulation == "linear":
        f = 1.0 - x
    elif modulation == "exponential":
        f = jnp.exp(-x)
    else:
        f = (1.0 - x) ** gamma
    return jax.lax.stop_gradient(base * f[:, None])


# ----------------------------------------------------------------------------------------- HAPO


def hapo_token_group_advantages(scores: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int,
                                *, epsilon: float = 1e-6, fallback: float = 5.0,
                                valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """HAPO's token-level group average: group statistics over tokens, not sequences.

    Every response token carries its sequence's reward; the group's mean and (population) std
    are taken over all its tokens, ``mu_g = sum_i L_i r_i / sum_i L_i``,
    ``sigma_g^2 = sum_i L_i (r_i - mu_g)^2 / sum_i L_i``, and ``A_i = (r_i - mu_g) / (sigma_g + eps)``:
    long responses weigh more in the baseline. If any ``|A_i| >= fallback`` in a group (a
    near-degenerate spread), the group falls back to ``GRPO(r)``.

    Paper: "From Uniform to Heterogeneous: Tailoring Policy Optimization to Every Token's
    Nature" (HAPO), arXiv:2509.16591; formula from the authors' code (``starriver030515/HAPO``
    @7671dde, ``compute_hapo_outcome_advantage``). Difference: the code also checks the
    fallback on padding positions (value ``-mu_g / sigma_g``); we check response tokens only.
    Identity: equal lengths give ``(r - mean) / pop_std``.

    Args:
      scores: ``[B]``. mask: ``[B, T]``. group_ids, num_groups, valid: as usual.
      epsilon: 1e-6. fallback: the ``|A|`` that triggers GRPO for the group (the code's 5).

    Returns:
      ``[B, T]`` float32.
    """
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    length = jnp.sum(m, axis=1) * v
    tot = group_sum(length, group_ids, num_groups)
    mu = safe_divide(group_sum(length * s, group_ids, num_groups), tot)[group_ids]
    var = safe_divide(group_sum(length * jnp.square(s - mu), group_ids, num_groups), tot)[group_ids]
    sigma = jnp.sqrt(jnp.maximum(var, 0.0))
    tlga = (s - mu) / (sigma + epsilon)
    big = group_sum(((jnp.abs(tlga) >= fallback) & (length > 0)).astype(jnp.float32), group_ids, num_groups)
    grpo, _ = _grpo_row(s, m, group_ids, num_groups, v, epsilon=epsilon)
    adv = jnp.where(big[group_ids] > 0, grpo, tlga)
    return _broadcast(adv, m, v)


# ----------------------------------------------------------------------------------------- RiskPO


def _within_group_index(group_ids, v, num_groups):
    """``[B]`` the index of each valid row among its group's valid rows, in row order."""
    b = group_ids.shape[0]
    onehot = (jnp.asarray(group_ids)[:, None] == jnp.arange(num_groups)[None]) & (v[:, None] > 0)
    return jnp.take_along_axis(jnp.cumsum(onehot, axis=0) - 1, jnp.asarray(group_ids)[:, None], 1)[:, 0]


def riskpo_advantages(scores: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                      bundle_size: int = 5, alpha: float = 0.2, beta: float = 0.8, omega: float = 1.5,
                      credit: str = "std", nonpositive: bool = True, epsilon: float = 1e-6,
                      valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """RiskPO: Mixed Value-at-Risk advantages over bundles of questions.

    Questions (groups) ``q`` are bundled ``bundle_size`` at a time by group id
    (``bundle = group_id // bundle_size``); the ``k``-th responses of a bundle's questions form a
    "paper" with score ``S_k = sum_q r_{q,k}`` (``k < n``, ``n`` the smallest group size of the
    bundle; rows beyond get 0). With ``a, b`` the ``alpha``- and ``beta``-quantiles of the
    bundle's papers (linear interpolation, as ``torch.quantile``) and ``sigma_S`` their unbiased
    std, the likelihood-ratio weights of the range- and tail-risk measures are::

        A_rv(S) = [ (S - a)^+ - (S - b)^+ - (b - a) [nonpositive] ] / (beta - alpha + eps)
        A_cv(S) = -(a - S)^+ / (alpha + eps)
        A_p     = (omega A_cv + A_rv) / (omega + 1) / (sigma_S + eps)

    and the paper's score goes to its responses by ``credit``: ``"uniform"`` ``A_p``; ``"std"``
    ``A_p / (sigma_q + eps)`` (``sigma_q`` the question's unbiased reward std, 1 where it is
    <= 1e-3); ``"score"`` ``0.5 A_p`` for ``r > 0`` else ``1.5 A_p``; ``"sum_mean"``
    ``A_p (r_{q,k} - mean r_q) / sum_{q'} (r_{q',k} - mean r_{q'})`` (``A_p / bundle`` where that
    sum is ~0). With ``nonpositive`` every advantage is <= 0: papers at or above the
    ``beta``-quantile get 0, the rest are pushed down.

    Paper: "RiskPO: Risk-based Policy Optimization via Verifiable Reward for LLM Post-Training"
    (Ren et al.), arXiv:2510.00911. Computation from the authors' code (``RTkenny/RiskPO``
    @65ec40c, ``compute_grpo_bundle_rvar_outcome_advantage_quantile_tracking``): the code's
    quantile tracker never reaches the advantage (it is stored after it), so each bundle's own
    quantiles are used, as here. Defaults: the paper's ``alpha = 0.2, beta = 0.8``, bundles of
    5, the code's ``omega = 1.5`` and ``credit="std"`` with ``nonpositive`` (its MATH script; the
    DAPO-math script uses ``credit="sum_mean", nonpositive=False``). Identity: one question per
    bundle, ``omega = 0``, ``nonpositive=False``, ``alpha = 0``, ``beta = 1`` and uniform credit give
    ``(r - min_g r) / (std_g r + eps)``.

    Args:
      scores: ``[B]``. mask, group_ids, num_groups, valid: as usual (rows of a group in any
        order; the ``k``-th valid row of each group in row order makes paper ``k``).
      bundle_size: questions per bundle (static). alpha, beta: quantile levels, ``0 <= alpha <
        beta <= 1``. omega: weight of the tail (CVaR) term. credit: see above.
      nonpositive: subtract ``b - a`` (the code's ``nb_adv``). epsilon: 1e-6.

    Returns:
      ``[B, T]`` float32.
    """
    _checks.check_static_int("bundle_size", bundle_size)
    _checks.check_choice("credit", credit, ("uniform", "std", "score", "sum_mean"))
    if not (0.0 <= alpha < beta <= 1.0):
        raise ValueError(f"RiskPO needs 0 <= alpha < beta <= 1, got alpha={alpha!r}, beta={beta!r}")
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    gid = jnp.asarray(group_ids, jnp.int32)
    nb = -(-num_groups // bundle_size)
    bundle = gid // bundle_size
    k = _within_group_index(gid, v, num_groups)                    # paper index of each row
    size = group_sum(v, gid, num_groups)                           # valid rows per group
    big = jnp.max(size) + 1
    present = size > 0
    g_bundle = jnp.arange(num_groups) // bundle_size
    n_b = jax.ops.segment_min(jnp.where(present, size, big), g_bundle, nb)   # papers per bundle
    n_b = jnp.where(n_b >= big, 0, n_b).astype(jnp.int32)
    kmax = s.shape[0]                                              # static bound on papers per bundle
    use = (v > 0) & (k < n_b[bundle])
    slot = bundle * kmax + jnp.clip(k, 0, kmax - 1)
    papers = jax.ops.segment_sum(jnp.where(use, s, 0.0), slot, nb * kmax).reshape(nb, kmax)
    col = jnp.arange(kmax)[None]
    live = col < n_b[:, None]
    srt = jnp.sort(jnp.where(live, papers, jnp.inf), axis=1)

    def quantile(q):
        pos = q * jnp.maximum(n_b - 1, 0).astype(jnp.float32)
        lo = jnp.floor(pos).astype(jnp.int32)
        hi = jnp.minimum(lo + 1, jnp.maximum(n_b - 1, 0))
        frac = pos - lo
        x_lo = jnp.take_along_axis(srt, lo[:, None], 1)[:, 0]
        x_hi = jnp.take_along_axis(srt, hi[:, None], 1)[:, 0]
        return jnp.where(n_b > 0, x_lo + frac * (x_hi - x_lo), 0.0)

    a_q, b_q = quantile(alpha), quantile(beta)
    cnt = jnp.maximum(n_b, 1).astype(jnp.float32)
    mean_p = jnp.sum(jnp.where(live, papers, 0.0), 1) / cnt
    var_p = jnp.sum(jnp.where(live, jnp.square(papers - mean_p[:, None]), 0.0), 1) / jnp.maximum(cnt - 1.0, 1.0)
    sd_p = jnp.where(n_b > 1, jnp.sqrt(var_p), 1.0)
    a_r, b_r = a_q[:, None], b_q[:, None]
    a_rv = jnp.maximum(papers - a_r, 0.0) - jnp.maximum(papers - b_r, 0.0)
    if nonpositive:
        a_rv = a_rv + (a_r - b_r)
    a_rv = a_rv / (beta - alpha + epsilon)
    a_cv = -jnp.maximum(a_r - papers, 0.0) / (alpha + epsilon)
    a_p = (omega * a_cv + a_rv) / (omega + 1.0) / (sd_p[:, None] + epsilon)
    a_p = jnp.where(live, a_p, 0.0)
    row_ap = jnp.where(use, a_p.reshape(-1)[slot], 0.0)
    if credit == "uniform":
        adv = row_ap
    elif credit == "score":
        adv = jnp.where(s > 0, 0.5, 1.5) * row_ap
    else:
        st = group_stats(s, gid, num_groups, v)
        if credit == "std":
            sd = jnp.where(st.std <= 1e-3, 1.0, st.std)
            adv = row_ap / (sd + epsilon)
        else:  # sum_mean
            dev = jnp.where(use, s - st.mean, 0.0)
            tot = jax.ops.segment_sum(dev, slot, nb * kmax)[slot]
            adv = jnp.where(jnp.abs(tot) > 1e-6, row_ap * safe_divide(dev, tot), row_ap / bundle_size)
    adv = jnp.where(use, adv, 0.0)
    return _broadcast(adv, m, v)


# ----------------------------------------------------------------------------------------- ADORA


def adora_advantages(scores: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                     lam: float = 0.1, correct_threshold: float = 0.5, length_threshold: float | None = None,
                     epsilon: float = 1e-6, valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """ADORA (length criterion): GRPO advantages down-weighted on groups that favour brevity.

    Per group, with ``POS`` the rows scoring above ``correct_threshold`` and ``NEG`` the others
    shorter than ``length_threshold`` (truncated responses excluded): the group is "temporarily
    advantageous" when its longest correct response is longer than its average wrong one,
    ``max_POS L > mean_NEG L``; then ``w_g = 1``, else ``w_g = lam``, and ``A_i = w_g GRPO(r)_i``
    (a one-sample group keeps its raw score, as in the code). A group without a correct
    response gets ``lam``, one without an eligible wrong response 1 (the LLM code's edge cases).

    Paper: "ADORA: Training Reasoning Models with Dynamic Advantage Estimation on Reinforcement
    Learning" (Gui and Ren); formula from the authors' code (``ShadeCloak/ADORA`` @c518485,
    ``compute_grpo_outcome_advantage_ADORA``), the only criterion it ships (the paper's difficulty
    criterion is left to user weight functions). Defaults: ``lam = 0.1`` (the code's); the
    correctness threshold is 0.5 for 0/1 rewards (the Logic-RL script uses 1.01 on its +3/-x
    rewards); ``length_threshold=None`` excludes nothing (the script's 3900 tokens is a
    truncation cut-off: set it just below the sampling budget). Identity: ``lam = 1`` is GRPO.

    Args:
      scores: ``[B]``. mask: ``[B, T]`` (lengths). group_ids, num_groups, valid: as usual.
      lam: weight of non-advantageous groups. correct_threshold: ``r > threshold`` is correct.
      length_threshold: wrong responses at or above this length are excluded. epsilon: 1e-6.

    Returns:
      ``[B, T]`` float32.
    """
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    length = jnp.sum(m, axis=1)
    pos = (s > correct_threshold) & (v > 0)
    neg = (s <= correct_threshold) & (v > 0)
    if length_threshold is not None:
        neg = neg & (length < length_threshold)
    max_pos = jax.ops.segment_max(jnp.where(pos, length, -jnp.inf), group_ids, num_groups)
    fneg = neg.astype(jnp.float32)
    n_neg = group_sum(fneg, group_ids, num_groups)
    mean_neg = jnp.where(n_neg > 0, safe_divide(group_sum(length * fneg, group_ids, num_groups), n_neg), -jnp.inf)
    w = jnp.where(max_pos > mean_neg, 1.0, lam)[group_ids]
    a, _ = _grpo_row(s, m, group_ids, num_groups, v, epsilon=epsilon)
    return _broadcast(w * a, m, v)


# ----------------------------------------------------------------------------------------- LOOP


def drop_small_advantages(advantages: jnp.ndarray, mask: jnp.ndarray, threshold: float) -> jnp.ndarray:
    """Advantages with ``|A| < threshold`` set to 0 (those tokens or rollouts carry no update):
    LOOP's rollout filter (``abs_adv_threshold`` 0.01), which the paper applies to whole rollouts
    of constant advantage.

    Paper: "Reinforcement Learning for Long-Horizon Interactive LLM Agents" (LOOP, Chen et al.),
    arXiv:2502.01600; ``apple/ml-loop`` @6ade7b9 ``_filter_rollouts``. The code removes the
    rollouts and divides the loss by the constant mini-batch size, which equals keeping them with
    advantage 0 under ``seq-mean-token-mean`` over all rows.

    Args:
      advantages: ``[B, T]``. mask: ``[B, T]``. threshold: >= 0.

    Returns:
      ``[B, T]`` float32, zero outside the mask.
    """
    _checks.check_token_args(advantages=advantages, mask=mask)
    _checks.check_positive("threshold", threshold, allow_zero=True)
    a = _checks.as_float(advantages)
    m = _checks.as_mask(mask)
    return jax.lax.stop_gradient(jnp.where(jnp.abs(a) < threshold, 0.0, a) * m)


# ----------------------------------------------------------------------------------------- HICRA


def hicra_advantages(advantages: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                     entropy: jnp.ndarray | None = None, planning_mask: jnp.ndarray | None = None,
                     alpha: float = 0.2, entropy_top: float = 0.3, form: str = "verl",
                     valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """HICRA: extra credit on the high-impact (planning) tokens of the advantages ``A``.

    ``form="paper"``: ``A_t + alpha |A_t|`` on the planning tokens ``S`` (``planning_mask``): credit
    amplified, blame softened there (``A (1 + alpha sign A)``). ``form="verl"`` (the authors' VeRL
    code): only correct (``A > 0``) responses longer than their group's mean length are touched;
    on their tokens whose entropy is above the row's top-``entropy_top`` value (strictly: the
    value at sorted position ``int((1 - entropy_top) n)``), and on planning tokens if given,
    ``A <- A (1 + alpha sign A)``; every other token keeps ``A``.

    Paper: "Emergent Hierarchical Reasoning in LLMs through Reinforcement Learning" (HICRA),
    arXiv:2509.03646: ``alpha = 0.2``; the planning tokens are the paper's Strategic Grams (mined
    n-grams, the caller's mask). The VeRL variant as quoted line by line in TRL's
    ``HICRATrainer`` (``entropy_top = 0.3``); TRL's in-place chained indexing may leave its
    advantages unchanged, so it is not used as a reference. ``alpha = 0`` gives ``A``.

    Args:
      advantages: ``[B, T]`` base advantages (GRPO's). mask: ``[B, T]``. group_ids, num_groups,
        valid: as usual. entropy: ``[B, T]`` token entropy (``form="verl"``). planning_mask:
        ``[B, T]`` optional planning tokens. alpha: amplification. entropy_top: the entropy quantile.
      form: ``"verl"`` or ``"paper"`` (needs ``planning_mask``).

    Returns:
      ``[B, T]`` float32.
    """
    _checks.check_choice("form", form, ("verl", "paper"))
    b, t = _checks.check_token_args(advantages=advantages, mask=mask)
    _checks.check_groups(group_ids, num_groups, b)
    m = _checks.as_mask(mask)
    a = _checks.zero_outside(_checks.as_float(advantages), m)
    v = jnp.ones((b,), jnp.float32) if valid is None else _checks.as_mask(valid)
    plan = None
    if planning_mask is not None:
        _checks.check_same_shape("mask", mask, planning_mask=planning_mask)
        plan = (_checks.as_mask(planning_mask) > 0) & (m > 0)
    if form == "paper":
        if plan is None:
            raise ValueError("hicra_advantages(form='paper') needs planning_mask (the Strategic Gram tokens)")
        out = jnp.where(plan, a + alpha * jnp.abs(a), a)
        return jax.lax.stop_gradient(out * m * v[:, None])
    if entropy is None:
        raise ValueError("hicra_advantages(form='verl') needs entropy [B, T]")
    _checks.check_same_shape("mask", mask, entropy=entropy)
    h = _checks.zero_outside(_checks.as_float(entropy), m)
    n = jnp.sum(m, axis=1)
    srt = jnp.sort(jnp.where(m > 0, h, jnp.inf), axis=1)
    k = jnp.clip(jnp.floor((1.0 - entropy_top) * n).astype(jnp.int32), 0, jnp.maximum(n - 1, 0).astype(jnp.int32))
    thr = jnp.take_along_axis(srt, k[:, None], axis=1)
    high = (h > thr) & (m > 0)
    row_a = jnp.sum(a, axis=1) / jnp.maximum(n, 1.0)                 # the row's (outcome) advantage
    length = n * v
    mean_len = safe_divide(group_sum(length, group_ids, num_groups), group_sum(v, group_ids, num_groups))[group_ids]
    amplify = (row_a > 0) & (length > mean_len) & (v > 0)
    where = high | plan if plan is not None else high
    out = jnp.where(amplify[:, None] & where, a * (1.0 + alpha * jnp.sign(a)), a)
    return jax.lax.stop_gradient(out * m * v[:, None])


# ----------------------------------------------------------------------------------------- COPO


def copo_advantages(scores: jnp.ndarray, answer_ids: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray,
                    num_groups: int, *, k: float = 5.0, b: float = 1.0, gate: str = "soft_with_zero",
                    epsilon: float = 1e-6, valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """COPO: local (group) and global (batch) advantages blended by the group's answer entropy.

    ``A^loc = GRPO(r)``; ``A^glob_q = (p_q - mean_q' p_q') / (std_q' p + eps)`` over the batch's
    prompts (``p_q`` the group's mean reward, unbiased std; 0 with one prompt), the same for every
    row of the prompt; the blend weight is an entropy gate on the group's answers,
    ``w_i = sigmoid(k (H_q - b))`` with ``H_q = -sum_c f_c log2 f_c`` (bits) over the answer clusters:
    a consistent group (all agree, ``H = 0``) learns from the global signal, a diverse one from
    its own. ``gate="soft_with_zero"`` (the authors' script) multiplies ``w_i`` by ``1[r_i != 0]``,
    so wrong answers learn from the global advantage only; ``"soft"`` is the plain gate.
    ``A_i = (1 - w_i) A^glob + w_i A^loc``.

    Paper: "COPO: Consistency-Aware Policy Optimization", arXiv:2508.04138; the authors' code
    (``hijih/copo-code``, ``compute_score_global``, ``compute_grpo_outcome_advantage_with_global``,
    ``run_copo.sh``): ``k = 5``, ``b = 1``, gate "soft-with-zero". Difference: the code blends the two
    *clipped losses* (each advantage through its own clip); we blend the advantages under one clip,
    which is the same objective on-policy (ratio 1, the first mini-batch) and differs only in
    which tokens clip afterwards.

    Args:
      scores: ``[B]`` 0/1 rewards. answer_ids: ``[B]`` clusters (:func:`semantic_entropy`).
      mask, group_ids, num_groups, valid: as usual. k, b: the gate's slope and centre (bits).
      gate: ``"soft_with_zero"`` or ``"soft"``. epsilon: 1e-6.

    Returns:
      ``[B, T]`` float32.
    """
    _checks.check_choice("gate", gate, ("soft_with_zero", "soft"))
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    local, _ = _grpo_row(s, m, group_ids, num_groups, v, epsilon=epsilon)
    n = s.shape[0]
    _checks.check_seq_args(n, answer_ids=answer_ids)
    _checks.check_int("answer_ids", answer_ids)
    ids = jnp.clip(jnp.asarray(answer_ids, jnp.int32), 0, n - 1)
    cnt_g = group_sum(v, group_ids, num_groups)
    present = cnt_g > 0
    p = safe_divide(group_sum(s * v, group_ids, num_groups), cnt_g)
    n_q = jnp.sum(present.astype(jnp.float32))
    mean_p = safe_divide(jnp.sum(jnp.where(present, p, 0.0)), n_q)
    var_p = safe_divide(jnp.sum(jnp.where(present, jnp.square(p - mean_p), 0.0)), n_q - 1.0)
    glob = jnp.where(n_q > 1, (p - mean_p) / (jnp.sqrt(jnp.maximum(var_p, 0.0)) + epsilon), 0.0)[group_ids]
    f = safe_divide(jax.ops.segment_sum(v, ids, n)[ids], cnt_g[group_ids])
    first = (v > 0) & (jax.ops.segment_min(jnp.where(v > 0, jnp.arange(n), n), ids, n)[ids] == jnp.arange(n))
    h = group_sum(jnp.where(first & (f > 0), -f * jnp.log2(jnp.where(f > 0, f, 1.0)), 0.0), group_ids,
                  num_groups)[group_ids]
    w = jax.nn.sigmoid(k * (h - b))
    if gate == "soft_with_zero":
        w = w * (s != 0)
    adv = (1.0 - w) * glob + w * local
    return _broadcast(adv, m, v)


# ----------------------------------------------------------------------------------------- ProGRPO / ARM


def low_probability_confidence(logp: jnp.ndarray, mask: jnp.ndarray, *, fraction: float = 0.2) -> jnp.ndarray:
    """``[B]`` the mean log-prob of each row's ``ceil(fraction L)`` least likely tokens (``L`` its
    masked tokens): a length-normalised confidence that long runs of near-certain tokens do not
    inflate (ProGRPO's "low-probability token length normalisation"); 0 for an empty row.

    Paper: "Back to Basics: Revisiting Exploration in Reinforcement Learning for LLM Reasoning via
    Generative Probabilities" (ProGRPO / ARM), arXiv:2602.05281 (about 20% of the positions; the
    rounding up is our reading).
    """
    _checks.check_token_args(logp=logp, mask=mask)
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"argument 'fraction' must be in (0, 1], got {fraction!r}")
    m = _checks.as_mask(mask) > 0
    x = jnp.where(m, _checks.as_float(logp), jnp.inf)
    srt = jnp.sort(x, axis=1)
    n = jnp.sum(m, axis=1)
    k = jnp.ceil(fraction * n).astype(jnp.int32)
    take = jnp.arange(x.shape[1])[None] < k[:, None]
    return jax.lax.stop_gradient(safe_divide(jnp.sum(jnp.where(take, srt, 0.0), axis=1), k.astype(jnp.float32)))


def arm_advantages(scores: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int,
                   answer_confidence: jnp.ndarray, prompt_confidence: jnp.ndarray, *, alpha: float,
                   correct_only: bool = False, epsilon: float = 1e-6,
                   valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """ProGRPO's Advantage Re-weighting Mechanism: GRPO shifted by the prompt's confidence minus
    the answer's.

    In a group with at least one positive reward, ``A_i = GRPO(r)_i + alpha (c(q) - c(o_i | q))`` with
    ``c`` the low-probability confidence (:func:`low_probability_confidence`) of the prompt and of
    the answer under the sampling policy: over-confident answers lose credit, unlikely (diverse)
    ones gain, which keeps exploration alive. Groups without a positive reward keep GRPO's
    advantage. ``correct_only`` applies the shift to correct rows only (the abstract's
    "equilibrate confidence across correct responses"; the quoted formula shifts every row).

    Paper: "Back to Basics: Revisiting Exploration in Reinforcement Learning for LLM Reasoning via
    Generative Probabilities" (ProGRPO / ARM), arXiv:2602.05281. No code was found: the formula
    is the paper's as a review quotes it; ``alpha`` has no default (its value was not found).
    ``alpha = 0`` is GRPO.

    Args:
      scores: ``[B]``. mask, group_ids, num_groups, valid: as usual. answer_confidence: ``[B]``
        ``c(o_i | q)``. prompt_confidence: ``[B]`` ``c(q)`` of each row's prompt. alpha: weight.
      correct_only: shift correct (``r > 0``) rows only. epsilon: GRPO's 1e-6.

    Returns:
      ``[B, T]`` float32.
    """
    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    _checks.check_seq_args(s.shape[0], answer_confidence=answer_confidence, prompt_confidence=prompt_confidence)
    base, _ = _grpo_row(s, m, group_ids, num_groups, v, epsilon=epsilon)
    pos = group_sum(((s > 0) & (v > 0)).astype(jnp.float32), group_ids, num_groups)[group_ids] > 0
    shift = alpha * (_checks.as_float(prompt_confidence) - _checks.as_float(answer_confidence))
    apply = pos & ((s > 0) if correct_only else True)
    return _broadcast(jnp.where(apply, base + shift, base), m, v)


# ----------------------------------------------------------------------------------------- ASPO


def aspo_advantages(advantages: jnp.ndarray, correct: jnp.ndarray, first_call: jnp.ndarray, lengths: jnp.ndarray,
                    mask: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *, delta: float = -2.0, k: float = 0.7,
                    valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """ASPO: shaping the advantage of correct tool-using responses by *when* the tool is first used.

    For the rows that are correct and call a tool (``first_call >= 0``, the position of the first
    call in the response), with ``mean p`` and ``mean L`` over those rows of the group::

        A_i <- A_i + clip(delta (p_i - mean p) / mean L, -k |A_i|, k |A_i|)

    so with ``delta < 0`` an earlier call earns more, a later one less, and the clip keeps the
    shaping within ``k`` of the advantage: its sign never flips (``k < 1``) and a zero advantage
    (an all-correct group) is not shaped. Other rows keep ``A``. The advantage is shaped, not the
    reward, so the accuracy signal and its normalisation are untouched.

    Paper: "Understanding Tool-Integrated Reasoning" (ASPO), arXiv:2508.19201, Eq. 2 and §4.5:
    ``delta = -2.0, k = 0.7`` (conservative; ``-2.5, 0.9`` aggressive); the base advantage is
    DAPO's (GRPO's normalisation).

    Args:
      advantages: ``[B]`` per-row base advantages. correct: ``[B]`` bool. first_call: ``[B]`` the
        position of the first tool call (-1: none). lengths: ``[B]`` response lengths. mask:
        ``[B, T]`` (the advantage is broadcast over it). group_ids, num_groups, valid: as usual.
      delta, k: as above.

    Returns:
      ``[B, T]`` float32.
    """
    b = _checks.check_token_args(mask=mask)[0]
    _checks.check_seq_args(b, advantages=advantages, correct=correct, first_call=first_call, lengths=lengths)
    _checks.check_groups(group_ids, num_groups, b)
    m = _checks.as_mask(mask)
    v = jnp.ones((b,), jnp.float32) if valid is None else _checks.as_mask(valid)
    a = _checks.zero_outside(_checks.as_float(advantages), v)
    pos = _checks.as_float(first_call)
    elig = (jnp.asarray(correct, bool) & (pos >= 0) & (v > 0)).astype(jnp.float32)
    n = group_sum(elig, group_ids, num_groups)
    mean_p = safe_divide(group_sum(pos * elig, group_ids, num_groups), n)[group_ids]
    mean_l = safe_divide(group_sum(_checks.as_float(lengths) * elig, group_ids, num_groups), n)[group_ids]
    raw = delta * safe_divide(pos - mean_p, mean_l)
    bound = k * jnp.abs(a)
    shaped = a + jnp.clip(raw, -bound, bound)
    out = jnp.where(elig > 0, shaped, a)
    return jax.lax.stop_gradient(out[:, None] * m * v[:, None])


# ----------------------------------------------------------------------------------------- D^3S

def max_variance_subset(values: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, size, *,
                        valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """``[B]`` bool: in every group, the ``size`` valid rows whose ``values`` have the largest
    variance (all of a group's valid rows when it has at most ``size``).

    A largest-variance subset of given size is always the ``k`` smallest values plus the
    ``size - k`` largest for some ``k``, so every ``k`` in ``0..size`` is tried. Ties: the smallest
    and the largest values are taken in row order; between subsets of equal variance the one
    with the larger ``sum |values|`` wins (for ``size = 1``, whose variances are all 0: the row
    of largest magnitude), then the smaller ``k``. ``size`` may be traced (a schedule inside
    ``jit``). (With values an increasing affine function of the rewards, as GRPO advantages
    within a group, this is PODS' max-variance down-sampling, arXiv:2504.13818.)
    """
    b = _checks._shape(values)[0]
    _checks.check_groups(group_ids, num_groups, b)
    if isinstance(size, int) and size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    size = jnp.asarray(size, jnp.int32)
    v = jnp.ones((b,), jnp.float32) if valid is None else _checks.as_mask(valid)
    a = jnp.asarray(values, jnp.float32)
    gid = jnp.asarray(group_ids, jnp.int32)
    asc = _rank_in_group(a, gid, v, num_groups)
    desc = _rank_in_group(-a, gid, v, num_groups)
    count = group_sum(v, gid, num_groups)
    want = jnp.minimum(count, size.astype(jnp.float32))

    def subset(k):
        return ((asc < k) | (desc < size - k)) & (v > 0)

    def body(k, best):
        best_var, best_abs, best_k = best
        w = subset(k).astype(jnp.float32)
        n = group_sum(w, gid, num_groups)
        mean = safe_divide(group_sum(w * a, gid, num_groups), n)
        var = safe_divide(group_sum(w * (a - mean[gid]) ** 2, gid, num_groups), n)
        mag = group_sum(w * jnp.abs(a), gid, num_groups)
        better = (n == want) & ((var > best_var) | ((var == best_var) & (mag > best_abs)))
        return (jnp.where(better, var, best_var), jnp.where(better, mag, best_abs), jnp.where(better, k, best_k))
    init = (jnp.full((num_groups,), -jnp.inf), jnp.full((num_groups,), -jnp.inf), jnp.zeros((num_groups,), jnp.int32))
    _, _, best_k = jax.lax.fori_loop(0, jnp.minimum(size, b) + 1, body, init)
    return (subset(best_k[gid]) | (count[gid] <= size)) & (v > 0)


def d3s_mask(advantages: jnp.ndarray, entropy: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray,
             num_groups: int, *, samples_per_group: int, token_fraction: float, batch_samples: int | None = None,
             valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """D^3S's dual-level down-sampling: the loss mask ``[B, T]`` float32 of the rows and tokens
    that train (the advantages themselves are unchanged: GRPO's on the full group).

    1. In each group, the ``samples_per_group`` rows whose advantages have the largest variance
       (:func:`max_variance_subset`).
    2. Across the batch, of those, the ``batch_samples`` rows of largest variance (no
       re-normalisation; ``None``: keep them all).
    3. Of all response tokens of the kept rows together, the ``ceil(token_fraction n)`` with the
       largest ``|A_t| H_t`` (advantage magnitude times the sampling policy's token entropy);
       ties in row-major order.

    Paper: "Learning More with Less: A Dynamic Dual-Level Down-Sampling Framework for Efficient
    Policy Optimization" (D^3S), arXiv:2509.22115. No code is public and the paper's full text
    was not readable here: the three steps follow the paper's equations as restated by
    third-party notes; tie rules, the token count's rounding and the cross-group pool (the rows
    kept in step 1) are our reading. The paper's schedule (sizes moving linearly from their
    initial to their final values over training) is the estimator's (``recipe.advantage=d3s``).

    Args:
      advantages: ``[B, T]`` (GRPO's, broadcast). entropy: ``[B, T]`` token entropies of the
        sampling policy. mask: ``[B, T]``. group_ids, num_groups, valid: as usual.
      samples_per_group: rows kept per group (>= 1). token_fraction: in ``(0, 1]``.
      batch_samples: rows kept across the batch after step 1 (``None``: all). The three may be
      traced (the schedule's values inside ``jit``).

    Returns:
      ``[B, T]`` float32 in ``{0, 1}``, within ``mask``.
    """
    _checks.check_rank("advantages", advantages, 2)
    b, t = _checks._shape(advantages)
    for name, x in (("entropy", entropy), ("mask", mask)):
        if _checks._shape(x) != (b, t):
            raise ValueError(f"argument {name!r} must have shape {(b, t)} like advantages, got {_checks._shape(x)}")
    _checks.check_groups(group_ids, num_groups, b)
    if isinstance(token_fraction, (int, float)) and not 0.0 < token_fraction <= 1.0:
        raise ValueError(f"token_fraction must be in (0, 1], got {token_fraction}")
    m = _checks.as_mask(mask)
    v = jnp.ones((b,), jnp.float32) if valid is None else _checks.as_mask(valid)
    v = v * (jnp.sum(m, axis=1) > 0)  # a row without response tokens cannot contribute
    a_tok = jnp.where(m > 0, jnp.asarray(advantages, jnp.float32), 0.0)
    a_row = _row_adv(a_tok)
    rows = max_variance_subset(a_row, group_ids, num_groups, samples_per_group, valid=v)
    if batch_samples is not None:
        rows = max_variance_subset(a_row, jnp.zeros((b,), jnp.int32), 1, batch_samples, valid=rows)
    mm = m * rows[:, None]
    ent = jnp.where(mm > 0, jnp.asarray(entropy, jnp.float32), 0.0)
    score = jnp.where(mm > 0, jnp.abs(a_tok) * ent, -jnp.inf).reshape(-1)
    n = jnp.sum(mm)
    keep_n = jnp.where(n > 0, jnp.maximum(jnp.ceil(jnp.asarray(token_fraction, jnp.float32) * n - 1e-4), 1.0), 0.0)
    order = jnp.lexsort((jnp.arange(b * t), -score))
    rank = jnp.zeros(b * t, jnp.int32).at[order].set(jnp.arange(b * t, dtype=jnp.int32))
    keep = (rank < keep_n) & (mm.reshape(-1) > 0)
    return jax.lax.stop_gradient(keep.reshape(b, t).astype(jnp.float32))


def treepo_advantages(scores, prefix_ids, mask, *, valid=None, combine: str = "average") -> jnp.ndarray:
    """TreePO's tree advantage: each leaf's reward against the mean of every subtree it belongs
    to, averaged over those subtrees, then whitened over the batch's tokens.

    A leaf (response) of a segment tree shares its first ``d`` segments with the leaves of one
    subtree ``G_d(i)``; ``G_0`` is the prompt's group. With ``mu_g`` the mean reward of ``g``
    (0 for a one-leaf group), the terms ``s_i - mu_{G_d(i)}`` count for ``d = 0`` and for every
    ``d >= 1`` whose subtree holds more than one leaf. ``combine="average"`` (the paper's runs)
    is their mean; ``"group_size"`` weighs each by ``|G_d(i)|``. The per-leaf value is broadcast
    over the response and whitened over all valid tokens of the batch (REINFORCE++-baseline's
    ``masked_whiten``: unbiased variance, eps 1e-8), so no group is divided by its own std. A
    node with one child repeats its subtree, whose term then counts twice, as in the code.

    Paper: Li et al., "TreePO: Bridging the Gap of Policy Optimization and Efficacy and Inference
    Efficiency with Heuristic Tree-based Modeling", arXiv:2508.17445; the authors' code
    (``multimodal-art-projection/TreePO`` @f055523,
    ``core_algos.compute_tree_reinforce_plus_plus_baseline_outcome_advantage``,
    ``adv_weight_strategy="average"``). Identities: no branching below the root gives
    REINFORCE++-baseline; one leaf per prompt gives the whitened raw score.

    Args:
      scores: ``[B]`` leaf rewards. prefix_ids: ``[B, K]`` int, column ``d`` the dense id (in
        ``[0, B)``) of the leaf's depth-``d`` subtree, ``-1`` where the leaf is shallower;
        column 0 is the prompt. mask: ``[B, T]``. valid: optional ``[B]``.

    Returns:
      ``[B, T]`` float32 advantages, zero outside the mask and on invalid rows.
    """
    if combine not in ("average", "group_size"):
        raise ValueError(f"treepo_advantages: combine must be 'average' or 'group_size', got {combine!r}")
    ids = jnp.asarray(prefix_ids)
    if ids.ndim != 2 or ids.shape[1] < 1:
        raise ValueError(f"treepo_advantages: prefix_ids must be [B, K >= 1], got shape {ids.shape}")
    b = ids.shape[0]
    s, m, v = _prep_outcome(scores, mask, jnp.maximum(ids[:, 0], 0), b, valid)
    num = jnp.zeros_like(s)
    den = jnp.zeros_like(s)
    for d in range(ids.shape[1]):
        present = (ids[:, d] >= 0) & (v > 0)
        gid = jnp.where(present, ids[:, d], 0)
        w = present.astype(s.dtype)
        count = group_sum(w, gid, b)[gid]
        mu = jnp.where(count > 1, safe_divide(group_sum(s * w, gid, b)[gid], count), 0.0)
        take = present & ((d == 0) | (count > 1))
        weight = jnp.where(take, count if combine == "group_size" else 1.0, 0.0)
        num = num + weight * (s - mu)
        den = den + weight
    adv = jnp.where(den > 0, num / jnp.maximum(den, 1e-30), 0.0)
    tok = _broadcast(adv, m, v)
    mm = m * v[:, None]
    return jax.lax.stop_gradient(masked_whiten(tok, mm) * mm)



# ----------------------------------------------------------------------------- BRPO (AnytimeReasoner)
def brpo_budget_prior(num_budgets: int, kind: str = "linear") -> jnp.ndarray:
    """AnytimeReasoner's prior over the ``S`` thinking budgets ``b_j = (j + 1) L / S``:
    ``uniform`` (``1 / S``), ``linear`` (``p_j`` proportional to ``b_j``) or ``base`` (all mass on
    the last budget: plain outcome RL). ``[S]`` float32 summing to 1."""
    if not (isinstance(num_budgets, int) and num_budgets >= 1):
        raise ValueError(f"argument 'num_budgets' must be an int >= 1, got {num_budgets!r}")
    if kind == "uniform":
        p = jnp.ones((num_budgets,), jnp.float32)
    elif kind == "linear":
        p = jnp.arange(1, num_budgets + 1, dtype=jnp.float32)
    elif kind == "base":
        p = jnp.zeros((num_budgets,), jnp.float32).at[-1].set(1.0)
    else:
        raise ValueError(f"argument 'kind' must be 'uniform', 'linear' or 'base', got {kind!r}")
    return p / jnp.sum(p)


def brpo_advantages(budget_scores: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                    prior: jnp.ndarray, variant: str = "brpo", valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """BRPO's advantage of each thinking segment: the budget-weighted return-to-go minus a
    baseline that blends the trace's own earlier budgets with the group.

    ``s_{g,j}`` is the mean score of the summaries written after trace ``g``'s thinking was cut at
    budget ``j`` (``budget_scores [N, S]``), ``p`` the prior over budgets. For the thinking tokens
    of segment ``j`` (between budgets ``j - 1`` and ``j``):

    - ``R_{g,j} = sum_{k >= j} p_k s_{g,k}``;
    - ``V1_{g,j} = [sum_{k < j} 2^k s_{g,k} / sum_{k < j} 2^k] sum_{k >= j} p_k`` (0 for ``j = 0``);
    - ``V2_j`` = the group's mean of ``R_{., j}``;
    - ``brpo``: ``A = R - (j V1 + (S - j) V2) / S``; ``v1only``: ``R - V1``; ``v2only``: ``R - V2``
      (with one budget, GRPO without the std); ``none``: ``R``.

    No std normalisation. Paper: "Optimizing Anytime Reasoning via Budget Relative Policy
    Optimization" (AnytimeReasoner), arXiv:2505.13438; code ``sail-sg/AnytimeReasoner`` @7e3f5bb
    (``brpo.py``: ``compute_cot_advantage``, the discount base 2 hard-coded).

    Returns:
      ``[N, S]`` float32; no gradient.
    """
    if variant not in ("brpo", "v1only", "v2only", "none"):
        raise ValueError(f"argument 'variant' must be 'brpo', 'v1only', 'v2only' or 'none', got {variant!r}")
    _checks.check_rank("budget_scores", budget_scores, 2)
    n, k = _checks._shape(budget_scores)
    _checks.check_groups(group_ids, num_groups, n)
    sc = _checks.as_float(budget_scores)
    p = _checks.as_float(prior)
    if p.shape != (k,):
        raise ValueError(f"argument 'prior' must have shape ({k},), got {p.shape}")
    v = jnp.ones((n,), jnp.float32) if valid is None else _checks.as_mask(valid)
    tail = jnp.cumsum(p[::-1])[::-1]  # sum_{k >= j} p_k
    ret = jnp.cumsum((sc * p[None])[:, ::-1], axis=1)[:, ::-1]  # R_{g,j}
    w2 = 2.0 ** jnp.arange(k, dtype=jnp.float32)
    num = jnp.concatenate([jnp.zeros((n, 1)), jnp.cumsum(sc * w2[None], axis=1)[:, :-1]], axis=1)
    den = jnp.concatenate([jnp.zeros((1,)), jnp.cumsum(w2)[:-1]])
    v1 = jnp.where(den[None] > 0, num / jnp.where(den > 0, den, 1.0)[None], 0.0) * tail[None]
    cnt = jax.ops.segment_sum(v, group_ids, num_segments=num_groups)
    v2 = (jax.ops.segment_sum(ret * v[:, None], group_ids, num_segments=num_groups)
          / jnp.maximum(cnt, 1.0)[:, None])[group_ids]
    j = jnp.arange(k, dtype=jnp.float32)[None]
    base = {"brpo": (j * v1 + (k - j) * v2) / k, "v1only": v1, "v2only": v2, "none": jnp.zeros_like(ret)}[variant]
    return jax.lax.stop_gradient(jnp.where(v[:, None] > 0, ret - base, 0.0))



# ----------------------------------------------------------------------------- XRPO (novelty sharpening)
def xrpo_novelty_advantages(scores: jnp.ndarray, logp: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray,
                            num_groups: int, *, lam: float = 2.5, kappa: float = 0.5, threshold: float = 1.0,
                            epsilon: float = 1e-6, valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """XRPO's novelty sharpening: GRPO, plus a bonus for correct responses the policy found
    unlikely.

    ``s_i`` = the mean log-prob of response ``i`` (length-normalised), ``eta_i = exp(s_i - mean_g s)``
    over its group's valid responses; for a correct response (score ``>= threshold``) with GRPO
    advantage ``A_i > 0``: ``A+_i = A_i + min(max(lam (1 - eta_i), 0), kappa A_i)`` -- a bonus only
    for responses less likely than their group's average, capped at ``kappa`` times the advantage.
    Other rows keep GRPO's advantage.

    Paper: "XRPO: Pushing the limits of GRPO with Targeted Exploration and Exploitation",
    arXiv:2510.06672 (lam 2.5, kappa 0.5 from its reproducibility section, as quoted by its
    reviews; no code available to us). Identity: ``lam = 0`` is GRPO.

    Returns:
      ``[B, T]`` float32 token advantages; no gradient.
    """
    _checks.check_positive("lam", lam, allow_zero=True)
    _checks.check_positive("kappa", kappa, allow_zero=True)
    base = grpo_advantages(scores, mask, group_ids, num_groups, epsilon=epsilon, valid=valid)
    m = _checks.as_mask(mask)
    b = m.shape[0]
    v = jnp.ones((b,), jnp.float32) if valid is None else _checks.as_mask(valid)
    rows = (jnp.sum(m, axis=1) > 0).astype(jnp.float32) * v
    s = safe_divide(jnp.sum(_checks.zero_outside(_checks.as_float(logp), m), axis=1), jnp.sum(m, axis=1))
    mean_s = safe_divide(group_sum(s * rows, group_ids, num_groups), group_sum(rows, group_ids, num_groups))[group_ids]
    eta = jnp.exp(s - mean_s)
    a = safe_divide(jnp.sum(base * m, axis=1), jnp.sum(m, axis=1))  # the row's (constant) GRPO advantage
    correct = (_checks.as_float(scores) >= threshold) & (a > 0) & (rows > 0)
    bonus = jnp.where(correct, jnp.minimum(jnp.maximum(lam * (1.0 - eta), 0.0), kappa * a), 0.0)
    return jax.lax.stop_gradient(jnp.where(m > 0, base + bonus[:, None], 0.0))


# ----------------------------------------------------------------------------- R3 (entropy ranking)
def r3_entropy_rank_rewards(scores: jnp.ndarray, entropy: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray,
                            num_groups: int, *, r_max: float, peak_frac: float, threshold: float = 1.0,
                            valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """R³'s structural entropy ranking reward: graded rewards for the responses of a group in which
    every response failed, so that the group still teaches something.

    For response ``i`` with token entropies ``H_t`` over its ``L_i`` tokens: the *peak* entropy
    ``E_peak,i`` = mean of its ``max(1, floor(peak_frac L_i))`` highest ``H_t``, the *global*
    entropy ``E_global,i`` = mean ``H_t``. Response ``i`` dominates ``j`` when ``E_peak,i >
    E_peak,j`` and ``E_global,i < E_global,j`` (it explored at a few decisive points and was
    confident elsewhere); ``S_i`` = how many of its group it dominates. Ranked by ``S`` (ties: the
    earlier row first), the ``k``-th of ``N`` responses (``k = 0`` best) gets ``r_max (1 - k / (N -
    1))``. Rows of groups with a success (score ``>= threshold``) keep their scores.

    Paper: "R³: Replay, Reflection, and Ranking Rewards for LLM Reinforcement Learning",
    arXiv:2601.19620 (Algorithm 1; no code released): ``r_max`` and ``peak_frac`` have no default
    (their values were not found). The cross-context replay of the paper is ``recipe.replay``'s
    kind of part; the self-reflection prompts are not reproduced.

    Returns:
      ``[B]`` float32 rewards; no gradient.
    """
    _checks.check_positive("r_max", r_max)
    if not 0.0 < float(peak_frac) <= 1.0:
        raise ValueError(f"argument 'peak_frac' must be in (0, 1], got {peak_frac!r}")
    m = _checks.as_mask(mask)
    b, t = m.shape
    v = jnp.ones((b,), jnp.float32) if valid is None else _checks.as_mask(valid)
    h = jnp.where(m > 0, _checks.as_float(entropy), -jnp.inf)
    length = jnp.sum(m, axis=1)
    k = jnp.maximum(1.0, jnp.floor(peak_frac * length))
    srt = -jnp.sort(-h, axis=1)  # descending, padding (-inf) last
    top = jnp.arange(t)[None] < k[:, None]
    peak = safe_divide(jnp.sum(jnp.where(top & jnp.isfinite(srt), srt, 0.0), axis=1), k)
    glob = safe_divide(jnp.sum(jnp.where(m > 0, _checks.as_float(entropy), 0.0), axis=1), length)
    sc = _checks.as_float(scores)
    live = (length > 0) & (v > 0)
    same = (group_ids[:, None] == group_ids[None]) & live[:, None] & live[None]
    dom = same & (peak[:, None] > peak[None]) & (glob[:, None] < glob[None])
    s_i = jnp.sum(dom, axis=1).astype(jnp.float32)
    # rank within the group: rows with more dominance first, then the earlier row
    better = same & ((s_i[None] > s_i[:, None]) | ((s_i[None] == s_i[:, None]) & (jnp.arange(b)[None] < jnp.arange(b)[:, None])))
    rank = jnp.sum(better, axis=1).astype(jnp.float32)
    n = jnp.sum(same, axis=1).astype(jnp.float32)
    graded = r_max * (1.0 - safe_divide(rank, n - 1.0))
    success = group_sum(jnp.where(live & (sc >= threshold), 1.0, 0.0), group_ids, num_groups)[group_ids] > 0
    return jax.lax.stop_gradient(jnp.where(live & ~success & (n > 1), graded, sc))



# ----------------------------------------------------------------------------- DECS
def decs_token_rewards(correct: jnp.ndarray, necessary: jnp.ndarray, mask: jnp.ndarray, *, beta: float = 0.1,
                       max_length: float) -> jnp.ndarray:
    """DECS's decoupled token rewards: ``[B, T]``.

    For a correct response of ``L`` tokens whose first ``necessary`` tokens reach the answer
    (its thinking up to the first chunk that already holds a correct answer): those tokens get
    ``1 + beta``, the redundant ones after them ``1 + beta (1 - L / max_length)``; every position
    of a wrong response gets 0. As in the authors' code the positions past a correct response's
    end (its padding, which :func:`decs_advantages` counts in the group's statistics) hold
    ``1 + beta`` too. Paper: "Overthinking Reduction with Decoupled Rewards and Curriculum Data
    Scheduling" (DECS), arXiv:2509.25827; code ``pixas/DECS`` @0d12e53 (``valid_ray_trainer.py``,
    ``compute_grpo_proc_length_advantage_return``: beta 0.1, ``L_max`` the padded response width,
    its ``max_response_length`` 16384).
    """
    _checks.check_positive("beta", beta, allow_zero=True)
    _checks.check_positive("max_length", max_length)
    m = _checks.as_mask(mask)
    b, t = m.shape
    length = jnp.sum(m, axis=1)
    pos = jnp.arange(t)[None]
    nec = pos < jnp.asarray(necessary, jnp.float32)[:, None]
    ok = jnp.asarray(correct, bool)[:, None]
    redundant = ~nec & (pos < length[:, None])
    r = jnp.where(redundant, 1.0 + beta * (1.0 - length / max_length)[:, None], 1.0 + beta)
    return jax.lax.stop_gradient(jnp.where(ok, r, 0.0))


def decs_advantages(token_rewards: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                    epsilon: float = 1e-6, pad_in_stats: bool = True, valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """DECS's advantage: each position's reward normalised across the group at that position,
    ``A_{i,t} = (R_{i,t} - mean_g R_{., t}) / (std_g R_{., t} + epsilon)`` (unbiased std; a group
    of one response: mean 0, std 1). With ``pad_in_stats`` (the authors' code) every response counts at
    every position, with the reward ``token_rewards`` holds there past its end (the code's: ``1 +
    beta`` for a correct response, 0 for a wrong one; :func:`decs_token_rewards`); without it only
    the responses that reach position ``t`` count. Masked to the response.
    """
    _checks.check_rank("token_rewards", token_rewards, 2)
    m = _checks.as_mask(mask)
    b, t = m.shape
    v = jnp.ones((b,), jnp.float32) if valid is None else _checks.as_mask(valid)
    r = _checks.as_float(token_rewards) if pad_in_stats else jnp.where(m > 0, _checks.as_float(token_rewards), 0.0)
    w = (jnp.ones_like(m) if pad_in_stats else m) * v[:, None]
    cnt = jax.ops.segment_sum(w, group_ids, num_segments=num_groups)
    mean = safe_divide(jax.ops.segment_sum(r * w, group_ids, num_segments=num_groups), cnt)
    dev = (r - mean[group_ids]) * w
    var = safe_divide(jax.ops.segment_sum(dev * dev, group_ids, num_segments=num_groups), jnp.maximum(cnt - 1.0, 1.0))
    rows = jax.ops.segment_sum(v, group_ids, num_segments=num_groups)
    single = (rows <= 1.0)[group_ids][:, None]  # a group of one response: mean 0, std 1 (the code's)
    adv = jnp.where(single, r, (r - mean[group_ids]) / (jnp.sqrt(var)[group_ids] + epsilon))
    return jax.lax.stop_gradient(jnp.where((m > 0) & (v[:, None] > 0), adv, 0.0))

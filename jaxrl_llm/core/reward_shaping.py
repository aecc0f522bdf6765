"""Reward designs of the seed papers: pure functions from per-row outcomes to rewards.

Inputs are sequence-level (``[B]``): correctness flags, lengths, tool-call counts, flaw flags,
component scores, answer clusters, a pairwise preference matrix, with ``group_ids [B]`` in
``[0, num_groups)`` (static ``num_groups``) where a method compares the rows of a prompt and an
optional ``valid [B]`` (rows outside take no part and get 0). Each returns ``[B]`` float32
rewards (the method's reward, to be used in place of the verifier's; the loop's shaping parts add
the difference), without gradient. The group-relative advantage is computed afterwards by the
recipe's estimator (GRPO unless the paper says otherwise).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks
from jaxrl_llm.core.shaping import kimi_length_reward
from jaxrl_llm.core.stats import group_sum, safe_divide

__all__ = [
    "thinkless_reward",
    "grpo_lambda_reward",
    "concise_reward",
    "otc_tool_reward",
    "fapo_reward",
    "posterior_reward",
    "empo_reward",
    "self_play_win_rate",
    "region_consistency_reward",
    "cgpo_calibrated_reward",
    "cosine_length_reward",
    "auto_cei_reward",
    "campo_repetition_penalty",
    "mutual_welfare_reward",
    "apo_adaptive_reward",
    "group_contrastive_aux_reward",
    "window_entropy_counts",
    "ares_entropy_reward",
    "dot_truncation_lengths",
    "hbpo_reward",
    "hbpo_advantages",
    "triangular_length_reward",
    "curriculum_budget",
    "hapo_history_reward",
    "hapo_history_update",
    "stage_schedule",
    "interleaved_length_cap",
]

sg = jax.lax.stop_gradient


def _seq(name, x, b=None):
    _checks.check_rank(name, x, 1)
    if b is not None and _checks._shape(x)[0] != b:
        raise ValueError(f"argument {name!r} must have shape ({b},), got {_checks._shape(x)}")
    return _checks._shape(x)[0]


def _valid(valid, b):
    return jnp.ones((b,), jnp.float32) if valid is None else _checks.as_mask(valid)


def thinkless_reward(correct: jnp.ndarray, short_mode: jnp.ndarray, *, short_reward: float = 1.0,
                     think_reward: float = 0.5, wrong_reward: float = -1.0) -> jnp.ndarray:
    """Thinkless's mode-dependent reward: ``short_reward`` for a correct answer in the short mode
    (``<short>`` control token), ``think_reward`` for a correct one after thinking (``<think>``),
    ``wrong_reward`` for a wrong one in either mode.

    Paper: "Thinkless: LLM Learns When to Think" (Fang et al.), arXiv:2505.13379; values from the
    authors' code (``VainF/Thinkless`` @aa225d2, ``deepscaler/rewards/math_reward.py``): 1.0, 0.5,
    -1.0 (a format error is also -1.0: pass it as wrong).

    Args:
      correct: ``[B]`` bool. short_mode: ``[B]`` bool, the row answered in the short mode.

    Returns:
      ``[B]`` float32.
    """
    b = _seq("correct", correct)
    _seq("short_mode", short_mode, b)
    c, s = jnp.asarray(correct, bool), jnp.asarray(short_mode, bool)
    return jnp.where(c, jnp.where(s, short_reward, think_reward), wrong_reward).astype(jnp.float32)


def grpo_lambda_reward(correct: jnp.ndarray, lengths: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                       top_fraction: float = 0.5, length_weight: float = 1.0,
                       valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """GRPO-lambda's per-group reward switch: a length penalty only for the most accurate groups.

    Groups are ranked by their correctness ratio ``p_q``; the top ``ceil(top_fraction * n_groups)``
    groups of the batch with ``p_q > 0`` (ties by group id) get ``c_i + length_weight * len_i`` with
    Kimi k1.5's group length reward ``len_i`` (:func:`~jaxrl_llm.core.kimi_length_reward`:
    ``0.5 - (L - L_min) / (L_max - L_min)`` for correct rows, ``min(0, .)`` for wrong ones); the
    others keep the plain 0/1 reward ``c_i``. Penalising length only where the group is already
    mostly right avoids the accuracy collapse of an always-on length penalty.

    Paper: "Stable Reinforcement Learning for Efficient Reasoning" (GRPO-lambda), arXiv:2505.18086.
    No code was released: the group ratio and the top-lambda selection are the paper's; the length
    penalty form (Kimi k1.5's, on which the paper builds), ``length_weight`` and the default
    ``top_fraction`` are our reading. ``top_fraction = 0`` is GRPO, 1 the always-on penalty.

    Args:
      correct: ``[B]`` bool. lengths: ``[B]`` response lengths. group_ids, num_groups, valid: as usual.
      top_fraction: the fraction of the batch's groups that get the length penalty.
      length_weight: weight of the length reward.

    Returns:
      ``[B]`` float32.
    """
    b = _seq("correct", correct)
    _seq("lengths", lengths, b)
    _checks.check_groups(group_ids, num_groups, b)
    if not 0.0 <= top_fraction <= 1.0:
        raise ValueError(f"argument 'top_fraction' must be in [0, 1], got {top_fraction!r}")
    v = _valid(valid, b)
    c = jnp.asarray(correct, bool) & (v > 0)
    cnt = group_sum(v, group_ids, num_groups)
    p = safe_divide(group_sum(c.astype(jnp.float32), group_ids, num_groups), cnt)
    present = cnt > 0
    n_groups = jnp.sum(present.astype(jnp.float32))
    k = jnp.ceil(top_fraction * n_groups)
    key = jnp.where(present & (p > 0), p, -1.0)
    order = jnp.lexsort((jnp.arange(num_groups), -key))            # highest ratio first, ties by id
    rank = jnp.zeros(num_groups, jnp.int32).at[order].set(jnp.arange(num_groups, dtype=jnp.int32))
    chosen = (rank < k) & (key > 0)
    length_r = kimi_length_reward(lengths, c, group_ids, num_groups, v > 0)
    base = c.astype(jnp.float32)
    out = jnp.where(chosen[group_ids], base + length_weight * length_r, base)
    return sg(jnp.where(v > 0, out, 0.0))


def concise_reward(correct: jnp.ndarray, lengths: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                   max_length: float, alpha: float = 1.0, valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """ConciseR's L-GRPO reward: a length bonus only when every rollout of the prompt is correct.

    ``r_i = 1 + alpha (1 - L_i / max_length)`` in a group whose rows are all correct ("walk before
    you run"), ``r_i = c_i`` otherwise. In mixed groups this is GRPO; in an all-correct group the
    normalised advantage is ``-(L - mean L) / std L`` whatever ``alpha > 0``.

    Paper: "Walk Before You Run! Concise LLM Reasoning via Reinforcement Learning" (ConciseR),
    arXiv:2505.21178. The gate is the paper's; the repository holds no code, so the linear bonus
    and ``alpha = 1`` are our reading (arguments).

    Args:
      correct: ``[B]`` bool. lengths: ``[B]``. group_ids, num_groups, valid: as usual.
      max_length: the response budget ``L_max`` (> 0). alpha: bonus weight.

    Returns:
      ``[B]`` float32.
    """
    b = _seq("correct", correct)
    _seq("lengths", lengths, b)
    _checks.check_groups(group_ids, num_groups, b)
    _checks.check_positive("max_length", max_length)
    v = _valid(valid, b)
    c = jnp.asarray(correct, bool) & (v > 0)
    all_ok = group_sum(c.astype(jnp.float32), group_ids, num_groups) >= group_sum(v, group_ids, num_groups)
    bonus = 1.0 + alpha * (1.0 - _checks.as_float(lengths) / max_length)
    out = jnp.where(all_ok[group_ids], bonus, c.astype(jnp.float32))
    return sg(jnp.where(v > 0, out, 0.0))


def otc_tool_reward(correct: jnp.ndarray, calls: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                    c: float = 1.0, alpha: float = 1.0, mode: str = "grpo",
                    valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """OTC's tool-efficiency reward: correctness times a factor that peaks at the fewest calls.

    ``r = alpha r_tool r_correct``. ``mode="ppo"``: ``r_tool = cos(m pi / (2m + c))`` (1 at no call,
    toward 0 with many). ``mode="grpo"``: with ``n`` the fewest calls among the group's correct
    rows, ``f(m, n) = 0`` if ``m = n = 0``, ``m`` if ``n = 0``, else the harmonic mean ``2nm / (m + n)``;
    ``r_tool = 1`` if ``f = n = 0``, ``cos(m pi / (2m + c))`` if ``n = 0``, else
    ``sin(f pi / (2n))`` (1 at ``m = n``, toward 0 as ``m`` grows, and 0 for ``m = 0 < n``: a
    correct answer that skipped a needed call is worth no more than a wrong one).

    Paper: "OTC: Optimal Tool Calls via Reinforcement Learning" (Wang et al.), arXiv:2504.14870. No
    author code was found; the formulas are the paper's as quoted verbatim by two independent
    sources, ``c = 1`` and ``alpha = 1`` their defaults. The paper's running per-question minimum
    across epochs needs per-prompt state; here ``n`` is the batch group's.

    Args:
      correct: ``[B]`` bool. calls: ``[B]`` tool calls per response. group_ids, num_groups, valid.
      c: smoothing constant. alpha: scale. mode: ``"grpo"`` or ``"ppo"``.

    Returns:
      ``[B]`` float32.
    """
    b = _seq("correct", correct)
    _seq("calls", calls, b)
    _checks.check_groups(group_ids, num_groups, b)
    _checks.check_choice("mode", mode, ("grpo", "ppo"))
    _checks.check_positive("c", c)
    v = _valid(valid, b)
    ok = jnp.asarray(correct, bool) & (v > 0)
    m = jnp.maximum(_checks.as_float(calls), 0.0)
    cos_r = jnp.cos(m * math.pi / (2.0 * m + c))
    if mode == "ppo":
        tool = cos_r
    else:
        big = jnp.float32(1e9)
        n = jax.ops.segment_min(jnp.where(ok, m, big), group_ids, num_groups)
        n = jnp.where(n >= big, 0.0, n)[group_ids]
        f = jnp.where((m == 0) & (n == 0), 0.0, jnp.where(n == 0, m, safe_divide(2.0 * n * m, m + n)))
        tool = jnp.where((f == 0) & (n == 0), 1.0,
                         jnp.where(n == 0, cos_r, jnp.sin(f * math.pi / (2.0 * jnp.where(n > 0, n, 1.0)))))
    return sg(jnp.where(ok, alpha * tool, 0.0))


def fapo_reward(correct: jnp.ndarray, flawed: jnp.ndarray, *, penalty: float = 1.0) -> jnp.ndarray:
    """FAPO's flaw-aware reward: ``+1`` correct, ``-1`` wrong, and ``penalty`` off a correct answer
    whose reasoning a generative reward model flags as flawed (``1 - 1 = 0`` by default).

    With group normalisation a flawed-correct row's advantage is proportional to ``(n_wrong -
    n_clean) / G``: positive while wrong answers outnumber clean correct ones (it is still useful
    then) and negative after, the paper's parameter-free exploit-then-suppress schedule.

    Paper: "FAPO: Flawed-Aware Policy Optimization for Efficient and Reliable Reasoning",
    arXiv:2510.22543; values from the authors' recipe (``verl-project/verl-recipe`` @48ea0a7,
    ``fapo/reward_fn_reasoning.py``: ``FLAWED_REWARD_PENALTY = 1``). The flaw flag is any reward
    function's output (the paper's FAPO-GenRM); wrong rows are never flagged.

    Args:
      correct: ``[B]`` bool. flawed: ``[B]`` bool. penalty: subtracted from flawed correct rows.

    Returns:
      ``[B]`` float32.
    """
    b = _seq("correct", correct)
    _seq("flawed", flawed, b)
    c = jnp.asarray(correct, bool)
    r = jnp.where(c, 1.0, -1.0) - jnp.where(c & jnp.asarray(flawed, bool), penalty, 0.0)
    return r.astype(jnp.float32)


def posterior_reward(format_ok: jnp.ndarray, outcome: jnp.ndarray, thinking: jnp.ndarray) -> jnp.ndarray:
    """Posterior-GRPO's reward: the process (thinking-quality) reward counts only on success.

    ``R = R_f + R_o + R_o R_t`` with the format reward ``R_f``, the outcome ``R_o`` (1 when the
    answer is right, e.g. all tests pass) and the thinking score ``R_t`` in ``[0, 1]`` of a
    reasoning reward model; a wrong answer's reasoning earns nothing, so the policy cannot farm
    process reward without solving.

    Paper: "Posterior-GRPO: Rewarding Reasoning Processes in Code Generation", arXiv:2508.05170
    (the sum as re-implemented by an independent library citing the paper; no author code). The
    mapping of the reward model's score to ``[0, 1]`` is the caller's.

    Args:
      format_ok, outcome, thinking: ``[B]`` floats.

    Returns:
      ``[B]`` float32.
    """
    b = _seq("format_ok", format_ok)
    _seq("outcome", outcome, b)
    _seq("thinking", thinking, b)
    f, o, t = (_checks.as_float(x) for x in (format_ok, outcome, thinking))
    return sg(f + o + o * t)


def empo_reward(answer_ids: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                empty: jnp.ndarray | None = None, threshold: bool = True,
                valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """EMPO's unsupervised reward: the share of the group that gave the same answer.

    ``r_i = |C(i)| / G`` for the answer cluster ``C(i)`` of row ``i`` (semantic clusters: equal
    extracted answers), 0 for a row without an answer; with ``threshold`` every row of a group
    whose semantic entropy ``-sum_c p_c log p_c`` reaches ``log G`` (all answers distinct) gets 0
    ("entropy thresholding": an unreliable prompt). Maximising it minimises the semantic entropy
    of the policy's answers, with no label.

    Paper: "Right Question is Already Half the Answer: Fully Unsupervised LLM Reasoning
    Incentivization" (EMPO, Zhang et al.), arXiv:2504.05812; the authors' TRL version
    (``QingyangZhang/EMPO`` @c5eccd4, ``get_empo_math_reward``): empty answers count in the
    shares but get 0, threshold ``H < log G``. (Their verl version counts an empty answer as its
    own cluster with reward ``1/G`` and drops the threshold: ``empty=None, threshold=False``.)

    Args:
      answer_ids: ``[B]`` cluster ids in ``[0, B)`` (equal only within a group).
      group_ids, num_groups, valid: as usual. empty: optional ``[B]`` bool, the row has no answer.
      threshold: apply the entropy threshold.

    Returns:
      ``[B]`` float32.
    """
    b = _seq("answer_ids", answer_ids)
    _checks.check_int("answer_ids", answer_ids)
    _checks.check_groups(group_ids, num_groups, b)
    v = _valid(valid, b)
    ids = jnp.clip(jnp.asarray(answer_ids, jnp.int32), 0, b - 1)
    size_c = jax.ops.segment_sum(v, ids, b)[ids]
    cnt = group_sum(v, group_ids, num_groups)[group_ids]
    p = safe_divide(size_c, cnt)
    first = (v > 0) & (jax.ops.segment_min(jnp.where(v > 0, jnp.arange(b), b), ids, b)[ids] == jnp.arange(b))
    h_terms = jnp.where(first & (p > 0), -p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0)
    h = group_sum(h_terms, group_ids, num_groups)[group_ids]
    r = p
    if empty is not None:
        _seq("empty", empty, b)
        r = jnp.where(jnp.asarray(empty, bool), 0.0, r)
    if threshold:
        r = jnp.where(h < jnp.log(jnp.maximum(cnt, 1.0)) - 1e-6, r, 0.0)
    return sg(jnp.where(v > 0, r, 0.0))


def region_consistency_reward(starts: jnp.ndarray, ends: jnp.ndarray, has_region: jnp.ndarray, group_ids: jnp.ndarray,
                              num_groups: int, *, grid: int, valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """GUI-RCPO's region consistency reward, on a 1-D grid: how much of the group agrees with
    the region a response predicted, with no label.

    Each response ``k`` of a prompt predicts a region ``B_k = [start_k, end_k]`` (inclusive
    integer positions on a grid of ``grid`` cells; on a screen, pixels; in the text tasks, word
    positions). Every response with a region votes for its cells: ``v(p) = (1 / K) sum_k
    1[p in B_k]`` with ``K`` the group's (valid) responses, those without a region counting in
    ``K`` but casting no vote. The reward is the mean vote over the response's own region,
    ``r_k = (1 / |B_k|) sum_{p in B_k} v(p)``, and 0 for a response without a region. It is 1
    when all ``K`` responses predict the same region and ``1 / K`` for a region no other response
    overlaps; maximising it moves the policy towards the consensus region (which GUI-RC, the
    training-free half of the paper, takes as the answer).

    Paper: Du et al., "Test-Time Reinforcement Learning for GUI Grounding via Region
    Consistency" (GUI-RC / GUI-RCPO), arXiv:2508.05615: spatial voting over the sampled
    predictions and a reward of each prediction's agreement with the voting map, trained with
    GRPO on unlabeled data. The 2-D screen becomes a 1-D grid here (the text analogue the
    library's tasks host); the normalisation of the votes by ``K`` and of the reward by the
    region's size are our reading of the paper's description (code not available to us).

    Args:
      starts, ends: ``[B]`` integer region bounds (inclusive; clipped to the grid).
      has_region: ``[B]`` bool, the response gave a parseable region with ``start <= end``.
      group_ids, num_groups, valid: as usual. grid: the number of cells (static).

    Returns:
      ``[B]`` float32 in ``[0, 1]``.
    """
    b = _seq("starts", starts)
    _seq("ends", ends, b)
    _seq("has_region", has_region, b)
    _checks.check_int("starts", starts)
    _checks.check_int("ends", ends)
    _checks.check_groups(group_ids, num_groups, b)
    if not (isinstance(grid, int) and grid >= 1):
        raise ValueError(f"argument 'grid' must be an int >= 1, got {grid!r}")
    v = _valid(valid, b)
    s = jnp.clip(jnp.asarray(starts, jnp.int32), 0, grid - 1)
    e = jnp.clip(jnp.asarray(ends, jnp.int32), 0, grid - 1)
    has = jnp.asarray(has_region, bool) & (v > 0) & (jnp.asarray(starts) <= jnp.asarray(ends))
    p = jnp.arange(grid)
    cover = ((p[None] >= s[:, None]) & (p[None] <= e[:, None]) & has[:, None]).astype(jnp.float32)
    votes = jax.ops.segment_sum(cover, group_ids, num_segments=num_groups)
    k = group_sum(v, group_ids, num_groups)
    vmap_ = safe_divide(votes, k[:, None])[group_ids]
    r = safe_divide(jnp.sum(cover * vmap_, axis=1), jnp.sum(cover, axis=1))
    return sg(jnp.where(has, r, 0.0))


def cgpo_calibrated_reward(reward: jnp.ndarray, baseline: jnp.ndarray, feasible: jnp.ndarray) -> jnp.ndarray:
    """CGPO's calibrated, constraint-gated reward (CRPG's reward): ``sigmoid(r - r_base)`` where
    every judge passes the response, 0 where one flags it.

    ``r`` is the reward model's score of the response and ``r_base`` its score of a baseline
    response to the same prompt (the paper: a golden or reference answer), so the calibrated
    reward is the Bradley-Terry probability that the response beats the baseline, in ``(0, 1)``
    and comparable across prompts. A response that violates a constraint (a *judge*: a rule or
    an LLM checking correctness, safety, format, ...) gets 0, the least any response can get,
    so the policy is never pushed towards a violation, however the reward model scores it (the
    reward hacking the judges exist to stop).

    Paper: Xu et al., "The Perfect Blend: Redefining RLHF with Mixture of Judges" (CGPO),
    arXiv:2409.20370: the calibrated reward and the restriction of the policy gradient to
    feasible responses (CRPG). Not reproduced: the per-task stratification (one optimiser and
    reward model per task) and the CODPO / CRRAFT optimisers.

    Args:
      reward, baseline: ``[B]`` reward-model scores of the response and of the baseline.
      feasible: ``[B]`` bool, every judge passes the response.

    Returns:
      ``[B]`` float32 in ``[0, 1)``.
    """
    b = _seq("reward", reward)
    _seq("baseline", baseline, b)
    _seq("feasible", feasible, b)
    r = jax.nn.sigmoid(_checks.as_float(reward) - _checks.as_float(baseline))
    return sg(jnp.where(jnp.asarray(feasible, bool), r, 0.0))


def cosine_length_reward(correct: jnp.ndarray, lengths: jnp.ndarray, *, max_length: float, min_correct: float = 0.5,
                         max_correct: float = 1.0, min_wrong: float = -0.5, max_wrong: float = 0.0,
                         clamp_length: bool = False) -> jnp.ndarray:
    """The cosine-scaled correctness reward: short correct answers earn most, long wrong ones
    lose most.

    ``r = lo + (hi - lo) (1 + cos(pi L / L_max)) / 2`` with ``(lo, hi) = (min_correct,
    max_correct)`` for a correct answer and ``(min_wrong, max_wrong)`` for a wrong one: at
    ``L = 0`` the reward is ``hi``, at ``L = L_max`` it is ``lo`` (1.0 -> 0.5 when correct, 0.0 ->
    -0.5 when wrong, by default). Past ``L_max`` the cosine goes on (it rises again, back to
    ``hi`` at ``2 L_max``), as in the code the open-r1 / Open-RS runs used; ``clamp_length``
    holds ``L`` at ``L_max`` instead. The code names its wrong-answer bounds the other way round
    (its ``min_value_wrong`` is the value at length 0, its ``max_value_wrong`` the value at
    ``L_max``): Open-RS's ``0.0 / -0.5`` are ``max_wrong=0.0, min_wrong=-0.5`` here (the defaults: a
    longer wrong answer loses more, as in its runs); open-r1's own defaults ``-1.0 / -0.5`` (a
    longer wrong answer loses less, Yeo et al.'s design) are ``max_wrong=-1.0, min_wrong=-0.5``.

    Papers: Yeo et al., "Demystifying Long Chain-of-Thought Reasoning in LLMs",
    arXiv:2502.03373 (the cosine reward); used by Dang and Ngo, "Reinforcement Learning for
    Reasoning in Small LLMs: What Works and What Doesn't" (Open-RS), arXiv:2503.16219, code
    ``knoveleng/open-rs`` @2889c47 (``rewards.py``: these defaults, the length in characters,
    ``max_length`` 1000, 3584 in its third experiment). Identity: ``min = max`` for both outcomes
    gives the constant rewards ``max_correct`` / ``max_wrong`` (the plain correctness reward).

    Args:
      correct: ``[B]`` bool. lengths: ``[B]`` (characters or tokens; the caller's unit).
      max_length: ``L_max`` > 0.

    Returns:
      ``[B]`` float32.
    """
    b = _seq("correct", correct)
    _seq("lengths", lengths, b)
    _checks.check_positive("max_length", max_length)
    ln = _checks.as_float(lengths)
    if clamp_length:
        ln = jnp.minimum(ln, max_length)
    c = (1.0 + jnp.cos(math.pi * ln / max_length)) / 2.0
    ok = jnp.asarray(correct, bool)
    lo = jnp.where(ok, min_correct, min_wrong)
    hi = jnp.where(ok, max_correct, max_wrong)
    return sg(lo + (hi - lo) * c)


def auto_cei_reward(correct: jnp.ndarray, refused: jnp.ndarray, steps: jnp.ndarray, *, c1: float = 13.0,
                    c2: float = 0.4) -> jnp.ndarray:
    """Auto-CEI's reward with an "I don't know": +1 right, -1 wrong, and for a refusal after ``x``
    reasoning steps ``2 / (1 + exp(-c2 (x - c1))) - 1`` (``tanh(c2 (x - c1) / 2)``, in ``(-1, 1)``):
    giving up after real effort (more than ``c1`` steps) is rewarded, giving up early is punished.

    Paper: Zhao et al., "Automatic Curriculum Expert Iteration for Reliable LLM Reasoning"
    (Auto-CEI), arXiv:2410.07627; code ``SalesforceAIResearch/Auto-CEI`` @b7ea2f5
    (``src/utils/utils.py``, the conservative reward; ``c1`` 13 and ``c2`` 0.4 are its argument
    defaults, which its curriculum replaces by data-driven values and then moves ``c1`` by hill
    climbing). Identity: a refusal at exactly ``c1`` steps scores 0.

    Returns:
      ``[B]`` float32.
    """
    b = _seq("correct", correct)
    _seq("refused", refused, b)
    _seq("steps", steps, b)
    _checks.check_positive("c2", c2)
    idk = 2.0 / (1.0 + jnp.exp(-c2 * (_checks.as_float(steps) - c1))) - 1.0
    out = jnp.where(jnp.asarray(correct, bool), 1.0, -1.0)
    return sg(jnp.where(jnp.asarray(refused, bool), idk, out))


def campo_repetition_penalty(loop_fraction: jnp.ndarray, truncated: jnp.ndarray, *, coef: float = 1.0,
                             constant: float | None = None) -> jnp.ndarray:
    """CAMPO's adaptive repetition penalty, to subtract from the reward of a response that ran
    into the length cap while repeating itself.

    ``loop_fraction`` is ``f(o)``, the share of the response inside the repeating block it ends
    with (0 without one; :func:`jaxrl_llm.algorithms.reward_designs.trailing_loop_fraction`): a
    loop that starts earlier is penalised more. The penalty is ``coef f(o)`` (the paper's Eq. 5-6,
    ``coef`` 1) or, with ``constant`` set, ``constant`` wherever ``f(o) > 0`` (the authors'
    released code: 0.1, whatever the fraction), and 0 on responses that ended before the cap.

    Paper: MiroMind-M1, "Context-Aware Multi-Stage Policy Optimization" (CAMPO), arXiv:2507.14683;
    code ``MiroMindAsia/MiroMind-M1`` @3ace1ab (``verl/trainer/ppo/core_algos.py``:
    ``find_infinite_loop_start`` and ``compute_campo_outcome_advantage``, which checks only the
    responses whose mask is full, i.e. cut at the cap). Identity: ``coef = 0`` (no ``constant``)
    is no penalty.

    Args:
      loop_fraction: ``[B]`` float in ``[0, 1]``. truncated: ``[B]`` bool, the response hit the cap.

    Returns:
      ``[B]`` float32 penalties (>= 0), no gradient.
    """
    b = _seq("loop_fraction", loop_fraction)
    _seq("truncated", truncated, b)
    _checks.check_positive("coef", coef, allow_zero=True)
    f = _checks.as_float(loop_fraction)
    if constant is not None:
        _checks.check_positive("constant", constant, allow_zero=True)
        pen = jnp.where(f > 0, jnp.float32(constant), 0.0)
    else:
        pen = coef * f
    return sg(jnp.where(jnp.asarray(truncated, bool), pen, 0.0))


def mutual_welfare_reward(user_welfare: jnp.ndarray, llm_welfare: jnp.ndarray, *,
                          mode: str = "cobb_douglas") -> jnp.ndarray:
    """GTAlign's mutual-welfare reward: the geometric mean ``sqrt(U W)`` of the user's welfare
    ``U`` and the model's ``W`` (Cobb-Douglas with equal weights: the Nash social welfare), so a
    response good for one side only earns little; ``mode="linear"`` is the paper's ablation
    ``(U + W) / 2``.

    Paper: "GTAlign: Game-Theoretic Alignment of LLM Assistants for Social Welfare",
    arXiv:2510.08872; code ``ulab-uiuc/GTAlign`` @1e35360 (``recipe/gamellm/tasks/*.py``,
    ``compute_score``: ``score = (user_reward * llm_reward) ** 0.5``; ``tasks_linear_comb/``: the
    mean). Identity: ``U = W`` gives ``U`` in both modes.

    Args:
      user_welfare, llm_welfare: ``[B]`` float, >= 0.

    Returns:
      ``[B]`` float32, no gradient.
    """
    b = _seq("user_welfare", user_welfare)
    _seq("llm_welfare", llm_welfare, b)
    _checks.check_choice("mode", mode, ("cobb_douglas", "linear"))
    u, w = _checks.as_float(user_welfare), _checks.as_float(llm_welfare)
    if mode == "linear":
        return sg((u + w) / 2.0)
    return sg(jnp.sqrt(jnp.maximum(u * w, 0.0)))


def window_entropy_counts(entropy: jnp.ndarray, mask: jnp.ndarray, *, window: int = 4,
                          threshold: jnp.ndarray | float | None = None, percentile: float = 95.0):
    """ARES's high window-entropy (HWE) tokens: the response tokens after which the mean entropy of
    the next ``window`` tokens is at least ``threshold``.

    ``W_j = mean(H_j .. H_{j + window - 1})`` over the windows inside the response; token ``i`` is an
    HWE token when ``W_{i + 1} >= threshold`` (the window after it, which must fit in the response).
    With ``threshold=None`` it is the batch's median of each response's ``percentile``-th percentile
    of its ``W_j`` (ARES's per-batch threshold; the code then smooths it over batches, 0.99 / 0.01).

    Paper: "ARES: Multimodal Adaptive Reasoning via Difficulty-Aware Token-Level Entropy Shaping",
    arXiv:2510.08457; code ``shawn0728/ARES`` @146620e (``vllm_rollout_spmd.py``: window 4, the
    95th percentile; it counts only after the reasoning-trigger words of its
    ``data/crucial_token_final_version.json`` and estimates ``H`` from the top-10 log-probs: here every
    response token and the exact entropy).

    Args:
      entropy, mask: ``[B, T]`` (the response tokens contiguous in each row).

    Returns:
      ``(counts [B] float32, threshold scalar float32)``, no gradient.
    """
    _checks.check_token_args(entropy=entropy, mask=mask)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"argument 'window' must be an int >= 1, got {window!r}")
    m = _checks.as_mask(mask)
    h = _checks.zero_outside(_checks.as_float(entropy), m)
    b, t = h.shape
    zero = jnp.zeros((b, 1), h.dtype)
    cs, cm = jnp.concatenate([zero, jnp.cumsum(h, 1)], 1), jnp.concatenate([zero, jnp.cumsum(m, 1)], 1)
    n_win = max(t - window + 1, 0)
    if n_win == 0:
        return jnp.zeros(b, jnp.float32), jnp.float32(0.0)
    wsum = cs[:, window:window + n_win] - cs[:, :n_win]
    wcnt = cm[:, window:window + n_win] - cm[:, :n_win]
    inside = wcnt >= window  # the window lies in the response
    wmean = wsum / window
    if threshold is None:
        p = jnp.nanpercentile(jnp.where(inside, wmean, jnp.nan), percentile, axis=1)
        threshold = jnp.nanmedian(p)
        threshold = jnp.where(jnp.isnan(threshold), jnp.inf, threshold)
    before = jnp.concatenate([jnp.zeros((b, 1), bool), m[:, :n_win - 1] > 0], 1)  # a response token precedes W_j
    hwe = inside & before & (wmean >= threshold)
    return sg(jnp.sum(hwe, 1).astype(jnp.float32)), sg(jnp.asarray(threshold, jnp.float32))


_ARES_MARGIN, _ARES_KAPPA, _ARES_TEMP, _ARES_CAP = (0.15, 0.25, 0.35), (2.0, 3.0, 4.0), (2.0, 2.5, 3.0), (1.0, 1.0, 1.2)


def ares_entropy_reward(counts: jnp.ndarray, targets: jnp.ndarray, correct: jnp.ndarray, level: jnp.ndarray, *,
                        alpha: float = 0.5) -> jnp.ndarray:
    """ARES's hierarchical entropy reward: fewer high-window-entropy tokens than the difficulty's
    target on easy problems, about the target on medium ones, more on hard ones.

    With ``d = N - T`` (the response's HWE count against its difficulty's target), margin ``mu =
    max(1, f T)``, ``f`` = 0.15 / 0.25 / 0.35, Huber scale ``kappa`` = 2 / 3 / 4, sigmoid temperature
    ``s`` = 2 / 2.5 / 3 and cap ``c = alpha`` x 1 / 1 / 1.2 for easy / medium / hard (``level`` 0 / 1 /
    2), ``Hub(x) = x^2 / (2 kappa)`` up to ``kappa``, then ``x - kappa / 2``, ``S(x) = sigmoid(x / s)``:

    - easy, correct: ``-min(c, Hub(max(d - mu, 0)) / (mu + kappa) c)``;
    - medium, correct: the same with ``|d|``;
    - easy / medium, wrong: ``S(max(d - mu, 0)) c`` x 0.6 / 0.8;
    - hard, correct: ``S(d + mu) c`` if ``d >= -mu``, else ``-min(c, 0.5 Hub(-d - mu) / (mu + kappa) c)``;
    - hard, wrong: ``S(max(d - mu, 0)) c``.

    Paper: ARES (AEPO, adaptive entropy policy optimisation), arXiv:2510.08457; code
    ``shawn0728/ARES`` @146620e (``examples/reward_function/aepo.py``, ``compute_score``; ``alpha`` is
    its per-bucket cap, 0.5 at the start, which its trainer moves by 0.05 x the gap between the
    bucket's mean count and its target). Identity: ``alpha = 0`` is no reward.

    Args:
      counts, targets: ``[B]`` float. correct: ``[B]`` bool. level: ``[B]`` int in ``{0, 1, 2}``.

    Returns:
      ``[B]`` float32, no gradient.
    """
    b = _seq("counts", counts)
    for name, x in (("targets", targets), ("correct", correct), ("level", level)):
        _seq(name, x, b)
    _checks.check_positive("alpha", alpha, allow_zero=True)
    lv = jnp.clip(jnp.asarray(level, jnp.int32), 0, 2)
    pick = lambda tab: jnp.asarray(tab, jnp.float32)[lv]  # noqa: E731
    tgt = _checks.as_float(targets)
    d = _checks.as_float(counts) - tgt
    mu = jnp.maximum(1.0, pick(_ARES_MARGIN) * jnp.maximum(tgt, 1.0))
    kappa, temp, cap = pick(_ARES_KAPPA), pick(_ARES_TEMP), alpha * pick(_ARES_CAP)

    def hub(x):
        x = jnp.maximum(x, 0.0)
        return jnp.where(x <= kappa, 0.5 * x * x / kappa, x - 0.5 * kappa)

    sat = lambda x: jax.nn.sigmoid(x / temp)  # noqa: E731
    ok = jnp.asarray(correct, bool)
    easy_ok = -jnp.minimum(cap, hub(d - mu) / (mu + kappa) * cap)
    med_ok = -jnp.minimum(cap, hub(jnp.abs(d) - mu) / (mu + kappa) * cap)
    wrong = sat(jnp.maximum(d - mu, 0.0)) * cap * pick((0.6, 0.8, 1.0))
    hard_ok = jnp.where(d >= -mu, sat(d + mu) * cap, -jnp.minimum(cap, 0.5 * hub(-d - mu) / (mu + kappa) * cap))
    r = jnp.where(ok, jnp.where(lv == 0, easy_ok, jnp.where(lv == 1, med_ok, hard_ok)), wrong)
    return sg(r)


def apo_adaptive_reward(correct: jnp.ndarray, fast_mode: jnp.ndarray, fast_success: jnp.ndarray,
                        formatted: jnp.ndarray | None = None, *, tau: float, alpha: float = 2.0) -> jnp.ndarray:
    """A²FM's APO reward: accuracy times a cost term that taxes a slow mode on easy queries, times
    the format.

    ``r = 1[correct] x r_adaptive x 1[formatted]`` with ``r_adaptive = 1 - p^alpha`` when the query
    is easy -- its fast ("instant") mode succeeds with rate ``p > tau`` -- and the response used a
    slower mode (reasoning or agentic), else 1. The product zeroes the reward on any failure.

    Paper: "A²FM: An Adaptive Agent Foundation Model for Tool-Aware Hybrid Reasoning" (APO),
    arXiv:2510.12838: ``alpha = 2``; ``p`` the success rate of the rollouts forced into the instant
    mode (the paper samples each mode rho = 3 times by prefix injection, plus gamma = 3 free
    rollouts). From secondary write-ups of the paper (no training code is released): ``tau``'s value
    was not found (no default). Identity: no easy query (``p <= tau``) is the product of accuracy
    and format.

    Args:
      correct, fast_mode: ``[B]`` bool (the response chose the fast mode). fast_success: ``[B]`` the
        query's fast-mode success rate in ``[0, 1]``. formatted: ``[B]`` bool or None (all).

    Returns:
      ``[B]`` float32, no gradient.
    """
    b = _seq("correct", correct)
    _seq("fast_mode", fast_mode, b)
    _seq("fast_success", fast_success, b)
    _checks.check_positive("alpha", alpha)
    p = _checks.as_float(fast_success)
    slow_on_easy = (p > tau) & ~jnp.asarray(fast_mode, bool)
    adaptive = jnp.where(slow_on_easy, 1.0 - jnp.power(p, alpha), 1.0)
    fmt = 1.0 if formatted is None else jnp.asarray(formatted, bool).astype(jnp.float32)
    return sg(jnp.asarray(correct, bool).astype(jnp.float32) * adaptive * fmt)


def group_contrastive_aux_reward(used: jnp.ndarray, correct: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                                 margin: float, valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """GeometryZero's group contrastive masking of an auxiliary-construction reward: a response
    that uses the auxiliary step (``used``; the paper's auxiliary lines) is rewarded +1 when, in its
    group, the responses that use it are right more often than those that do not by more than
    ``margin``, -1 when less often by more than ``margin``, and 0 (masked) otherwise, or when either
    side of the group is empty; responses that do not use it get 0.

    Paper: "GeometryZero: Improving Geometry Solving for LLM with Group Contrastive Policy
    Optimization" (GCPO), arXiv:2506.07160: ``R_aux = 1`` for a construction (its Eq. 3) made
    conditional on the group's accuracy contrast (its Eq. 4, whose exact cases and margin we could
    not read: this is our reconstruction from reviews of the paper, and ``margin`` has no default).
    Identity: a margin of 1 or more masks every response (no aux reward).

    Args:
      used, correct: ``[B]`` bool. group_ids, num_groups, valid: as usual.

    Returns:
      ``[B]`` float32 in ``{-1, 0, 1}``, no gradient.
    """
    b = _seq("used", used)
    _seq("correct", correct, b)
    _checks.check_positive("margin", margin, allow_zero=True)
    v = jnp.ones(b, jnp.float32) if valid is None else _checks.as_mask(valid)
    u = jnp.asarray(used, bool).astype(jnp.float32) * v
    nu = (1.0 - jnp.asarray(used, bool).astype(jnp.float32)) * v
    c = jnp.asarray(correct, bool).astype(jnp.float32)
    n_u, n_n = group_sum(u, group_ids, num_groups), group_sum(nu, group_ids, num_groups)
    acc_u = safe_divide(group_sum(u * c, group_ids, num_groups), n_u)
    acc_n = safe_divide(group_sum(nu * c, group_ids, num_groups), n_n)
    diff = acc_u - acc_n
    both = (n_u > 0) & (n_n > 0)
    sign = jnp.where(both & (diff > margin), 1.0, jnp.where(both & (diff < -margin), -1.0, 0.0))
    return sg(sign[jnp.asarray(group_ids)] * u)


def self_play_win_rate(preference: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                       valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """Minimaximalist SPO's self-play reward: each response's win rate against the other responses
    the policy sampled for the same prompt.

    ``r_i = (1 / (G - 1)) sum_{j != i, same prompt} P(y_i > y_j)`` for a pairwise preference
    ``P [B, B]`` (a judge's probability; ties 0.5); a one-response group gets the neutral 0.5. No
    Bradley-Terry or transitivity assumption: the reward of the symmetric game's minimax winner.
    With ``P(i > j) = 1[s_i > s_j] + 0.5 1[s_i = s_j]`` the reward is the normalised rank of ``s``.

    Paper: "A Minimaximalist Approach to Reinforcement Learning from Human Feedback" (Swamy et
    al.), arXiv:2401.04056 (the reward as the paper and its project page state it; self-comparison
    excluded and ties 0.5 are our choices, constant shifts a group baseline removes).

    Args:
      preference: ``[B, B]`` float, ``P[i, j] = P(y_i preferred to y_j)`` (only same-group pairs read).
      group_ids, num_groups, valid: as usual.

    Returns:
      ``[B]`` float32.
    """
    _checks.check_rank("preference", preference, 2)
    b = _checks._shape(preference)[0]
    if _checks._shape(preference) != (b, b):
        raise ValueError(f"argument 'preference' must be square [B, B], got {_checks._shape(preference)}")
    _checks.check_groups(group_ids, num_groups, b)
    v = _valid(valid, b) > 0
    gid = jnp.asarray(group_ids)
    pair = (gid[:, None] == gid[None]) & v[:, None] & v[None] & ~jnp.eye(b, dtype=bool)
    pm = jnp.where(pair, _checks.as_float(preference), 0.0)
    n = jnp.sum(pair, axis=1).astype(jnp.float32)
    r = jnp.where(n > 0, jnp.sum(pm, axis=1) / jnp.maximum(n, 1.0), 0.5)
    return sg(jnp.where(v, r, 0.0))


def dot_truncation_lengths(lengths: jnp.ndarray, correct: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                           alpha: float = 3.0, min_cut: float = 32, success: float = 1.0,
                           valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """DOT's dynamic outlier truncation: the length each response is cut to.

    In a group whose success rate is at least ``success`` (all correct, by default), the outlier
    threshold is ``T_q = floor(mean_g L + alpha std_g L)`` (unbiased std; 0 for one row); a response
    longer than ``T_q`` by at least ``min_cut`` tokens is cut to ``T_q`` (``0 < min_cut < 1``: by at
    least ``max(floor(L min_cut), 16)`` tokens); everything else keeps its length. The cut responses
    are then scored again: an answer that falls after the cut is lost, so over-long correct
    reasoning stops paying off without a length penalty on the rest. With ``alpha = 3`` and the
    unbiased std nothing can be cut in a group of fewer than 11 (the largest possible z-score of
    ``n`` samples is ``(n - 1) / sqrt(n)``); the paper samples 32 per prompt.

    Paper: "Anti-Length Shift: Dynamic Outlier Truncation for Training Efficient Reasoning Models"
    (DOT), arXiv:2601.03969; the authors' code (``U-rara/DOT`` @9e6574b, ``apply_length_truncation``,
    ``run_dot.sh``): ``alpha = 3``, ``min_cut = 32``, ``success = 1``.

    Args:
      lengths: ``[B]`` response lengths. correct: ``[B]`` bool. group_ids, num_groups, valid: as usual.
      alpha, min_cut, success: as above.

    Returns:
      ``[B]`` int32 lengths (equal to ``lengths`` where nothing is cut).
    """
    b = _seq("lengths", lengths)
    _seq("correct", correct, b)
    _checks.check_groups(group_ids, num_groups, b)
    v = _valid(valid, b)
    L = _checks.as_float(lengths)
    from jaxrl_llm.core.stats import group_stats

    st = group_stats(jnp.where(v > 0, L, 0.0), group_ids, num_groups, v)
    rate = safe_divide(group_sum((jnp.asarray(correct, bool) & (v > 0)).astype(jnp.float32), group_ids, num_groups),
                       group_sum(v, group_ids, num_groups))[group_ids]
    thr = jnp.floor(st.mean + alpha * jnp.where(st.count > 1, st.std, 0.0))
    need = min_cut if min_cut >= 1 else jnp.maximum(jnp.floor(L * min_cut), 16.0)
    cut = (v > 0) & (rate >= success) & (L > thr) & (L - thr >= need)
    return jax.lax.stop_gradient(jnp.where(cut, thr, L)).astype(jnp.int32)


def _hbpo_f(x, beta, max_length):
    return beta * jnp.cos(math.pi * x / (2.0 * max_length))


def hbpo_reward(correct: jnp.ndarray, lengths: jnp.ndarray, budgets: jnp.ndarray, *, beta: float = 4.0,
                max_length: float = 4096.0, alpha: float | None = None,
                format_ok: jnp.ndarray | None = None) -> jnp.ndarray:
    """HBPO's budget-aware reward.

    ``f1(L, b) = beta cos(pi L / (2 L_max)) - alpha |L - b|`` and ``f2(b) = beta cos(pi b / (2 L_max))``;
    a correct response within ``L_max`` gets ``min(f1, f2)`` (shorter than its budget: the
    budget's value; past it: less, the further the less), a wrong one 0, a format failure -1. A
    short budget's full credit is higher than a long one's, so budgets compete.

    Paper: "Hierarchical Budget Policy Optimization for Adaptive Reasoning" (HBPO), arXiv:2507.15844,
    Eqs. f1 / f2; the authors' code (``ZJU-REAL/HBPO`` @5c8991d, ``compute_score``) takes the min,
    which equals the paper's piecewise form except for short answers under the 512 budget:
    ``beta = 4``, ``L_max = 4096``, ``alpha = 1 / L_max``, budgets 512, 1024, 2048, 2560.

    Args:
      correct: ``[B]`` bool. lengths: ``[B]``. budgets: ``[B]`` each row's token budget.
      beta, max_length, alpha (default ``1 / max_length``): as above. format_ok: optional ``[B]``.

    Returns:
      ``[B]`` float32.
    """
    b = _seq("correct", correct)
    _seq("lengths", lengths, b)
    _seq("budgets", budgets, b)
    _checks.check_positive("max_length", max_length)
    a = 1.0 / max_length if alpha is None else alpha
    L, bud = _checks.as_float(lengths), _checks.as_float(budgets)
    f1 = _hbpo_f(L, beta, max_length) - a * jnp.abs(L - bud)
    f2 = _hbpo_f(bud, beta, max_length)
    ok = jnp.asarray(correct, bool) & (L <= max_length)
    r = jnp.where(ok, jnp.minimum(f1, f2), 0.0)
    if format_ok is not None:
        _seq("format_ok", format_ok, b)
        r = jnp.where(jnp.asarray(format_ok, bool), r, -1.0)
    return sg(r.astype(jnp.float32))


def hbpo_advantages(scores: jnp.ndarray, mask: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int,
                    budgets: jnp.ndarray, question_ids: jnp.ndarray, num_questions: int, *, beta: float = 4.0,
                    max_length: float = 4096.0, intra_coef: float = 1.0, epsilon: float = 1e-6,
                    valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """HBPO's hierarchical advantage: within a budget's sub-group and across the question's sub-groups.

    The rollouts of a question are split into sub-groups by budget (``group_ids``: one per
    (question, budget); ``question_ids``). With HBPO's rewards ``R`` (:func:`hbpo_reward`)::

        A_intra(j) = mean_{sub-group j} R - f2(b_j)        (<= 0: how far the sub-group falls short
                                                             of its budget's full credit)
        A_inter(i) = (R_i - mean_q R) / (std_q R + eps)     (over all the question's rollouts)
        A_i        = intra_coef A_intra(j(i)) + A_inter(i)

    Identities (paper): one budget with every rollout correct and within it gives 0; all wrong
    gives every row ``-f2(b)``. A question with one rollout gets ``A = R`` (no comparison).

    Paper: "Hierarchical Budget Policy Optimization for Adaptive Reasoning" (HBPO),
    arXiv:2507.15844, Alg. 1 / §3.3: the intra term is the sub-group mean minus the budget's
    full credit, the inter term GRPO over the question (unbiased std, as the code). The released
    code adds the intra term twice (``intra_coef=2`` reproduces it).

    Args:
      scores: ``[B]`` HBPO rewards. mask: ``[B, T]``. group_ids: ``[B]`` sub-groups, num_groups
        static. budgets: ``[B]`` each row's budget. question_ids: ``[B]``, num_questions static.
      beta, max_length: the reward's (for ``f2``). intra_coef: weight of the intra term.
      epsilon: 1e-6. valid: optional ``[B]``.

    Returns:
      ``[B, T]`` float32.
    """
    from jaxrl_llm.core.advantages import _broadcast, _prep_outcome
    from jaxrl_llm.core.stats import group_stats

    s, m, v = _prep_outcome(scores, mask, group_ids, num_groups, valid)
    _seq("budgets", budgets, s.shape[0])
    _checks.check_groups(question_ids, num_questions, s.shape[0])
    sub_mean = safe_divide(group_sum(s * v, group_ids, num_groups), group_sum(v, group_ids, num_groups))[group_ids]
    intra = sub_mean - _hbpo_f(_checks.as_float(budgets), beta, max_length)
    st = group_stats(s, question_ids, num_questions, v)
    single = st.count <= 1
    inter = jnp.where(single, s, safe_divide(s - st.mean, st.std + epsilon))
    adv = jnp.where(single, s, intra_coef * intra + inter)
    return _broadcast(adv, m, v)


def triangular_length_reward(lengths: jnp.ndarray, budget, *, r_max: float = 1.0, band: bool = False
                             ) -> jnp.ndarray:
    """"Train Long, Think Short"'s length reward: a triangle peaking at the budget ``L``.

    ``R(l) = r_max l / L`` for ``l <= L``, ``r_max (1 - (l - L) / L)`` for ``L < l <= 2L`` and 0
    beyond; ``band=True`` (the paper's "band" ablation) pays ``r_max`` for every ``l <= L``.

    Paper: "Train Long, Think Short: Curriculum Learning for Efficient Reasoning" (Hammoud et
    al.), arXiv:2508.08940, sections 3.3-3.4 (no code was available; the paper's formulas).

    Args:
      lengths: ``[B]`` response lengths in tokens. budget: the budget ``L`` (> 0), a scalar or
        ``[B]``. r_max: the peak reward.

    Returns:
      ``[B]`` float32.
    """
    _seq("lengths", lengths)
    if isinstance(budget, (int, float)):
        _checks.check_positive("budget", float(budget))
    b = jnp.asarray(budget, jnp.float32)
    l = _checks.as_float(lengths)
    up = jnp.full_like(l, r_max) if band else r_max * l / b
    down = r_max * (1.0 - (l - b) / b)
    return sg(jnp.where(l <= b, up, jnp.where(l <= 2.0 * b, down, 0.0)))


def curriculum_budget(step: int, *, initial: float = 256.0, final: float = 87.0, drops: int = 3,
                      interval: int = 150, schedule: str = "exponential") -> float:
    """"Train Long, Think Short"'s token budget at training ``step`` (0-based): ``drops`` steps
    of ``interval`` training steps each from ``initial`` to ``final``.

    ``exponential``: ``S_k = initial d^k`` with ``d = (final / initial)^(1 / drops)``; ``linear``
    (the paper's ablation): equal drops. ``k = min(step // interval, drops)``. Defaults: the
    paper's run (256 -> 178.6 -> 124.7 -> 87 tokens, a drop every 150 of 600 steps).
    """
    if initial <= 0 or final <= 0:
        raise ValueError(f"curriculum budgets must be > 0, got initial={initial}, final={final}")
    if drops < 1 or interval < 1:
        raise ValueError(f"drops and interval must be >= 1, got {drops}, {interval}")
    if schedule not in ("exponential", "linear"):
        raise ValueError(f"schedule must be 'exponential' or 'linear', got {schedule!r}")
    k = min(int(step) // int(interval), int(drops))
    if schedule == "linear":
        return float(initial - k * (initial - final) / drops)
    return float(initial * (final / initial) ** (k / drops))


def stage_schedule(step: int, values, every: int):
    """A staged schedule: ``values[min(step // every, len(values) - 1)]`` at training ``step``
    (0-based). ScalingInter-RL's interaction horizon (AgentGym-RL, arXiv:2509.08755; the
    authors' ``WooooDyy/AgentGym-RL`` @82402a9: max turns at training step ``k`` counted from 1
    is ``rounds[min((k - 1) // interval, K - 1)]``, e.g. BabyAI 6, 13, 20 every 100 steps),
    computed from the step alone (so a resumed run is in the right stage)."""
    values = list(values)
    if not values:
        raise ValueError("stage_schedule: values must be non-empty")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"stage_schedule: every must be an int >= 1, got {every!r}")
    if step < 0:
        raise ValueError(f"stage_schedule: step must be >= 0, got {step}")
    return values[min(int(step) // every, len(values) - 1)]


def interleaved_length_cap(step: int, *, low: int, high: int, compress_steps: int, expand_steps: int,
                           shape: str = "cosine", block: int = 1) -> int:
    """SIRI's generation cap at training ``step`` (0-based): training alternates compression
    phases (the cap lowered towards ``low``) and expansion phases (back to ``high``), period
    ``P = compress_steps + expand_steps``, phase position ``tau = step mod P``.

    * ``"stair"``: ``low`` for ``tau < compress_steps``, else ``high``;
    * ``"cosine"``: one cosine period, ``low + (high - low) (1 + cos(2 pi tau / P)) / 2``: from
      ``high`` at ``tau = 0`` down to ``low`` at mid-period and back;
    * ``"stair_cosine"``: a half cosine from ``high`` to ``low`` over the compression phase,
      ``low + (high - low) (1 + cos(pi tau / compress_steps)) / 2``, then ``high``.

    The cap is rounded down to a multiple of ``block`` (at least ``block``), so a run sees few
    distinct caps.

    Paper: Wen et al., "SIRI: Scaling Iterative Reinforcement Learning with Interleaved
    Compression", arXiv:2509.25176. What is verified: the alternation of compression and
    expansion by the maximum rollout length, the cosine length scheduler named on the authors'
    model cards, and stair / cosine / stair-cosine compared in the paper (a review). The
    formulas above, where the cosine starts, and every number are our construction (the method
    section could not be read; no code was released): no defaults, the caller sets them.
    """
    for name, v in (("low", low), ("high", high), ("block", block)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"interleaved_length_cap: {name} must be an int >= 1, got {v!r}")
    if low > high:
        raise ValueError(f"interleaved_length_cap: low ({low}) must be <= high ({high})")
    for name, v in (("compress_steps", compress_steps), ("expand_steps", expand_steps)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"interleaved_length_cap: {name} must be an int >= 0, got {v!r}")
    period = compress_steps + expand_steps
    if period < 1:
        raise ValueError("interleaved_length_cap: compress_steps + expand_steps must be >= 1")
    if step < 0:
        raise ValueError(f"interleaved_length_cap: step must be >= 0, got {step}")
    tau = int(step) % period
    if shape == "stair":
        cap = float(low if tau < compress_steps else high)
    elif shape == "cosine":
        cap = low + (high - low) * (1.0 + math.cos(2.0 * math.pi * tau / period)) / 2.0
    elif shape == "stair_cosine":
        cap = (low + (high - low) * (1.0 + math.cos(math.pi * tau / compress_steps)) / 2.0
               if tau < compress_steps else float(high))
    else:
        raise ValueError(f"interleaved_length_cap: shape must be 'stair', 'cosine' or 'stair_cosine', got {shape!r}")
    cap = int(math.floor(cap + 1e-9))
    return max(block, cap // block * block)


def hapo_history_reward(correct: jnp.ndarray, lengths: jnp.ndarray, history: jnp.ndarray, *,
                        weight: float = 1.0, floor: float = -0.7, mode: str = "cosine") -> jnp.ndarray:
    """HAPO (history-aware)'s reward: correctness plus a length reward relative to the shortest
    correct response the prompt has had so far.

    With ``h`` the row's prompt history (``h <= 0``: the prompt has had no correct response yet,
    then the length reward is 0; the authors store a large sentinel), ``cosine``: ``v = cos(pi/2 L/h)`` if ``L < 2h`` else ``-1``, and
    ``r_len = max(floor, v)`` for a correct row, ``min(0, v)`` for a wrong one (a wrong answer is
    never paid for being short); ``linear``: correct ``1 - L/h`` below ``h``, 0 up to ``1.1h``,
    then ``max(floor, -(L - 1.1h)/h)``; wrong 0 up to ``1.1h``, then ``max(-1, -(L - 1.1h)/h)``.
    ``r = 1[correct] + weight r_len``. :func:`hapo_history_update` moves ``h`` after scoring.

    Paper: "HAPO: Training Language Models to Reason Concisely via History-Aware Policy
    Optimization", arXiv:2505.11225; the authors' code (``HCY123902/HAPO`` @c91ae3b,
    ``compute_len_reward``): weight 1, floor -0.7, cosine, the history the running minimum.

    Args:
      correct: ``[B]`` bool. lengths: ``[B]``. history: ``[B]`` float, ``h`` of each row's prompt
        (0: none yet).

    Returns:
      ``[B]`` float32.
    """
    b = _seq("correct", correct)
    _seq("lengths", lengths, b)
    _seq("history", history, b)
    if mode not in ("cosine", "linear"):
        raise ValueError(f"mode must be 'cosine' or 'linear', got {mode!r}")
    c = jnp.asarray(correct, bool)
    l = _checks.as_float(lengths)
    h = jnp.asarray(history, jnp.float32)
    known = h > 0
    hs = jnp.where(known, h, 1.0)
    if mode == "cosine":
        v = jnp.where(l < 2.0 * hs, jnp.cos(0.5 * jnp.pi * l / hs), -1.0)
        r_len = jnp.where(c, jnp.maximum(floor, v), jnp.minimum(0.0, v))
    else:
        over = -(l - 1.1 * hs) / hs
        right = jnp.where(l < hs, 1.0 - l / hs, jnp.where(l < 1.1 * hs, 0.0, jnp.maximum(floor, over)))
        wrong = jnp.where(l < 1.1 * hs, 0.0, jnp.maximum(-1.0, over))
        r_len = jnp.where(c, right, wrong)
    return sg(c.astype(jnp.float32) + weight * jnp.where(known, r_len, 0.0))


def hapo_history_update(history: jnp.ndarray, correct: jnp.ndarray, lengths: jnp.ndarray,
                        group_ids: jnp.ndarray, num_groups: int) -> jnp.ndarray:
    """HAPO's history after a batch: ``h_q <- min(h_q, min L of the correct rows of prompt q)``
    (``[num_groups]`` float32; 0 while a prompt has had no correct response, the convention of
    ``history``, ``[num_groups]``, too)."""
    b = _seq("correct", correct)
    _seq("lengths", lengths, b)
    _checks.check_groups(group_ids, num_groups, b)
    _seq("history", history, num_groups)
    l = jnp.where(jnp.asarray(correct, bool), _checks.as_float(lengths), jnp.inf)
    best = jax.ops.segment_min(l, jnp.asarray(group_ids, jnp.int32), num_groups)
    h = jnp.asarray(history, jnp.float32)
    new = jnp.minimum(jnp.where(h > 0, h, jnp.inf), best)
    return jnp.where(jnp.isfinite(new), new, jnp.where(h > 0, h, 0.0))

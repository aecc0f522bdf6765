"""Turn-level credit assignment for multi-turn agent RL: pure functions on ``[N, K]`` turn arrays.

Conventions (shapes are static, checked at trace time; each error names the argument):

- ``N`` episodes (rows), ``K`` the maximum number of policy turns, ``T`` response tokens:
  everything after the first prompt, policy tokens and observation (tool / environment)
  tokens interleaved.
- ``turn_rewards: [N, K]`` float, the environment's reward after policy turn ``k``;
  ``turn_mask: [N, K]`` bool, turn ``k`` exists. Turns are a prefix (``turn_mask[i, k]`` is set
  for ``k < turns_i``); the functions stay defined for other masks (a missing turn is skipped
  by every recursion) but the papers assume a prefix.
- Token side: ``mask: [N, T]`` marks the POLICY tokens only (observation tokens are context,
  mask 0); ``turn_ids: [N, T]`` int gives the turn index of each policy token (any value, e.g.
  -1, where ``mask`` is 0).
- ``state_ids: [N, K]`` int (GiGPO anchor states): ids of (prompt group, state key) pairs made
  global by the caller, in ``[0, num_states)`` with ``num_states`` static; meaningless where
  ``turn_mask`` is 0. ``agent_ids: [N, K]`` int (MARS), likewise in ``[0, num_agents)``.
- ``group_ids: [N]`` int in ``[0, num_groups)`` marks the episodes of one prompt (any order),
  ``num_groups`` static, as in :mod:`jaxrl_llm.core.advantages`. ``valid: [N]`` (optional)
  excludes padding rows from every statistic; their outputs are 0.

Turn-level functions return ``[N, K]`` float32, 0 where ``turn_mask`` is 0 or the row is
invalid; :func:`broadcast_turns` puts them on the policy tokens (``A[i, t] =
A_turn[i, turn_ids[i, t]]``), :func:`place_turn_rewards` puts per-turn rewards on the last
policy token of each turn (for token-level estimators such as
:func:`multiturn_gae_advantages`). Inputs in bf16 are computed in float32. Advantages and
rewards carry no gradient (``jax.lax.stop_gradient``); the one loss here
(:func:`spa_progress_loss`) does. Values under the masks (padding garbage, inf, NaN) reach
neither the outputs nor the gradients.

Group statistics reuse :mod:`jaxrl_llm.core.stats`: a statistic over (episode, turn) pairs is
:func:`~jaxrl_llm.core.stats.group_stats` over the flattened ``[N * K]`` arrays, weighted by
``turn_mask``, with an id per pair (state id, group x turn index, group x agent, ...).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.core import _checks
from jaxrl_llm.core.advantages import _check_discount, _compact_responses, _reverse_masked_scan
from jaxrl_llm.core.stats import _check_concrete_ids, group_stats, masked_whiten, safe_divide

__all__ = [
    "rlvmr_advantages",
    "broadcast_turns",
    "place_turn_rewards",
    "turn_returns",
    "gigpo_advantages",
    "turn_group_baseline_advantages",
    "flow_grpo_advantages",
    "matchtir_advantages",
    "empg_advantages",
    "igpo_turn_rewards",
    "igpo_advantages",
    "mars_advantages",
    "spa_progress_loss",
    "spa_turn_rewards",
    "multiturn_gae_advantages",
    "poad_advantages",
    "eapo_turn_advantages",
]


# ----------------------------------------------------------------------------- checks / helpers
def _shape(x: Any) -> tuple[int, ...]:
    return tuple(np.shape(x))


def _check_turn_array(name: str, x: Any, turn_mask: Any, *, kind: str | None = "float") -> None:
    """``x`` is ``[N, K]`` like ``turn_mask``; its dtype must be floating (``kind="float"``) or
    integer (``"int"``); ``kind=None`` skips the dtype check (masks: any dtype)."""
    if x is None:
        raise ValueError(f"argument '{name}' is required but got None")
    if np.ndim(x) != 2:
        raise ValueError(f"argument '{name}' must have rank 2 ([N, K] turns), got shape {_shape(x)}")
    if _shape(x) != _shape(turn_mask):
        raise ValueError(f"argument '{name}' must have the shape of 'turn_mask' {_shape(turn_mask)} "
                         f"([N, K] turns), got {_shape(x)}")
    if kind == "float":
        _checks.check_float(name, x)
    elif kind == "int":
        _checks.check_int(name, x)


def _check_turns(turn_mask: Any, valid: Any = None, **float_arrays: Any) -> tuple[int, int]:
    """``turn_mask: [N, K]``, float ``[N, K]`` arrays, ``valid: [N]``. Returns ``(N, K)``."""
    if turn_mask is None:
        raise ValueError("argument 'turn_mask' is required but got None")
    if np.ndim(turn_mask) != 2:
        raise ValueError(f"argument 'turn_mask' must have rank 2 ([N, K] turns), got shape {_shape(turn_mask)}")
    for name, x in float_arrays.items():
        _check_turn_array(name, x, turn_mask)
    n, k = _shape(turn_mask)
    _checks.check_seq_args(n, valid=valid)
    return n, k


def _check_ids_in_range(name: str, ids: Any, used: Any, num: int, num_name: str) -> None:
    """Concrete inputs only: ids where ``used`` is set must lie in ``[0, num)``."""
    if isinstance(ids, jax.core.Tracer) or isinstance(used, jax.core.Tracer):
        return
    sel = np.asarray(ids)[np.asarray(used) > 0]
    if sel.size and (sel.min() < 0 or sel.max() >= num):
        raise ValueError(f"argument '{name}' must lie in [0, {num_name}={num}) where it is used, "
                         f"got values in [{sel.min()}, {sel.max()}]")


def _check_group_args(group_ids: Any, num_groups: Any, n: int) -> None:
    _checks.check_groups(group_ids, num_groups, n)
    _check_concrete_ids(group_ids, num_groups)


def _weights(turn_mask: Any, valid: Any) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(m, v)``: the turn mask with invalid rows cleared (float ``[N, K]``) and ``valid`` (``[N]``)."""
    m = _checks.as_mask(turn_mask)
    v = jnp.ones(m.shape[0], m.dtype) if valid is None else _checks.as_mask(valid)
    return m * v[:, None], v


def _turn_float(x: Any, m: jnp.ndarray) -> jnp.ndarray:
    return _checks.zero_outside(_checks.as_float(x).astype(jnp.float32), m)


def _discounted(r: jnp.ndarray, m: jnp.ndarray, gamma: Any) -> jnp.ndarray:
    """``G_k = r_k + gamma G_{k'}`` with ``k'`` the next turn where ``m`` is set; 0 where ``m`` is 0.

    Turns with ``m = 0`` are skipped (they neither add a reward nor count a discount step).
    """

    def step(run, x):
        r_t, m_t = x
        new = r_t + gamma * run
        return jnp.where(m_t > 0, new, run), jnp.where(m_t > 0, new, 0.0)

    return _reverse_masked_scan(step, jnp.zeros(r.shape[0], r.dtype), (r, m))


def _pair_stats(x: jnp.ndarray, ids: jnp.ndarray, num: int, w: jnp.ndarray, unbiased: bool = True):
    """Statistics of ``x: [N, K]`` over the (episode, turn) pairs with the same id (weights ``w``),
    via :func:`~jaxrl_llm.core.stats.group_stats` on the flattened arrays; each ``[N, K]``."""
    ids = jnp.where(w > 0, ids, 0).astype(jnp.int32)
    st = group_stats(x.reshape(-1), ids.reshape(-1), num, valid=w.reshape(-1), unbiased=unbiased)
    return tuple(a.reshape(x.shape) for a in st)


def _last_turn(m: jnp.ndarray) -> jnp.ndarray:
    """Index of the last set turn of each row (``-1`` for a row without turns)."""
    k = m.shape[1]
    idx = jnp.where(m > 0, jnp.arange(k)[None], -1)
    return jnp.max(idx, axis=1)


def _episode_advantages(scores, m, v, group_ids, num_groups, scale_by_std, epsilon, episode_stats):
    """GRPO advantage of each episode ``[N]`` (verl conventions: unbiased std, a one-member
    group gets mean 0 and std 1). ``episode_stats="turns"`` weights each episode by its number
    of turns (the statistics of one row per (episode, turn), as verl-agent / AgentFlow compute
    them when every turn is a training row)."""
    s = _checks.zero_outside(_checks.as_float(scores).astype(jnp.float32), v)
    if episode_stats == "episodes":
        cnt, mean, std = group_stats(s, group_ids, num_groups, v)
    else:
        # one value per (episode, turn): the row's score, weighted by the turn mask
        x = jnp.broadcast_to(s[:, None], m.shape).reshape(-1)
        ids = jnp.broadcast_to(jnp.asarray(group_ids)[:, None], m.shape).reshape(-1)
        cnt, mean, std = (a.reshape(m.shape)[:, 0] for a in group_stats(x, ids, num_groups, m.reshape(-1)))
    single = cnt <= 1
    mean = jnp.where(single, 0.0, mean)
    std = jnp.where(single, 1.0, std)
    adv = safe_divide(s - mean, std + epsilon) if scale_by_std else s - mean
    return jnp.where(v > 0, adv, 0.0)


def _out(x: jnp.ndarray, m: jnp.ndarray) -> jnp.ndarray:
    return jax.lax.stop_gradient(jnp.where(m > 0, x, 0.0).astype(jnp.float32))


# ----------------------------------------------------------------------------- token <-> turn
def _check_token_turn_args(turn_values: Any, turn_ids: Any, mask: Any, values_name: str) -> tuple[int, int, int]:
    b, t = _checks.check_token_args(mask=mask)
    if np.ndim(turn_values) != 2:
        raise ValueError(f"argument '{values_name}' must have rank 2 ([N, K] turns), got shape {_shape(turn_values)}")
    if _shape(turn_values)[0] != b:
        raise ValueError(f"argument '{values_name}' must have {b} rows like 'mask' {(b, t)}, got {_shape(turn_values)}")
    _checks.check_float(values_name, turn_values)
    if np.ndim(turn_ids) != 2 or _shape(turn_ids) != (b, t):
        raise ValueError(f"argument 'turn_ids' must have the shape of 'mask' {(b, t)} ([N, T] tokens), "
                         f"got {_shape(turn_ids)}")
    _checks.check_int("turn_ids", turn_ids)
    k = _shape(turn_values)[1]
    if k < 1:
        raise ValueError(f"argument '{values_name}' must have at least one turn column, got {_shape(turn_values)}")
    _check_ids_in_range("turn_ids", turn_ids, mask, k, f"{values_name}.shape[1]")
    return b, t, k


def broadcast_turns(turn_values: jnp.ndarray, turn_ids: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Put turn-level values on the policy tokens: ``out[i, t] = turn_values[i, turn_ids[i, t]]``.

    Tokens with ``mask = 0`` (observation tokens, padding) get 0. Differentiable in
    ``turn_values`` (a gather); the advantage functions of this module already stop gradients.

    Args:
      turn_values: ``[N, K]`` (e.g. turn advantages). turn_ids: ``[N, T]`` int, the turn of each
        policy token (in ``[0, K)`` where ``mask`` is set; checked for concrete inputs).
      mask: ``[N, T]`` policy-token mask.

    Returns:
      ``[N, T]`` float32.
    """
    _, _, k = _check_token_turn_args(turn_values, turn_ids, mask, "turn_values")
    vals = _checks.as_float(turn_values).astype(jnp.float32)
    m = _checks.as_mask(mask)
    ids = jnp.asarray(turn_ids)
    inside = (m > 0) & (ids >= 0) & (ids < k)
    out = jnp.take_along_axis(vals, jnp.where(inside, ids, 0), axis=1)
    return jnp.where(inside, out, 0.0)


def place_turn_rewards(turn_rewards: jnp.ndarray, turn_ids: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Token-level rewards: each turn's reward on the LAST policy token of that turn, 0 elsewhere.

    The form token-level estimators expect (:func:`multiturn_gae_advantages`,
    :func:`~jaxrl_llm.core.advantages.gae_advantages`, REINFORCE++): a reward placed on an
    observation token (``mask = 0``) would be dropped by verl's GAE and ours, so the reward the
    environment returns after turn ``k`` belongs on turn ``k``'s last policy token. A policy token
    is the last of its turn when the next policy token (if any) has another turn id.

    Args:
      turn_rewards: ``[N, K]``. turn_ids: ``[N, T]`` int. mask: ``[N, T]`` policy-token mask.

    Returns:
      ``[N, T]`` float32, no gradient.
    """
    b, _, k = _check_token_turn_args(turn_rewards, turn_ids, mask, "turn_rewards")
    vals = _checks.as_float(turn_rewards).astype(jnp.float32)
    m = _checks.as_mask(mask)
    ids = jnp.asarray(turn_ids).astype(jnp.int32)
    inside = (m > 0) & (ids >= 0) & (ids < k)

    def step(nxt, x):  # carries the turn id of the next policy token (-1: none)
        id_t, in_t = x
        return jnp.where(in_t, id_t, nxt), nxt

    next_id = _reverse_masked_scan(step, jnp.full((b,), -1, jnp.int32), (ids, inside))
    last = inside & (ids != next_id)
    out = jnp.take_along_axis(vals, jnp.where(inside, ids, 0), axis=1)
    return jax.lax.stop_gradient(jnp.where(last, out, 0.0))


# ----------------------------------------------------------------------------- returns
def turn_returns(turn_rewards: jnp.ndarray, turn_mask: jnp.ndarray, gamma: float = 1.0, *,
                 valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """Discounted return-to-go per turn: ``G_k = sum_{k' >= k} gamma^(k' - k) r_{k'}``.

    Computed backwards, ``G_k = r_k + gamma G_{k+1}`` (``G = 0`` after the last turn); a turn
    with ``turn_mask = 0`` is skipped (no reward, no discount step). No paper: the Monte Carlo
    return of a turn-level MDP (GiGPO's Eq. 5, IGPO's cumulative advantage, MARS's ``R_k``).

    Args:
      turn_rewards: ``[N, K]``. turn_mask: ``[N, K]``. gamma: discount in ``[0, 1]``.
      valid: optional ``[N]`` row mask.

    Returns:
      ``[N, K]`` float32, 0 outside the turns; no gradient.
    """
    _check_turns(turn_mask, valid, turn_rewards=turn_rewards)
    _check_discount("gamma", gamma)
    m, _ = _weights(turn_mask, valid)
    return _out(_discounted(_turn_float(turn_rewards, m), m, gamma), m)


# ----------------------------------------------------------------------------- GiGPO
def gigpo_advantages(episode_returns: jnp.ndarray, turn_rewards: jnp.ndarray, turn_mask: jnp.ndarray,
                     state_ids: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, num_states: int, *,
                     gamma: float, omega: float = 1.0, scale_by_std: bool = True, epsilon: float = 1e-6,
                     episode_stats: str = "episodes", valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """GiGPO: episode-level group advantage plus ``omega`` times the anchor-state step advantage.

    ``A_{i,k} = A^E_i + omega A^S_{i,k}`` (Eq. 8) with

    - episode level (Eq. 3): ``A^E_i = (R_i - mean_g R) / (std_g R + epsilon)`` over the episodes
      of the prompt group (``scale_by_std=False``: ``R_i - mean_g R``, the paper's ``F_norm = 1``
      / verl-agent's ``mode="mean_norm"``); ``std`` unbiased, a one-episode group gets mean 0 and
      std 1 (verl's GRPO convention, kept by verl-agent);
    - step level (Eqs. 5-7): the discounted return from each turn, ``G_{i,k} = sum_{k' >= k}
      gamma^(k'-k) r_{i,k'}`` (it INCLUDES the turn's own reward, as verl-agent's
      ``compute_step_discounted_returns``), normalised within its anchor-state group, i.e. all
      (episode, turn) pairs of the batch with the same ``state_ids`` (any turn index, any episode
      of the group, several times from one episode): ``A^S = (G - mean_s G) / (std_s G +
      epsilon)`` (or ``G - mean_s G``), unbiased std. A state seen once gets ``A^S = 0``
      (verl-agent: mean = its own return, std 1).

    Paper: Feng, Xue, Liu and An, "Group-in-Group Policy Optimization for LLM Agent Training",
    arXiv:2505.10978. Formulas from the paper and the authors' verl-agent (``gigpo/core_gigpo.py``:
    ``episode_norm_reward``, ``build_step_group``, ``step_norm_reward``,
    ``compute_step_discounted_returns``). Differences / choices:

    - ``episode_stats="episodes"`` (default) takes the episode statistics over the N episodes
      (the paper's Eq. 3). verl-agent's default (``compute_mean_std_cross_steps=True``) takes them
      over its training rows, one per (episode, turn), so long episodes weigh more:
      ``episode_stats="turns"`` reproduces that.
    - ``state_ids`` are exact keys made by the caller; verl-agent's optional similarity grouping
      (``enable_similarity``) is a host-side clustering that produces such ids.
    - verl-agent subtracts its invalid-action penalty from the per-step episode score and the
      step reward; pass penalised ``episode_returns`` / ``turn_rewards`` for that.
    - Defaults: the paper uses ``gamma = 0.95``, ``omega = 1``; verl-agent's config default mode
      is ``mean_norm`` (``scale_by_std=False``), its ALFWorld script ``mean_std_norm``.

    Args:
      episode_returns: ``[N]`` episode reward ``R(tau_i)`` (e.g. the sum of ``turn_rewards``).
      turn_rewards: ``[N, K]`` per-turn environment rewards. turn_mask: ``[N, K]``.
      state_ids: ``[N, K]`` int anchor-state ids in ``[0, num_states)`` (global over the batch,
        one per (prompt group, state key)). group_ids: ``[N]`` int; num_groups, num_states: static.
      gamma: discount of the step returns. omega: weight of the step advantage.
      scale_by_std: divide by the std at both levels (verl-agent's ``mean_std_norm``).
      epsilon: added to the std (verl-agent 1e-6). episode_stats: ``"episodes"`` or ``"turns"``.
      valid: optional ``[N]`` row mask.

    Returns:
      ``[N, K]`` float32 turn advantages (0 outside the turns); no gradient.
    """
    n, _ = _check_turns(turn_mask, valid, turn_rewards=turn_rewards)
    _checks.check_seq_args(n, episode_returns=episode_returns)
    _checks.check_float("episode_returns", episode_returns)
    _check_group_args(group_ids, num_groups, n)
    _check_turn_array("state_ids", state_ids, turn_mask, kind="int")
    _checks.check_static_int("num_states", num_states)
    _checks.check_choice("episode_stats", episode_stats, ("episodes", "turns"))
    _check_discount("gamma", gamma)
    m, v = _weights(turn_mask, valid)
    _check_ids_in_range("state_ids", state_ids, m, num_states, "num_states")
    ep = _episode_advantages(episode_returns, m, v, group_ids, num_groups, scale_by_std, epsilon, episode_stats)
    ret = _discounted(_turn_float(turn_rewards, m), m, gamma)
    _, mean, std = _pair_stats(ret, jnp.asarray(state_ids), num_states, m)
    dev = ret - mean  # exactly 0 for a state seen once
    step = safe_divide(dev, std + epsilon) if scale_by_std else dev
    return _out(ep[:, None] + omega * step, m)


# ----------------------------------------------------------------------------- per-turn group baseline
def turn_group_baseline_advantages(turn_rewards: jnp.ndarray, turn_mask: jnp.ndarray, group_ids: jnp.ndarray,
                                   num_groups: int, *, gamma: float, scale_by_std: bool = False,
                                   epsilon: float = 1e-6, valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """Turn returns minus a per-turn-index group baseline.

    ``A_{i,k} = G_{i,k} - b_{g,k}``, ``G`` the discounted return-to-go (:func:`turn_returns`) and
    ``b_{g,k}`` the mean of ``G_{j,k}`` over the episodes ``j`` of the same group that HAVE turn
    ``k``; with ``scale_by_std`` divided by their (unbiased) std ``+ epsilon``. Where a single
    episode of the group reaches turn ``k`` there is nothing to compare with: baseline 0 and std
    1, i.e. the raw return (verl's GRPO one-sample convention, and what verl's optimal token
    baseline does on the tail of the unique longest response).

    No paper is followed: this is REINFORCE with a time-dependent group-mean baseline (the
    multi-turn counterpart of the per-position baseline of
    :func:`~jaxrl_llm.core.advantages.optimal_token_baseline_advantages` with equal weights).

    Args:
      turn_rewards: ``[N, K]``. turn_mask: ``[N, K]``. group_ids: ``[N]`` int; num_groups: static.
      gamma: discount. scale_by_std: divide by the per-turn group std. epsilon: added to it.
      valid: optional ``[N]`` row mask.

    Returns:
      ``[N, K]`` float32; no gradient.
    """
    n, k = _check_turns(turn_mask, valid, turn_rewards=turn_rewards)
    _check_group_args(group_ids, num_groups, n)
    _check_discount("gamma", gamma)
    m, _ = _weights(turn_mask, valid)
    ret = _discounted(_turn_float(turn_rewards, m), m, gamma)
    ids = jnp.asarray(group_ids)[:, None] * k + jnp.arange(k)[None]
    cnt, mean, std = _pair_stats(ret, ids, num_groups * k, m)
    single = cnt <= 1
    adv = ret - jnp.where(single, 0.0, mean)
    if scale_by_std:
        adv = safe_divide(adv, jnp.where(single, 1.0, std) + epsilon)
    return _out(adv, m)


# ----------------------------------------------------------------------------- MatchTIR
def matchtir_advantages(turn_rewards: jnp.ndarray, turn_mask: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int,
                        *, gamma: float = 0.9, traj_weight: float = 0.5, epsilon: float = 1e-6,
                        valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """MatchTIR's dual-level advantage: the trajectory's and the turn's, averaged.

    With turn rewards ``r_{i,k}`` (MatchTIR's: the matched tool calls' similarities, the answer
    turn's outcome; :mod:`jaxrl_llm.rewards.tool_matching`) and ``R_i = sum_k r_{i,k}``:

    - trajectory level: ``A^traj_i = (R_i - mean_g R) / (std_g R + epsilon)``
      (:func:`flow_grpo_advantages` of ``R``);
    - turn level: ``A^turn_{i,k} = (G_{i,k} - mean) / (std + epsilon)`` over the episodes of the
      group that have turn ``k``, ``G_{i,k} = sum_{j >= k} gamma^{j - k} r_{i,j}``
      (:func:`turn_group_baseline_advantages` with ``scale_by_std``);
    - ``A_{i,k} = traj_weight A^traj_i + (1 - traj_weight) A^turn_{i,k}``, on every policy token of
      turn ``k``.

    Unbiased stds; a group (or a turn index) with one episode gets mean 0 and std 1, as in the
    authors' code. Paper: Qu et al., "MatchTIR: Fine-Grained Supervision for Tool-Integrated
    Reasoning via Bipartite Matching", arXiv:2601.10712; code ``quchangle1/MatchTIR`` @f614ce1
    (``core_algos.py`` ``compute_grpo_outcome_advantage``: ``gamma = 0.9`` and the equal weights
    hard-coded). Identity: ``traj_weight = 1`` is GRPO on ``R`` broadcast to the turns.

    Returns:
      ``[N, K]`` float32; no gradient.
    """
    if not 0.0 <= float(traj_weight) <= 1.0:
        raise ValueError(f"argument 'traj_weight' must be in [0, 1], got {traj_weight!r}")
    n, k = _check_turns(turn_mask, valid, turn_rewards=turn_rewards)
    m, _ = _weights(turn_mask, valid)
    total = jnp.sum(_turn_float(turn_rewards, m), axis=1)
    traj = flow_grpo_advantages(total, turn_mask, group_ids, num_groups, scale_by_std=True, epsilon=epsilon,
                                valid=valid)
    turn = turn_group_baseline_advantages(turn_rewards, turn_mask, group_ids, num_groups, gamma=gamma,
                                          scale_by_std=True, epsilon=epsilon, valid=valid)
    return _out(traj_weight * traj + (1.0 - traj_weight) * turn, m)


#: RLVMR's meta-reasoning tags, by their codes in ``tags`` (0: none)
RLVMR_TAGS = ("none", "planning", "explore", "reflection")


def rlvmr_advantages(scores: jnp.ndarray, mr_rewards: jnp.ndarray, tags: jnp.ndarray, grounding: jnp.ndarray,
                     turn_mask: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *, weight: float = 1.0,
                     invalid_penalty: float = 0.1, scale_by_std: bool = True, epsilon: float = 1e-6,
                     valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """RLVMR's advantage ("GRPO-MR"): an outcome advantage per turn plus ``weight`` times the
    meta-reasoning reward normalised among the turns with the same tag.

    Every turn is a row, as in the authors' verl-agent trainer: turn ``k`` of episode ``i`` scores
    ``s_{i,k} = R_i - invalid_penalty [turn k's action was invalid]`` (``grounding`` 0), and

    - ``A^out_{i,k} = (s_{i,k} - mean) / (std + epsilon)`` over all the turns of the group's
      episodes;
    - ``A^MR_{i,k} = (r_{i,k} - mean) / (std + epsilon)`` over the group's turns with the same
      tag (``tags``: 0 none, 1 planning, 2 explore, 3 reflection; :data:`RLVMR_TAGS`), ``r`` the
      rule rewards of :func:`jaxrl_llm.training.agent_loop.rlvmr_turn_rewards`;
    - ``A_{i,k} = A^out_{i,k} + weight A^MR_{i,k}``.

    Unbiased stds; a set of one turn gets mean 0 and std 1; ``scale_by_std=False`` is the code's
    ``mean_norm``. Paper: "RLVMR: Reinforcement Learning with Verifiable Meta-Reasoning Rewards for
    Robust Long-Horizon Agents", arXiv:2507.22844; code ``Tencent/DigitalHuman`` (``RLVMR/``, read
    at the mirror ``zzjweb/digitalhuman`` @789ccd6: ``core_rlvmr.py``, ``episode_norm_reward``,
    ``step_norm_reward_by_tag``; ``ray_trainer.py``'s invalid-action penalty 0.1; the scripts'
    ``step_advantage_w`` 1.0 and ``mean_std_norm``). Identity: ``weight = 0`` and
    ``invalid_penalty = 0`` is GRPO on the episode returns with every turn a row.

    Args:
      scores: ``[N]`` episode returns. mr_rewards, grounding: ``[N, K]`` float. tags: ``[N, K]``
        int in ``0..3``. turn_mask: ``[N, K]``. group_ids, num_groups, valid: as usual.

    Returns:
      ``[N, K]`` float32; no gradient.
    """
    n, k = _check_turns(turn_mask, valid, mr_rewards=mr_rewards, grounding=grounding)
    _check_group_args(group_ids, num_groups, n)
    _check_turn_array("tags", tags, turn_mask, kind="int")
    _checks.check_seq_args(n, scores=scores)
    _checks.check_positive("invalid_penalty", invalid_penalty, allow_zero=True)
    m, v = _weights(turn_mask, valid)
    s = _checks.zero_outside(_checks.as_float(scores).astype(jnp.float32), v)
    step = s[:, None] - invalid_penalty * (1.0 - _turn_float(grounding, m))
    gid = jnp.broadcast_to(jnp.asarray(group_ids, jnp.int32)[:, None], (n, k))

    def norm(x, ids, num):
        cnt, mean, std = _pair_stats(x, ids, num, m)
        single = cnt <= 1
        mean, std = jnp.where(single, 0.0, mean), jnp.where(single, 1.0, std)
        return safe_divide(x - mean, std + epsilon) if scale_by_std else x - mean

    tag = jnp.clip(jnp.asarray(tags, jnp.int32), 0, len(RLVMR_TAGS) - 1)
    out = norm(step, gid, num_groups) + weight * norm(_turn_float(mr_rewards, m), gid * len(RLVMR_TAGS) + tag,
                                                       num_groups * len(RLVMR_TAGS))
    return _out(out, m)


# ----------------------------------------------------------------------------- Flow-GRPO
def flow_grpo_advantages(scores: jnp.ndarray, turn_mask: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                         scale_by_std: bool = True, epsilon: float = 1e-6, episode_stats: str = "episodes",
                         valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """Flow-GRPO (AgentFlow): the final outcome, group-normalised, on every turn.

    ``A_{i,k} = (R_i - mean_g R) / (std_g R + epsilon)`` for every turn ``k`` of episode ``i``
    (``scale_by_std=False``: ``R_i - mean_g R``), unbiased std, a one-episode group gets mean 0
    and std 1 (verl). Broadcast to the policy tokens with :func:`broadcast_turns` it equals
    :func:`~jaxrl_llm.core.advantages.grpo_advantages` on the same rows (tested): the method's
    point is that each turn is then trained as its own single-turn sample (on-policy, the
    planner's prompt holding the memory), with the trajectory's outcome as its reward.

    Paper: Li et al., "In-the-Flow Agentic System Optimization for Effective Planning and Tool
    Use" (AgentFlow, Flow-GRPO), arXiv:2510.05592. Difference from the authors' code
    (``agentflow/verl``): it makes one training row per turn, all carrying the final reward,
    and runs verl's GRPO over those rows, so the group statistics weigh each episode by its
    number of turns; ``episode_stats="turns"`` reproduces that, the default ``"episodes"``
    follows the paper's formula (statistics over the group's trajectories).

    Args:
      scores: ``[N]`` final outcome rewards. turn_mask: ``[N, K]``. group_ids: ``[N]`` int;
      num_groups: static. epsilon: verl 1e-6. episode_stats: ``"episodes"`` or ``"turns"``.
      valid: optional ``[N]`` row mask.

    Returns:
      ``[N, K]`` float32; no gradient.
    """
    n, _ = _check_turns(turn_mask, valid)
    _checks.check_seq_args(n, scores=scores)
    _checks.check_float("scores", scores)
    _check_group_args(group_ids, num_groups, n)
    _checks.check_choice("episode_stats", episode_stats, ("episodes", "turns"))
    m, v = _weights(turn_mask, valid)
    ep = _episode_advantages(scores, m, v, group_ids, num_groups, scale_by_std, epsilon, episode_stats)
    return _out(jnp.broadcast_to(ep[:, None], m.shape), m)


# ----------------------------------------------------------------------------- EMPG
def empg_advantages(advantages: jnp.ndarray, turn_entropy: jnp.ndarray, turn_mask: jnp.ndarray, *,
                    k: float = 1.0, k_prime: float = 1.0, zeta: float = 0.05, final_norm: str = "mean",
                    valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """EMPG: entropy-modulated step advantages with the future-clarity bonus.

    With ``H_{i,t}`` the step's mean token entropy (``turn_entropy``, computed by the caller
    over the turn's policy tokens under the sampling policy):

    - batch min-max normalisation over all steps of the batch:
      ``H~ = (H - min H) / (max H - min H + 1e-8)``;
    - self-calibrated scaling ``g(H_t) = exp(-k H~_t) / mean_{batch steps} exp(-k H~)`` (mean 1
      over the steps of the batch: confident steps are amplified, uncertain ones attenuated);
    - future-clarity bonus ``f(H_{t+1}) = exp(-k' H~_{t+1})``, from the NEXT step of the same
      episode; the last step of an episode gets no bonus;
    - ``A_mod(i, t) = g(H_{i,t}) A_{i,t} + zeta f(H_{i,t+1})``;
    - final batch normalisation over the steps: ``final_norm="mean"`` subtracts the mean (the
      paper's zero-mean normalisation), ``"mean_std"`` whitens (unbiased variance, as
      :func:`~jaxrl_llm.core.stats.masked_whiten`), ``"none"`` skips it.

    Paper: Wang et al., "Harnessing Uncertainty: Entropy-Modulated Policy Gradients for
    Long-Horizon LLM Agents", arXiv:2509.09265 (modulated advantage, self-calibrating scaling
    ``g``, future-clarity bonus ``f``, batch min-max entropy normalisation, final zero-mean
    normalisation; hyper-parameters ``k``, ``k'``, ``zeta``). We found no training code from the
    authors; the formula follows the paper as restated in the ARLArena paper (appendix A.3.2,
    Eqs. S20-S23) and a public verl-based ``compute_EMPG_advantage`` (its 1e-8 in the min-max
    denominator and its rule that the last step gets no bonus are kept; it min-max normalises
    TOKEN entropies where the paper normalises STEP entropies: we follow the paper). Defaults:
    ``k = k' = 1``; ``zeta = 0.05`` as in ARLArena's table of EMPG settings (that implementation
    uses 0.1; the paper's own values were not available to us). The paper's ``A^(i)`` is the
    trajectory advantage (e.g. :func:`flow_grpo_advantages` or GRPO); any ``[N, K]`` turn
    advantage (e.g. GiGPO's) may be modulated instead.

    Args:
      advantages: ``[N]`` episode advantages (broadcast to the turns) or ``[N, K]`` turn
        advantages. turn_entropy: ``[N, K]`` mean token entropy of each turn. turn_mask: ``[N, K]``.
      k, k_prime, zeta: the paper's ``k``, ``k'``, ``zeta``. final_norm: ``"mean"``,
        ``"mean_std"`` or ``"none"``. valid: optional ``[N]`` row mask.

    Returns:
      ``[N, K]`` float32; no gradient (nor through the entropies).
    """
    n, kk = _check_turns(turn_mask, valid, turn_entropy=turn_entropy)
    _checks.check_choice("final_norm", final_norm, ("mean", "mean_std", "none"))
    for name, val in (("k", k), ("k_prime", k_prime), ("zeta", zeta)):
        _checks.check_scalar(name, val)
    if np.ndim(advantages) == 1:
        _checks.check_seq_args(n, advantages=advantages)
    elif np.ndim(advantages) == 2:
        _check_turn_array("advantages", advantages, turn_mask, kind=None)
    else:
        raise ValueError(f"argument 'advantages' must be [N] (episodes) or [N, K] (turns), got shape "
                         f"{_shape(advantages)}")
    _checks.check_float("advantages", advantages)
    m, _ = _weights(turn_mask, valid)
    a = _checks.as_float(advantages).astype(jnp.float32)
    a = _checks.zero_outside(jnp.broadcast_to(a[:, None], m.shape) if a.ndim == 1 else a, m)
    h = _turn_float(turn_entropy, m)
    cnt = jnp.sum(m)
    h_min = jnp.where(cnt > 0, jnp.min(jnp.where(m > 0, h, jnp.inf)), 0.0)
    h_max = jnp.where(cnt > 0, jnp.max(jnp.where(m > 0, h, -jnp.inf)), 0.0)
    h_n = jnp.where(m > 0, (h - h_min) / (h_max - h_min + 1e-8), 0.0)
    e = jnp.where(m > 0, jnp.exp(-k * h_n), 0.0)
    g = safe_divide(e, safe_divide(jnp.sum(e), cnt))
    f = jnp.exp(-k_prime * h_n)
    has_next = jnp.concatenate([m[:, 1:], jnp.zeros((n, 1), m.dtype)], axis=1) * m
    bonus = jnp.where(has_next > 0, jnp.concatenate([f[:, 1:], jnp.zeros((n, 1), f.dtype)], axis=1), 0.0)
    mod = jnp.where(m > 0, g * a + zeta * bonus, 0.0)
    if final_norm == "mean":
        mod = mod - safe_divide(jnp.sum(mod), cnt)
    elif final_norm == "mean_std":
        mod = masked_whiten(mod, m)
    return _out(mod, m)


# ----------------------------------------------------------------------------- IGPO
def igpo_turn_rewards(gt_logp: jnp.ndarray, turn_mask: jnp.ndarray, outcome: jnp.ndarray, *,
                      gain: str = "prob", valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """IGPO turn rewards: information gain about the ground-truth answer, the outcome last.

    ``gt_logp[i, j]`` is the policy's mean log-probability per token of the ground-truth answer
    ``a`` (teacher-forced after the interaction history), ``j = 0`` before any turn and
    ``j = k + 1`` after turn ``k``; ``pi(a | .) = exp(gt_logp)`` is the geometric mean of the
    token probabilities. For every turn but the last,

        ``r_{i,k} = pi(a | q, o_{<=k}) - pi(a | q, o_{<=k-1}) = exp(gt_logp[i, k+1]) - exp(gt_logp[i, k])``

    (``gain="prob"``, the paper's definition: a difference of PROBABILITIES); the last turn (the
    answer) gets the outcome reward (the paper: F1 of the answer). ``gain="log_prob"`` uses the
    log-probability difference ``gt_logp[i, k+1] - gt_logp[i, k]`` (an option of the authors'
    code, ``info_gain_type=log_prob_diff``). ``gt_logp[i, j]`` for ``j`` beyond the last turn is
    not read.

    Paper: Wang et al., "Information Gain-based Policy Optimization: A Simple and Effective
    Approach for Multi-Turn LLM Agents", arXiv:2510.14967 (definitions of ``pi(a | q, o)`` and
    of the information gain ``IG``). Authors' code (``scrl/llm_agent/generation.py``): ``prob_diff`` is its default;
    a turn whose log-probability is NaN/inf gets 0 there, here it propagates (sanitise first).

    Args:
      gt_logp: ``[N, K + 1]`` mean log-probabilities of the ground truth. turn_mask: ``[N, K]``.
      outcome: ``[N]`` outcome reward of the answer. gain: ``"prob"`` or ``"log_prob"``.
      valid: optional ``[N]`` row mask.

    Returns:
      ``[N, K]`` float32 turn rewards; no gradient.
    """
    n, kk = _check_turns(turn_mask, valid)
    if np.ndim(gt_logp) != 2 or _shape(gt_logp) != (n, kk + 1):
        raise ValueError(f"argument 'gt_logp' must have shape {(n, kk + 1)} ([N, K + 1]: before any turn, "
                         f"then after each turn), got {_shape(gt_logp)}")
    _checks.check_float("gt_logp", gt_logp)
    _checks.check_seq_args(n, outcome=outcome)
    _checks.check_float("outcome", outcome)
    _checks.check_choice("gain", gain, ("prob", "log_prob"))
    m, v = _weights(turn_mask, valid)
    last = _last_turn(m)
    is_last = (jnp.arange(kk)[None] == last[:, None]) & (m > 0)
    used = jnp.arange(kk + 1)[None] <= last[:, None]
    lp = _checks.zero_outside(_checks.as_float(gt_logp).astype(jnp.float32), used)
    p = jnp.exp(lp) if gain == "prob" else lp
    gain_k = p[:, 1:] - p[:, :-1]
    o = _checks.zero_outside(_checks.as_float(outcome).astype(jnp.float32), v)
    return _out(jnp.where(is_last, o[:, None], gain_k), m)


def igpo_advantages(turn_rewards: jnp.ndarray, turn_mask: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int, *,
                    gamma: float = 1.0, scale_by_std: bool = True, epsilon: float = 1e-6, norm_mode: str = "joint",
                    valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """IGPO advantages: group-normalised turn rewards, then their discounted cumulative sum.

    ``A^_{i,k} = (r_{i,k} - mean(R_g)) / (std(R_g) + epsilon)`` where ``R_g`` is the set of ALL
    turn rewards (every turn of every episode) of the prompt group (``norm_mode="joint"``, the
    paper and the authors' default), then ``A~_{i,k} = sum_{k' >= k} gamma^(k'-k) A^_{i,k'}``,
    broadcast to the turn's tokens. ``norm_mode="separate"`` normalises the outcome rewards (last
    turns) and the information-gain rewards (other turns) in separate pools (the authors'
    ``info_gain_norm_mode=separate``). ``scale_by_std=False`` only subtracts the mean.

    Paper: Wang et al., "Information Gain-based Policy Optimization: A Simple and Effective
    Approach for Multi-Turn LLM Agents", arXiv:2510.14967. Statistics as in the authors' code
    (``verl/trainer/ppo/core_algos.py``, ``compute_grpo_outcome_advantage``): population std,
    ``sqrt(var + 1e-8)``, a pool of one reward gets std 1 (its advantage is 0 since the mean is
    itself); default ``gamma = 1`` (their scripts). Difference: the authors' code finds turns by
    their NONZERO token rewards, so an information gain of exactly 0 is left out of the
    statistics and of the cumulative sum; here every turn of ``turn_mask`` counts.

    Args:
      turn_rewards: ``[N, K]`` (from :func:`igpo_turn_rewards`). turn_mask: ``[N, K]``.
      group_ids: ``[N]`` int; num_groups: static. gamma: discount of the cumulative sum.
      scale_by_std, epsilon: as GRPO (1e-6). norm_mode: ``"joint"`` or ``"separate"``.
      valid: optional ``[N]`` row mask.

    Returns:
      ``[N, K]`` float32; no gradient.
    """
    n, kk = _check_turns(turn_mask, valid, turn_rewards=turn_rewards)
    _check_group_args(group_ids, num_groups, n)
    _check_discount("gamma", gamma)
    _checks.check_choice("norm_mode", norm_mode, ("joint", "separate"))
    m, _ = _weights(turn_mask, valid)
    r = _turn_float(turn_rewards, m)
    ids = jnp.broadcast_to(jnp.asarray(group_ids)[:, None], m.shape)

    def normalise(pool):
        cnt, mean, std = _pair_stats(r, ids, num_groups, pool, unbiased=False)
        std = jnp.where(cnt <= 1, 1.0, jnp.sqrt(jnp.square(std) + 1e-8))
        dev = r - mean
        return safe_divide(dev, std + epsilon) if scale_by_std else dev

    if norm_mode == "joint":
        a = normalise(m)
    else:
        is_last = ((jnp.arange(kk)[None] == _last_turn(m)[:, None]) & (m > 0)).astype(m.dtype)
        a = jnp.where(is_last > 0, normalise(m * is_last), normalise(m * (1.0 - is_last)))
    a = jnp.where(m > 0, a, 0.0)
    return _out(_discounted(a, m, gamma), m)


# ----------------------------------------------------------------------------- MARS
def mars_advantages(turn_rewards: jnp.ndarray, turn_mask: jnp.ndarray, agent_ids: jnp.ndarray,
                    group_ids: jnp.ndarray, num_groups: int, num_agents: int, *, gamma: float = 1.0,
                    scale_by_std: bool = False, epsilon: float = 1e-6,
                    valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """MARS turn-level advantages with agent-specific normalisation.

    Sum first, then normalise: ``R_{i,k} = sum_{k' >= k, agent(k') = agent(k)} gamma^(n) r_{i,k'}``
    (the return-to-go of the acting agent: only the rewards of that agent's own later turns in
    the row, discounted per own turn), then ``A_{i,k} = R_{i,k} - mean(R^{g,p})`` where
    ``R^{g,p}`` holds the returns of every turn played by agent ``p = agent_ids[i, k]`` in the
    episodes of prompt group ``g`` (the paper's role sub-groups of a game's self-play
    trajectories); ``scale_by_std=True`` also divides by their unbiased std ``+ epsilon``. A
    (group, agent) set with one turn gets 0.

    Paper: Yuan, Xu et al., "MARS: Reinforcing Multi-Agent Reasoning of LLMs through Self-Play in
    Strategic Games" (renamed "MARSHAL: Incentivizing Multi-Agent Reasoning via Self-Play with
    Strategic LLMs" in later versions), arXiv:2510.15414: turn-level advantage ``A_k = R_k -
    mean(R)`` with the Monte Carlo return ``R_k = sum_{k' >= k} r_{k'}`` (``gamma = 1``,
    GAE(1, 1) with the batch-mean baseline), computed per player-role sub-group. The authors'
    code (thu-nics/MARS on ROLL, ``roll/utils/functionals.py``, self-play configs) chains other
    steps: it centres the turn rewards per player, whitens the token rewards, accumulates
    token-level returns, centres the advantages over their DISTINCT values per player
    (``normalize_unique_values_by_player``) and whitens them over the batch; we implement the
    paper's formula. Layout: a row may hold one agent's turns (the paper: one trajectory per
    role) or interleave several agents; returns never mix agents. The ``n`` in the discount is
    the number of the agent's own turns between ``k`` and ``k'`` (our choice for ``gamma < 1``:
    the paper has ``gamma = 1``).

    Args:
      turn_rewards: ``[N, K]``. turn_mask: ``[N, K]``. agent_ids: ``[N, K]`` int in
        ``[0, num_agents)`` (the acting agent / role of each turn). group_ids: ``[N]`` int.
      num_groups, num_agents: static. gamma: discount (paper 1). scale_by_std: divide by the std.
      epsilon: added to it. valid: optional ``[N]`` row mask.

    Returns:
      ``[N, K]`` float32; no gradient.
    """
    n, _ = _check_turns(turn_mask, valid, turn_rewards=turn_rewards)
    _check_turn_array("agent_ids", agent_ids, turn_mask, kind="int")
    _checks.check_static_int("num_agents", num_agents)
    _check_group_args(group_ids, num_groups, n)
    _check_discount("gamma", gamma)
    m, _ = _weights(turn_mask, valid)
    _check_ids_in_range("agent_ids", agent_ids, m, num_agents, "num_agents")
    agents = jnp.where(m > 0, jnp.asarray(agent_ids), 0).astype(jnp.int32)
    r = _turn_float(turn_rewards, m)
    ret = jnp.zeros_like(r)
    for a in range(int(num_agents)):
        ret = ret + _discounted(r, m * (agents == a), gamma)  # 0 off agent a's turns
    ids = jnp.asarray(group_ids).astype(jnp.int32)[:, None] * int(num_agents) + agents
    _, mean, std = _pair_stats(ret, ids, int(num_groups) * int(num_agents), m)
    adv = ret - mean
    if scale_by_std:
        adv = safe_divide(adv, std + epsilon)
    return _out(adv, m)


# ----------------------------------------------------------------------------- SPA-RL
def spa_progress_loss(contributions: jnp.ndarray, turn_mask: jnp.ndarray, outcome: jnp.ndarray, *,
                      valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """SPA progress-estimator loss: the per-step contributions must sum to the outcome.

    ``L = mean_i (sum_k c_{i,k} - R_i)^2`` over the valid episodes (MSE; 0 for an empty batch).
    Differentiable in ``contributions`` (the progress estimator's per-step outputs).

    Paper: Wang, Leong, Wang, Wang and Li, "SPA-RL: Reinforcing LLM Agents via Stepwise Progress
    Attribution", arXiv:2505.20732 (progress estimator objective). As the authors' code
    (``prm/train_our_progress_model.py``: ``nn.MSELoss`` between the sum of the per-turn values
    at each turn's last token and the final reward).

    Args:
      contributions: ``[N, K]`` predicted per-step contributions ``c``. turn_mask: ``[N, K]``.
      outcome: ``[N]`` final task reward. valid: optional ``[N]`` row mask.

    Returns:
      Scalar float32 loss.
    """
    n, _ = _check_turns(turn_mask, valid, contributions=contributions)
    _checks.check_seq_args(n, outcome=outcome)
    _checks.check_float("outcome", outcome)
    m, v = _weights(turn_mask, valid)
    c = _turn_float(contributions, m)
    o = jax.lax.stop_gradient(_checks.zero_outside(_checks.as_float(outcome).astype(jnp.float32), v))
    err = jnp.where(v > 0, jnp.sum(c, axis=1) - o, 0.0)
    return safe_divide(jnp.sum(jnp.square(err)), jnp.sum(v))


def spa_turn_rewards(contributions: jnp.ndarray, turn_mask: jnp.ndarray, grounding: jnp.ndarray | None = None, *,
                     alpha: float = 1.0, beta: float = 0.5, valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """SPA fused per-step reward: ``r_{i,k} = alpha c_{i,k} + beta g_{i,k}``.

    ``c`` are the progress estimator's contributions (trained with :func:`spa_progress_loss`,
    so they sum to about the outcome: the outcome is redistributed, not added again) and
    ``g`` the grounding signal, 1 when the step's action was executed by the environment
    (valid / grounded), else 0. The outcome itself is NOT part of the fused reward (the paper
    adds a grounding term, not a success term). The rewards are used as per-step rewards of a
    token-level estimator (the paper trains with PPO; put them on tokens with
    :func:`place_turn_rewards`).

    Paper: Wang, Leong, Wang, Wang and Li, "SPA-RL: Reinforcing LLM Agents via Stepwise Progress
    Attribution", arXiv:2505.20732 (fused intermediate reward). Defaults from the authors' data
    preparation (``prm/rl_data_org.py``): ``alpha = 1`` and a grounding reward of 0.5 per
    executed action (0 when the environment answers "Nothing happens"; their final step always
    counts as grounded, pass ``grounding`` accordingly). That script's example also replaces the
    contributions by a leave-one-out centred outcome (an experiment variant); we follow the paper.

    Args:
      contributions: ``[N, K]``. turn_mask: ``[N, K]``. grounding: ``[N, K]`` bool/float
        grounding indicator, or None (no grounding term). alpha, beta: weights.
      valid: optional ``[N]`` row mask.

    Returns:
      ``[N, K]`` float32 rewards; no gradient.
    """
    _check_turns(turn_mask, valid, contributions=contributions)
    if grounding is not None:
        _check_turn_array("grounding", grounding, turn_mask, kind=None)
    _checks.check_scalar("alpha", alpha)
    _checks.check_scalar("beta", beta)
    m, _ = _weights(turn_mask, valid)
    r = alpha * _turn_float(contributions, m)
    if grounding is not None:
        r = r + beta * _checks.as_mask(grounding)
    return _out(r, m)


# ----------------------------------------------------------------------------- multi-turn GAE
def multiturn_gae_advantages(token_rewards: jnp.ndarray, values: jnp.ndarray, mask: jnp.ndarray, *,
                             gamma: float = 1.0, lam: float = 1.0, whiten: bool = True
                             ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """GAE over the policy tokens of a multi-turn episode, observation tokens skipped.

    Let ``t_1 < t_2 < ...`` be the positions with ``mask = 1`` (policy tokens). Then
    ``delta_j = r_{t_j} + gamma V_{t_{j+1}} - V_{t_j}`` (``V = 0`` after the last policy token)
    and ``A_{t_j} = delta_j + gamma lam A_{t_{j+1}}``: the next value of a policy token is the
    value at the next POLICY token, and gamma / lambda apply once per policy token, never to the
    observation tokens between turns (their rewards and values are ignored; put a turn's
    environment reward on its last policy token, :func:`place_turn_rewards`). Computed by moving
    the policy tokens of each row to a contiguous prefix, running the plain recursion there and
    moving the results back. ``returns = A + V`` (before whitening); the advantages are whitened
    over the policy tokens of the batch (unbiased variance).

    This is exactly what verl 0.9.1's ``compute_gae_advantage_return`` does when given the
    multi-turn ``response_mask`` (observation tokens 0): it has no separate multi-turn GAE, its
    loop keeps ``nextvalues`` and ``lastgaelam`` unchanged across masked positions ("skip values
    and TD-error on observation tokens"); :func:`~jaxrl_llm.core.advantages.gae_advantages` is
    the same recursion and gives the same numbers (tested), and for a contiguous prefix mask
    both reduce to ordinary GAE (tested).

    Paper: Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", arXiv:1506.02438.

    Args:
      token_rewards: ``[N, T]``. values: ``[N, T]`` critic values. mask: ``[N, T]`` POLICY-token
        mask. gamma, lam: per-policy-token discount and GAE lambda. whiten: whiten the advantages.

    Returns:
      ``(advantages [N, T], returns [N, T])``, zero outside the mask; no gradient.
    """
    _checks.check_token_args(token_rewards=token_rewards, values=values, mask=mask)
    _check_discount("gamma", gamma)
    _check_discount("lam", lam)
    m = _checks.as_mask(mask)
    r = _checks.zero_outside(_checks.as_float(token_rewards).astype(jnp.float32), m)
    v = _checks.zero_outside(_checks.as_float(values).astype(jnp.float32), m)
    cm, (cr, cv), slot = _compact_responses(m, r, v)

    def step(carry, x):  # a contiguous prefix: slot j + 1 is the next policy token
        next_v, next_a = carry
        r_j, v_j, m_j = x
        adv = (r_j + gamma * next_v - v_j + gamma * lam * next_a) * m_j
        return (v_j * m_j, adv), adv

    zeros = jnp.zeros(r.shape[0], r.dtype)
    adv_c = _reverse_masked_scan(step, (zeros, zeros), (cr, cv, cm))
    back = lambda x: jnp.take_along_axis(x, slot, axis=1) * m  # noqa: E731
    adv, ret = back(adv_c), back(adv_c + cv)
    if whiten:
        adv = masked_whiten(adv, m) * m
    return jax.lax.stop_gradient(adv), jax.lax.stop_gradient(ret)


# ----------------------------------------------------------------------------- POAD (BAD)
def poad_advantages(token_rewards: jnp.ndarray, values: jnp.ndarray, mask: jnp.ndarray, turn_ids: jnp.ndarray, *,
                    gamma: float = 0.95, lam: float = 0.95, whiten: bool = True
                    ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """POAD: token-level GAE with Bellman backup with Action Decomposition (BAD).

    Over the policy tokens ``j`` of an episode (observation tokens skipped), with ``V_j`` the
    critic's value before token ``j`` and ``next`` the next policy token:

    - inside an action (a turn), no reward and no discount: ``delta_j = V_next - V_j``,
      ``A_j = delta_j + lam A_next``;
    - at an action's last token: ``delta_j = r_turn + gamma V_next - V_j`` (``V_next`` the value
      at the first token of the next action, 0 after the last one), ``A_j = delta_j + gamma lam
      A_next``;

    so the discount applies once per action, not once per token, and every token gets credit
    through the token-level Bellman backup inside its action. ``returns = A + V``; advantages
    whitened over the policy tokens of the batch. One-token actions reduce to turn-level GAE
    (:func:`multiturn_gae_advantages`, tested).

    Paper: "Reinforcing Language Agents via Policy Optimization with Action Decomposition" (Wen
    et al.), arXiv:2405.15821; code ``morning9393/ADRL`` @5ec1aa5 (``batch_process_tppo``, branch
    ``POAD``): ``gamma = 0.95``, ``lam = 0.95``. Difference: the code normalises advantages by the
    population mean/std over the non-zero entries of a mini-batch; we whiten over the batch's
    policy tokens (``whiten``).

    Args:
      token_rewards: ``[N, T]`` (each turn's reward on its last policy token,
        :func:`place_turn_rewards`). values: ``[N, T]``. mask: ``[N, T]`` policy tokens.
      turn_ids: ``[N, T]`` int, the turn of each token (equal along an action).
      gamma: per-action discount. lam: GAE lambda. whiten: whiten the advantages.

    Returns:
      ``(advantages [N, T], returns [N, T])``, zero outside the mask; no gradient.
    """
    _checks.check_token_args(token_rewards=token_rewards, values=values, mask=mask)
    _checks.check_same_shape("mask", mask, turn_ids=turn_ids)
    _checks.check_int("turn_ids", turn_ids)
    _check_discount("gamma", gamma)
    _check_discount("lam", lam)
    m = _checks.as_mask(mask)
    r = _checks.zero_outside(_checks.as_float(token_rewards).astype(jnp.float32), m)
    v = _checks.zero_outside(_checks.as_float(values).astype(jnp.float32), m)
    tid = jnp.where(m > 0, jnp.asarray(turn_ids, jnp.int32), -1).astype(jnp.float32)
    cm, (cr, cv, ct), slot = _compact_responses(m, r, v, tid)
    # the next slot's turn (the last slot's next is "none"): a slot ends its action when it differs
    nxt_t = jnp.concatenate([ct[:, 1:], jnp.full((ct.shape[0], 1), -2.0)], axis=1)
    nxt_m = jnp.concatenate([cm[:, 1:], jnp.zeros((cm.shape[0], 1), cm.dtype)], axis=1)
    last = (nxt_m <= 0) | (nxt_t != ct)

    def step(carry, x):
        next_v, next_a = carry
        r_j, v_j, m_j, last_j = x
        disc = jnp.where(last_j, gamma, 1.0)
        adv = (jnp.where(last_j, r_j, 0.0) + disc * next_v - v_j + disc * lam * next_a) * m_j
        return (v_j * m_j, adv), adv

    zeros = jnp.zeros(r.shape[0], r.dtype)
    adv_c = _reverse_masked_scan(step, (zeros, zeros), (cr, cv, cm, last))
    back = lambda x: jnp.take_along_axis(x, slot, axis=1) * m  # noqa: E731
    adv, ret = back(adv_c), back(adv_c + cv)
    if whiten:
        adv = masked_whiten(adv, m) * m
    return jax.lax.stop_gradient(adv), jax.lax.stop_gradient(ret)


# ----------------------------------------------------------------------------- IterResearch / EAPO
def eapo_turn_advantages(episode_returns: jnp.ndarray, turn_mask: jnp.ndarray, group_ids: jnp.ndarray,
                         num_groups: int, *, gamma: float, scale_by_std: bool = True, epsilon: float = 1e-6,
                         valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """IterResearch's efficiency-aware credit (EAPO): each round rewarded by a geometric discount of
    the outcome by the rounds still to go, then group-normalised over rounds.

    Round ``k`` (0-based) of an episode with ``K`` rounds and outcome ``R`` gets ``r_k =
    gamma^(K - 1 - k) R`` (the last round the full outcome, earlier rounds less: a correct answer
    reached in fewer rounds earns more per round); the advantage of each round is GRPO's
    normalisation of ``r_k`` over all (episode, round) samples of the prompt group (each round is
    its own training sample in the paper), unbiased std, a one-sample group mean 0 and std 1.

    Paper: "IterResearch: Rethinking Long-Horizon Agents via Markovian State Reconstruction",
    arXiv:2511.07327. The EAPO trainer is not released: the discounted per-round reward is the
    paper's (quoted identically by two summaries); ``gamma`` has no default (its value was not
    found) and the normalisation over all round-samples of the group is our reading. The paper's
    GSPO loss is ``recipe.loss=gspo``. ``gamma = 1``: every round gets the outcome (Flow-GRPO with
    turn-weighted statistics).

    Args:
      episode_returns: ``[N]`` outcomes. turn_mask: ``[N, K]``. group_ids: ``[N]``; num_groups static.
      gamma: the per-round discount in ``[0, 1]``. scale_by_std: divide by the group's std.
      epsilon: 1e-6. valid: optional ``[N]``.

    Returns:
      ``[N, K]`` float32 per-round advantages, 0 outside the turns; no gradient.
    """
    n, k = _check_turns(turn_mask, valid)
    _checks.check_seq_args(n, episode_returns=episode_returns)
    _checks.check_float("episode_returns", episode_returns)
    _check_group_args(group_ids, num_groups, n)
    _check_discount("gamma", gamma)
    m, v = _weights(turn_mask, valid)
    last = _last_turn(m)
    to_go = jnp.maximum(last[:, None] - jnp.arange(k)[None], 0).astype(jnp.float32)
    r = _checks.as_float(episode_returns).astype(jnp.float32)[:, None] * jnp.power(jnp.float32(gamma), to_go)
    ids = jnp.broadcast_to(jnp.asarray(group_ids)[:, None], m.shape)
    cnt, mean, std = _pair_stats(r * m, ids, num_groups, m)
    single = cnt <= 1
    mean = jnp.where(single, 0.0, mean)
    std = jnp.where(single, 1.0, std)
    adv = safe_divide(r - mean, std + epsilon) if scale_by_std else r - mean
    return _out(adv, m)

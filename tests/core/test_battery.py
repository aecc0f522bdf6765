"""The generic test battery, applied to *every* public function of jaxrl_llm.core.

For each function: jit == eager, vmap over a stack of two input sets == two calls, bf16 inputs
give finite float32 outputs, and an all-masked (or all-invalid) batch gives finite outputs.
``test_every_public_name_is_covered`` fails when a new public function is added without an
entry here (or an explicit exemption with a reason), so the battery cannot silently shrink.
Family-specific checks (hand values, masked == filtered, zero gradients, paper identities,
peer parity) live in the other test files.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.core as C

B, T, NG = 6, 5, 3
GID = np.array([0, 1, 2, 0, 1, 2], np.int32)


def _rng(seed):
    return np.random.default_rng(seed)


def _mask(seed):
    lengths = _rng(seed).integers(1, T + 1, B)
    return (np.arange(T)[None] < lengths[:, None]).astype(np.float32)


def _lp(seed, shape=(B, T)):
    return np.log(_rng(seed).uniform(0.05, 0.95, shape)).astype(np.float32)


def _n(seed, shape):
    return _rng(seed).normal(size=shape).astype(np.float32)


def _scores(seed):
    return _rng(seed).integers(0, 2, B).astype(np.float32)


def tok4(seed):  # logp, old_logp, advantages, mask
    return [_lp(seed), _lp(seed + 100), _n(seed, (B, T)), _mask(seed)]


def outcome(seed):  # scores, mask (group ids bound statically)
    return [_scores(seed), _mask(seed)]


def pairs(seed, n=4):
    return [-np.abs(_n(seed + i, (B,))) * 10 for i in range(n)]


def lengths(seed):
    return [_rng(seed).integers(1, 20, B).astype(np.float32) for _ in range(2)]


# name -> (function of the arrays, input maker(seed) -> list of arrays, index of the mask input or None)
R = {
    # advantages
    "gae_advantages": (lambda r, v, m: C.gae_advantages(r, v, m, 0.9, 0.95),
                       lambda s: [_n(s, (B, T)), _n(s + 1, (B, T)), _mask(s)], 2),
    "reinforce_pp_advantages": (lambda r, m: C.reinforce_pp_advantages(r, m, 0.99), lambda s: [_n(s, (B, T)), _mask(s)], 1),
    "remax_advantages": (C.remax_advantages, lambda s: [_n(s, (B, T)), _n(s, (B,)), _mask(s)], 2),
    "gdpo_advantages": (lambda c, m: C.gdpo_advantages(c, m, GID, NG), lambda s: [_n(s, (B, 2)), _mask(s)], 1),
    "optimal_token_baseline_advantages": (
        lambda r, lp, sp, w, m: C.optimal_token_baseline_advantages(r, lp, sp, m, GID, NG, is_weights=w, align="response"),
        lambda s: [_n(s, (B, T)), _lp(s), _rng(s).uniform(0.1, 1.0, (B, T)).astype(np.float32),
                   _rng(s + 1).uniform(0.5, 2.0, (B, T)).astype(np.float32), _mask(s)], 4),
    # aggregation
    "aggregate": (lambda x, m: C.aggregate(x, m, "seq-mean-token-mean"), lambda s: [_n(s, (B, T)), _mask(s)], 1),
    "aggregate_sum_weight": (lambda x, m: C.aggregate_sum_weight(x, m, "token-mean"),
                             lambda s: [_n(s, (B, T)), _mask(s)], 1),
    "finalize": (C.finalize, lambda s: [np.float32(3.0), np.float32(s)], None),
    # entropy
    "entropy_from_logits": (C.entropy_from_logits, lambda s: [_n(s, (B, T, 7))], None),
    "chunked_entropy": (lambda z: C.chunked_entropy(z, 2), lambda s: [_n(s, (B, T, 7))], None),
    "sum_pi_squared_from_logits": (lambda z: C.sum_pi_squared_from_logits(z, 0.8), lambda s: [_n(s, (B, T, 7))], None),
    "chunked_sum_pi_squared": (lambda z: C.chunked_sum_pi_squared(z, 2, 0.8), lambda s: [_n(s, (B, T, 7))], None),
    "chunked_logprobs_and_entropy": (lambda z, t: C.chunked_logprobs_and_entropy(z, t, 2),
                                     lambda s: [_n(s, (B, T, 7)), _rng(s).integers(0, 7, (B, T)).astype(np.int32)], None),
    # kl
    "kl_penalty": (lambda a, b: C.kl_penalty(a, b, "k3+"), lambda s: [_lp(s), _lp(s + 1)], None),
    "kl_in_reward": (lambda r, o, ref, m: C.kl_in_reward(r, o, ref, m, 0.1), lambda s: [_n(s, (B, T)), _lp(s), _lp(s + 1), _mask(s)], 3),
    "kl_importance_weight": (lambda a, b, m: C.kl_importance_weight(a, b, m, "sequence"),
                             lambda s: [_lp(s), _lp(s + 1), _mask(s)], 2),
    "fixed_kl_controller": (lambda kl: C.fixed_kl_controller(0.1).update(C.fixed_kl_controller(0.1).init(), kl, 4),
                            lambda s: [np.float32(0.05 * s)], None),
    "adaptive_kl_controller": (lambda kl: C.adaptive_kl_controller(0.1, 0.05, 100).update(
        C.adaptive_kl_controller(0.1, 0.05, 100).init(), kl, 4), lambda s: [np.float32(0.05 * s)], None),
    # policy losses
    "ppo_clip_loss": (lambda *a: C.ppo_clip_loss(*a), tok4, 3),
    "gppo_loss": (lambda *a: C.gppo_loss(*a), tok4, 3),
    "gspo_loss": (lambda *a: C.gspo_loss(*a), tok4, 3),
    "cispo_loss": (lambda *a: C.cispo_loss(*a), tok4, 3),
    "sapo_loss": (lambda *a: C.sapo_loss(*a), tok4, 3),
    "gpg_loss": (lambda *a: C.gpg_loss(*a), tok4, 3),
    "reinforce_loss": (lambda lp, a, m: C.reinforce_loss(lp, a, m), lambda s: [_lp(s), _n(s, (B, T)), _mask(s)], 2),
    "clip_cov_loss": (lambda *a: C.clip_cov_loss(*a, key=jax.random.key(0), clip_cov_ratio=0.1, clip_cov_lb=0.0), tok4, 3),
    "kl_cov_loss": (lambda *a: C.kl_cov_loss(*a, kl_cov_ratio=0.1), tok4, 3),
    "gmpo_loss": (lambda *a: C.gmpo_loss(*a), tok4, 3),
    "dro_loss": (lambda *a: C.dro_loss(*a, beta=0.5), tok4, 3),
    "dppo_tv_loss": (lambda *a: C.dppo_tv_loss(*a), tok4, 3),
    "dppo_kl_loss": (lambda *a: C.dppo_kl_loss(*a), tok4, 3),
    "guide_loss": (lambda *a: C.guide_loss(*a, (np.arange(B) % 2).astype(np.float32)), tok4, 3),
    "masked_row_quantile": (lambda v, m: C.masked_row_quantile(v, m, 0.9),
                            lambda s: [np.exp(_n(s, (B, T))), _mask(s)], 1),
    "rollout_is_weights": (lambda a, b, m: C.rollout_is_weights(a, b, m, level="sequence", upper=2.0, lower=0.1,
                                                                 batch_normalize=True),
                           lambda s: [_lp(s), _lp(s + 1), _mask(s)], 2),
    "rollout_rejection_mask": (lambda a, b, m: C.rollout_rejection_mask(a, b, m, mode="seq_max_k3", upper=0.5),
                               lambda s: [_lp(s), _lp(s + 1), _mask(s)], 2),
    "ratio_metrics": (C.ratio_metrics, lambda s: [_n(s, (B, T)), _mask(s)], 1),
    # preference
    "dpo_loss": (lambda *a: C.dpo_loss(*a, loss_type="ipo"), lambda s: pairs(s) + lengths(s), None),
    "simpo_loss": (lambda *a: C.simpo_loss(*a), lambda s: pairs(s, 2) + lengths(s), None),
    "cpo_loss": (lambda *a: C.cpo_loss(*a), lambda s: pairs(s, 2), None),
    "orpo_loss": (lambda *a: C.orpo_loss(*a), lambda s: [x / 20 for x in pairs(s, 2)], None),
    "kto_loss": (lambda p, r, d, z: C.kto_loss(p, r, d, z),
                 lambda s: pairs(s, 2) + [_rng(s).integers(0, 2, B).astype(bool), np.float32(0.1)], None),
    "kto_paired_loss": (lambda *a: C.kto_paired_loss(*a), lambda s: pairs(s), None),
    "kto_kl_reference_point": (C.kto_kl_reference_point, lambda s: pairs(s, 2), None),
    # shaping
    "overlong_penalty": (lambda l: C.overlong_penalty(l, 20, 5), lambda s: [_rng(s).integers(0, 25, B).astype(np.float32)], None),
    "kimi_length_reward": (lambda l, c, v: C.kimi_length_reward(l, c, GID, NG, v),
                           lambda s: lengths(s)[:1] + [_scores(s) > 0, np.ones(B, bool)], 2),
    "dynamic_sampling_mask": (lambda x, v: C.dynamic_sampling_mask(x, GID, NG, v), lambda s: [_scores(s), np.ones(B, bool)], 1),
    "pf_ppo_weights": (lambda x: C.pf_ppo_weights(x, "pow"), lambda s: [_n(s, (B,))], None),
    "pf_ppo_resample": (lambda k, x: C.pf_ppo_resample(k, x, "pow"), lambda s: [jax.random.key(s), _n(s, (B,))], None),
    # stats
    "masked_sum": (C.masked_sum, lambda s: [_n(s, (B, T)), _mask(s)], 1),
    "masked_mean": (C.masked_mean, lambda s: [_n(s, (B, T)), _mask(s)], 1),
    "masked_var": (C.masked_var, lambda s: [_n(s, (B, T)), _mask(s)], 1),
    "masked_whiten": (C.masked_whiten, lambda s: [_n(s, (B, T)), _mask(s)], 1),
    "group_stats": (lambda x, v: C.group_stats(x, GID, NG, v), lambda s: [_n(s, (B,)), np.ones(B, bool)], 1),
    "group_sum": (lambda x: C.group_sum(x, GID, NG), lambda s: [_n(s, (B,))], None),
    "safe_divide": (C.safe_divide, lambda s: [_n(s, (B,)), np.abs(_n(s + 1, (B,)))], None),
    # value
    "clipped_value_loss": (lambda v, o, r, m: C.clipped_value_loss(v, o, r, m, clip_range=0.2),
                           lambda s: [_n(s, (B, T)), _n(s + 1, (B, T)), _n(s + 2, (B, T)), _mask(s)], 3),
}
# turn-level estimators (jaxrl_llm.core.turns): [B, K] turn arrays with K = T, the turn mask a prefix
SID = _rng(7).integers(0, 4, (B, T)).astype(np.int32)  # GiGPO anchor-state ids (num_states = 4)
AID = (np.arange(T)[None] % 2 * np.ones((B, 1))).astype(np.int32)  # MARS: two agents alternate
TID = np.broadcast_to(np.minimum(np.arange(T) // 2, 2), (B, T)).astype(np.int32)  # token -> turn (K = 3)


def _holes(seed):  # a policy-token mask with an observation token inside
    m = _mask(seed)
    m[m.sum(1) >= 3, 1] = 0.0
    return m


R.update({
    "turn_returns": (lambda r, m: C.turn_returns(r, m, 0.9), lambda s: [_n(s, (B, T)), _mask(s)], 1),
    "gigpo_advantages": (lambda e, r, m: C.gigpo_advantages(e, r, m, SID, GID, NG, 4, gamma=0.95),
                         lambda s: [_n(s, (B,)), _n(s + 1, (B, T)), _mask(s)], 2),
    "turn_group_baseline_advantages": (
        lambda r, m: C.turn_group_baseline_advantages(r, m, GID, NG, gamma=0.9, scale_by_std=True),
        lambda s: [_n(s, (B, T)), _mask(s)], 1),
    "flow_grpo_advantages": (lambda x, m: C.flow_grpo_advantages(x, m, GID, NG), outcome, 1),
    "xrpo_novelty_advantages": (lambda sc, lp, m: C.xrpo_novelty_advantages(sc, lp, m, GID, NG),
                                lambda s: [_scores(s), _lp(s), _mask(s)], 2),
    "r3_entropy_rank_rewards": (lambda sc, h, m: C.r3_entropy_rank_rewards(sc, h, m, GID, NG, r_max=0.5, peak_frac=0.3),
                                lambda s: [_scores(s), np.abs(_n(s, (B, T))), _mask(s)], 2),
    "decs_token_rewards": (lambda c, n, m: C.decs_token_rewards(c, n, m, max_length=8.0),
                           lambda s: [_rng(s).integers(0, 2, B).astype(bool), _rng(s).integers(0, T, B).astype(np.float32),
                                      _mask(s)], 2),
    # pad_in_stats=False: with True (the default, the authors' code) the rewards past a response's end
    # are inputs by design (they count in the group's statistics), so "under the mask" is not garbage
    "decs_advantages": (lambda r, m: C.decs_advantages(r, m, GID, NG, pad_in_stats=False),
                        lambda s: [np.abs(_n(s, (B, T))), _mask(s)], 1),
    "brpo_advantages": (lambda sc, v: C.brpo_advantages(sc, GID, NG, prior=C.brpo_budget_prior(3), valid=v),
                        lambda s: [_rng(s).uniform(0, 1, (B, 3)).astype(np.float32), np.ones(B, bool)], 1),
    "matchtir_advantages": (lambda r, m: C.matchtir_advantages(r, m, GID, NG),
                            lambda s: [_n(s, (B, 3)), (np.arange(3)[None] < _rng(s).integers(1, 4, B)[:, None])], 1),
    "rlvmr_advantages": (lambda s_, r, g, m: C.rlvmr_advantages(s_, r, np.tile([[1, 2, 0]], (B, 1)).astype(np.int32), g,
                                                               m, GID, NG),
                         lambda s: [_n(s, (B,)), _rng(s).integers(0, 2, (B, 3)).astype(np.float32),
                                    _rng(s + 1).integers(0, 2, (B, 3)).astype(np.float32),
                                    (np.arange(3)[None] < _rng(s).integers(1, 4, B)[:, None])], 3),
    "empg_advantages": (lambda a, h, m: C.empg_advantages(a, h, m, zeta=0.1),
                        lambda s: [_n(s, (B, T)), np.abs(_n(s + 1, (B, T))), _mask(s)], 2),
    "igpo_turn_rewards": (lambda lp, o, m: C.igpo_turn_rewards(lp, m, o),
                          lambda s: [_lp(s, (B, T + 1)), _scores(s), _mask(s)], 2),
    "igpo_advantages": (lambda r, m: C.igpo_advantages(r, m, GID, NG, gamma=0.9, norm_mode="separate"),
                        lambda s: [_n(s, (B, T)), _mask(s)], 1),
    "mars_advantages": (lambda r, m: C.mars_advantages(r, m, AID, GID, NG, 2, scale_by_std=True),
                        lambda s: [_n(s, (B, T)), _mask(s)], 1),
    "spa_progress_loss": (lambda c, o, m: C.spa_progress_loss(c, m, o), lambda s: [_n(s, (B, T)), _scores(s), _mask(s)],
                          2),
    "spa_turn_rewards": (lambda c, g, m: C.spa_turn_rewards(c, m, g),
                         lambda s: [_n(s, (B, T)), _rng(s).integers(0, 2, (B, T)).astype(bool), _mask(s)], 2),
    "multiturn_gae_advantages": (lambda r, v, m: C.multiturn_gae_advantages(r, v, m, gamma=0.9, lam=0.95),
                                 lambda s: [_n(s, (B, T)), _n(s + 1, (B, T)), _holes(s)], 2),
    # turn values are [B, 3] (not the mask's shape): the garbage test leaves them alone, as it should
    "broadcast_turns": (lambda x, m: C.broadcast_turns(x, TID, m), lambda s: [_n(s, (B, 3)), _mask(s)], 1),
    "place_turn_rewards": (lambda x, m: C.place_turn_rewards(x, TID, m), lambda s: [_n(s, (B, 3)), _mask(s)], 1),
})
# the papers' group estimators (jaxrl_llm.core.group_advantages)
ANS = np.array([0, 1, 2, 0, 1, 5], np.int32)  # answer clusters within the groups of GID
R.update({
    "agrae_advantages": (lambda s, m: C.agrae_advantages(s, m, GID, NG), outcome, 1),
    "canon_advantages": (lambda s, x, m: C.canon_advantages(s, x, m, GID, NG, mu=0.5),
                         lambda s: [_scores(s), _n(s + 1, (B,)), _mask(s)], 2),
    "stratified_advantages": (lambda s, m: C.stratified_advantages(s, np.array([0, 1, 1, 0, 1, 0]), m, GID, NG, alpha=0.5,
                                                                   num_strata=2), outcome, 1),
    "seed_grpo_advantages": (lambda s, m: C.seed_grpo_advantages(s, ANS, m, GID, NG), outcome, 1),
    "semantic_entropy": (lambda lp: C.semantic_entropy(ANS, GID, NG, seq_logp=lp), lambda s: [_n(s, (B,))], None),
    "hapo_token_group_advantages": (lambda s, m: C.hapo_token_group_advantages(s, m, GID, NG), outcome, 1),
    "riskpo_advantages": (lambda s, m: C.riskpo_advantages(s, m, GID, NG, bundle_size=2), outcome, 1),
    "adora_advantages": (lambda s, m: C.adora_advantages(s, m, GID, NG), outcome, 1),
    "drop_small_advantages": (lambda a, m: C.drop_small_advantages(a, m, 0.3), lambda s: [_n(s, (B, T)), _mask(s)], 1),
})
# batch-coupled and paper surrogates (scalar losses over the batch; mdpo is per token)
SCB = np.array([1, 0, 1, 0, 0, 1], np.float32)
R.update({
    "bapo_loss": (lambda *a: C.bapo_loss(*a), tok4, 3),
    "bapo_bounds": (lambda *a: C.bapo_bounds(*a, count="grad"), tok4, 3),
    "disco_loss": (lambda *a: C.disco_loss(*a, scores=SCB, group_ids=GID), tok4, 3),
    "drpo_loss": (lambda *a: C.drpo_loss(*a, scores=SCB, group_ids=GID), tok4, 3),
    "thinkless_loss": (lambda *a: C.thinkless_loss(*a), tok4, 3),
    "p3o_loss": (lambda *a: C.p3o_loss(*a, scores=SCB, group_ids=GID, variant="joint"), tok4, 3),
    "hapo_entropy_hat": (lambda h, m: C.hapo_entropy_hat(h, m), lambda s: [np.abs(_n(s, (B, T))) + 0.01, _mask(s)], 1),
    "hapo_loss": (lambda lp, o, a, m: C.hapo_loss(lp, o, a, m, old_entropy=jnp.abs(o) + 0.05), tok4, 3),
    "mdpo_loss": (lambda *a: C.mdpo_loss(*a, t=0.5), tok4, 3),
    "hdpo_loss": (lambda *a: C.hdpo_loss(*a, tool_advantages=np.array([1, -1, 0, .5, 0, -.5], np.float32)), tok4, 3),
    "papo_loss": (lambda lp, o, a, m: C.papo_loss(lp, o, a, m, masked_logp=o - 0.3, gamma=0.02, eta_ori=0.05,
                                                  eta_aug=0.05), tok4, 3),
    "critique_grpo_loss": (lambda lp, o, a, m: C.critique_grpo_loss(lp, o, a, m, np.array([1, 0, 0, 1, 0, 0],
                                                                                        np.float32)), tok4, 3),
    "entropy_balanced_loss": (lambda lp, o, a, m: C.entropy_balanced_loss(lp, o, a, m, entropy=jnp.abs(o) + 0.1),
                              tok4, 3),
    "rover_loss": (lambda lp, o, a, m: C.rover_loss(lp, o, a, m, mean_logp=o - 1.0, old_mean_logp=lp - 1.2,
                                                    clip_ratio=0.2), tok4, 3),
    "epo_loss": (lambda lp, o, a, m: C.epo_loss(lp, o, a, m, entropy=jnp.abs(o) + 0.1, epo_entropy_ref=jnp.abs(a) + 0.2,
                                                epo_phase_weight=np.full(B, 0.9, np.float32)), tok4, 3),
    "aligndistil_loss": (lambda lp, o, a, m: C.aligndistil_loss(lp, o, a, m, teacher_logp=o * 1.1,
                                                                teacher_weight=jnp.abs(a) + 0.5), tok4, 3),
    "aligndistil_teacher": (lambda a, b: C.aligndistil_teacher(a, b, np.zeros((B, T), np.int32)),
                            lambda s: [_n(s, (B, T, 7)), _n(s + 1, (B, T, 7))], None),
    "nash_md_loss": (lambda lp, o, a, m: C.nash_md_loss(lp, o, a, m, ref_logp=o * 0.9), tok4, 3),
    "nash_md_preference": (lambda r, r2: C.nash_md_preference(r, r2), lambda s: [_n(s, (B,)), _n(s + 1, (B,))], None),
    "vppo_loss": (lambda lp, o, a, m: C.vppo_loss(lp, o, a, m, masked_logp=o - 0.4), tok4, 3),
    "etr_loss": (lambda *a: C.etr_loss(*a, scores=SCB, group_ids=GID, alpha=0.2, beta=0.5), tok4, 3),
    "r2vpo_loss": (lambda *a: C.r2vpo_loss(*a, r2vpo_lambda=np.full(B, 0.7, np.float32), delta=0.05), tok4, 3),
    "hdpo_advantages": (lambda a, f, k, v: C.hdpo_advantages(a, f, k, GID, NG, valid=v),
                        lambda s: [_scores(s), _scores(s + 1), _rng(s).integers(0, 4, B).astype(np.float32),
                                   np.ones(B, bool)], 3),
})
R.update({
    "egae_advantages": (lambda r, v, m: C.egae_advantages(r, v, m, np.array([True, False] * 3), 0.9, 0.95),
                        lambda s: [_n(s, (B, T)), _n(s + 1, (B, T)), _mask(s)], 2),
    "hicra_advantages": (lambda a, h, m: C.hicra_advantages(a, m, GID, NG, entropy=h),
                         lambda s: [_n(s, (B, T)), np.abs(_n(s + 1, (B, T))), _mask(s)], 2),
    "copo_advantages": (lambda s, m: C.copo_advantages(s, ANS, m, GID, NG), outcome, 1),
    "poad_advantages": (lambda r, v, m: C.poad_advantages(r, v, m, TID, gamma=0.9, lam=0.95),
                        lambda s: [_n(s, (B, T)), _n(s + 1, (B, T)), _mask(s)], 2),
    "eapo_turn_advantages": (lambda e, m: C.eapo_turn_advantages(e, m, GID, NG, gamma=0.9),
                             lambda s: [_n(s, (B,)), _mask(s)], 1),
    "aspo_advantages": (lambda a, c, p, l, m: C.aspo_advantages(a, c > 0, p, l, m, GID, NG),
                        lambda s: [_n(s, (B,)), _scores(s), _rng(s).integers(-1, 5, B).astype(np.float32),
                                   lengths(s)[0], _mask(s)], 4),
    "low_probability_confidence": (lambda lp, m: C.low_probability_confidence(lp, m), lambda s: [_lp(s), _mask(s)], 1),
    "max_variance_subset": (lambda x, v: C.max_variance_subset(x, GID, NG, 1, valid=v),
                            lambda s: [_n(s, (B,)), np.ones(B, bool)], 1),
    "d3s_mask": (lambda a, h, m: C.d3s_mask(a, h, m, GID, NG, samples_per_group=1, token_fraction=0.5, batch_samples=2),
                 lambda s: [_n(s, (B, T)), np.abs(_n(s + 1, (B, T))), _mask(s)], 2),
    "arm_advantages": (lambda s_, c, q, m: C.arm_advantages(s_, m, GID, NG, c, q, alpha=0.1),
                       lambda s: [_scores(s), _n(s, (B,)), _n(s + 1, (B,)), _mask(s)], 3),
})
R.update({
    "rto_token_rewards": (lambda a, r, m: C.rto_token_rewards(a, r, m), lambda s: [_lp(s), _lp(s + 1), _mask(s)], 2),
    "tgdpo_token_weights": (lambda a, b, c, d: C.tgdpo_token_weights(a, b, c, d, alpha=2.0),
                            lambda s: [_lp(s), _lp(s + 1), _lp(s + 2), _lp(s + 3)], None),
    "tgdpo_loss": (lambda lc, lr, m: C.tgdpo_loss(lc, lr, lc * 0.9, lr * 1.1, lc * 1.2, lr * 0.8, m, m),
                   lambda s: [_lp(s), _lp(s + 1), _mask(s)], 2),
})
CUTS = _rng(11).integers(0, 2, (B, T)).astype(bool)
R.update({
    "spo_cut_points": (lambda lp, m: C.spo_cut_points(lp, m, interval=2), lambda s: [_lp(s), _mask(s)], 1),
    "spo_chain_advantages": (lambda sc, v, lp, m: C.spo_chain_advantages(sc, v, CUTS, m, lp),
                             lambda s: [_scores(s), _rng(s).uniform(0, 1, (B, T)).astype(np.float32), _lp(s + 1),
                                        _mask(s)], 3),
    "pav_advantages": (lambda sc, v, lp, m: C.pav_advantages(sc, v, CUTS, m, lp),
                       lambda s: [_scores(s), _rng(s).uniform(0, 1, (B, T)).astype(np.float32), _lp(s + 1),
                                  _mask(s)], 3),
    "best_of_k_value": (lambda v: C.best_of_k_value(v, 4), lambda s: [_rng(s).uniform(0, 1, (B,)).astype(np.float32)],
                        None),
})
# reward designs (sequence-level)
R.update({
    "thinkless_reward": (lambda c, s: C.thinkless_reward(c > 0, s > 0), lambda s: [_scores(s), _scores(s + 1)], None),
    "grpo_lambda_reward": (lambda c, l, v: C.grpo_lambda_reward(c > 0, l, GID, NG, valid=v),
                           lambda s: [_scores(s), lengths(s)[0], np.ones(B, bool)], 2),
    "concise_reward": (lambda c, l, v: C.concise_reward(c > 0, l, GID, NG, max_length=20.0, valid=v),
                       lambda s: [_scores(s), lengths(s)[0], np.ones(B, bool)], 2),
    "otc_tool_reward": (lambda c, k, v: C.otc_tool_reward(c > 0, k, GID, NG, valid=v),
                        lambda s: [_scores(s), _rng(s).integers(0, 4, B).astype(np.float32), np.ones(B, bool)], 2),
    "fapo_reward": (lambda c, f: C.fapo_reward(c > 0, f > 0), lambda s: [_scores(s), _scores(s + 1)], None),
    "posterior_reward": (C.posterior_reward, lambda s: [_scores(s), _scores(s + 1), _rng(s).uniform(0, 1, B).astype(
        np.float32)], None),
    "empo_reward": (lambda v: C.empo_reward(ANS, GID, NG, valid=v), lambda s: [np.ones(B, bool)], 0),
    "dot_truncation_lengths": (lambda l, c, v: C.dot_truncation_lengths(l, c > 0, GID, NG, alpha=0.5, min_cut=1, valid=v),
                               lambda s: [lengths(s)[0], _scores(s), np.ones(B, bool)], 2),
    "hbpo_reward": (lambda c, l: C.hbpo_reward(c > 0, l, np.array([4, 8, 4, 8, 4, 8], np.float32), max_length=20.0),
                    lambda s: [_scores(s), lengths(s)[0]], None),
    "hbpo_advantages": (lambda s_, m: C.hbpo_advantages(s_, m, GID, NG, np.array([4, 8, 16, 4, 8, 16], np.float32),
                                                        np.zeros(B, np.int32), 1, max_length=20.0), outcome, 1),
    "triangular_length_reward": (lambda l: C.triangular_length_reward(l, 8.0), lambda s: [lengths(s)[0]], None),
    "hapo_history_reward": (lambda c, l, h: C.hapo_history_reward(c > 0, l, h),
                            lambda s: [_scores(s), lengths(s)[0], lengths(s + 1)[0] * _scores(s + 2)], None),
    "hapo_history_update": (lambda h, c, l: C.hapo_history_update(h, c > 0, l, GID, NG),
                            lambda s: [lengths(s)[0][:NG] * _scores(s + 1)[:NG], _scores(s), lengths(s + 2)[0]], None),
    "auto_cei_reward": (lambda c, r, st: C.auto_cei_reward(c, r, st),
                        lambda s: [_rng(s).integers(0, 2, B).astype(bool), _rng(s + 1).integers(0, 2, B).astype(bool),
                                   lengths(s)[0]], None),
    "campo_repetition_penalty": (lambda f, c: C.campo_repetition_penalty(f, c),
                                 lambda s: [_rng(s).uniform(0, 1, B).astype(np.float32),
                                            _rng(s + 1).integers(0, 2, B).astype(bool)], None),
    "mutual_welfare_reward": (lambda u, w: C.mutual_welfare_reward(u, w),
                              lambda s: [_rng(s).uniform(0, 1, B).astype(np.float32),
                                         _rng(s + 1).uniform(0, 1, B).astype(np.float32)], None),
    "window_entropy_counts": (lambda h, m: C.window_entropy_counts(h, m, window=2)[0],
                              lambda s: [np.abs(_n(s, (B, T))), _mask(s)], 1),
    "effective_rank": (lambda h, m: C.effective_rank(h, m), lambda s: [_n(s, (B, T, 4)), _mask(s)], 1),
    "effective_rank_dynamics": (lambda h, m: C.effective_rank_dynamics(h, m, stride=1, max_len=4)[2],
                                lambda s: [_n(s, (B, T, 4)), _mask(s)], 1),
    "effective_rank_bonus": (lambda a, b, c: C.effective_rank_bonus(a, b, c, np.array([1.0, -0.5, 2.0], np.float32)),
                             lambda s: [_n(s, (B,)), _n(s + 1, (B,)), _n(s + 2, (B,))], None),
    "capped_bonus_advantages": (lambda a, b, m: C.capped_bonus_advantages(a, b, m, kappa=2.0),
                                lambda s: [_n(s, (B, T)), _n(s + 1, (B,)), _mask(s)], 2),
    "ares_entropy_reward": (lambda c, t, k, lv: C.ares_entropy_reward(c, t, k, lv),
                            lambda s: [lengths(s)[0], lengths(s)[1], _rng(s).integers(0, 2, B).astype(bool),
                                       _rng(s).integers(0, 3, B).astype(np.int32)], None),
    "apo_adaptive_reward": (lambda c, f, p: C.apo_adaptive_reward(c, f, p, tau=0.5),
                            lambda s: [_rng(s).integers(0, 2, B).astype(bool), _rng(s + 1).integers(0, 2, B).astype(bool),
                                       _rng(s).uniform(0, 1, B).astype(np.float32)], None),
    "group_contrastive_aux_reward": (lambda u, c, v: C.group_contrastive_aux_reward(u, c, GID, NG, margin=0.1, valid=v),
                                     lambda s: [_rng(s).integers(0, 2, B).astype(bool),
                                                _rng(s + 1).integers(0, 2, B).astype(bool), np.ones(B, bool)], 2),
    "cosine_length_reward": (lambda c, ln: C.cosine_length_reward(c, ln, max_length=20.0),
                             lambda s: [_rng(s).integers(0, 2, B).astype(bool), lengths(s)[0]], None),
    "cgpo_calibrated_reward": (lambda r, b, f: C.cgpo_calibrated_reward(r, b, f),
                               lambda s: [_n(s, (B,)), _n(s + 1, (B,)), _rng(s).integers(0, 2, B).astype(bool)], None),
    "region_consistency_reward": (lambda st, en, v: C.region_consistency_reward(st, en, np.ones(B, bool), GID, NG,
                                                                               grid=8, valid=v),
                                  lambda s: [_rng(s).integers(0, 4, B).astype(np.int32),
                                             _rng(s).integers(3, 8, B).astype(np.int32), np.ones(B, bool)], 2),
    "self_play_win_rate": (lambda p, v: C.self_play_win_rate(p, GID, NG, valid=v),
                           lambda s: [_rng(s).uniform(0, 1, (B, B)).astype(np.float32), np.ones(B, bool)], 1),
})
# every DPO-family loss is its own function with the dpo_loss signature (lengths used by ipo / sigmoid_norm)
for _name in ("sigmoid_dpo_loss", "robust_dpo_loss", "ipo_loss", "sigmoid_norm_loss", "hinge_loss", "sppo_hard_loss",
              "nca_pair_loss", "exo_pair_loss", "bco_pair_loss", "apo_zero_loss", "apo_down_loss", "discopop_loss"):
    R[_name] = (lambda *a, _f=getattr(C, _name): _f(*a), lambda s: pairs(s) + lengths(s), None)
R["gated_distillation_advantages"] = (
    lambda a, o, t, m: C.gated_distillation_advantages(a, o, t, m, np.array([1, 0, 1, 1, 0, 0], bool), coef=0.5),
    lambda s: [_n(s, (B, T)), _lp(s), _lp(s + 1), _mask(s)], 3)
R["mpo_easy_pairs"] = (lambda c, r: C.mpo_easy_pairs(c, r, threshold=0.5), lambda s: [_n(s, (B,)), _n(s + 1, (B,))],
                       None)
R["rationale_dpo_loss"] = (lambda a, b, c, d, e: C.rationale_dpo_loss(a, b, c, d, e), lambda s: pairs(s, 5), None)
R["c3po_loss"] = (lambda a, b, c, d, n: C.c3po_loss(a, b, c, d, n, np.array([0, 1, 2, 0, 1, 2], np.int32)),
                  lambda s: pairs(s) + lengths(s)[:1], None)
# outcome advantage estimators share one signature
for _name in ("grpo_advantages", "dr_grpo_advantages", "rloo_advantages", "reinforce_pp_baseline_advantages",
              "opo_advantages", "grpo_passk_advantages", "gpg_advantages", "lite_ppo_advantages", "bnpo_advantages",
              "ngrpo_advantages"):
    R[_name] = (lambda s, m, _f=getattr(C, _name): _f(s, m, GID, NG), outcome, 1)

# TreePO: GID's three prompts, each splitting into two subtrees at depth 1 (ids dense per column)
_TREE_IDS = np.stack([GID, np.array([0, 1, 2, 3, 4, 5]), np.array([0, -1, 1, 2, -1, 3])], 1).astype(np.int32)
R["treepo_advantages"] = (lambda s, m: C.treepo_advantages(s, _TREE_IDS, m), outcome, 1)

# curricula (arms / candidates along the batch axis)
R["td_update"] = (lambda q, r, o: C.td_update(q, r, o, 0.5),
                  lambda s: [_n(s, (B,)), _n(s + 1, (B,)), _rng(s).integers(0, 2, B).astype(bool)], 2)
R["boltzmann_probs"] = (lambda q, a: C.boltzmann_probs(q, a, 0.7),
                        lambda s: [_n(s, (B,)), _rng(s).integers(0, 2, B).astype(bool)], 1)
R["variance_promotion_score"] = (lambda p, d: C.variance_promotion_score(p, d, outcome_weight=0.8, diversity_weight=0.2),
                                 lambda s: [_rng(s).uniform(0, 1, B).astype(np.float32),
                                            _rng(s + 1).uniform(0, 1, B).astype(np.float32)], None)
R["uncertainty_priority"] = (lambda p: C.uncertainty_priority(p), lambda s: [_rng(s).uniform(0, 1, B).astype(np.float32)],
                             None)
R["kl_adaptive_forgetting"] = (lambda d: C.kl_adaptive_forgetting(d), lambda s: [np.abs(_n(s, (B,))) * 0.1], None)
R["mean_abs_logp_change"] = (C.mean_abs_logp_change, lambda s: [_lp(s), _lp(s + 1), _mask(s)], 2)
R["beta_tracker_update"] = (C.beta_tracker_update,
                            lambda s: [_rng(s).uniform(0.5, 3, B).astype(np.float32),
                                       _rng(s + 1).uniform(0.5, 3, B).astype(np.float32),
                                       _rng(s).integers(0, 2, B).astype(np.float32),
                                       _rng(s).uniform(0.875, 0.96, B).astype(np.float32)], None)
R["single_stream_advantages"] = (lambda sc, b, m: C.single_stream_advantages(sc, b, m),
                                 lambda s: [_scores(s), _rng(s).uniform(0, 1, B).astype(np.float32), _mask(s)], 2)

EXEMPT = {
    "AGG_MODES": "constant", "AggMode": "type alias", "KL_ESTIMATORS": "constant", "KLControllerState": "NamedTuple",
    "PreferenceOutput": "NamedTuple", "DPO_LOSS_TYPES": "constant", "CPO_LOSS_TYPES": "constant",
    "DPO_LOSSES": "constant (loss_type -> function)",
    "GroupStats": "NamedTuple", "COMMON_METRICS": "constant",
    "dense_group_ids": "host-side helper over Python uids (not an array function); tested in test_shaping_stats",
    "curriculum_budget": "host-side schedule of a Python step (not an array function); tested in test_reward_shaping",
    "stage_schedule": "host-side schedule of a Python step (not an array function); tested in test_schedules",
    "epo_phase_weight": "host-side float schedule of a Python step (not an array function); tested in "
                        "test_policy_losses",
    "brpo_budget_prior": "a constant vector of a Python int and a name (not an array function); tested in "
                         "test_group_advantages",
    "r2vpo_dual_step": "host-side float update of R2VPO's multiplier (not an array function); tested in "
                       "test_batch_losses",
    "interleaved_length_cap": "host-side schedule of a Python step (not an array function); tested in "
                              "test_reward_shaping",
    **{n: "host-side integer program (NumPy, the shapes of the next rollout); tested in test_allocation"
       for n in ("knapsack_value", "knapsack_solve", "knapsack_allocate", "gvm_sample_ratios", "round_preserving_sum")},
}


def test_every_public_name_is_covered():
    public = set(C.__all__)
    assert not (set(R) - public), f"battery entries for unknown names: {set(R) - public}"
    missing = public - set(R) - set(EXEMPT)
    assert not missing, f"public functions without a battery entry: {sorted(missing)}"


def _leaves(out):
    return [np.asarray(x) for x in jax.tree.leaves(out) if not jax.dtypes.issubdtype(jnp.asarray(x).dtype, jax.dtypes.prng_key)]


@pytest.mark.parametrize("name", sorted(R))
def test_jit_equals_eager(name):
    fn, make, _ = R[name]
    args = make(1)
    eager, jitted = _leaves(fn(*args)), _leaves(jax.jit(fn)(*args))
    assert len(eager) == len(jitted) > 0
    for a, b in zip(eager, jitted):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(R))
def test_vmap_matches_separate_calls(name):
    fn, make, _ = R[name]
    a1, a2 = make(2), make(3)
    stacked = [jnp.stack([jnp.asarray(x), jnp.asarray(y)]) if not isinstance(x, jax.Array) or not
               jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else jnp.stack([x, y]) for x, y in zip(a1, a2)]
    out = _leaves(jax.vmap(fn)(*stacked))
    ref = _leaves(fn(*a2))
    for o, r in zip(out, ref):
        np.testing.assert_allclose(o[1], r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(R))
def test_bf16_inputs_give_finite_float_outputs(name):
    fn, make, _ = R[name]
    args = [jnp.asarray(x, jnp.bfloat16) if isinstance(x, (np.ndarray, np.floating)) and x.dtype == np.float32
            else x for x in make(4)]
    for leaf in _leaves(fn(*args)):
        if np.issubdtype(leaf.dtype, np.floating):
            assert leaf.dtype == np.float32, f"{name} returned {leaf.dtype} for bf16 inputs"
            assert np.all(np.isfinite(leaf))


@pytest.mark.parametrize("name", sorted(n for n in R if R[n][2] is not None))
def test_all_masked_batch_is_finite(name):
    fn, make, mi = R[name]
    args = make(5)
    args[mi] = np.zeros_like(args[mi])
    for leaf in _leaves(fn(*args)):
        if np.issubdtype(leaf.dtype, np.floating):
            assert np.all(np.isfinite(leaf)), name


_GARBAGE = {"large": lambda shape: np.where(np.arange(np.prod(shape)).reshape(shape) % 2, 3e4, -3e4),
            "inf": lambda shape: np.where(np.arange(np.prod(shape)).reshape(shape) % 2, np.inf, -np.inf),
            "nan": lambda shape: np.full(shape, np.nan)}


def _with_garbage(args, mi, kind):
    """Copy of ``args`` with every float input shaped like the mask overwritten where the mask is 0."""
    m = np.asarray(args[mi])
    out = list(args)
    for i, x in enumerate(args):
        if i == mi or not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.shape != m.shape:
            continue
        out[i] = np.where(m > 0, x, _GARBAGE[kind](x.shape)).astype(np.float32)
    return out


def _visible(out, m):
    """Output leaves as seen by a caller: ``[B, T]`` (or ``[B]``) leaves only where the mask is set."""
    return [np.where(m > 0, x, 0.0) if x.shape == m.shape else x for x in _leaves(out)
            if np.issubdtype(x.dtype, np.floating)]


@pytest.mark.parametrize("kind", sorted(_GARBAGE))
@pytest.mark.parametrize("name", sorted(n for n in R if R[n][2] is not None))
def test_values_under_the_mask_change_nothing_and_get_zero_gradient(name, kind):
    """masked == filtered in its strongest form: whatever sits under the mask (huge, +-inf, NaN)
    changes no visible output and receives an exactly zero, finite gradient."""
    fn, make, mi = R[name]
    args = make(6)
    m = np.asarray(args[mi])
    if m.ndim == 2:
        m[0, -1] = 0.0  # at least one masked position
    else:
        m[0] = False
    args[mi] = m
    bad = _with_garbage(args, mi, kind)
    for a, b in zip(_visible(fn(*args), m), _visible(fn(*bad), m)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=name)
    diff = [i for i, x in enumerate(bad) if isinstance(x, np.ndarray) and x.dtype == np.float32
            and x.shape == m.shape and i != mi]

    def scalar(*xs):
        full = list(bad)
        for i, x in zip(diff, xs):
            full[i] = x
        leaves = [jnp.where(m > 0, x, 0.0) if x.shape == m.shape else x for x in jax.tree.leaves(fn(*full))
                  if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
        return sum(jnp.sum(x) for x in leaves)

    has_float = any(np.issubdtype(x.dtype, np.floating) for x in _leaves(fn(*bad)))
    grads = jax.grad(scalar, argnums=tuple(range(len(diff))))(*[bad[i] for i in diff]) if diff and has_float else ()
    for g in grads:
        g = np.asarray(g)
        assert np.all(np.isfinite(g)), f"{name}: non-finite gradient"
        assert np.all(g[m == 0] == 0), f"{name}: gradient under the mask"

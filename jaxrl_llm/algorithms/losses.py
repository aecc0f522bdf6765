"""Policy surrogates, KL estimators and controllers, importance-weight corrections and rollout
rejection, as registered parts.

* ``recipe.loss=<name>`` (:data:`SURROGATES`): ``fn(logp, old_logp, advantages, mask, *,
  is_weights=None, [key=], **params) -> (per_token [N, T], metrics)``, the core policy losses.
* ``recipe.kl.estimator=<name>`` (:data:`KL_ESTIMATORS`): the per-token estimator of
  :func:`jaxrl_llm.core.kl_penalty` (``fn(logp, ref_logp) -> [N, T]``); a ``+`` suffix is the
  straight-through variant (its value, the gradient of ``k2``).
* ``recipe.kl.controller=<name>`` (:data:`KL_CONTROLLERS`): ``fn(coef, **params) ->
  KLController``, an ``(init, update)`` pair (:mod:`jaxrl_llm.core.kl`); the loop carries its
  state in the checkpoint and updates it once per iteration with the batch's KL.
* ``recipe.is_weights=<name>`` (:data:`IS_CORRECTIONS`): ``fn(logp, rollout_logp, mask,
  **params) -> (weights [N, T], metrics)``, truncated importance sampling against the
  sampler-trainer mismatch (weights multiply each token's loss).
* ``recipe.rejection=<name>`` (:data:`REJECTIONS`): ``fn(logp, rollout_logp, mask, **params)
  -> (mask [N, T], metrics)``, tokens or sequences whose mismatch is too large leave the loss.

The last two compare the trainer's log-probs before the update (``recipe.old_logp=recompute``)
with the sampler's; without a recompute they would compare a thing with itself.
"""

from __future__ import annotations

import functools

import jaxrl_llm.core as core
from jaxrl_llm.algorithms.registry import Part, new_registry

__all__ = ["SURROGATES", "AGGREGATIONS", "KL_ESTIMATORS", "KL_CONTROLLERS", "IS_CORRECTIONS", "REJECTIONS",
           "LOSS_INPUT_SHAPES", "reinforce_surrogate", "epo_surrogate", "icpo_surrogate"]

SURROGATES = new_registry("policy loss", "recipe.loss",
                          "fn(logp, old_logp, advantages, mask, *, is_weights=None, [inputs in requires], **params) -> "
                          "(per_token [N, T], metrics); coupled: (loss scalar over the batch, metrics)")

#: batch columns a surrogate may read (``Part.requires``), passed as keyword arguments of that name,
#: with their shapes for ``N`` rows of ``T`` target-aligned positions: ``scores [N]`` the shaped
#: sequence rewards, ``group_ids [N]`` the prompt of each row (dense in the mini-batch, whose groups
#: are whole when a surrogate reads them), ``old_entropy [N, T]`` the sampling policy's token entropy
#: (a provider: :mod:`jaxrl_llm.training.providers`), ``hinted [N]`` the rows
#: a plain-context hint part re-sampled (the loop marks them)
LOSS_INPUT_SHAPES = {"scores": lambda n, t: ((n,), "float32"), "group_ids": lambda n, t: ((n,), "int32"),
                     "old_entropy": lambda n, t: ((n, t), "float32"),
                     # PAPO: log-probs of the sampled tokens under the policy given a masked prompt
                     "masked_logp": lambda n, t: ((n, t), "float32"),
                     # ROVER: the sampling policy's vocabulary-mean log-prob at each position (the current
                     # policy's comes with the surrogate flag mean_logp, as mean_logp=)
                     "old_mean_logp": lambda n, t: ((n, t), "float32"),
                     # 1 on the rows sampled with a hint and trained after the plain prompt (Guide)
                     "hinted": lambda n, t: ((n,), "float32"),
                     # each reward function's score (the config-time trial assumes up to 8 functions)
                     "component_scores": lambda n, t: ((n, 8), "float32"),
                     # EPO: each response token's turn-level historical entropy, and the phase weight (every row
                     # the same): the loop part of recipe.loss=epo writes them
                     "epo_entropy_ref": lambda n, t: ((n, t), "float32"),
                     "epo_phase_weight": lambda n, t: ((n,), "float32"),
                     # AlignDistil: the teacher's log-prob of each sampled token and its per-token weight
                     "teacher_logp": lambda n, t: ((n, t), "float32"),
                     "teacher_weight": lambda n, t: ((n, t), "float32"),
                     # Nash-MD: the reference policy's log-probs (its KL by REINFORCE)
                     "ref_logp": lambda n, t: ((n, t), "float32"),
                     # R2VPO's dual variable, every row the same (the loop part recipe.loss=r2vpo keeps it)
                     "r2vpo_lambda": lambda n, t: ((n,), "float32")}
_T = "tests/core/test_policy_losses.py, tests/conformance/test_verl_conformance.py"
_T_TRL = _T + ", tests/conformance/test_trl_grpo.py"


def _aligndistil(logp, old_logp, advantages, mask, *, teacher_logp, teacher_weight, beta: float = 0.1,
                 beta2: float = 15.0, is_weights=None):
    """:func:`jaxrl_llm.core.aligndistil_loss`; ``beta2`` (the teacher's TV scale) is read by the
    loop's teacher pass."""
    del beta2
    return core.aligndistil_loss(logp, old_logp, advantages, mask, teacher_logp=teacher_logp,
                                 teacher_weight=teacher_weight, beta=beta, is_weights=is_weights)


def icpo_surrogate(logp, old_logp, advantages, mask, hinted, *, gamma: float = 0.1, clip_low: float = 0.2,
                   clip_high: float | None = None, dual_clip: float | None = 3.0, is_weights=None):
    """ICPO's loss (the authors' ``compute_icpo_policy_loss``): PPO's clip with verl's dual clip
    (3.0) on the policy's own rows, ``-A p / (p + gamma)`` on the demonstration-guided rows
    (``hinted``, trained after the plain question): :func:`jaxrl_llm.core.critique_grpo_loss`
    with ``clip=True``."""
    return core.critique_grpo_loss(logp, old_logp, advantages, mask, hinted, gamma=gamma, clip=True, clip_low=clip_low,
                                   clip_high=clip_high, dual_clip=dual_clip, is_weights=is_weights)


def epo_surrogate(logp, old_logp, advantages, mask, *, entropy, old_entropy, epo_entropy_ref, epo_phase_weight,
                  entropy_coef: float = 0.001, smooth_coef: float = 1.0, penalty: float = 0.1, band_low: float = 0.8,
                  band_high: float = 1.2, phase_steps: int | None = None, clip_low: float = 0.2,
                  clip_high: float | None = None, dual_clip: float | None = 3.0, smooth: str = "hinge",
                  is_weights=None):
    """:func:`jaxrl_llm.core.epo_loss` in the registry's convention: ``old_entropy`` is the
    sampling policy's entropy the loop part's history is made of, ``phase_steps`` the length of
    the phase-weight schedule (read by the loop part; unset: weight 1)."""
    del old_entropy, phase_steps
    return core.epo_loss(logp, old_logp, advantages, mask, entropy=entropy, epo_entropy_ref=epo_entropy_ref,
                         epo_phase_weight=epo_phase_weight, entropy_coef=entropy_coef, smooth_coef=smooth_coef,
                         penalty=penalty, band_low=band_low, band_high=band_high, clip_low=clip_low,
                         clip_high=clip_high, dual_clip=dual_clip, smooth=smooth, is_weights=is_weights)


def reinforce_surrogate(logp, old_logp, advantages, mask, *, is_weights=None):
    """Plain REINFORCE ``-A logp`` in the surrogate calling convention (``old_logp`` only
    feeds the ratio metrics): :func:`jaxrl_llm.core.reinforce_loss`."""
    return core.reinforce_loss(logp, advantages, mask, old_logp=old_logp, is_weights=is_weights)


for _part in (
    Part("ppo", core.ppo_clip_loss, paper="PPO (Schulman et al.), arXiv:1707.06347; clip-higher: DAPO, "
                                          "arXiv:2503.14476; dual clip: arXiv:1912.09729",
         core=("ppo_clip_loss",), defaults=(("clip_low", 0.2),), verified="verl, TRL", tests=_T_TRL,
         note="clip_high defaults to clip_low; dual_clip 3.0 is verl's default (None: the plain PPO objective)"),
    Part("gppo", core.gppo_loss, paper="Klear-Reasoner / GPPO (Su et al.), arXiv:2508.07629", core=("gppo_loss",),
         methods=(74,), verified="paper identity, hand values", tests="tests/core/test_policy_losses.py",
         note="the paper's objective has no dual clip (dual_clip=None); 3.0 is the authors' code default"),
    Part("guide", core.guide_loss, paper="Adaptive Guidance Accelerates Reinforcement Learning of Reasoning Models "
                                         "(Guide; Nath et al.), arXiv:2506.13923",
         core=("guide_loss", "masked_row_quantile"), requires=frozenset({"hinted"}), methods=(263,),
         verified="hand values (the authors' code's rule and worked example)", tests="tests/core/test_guide_loss.py",
         note="with recipe.hints=guide: PPO clip on plain rows; on the rows sampled with a hint the ratio between the "
              "plain and the hinted context, reshaped r/(r + gamma), gamma = its 0.9 percentile over the row's "
              "tokens (the code: over the micro-batch's hinted positions, padding included), unclipped"),
    Part("critique_grpo", core.critique_grpo_loss,
         paper="Critique-GRPO: Advancing LLM Reasoning with Natural Language and Numerical Feedback (Zhang et al.), "
               "arXiv:2506.03106",
         core=("critique_grpo_loss",), requires=frozenset({"hinted"}), methods=(225,),
         verified="hand values, identity (no refinement rows, clip: PPO clip); a transcription of the authors' code "
                  "(zhangxy-2019/critique-GRPO @e8f03a2)",
         tests="tests/core/test_policy_losses.py, tests/conformance/test_critique_grpo.py",
         flags=(("hinted_old_logp", False),),
         note="with recipe.hints=critique_grpo: -A rho (unclipped, the scripts' loss_remove_clip) on the own rows, "
              "-A p / (p + 0.1) on the refinement row of each group (sampled after the critique, trained after the "
              "question)"),
    Part("icpo", icpo_surrogate,
         paper="Think Outside the Policy: In-Context Steered Policy Optimization (ICPO), arXiv:2510.26519",
         core=("critique_grpo_loss",), requires=frozenset({"hinted"}), methods=(22,),
         verified="hand values, identity (no guided rows: PPO clip with the dual clip); a transcription of the "
                  "authors' code (Celine-hxy/ICPO @287ac48)",
         tests="tests/core/test_policy_losses.py, tests/conformance/test_icpo_authors.py",
         flags=(("hinted_old_logp", False),),
         note="with recipe.hints=icpo: PPO clip 0.2 and dual clip 3 on the own rows, -A p / (p + 0.1) on the rows "
              "sampled with demonstrations in context and trained after the plain question"),
    Part("papo", core.papo_loss, paper="Perception-Aware Policy Optimization for Multimodal Reasoning (PAPO; Wang "
                                       "et al.), arXiv:2507.06448",
         core=("papo_loss",), requires=frozenset({"masked_logp"}), methods=(8,),
         verified="hand values, paper identity (gamma = eta = 0: PPO clip); the authors' code's k3 form and clamps "
                  "(MikeWangWZHL/PAPO @fb63bf4)",
         tests="tests/core/test_policy_losses.py, tests/training/test_papo.py, tests/conformance/test_papo_authors.py",
         note="PPO clip - gamma k3-KL(policy || policy given a masked prompt) + double entropy (eta_ori, eta_aug); the "
              "image's masked patches become prompt tokens replaced by the pad token with probability mask_prob "
              "(0.6), fresh each step; gamma 0.01, eta off (the authors' defaults)"),
    Part("rover", core.rover_loss, paper="Random Policy Valuation is Enough for LLM Reasoning with Verifiable Rewards "
                                         "(ROVER; He et al.), arXiv:2505.17618",
         core=("rover_loss",), requires=frozenset({"old_mean_logp"}), methods=(204,),
         verified="hand values, paper identity (next_scale 0: squared error of the log-ratio against the advantage); "
                  "a transcription of the authors' code (yuxiaooye/ROVER @ea5ce63)",
         tests="tests/core/test_policy_losses.py, tests/training/test_rover.py, tests/conformance/test_rover_authors.py",
         flags=(("mean_logp", True),),
         note="(rho log-ratio - sg(A + rho (mean_v log pi - mean_v log pi_old) at the next position))^2: the log-ratio as "
              "the uniform random policy's Q-value, regressed on a one-step Bellman target; rho 1, GRPO advantage; "
              "the optional clip off (the authors' scripts); not reproduced: the Countdown runs' batch-level reward "
              "centring (the Math runs use GRPO's)"),
    Part("epo", epo_surrogate, paper="EPO: Entropy-regularized Policy Optimization for LLM Agents "
                                                "Reinforcement Learning (Xu et al.), arXiv:2509.22576",
         core=("epo_loss", "epo_phase_weight"),
         requires=frozenset({"old_entropy", "epo_entropy_ref", "epo_phase_weight"}), methods=(203,),
         verified="hand values, paper identity (coefficients 0: PPO clip); the authors' code's defaults, history "
                  "and phase weight (WujiangXu/EPO @5b6fa98)",
         tests="tests/core/test_policy_losses.py, tests/training/test_epo.py, tests/conformance/test_epo_authors.py", flags=(("entropy", True),),
         note="PPO clip - 0.001 H + the smoothing hinge outside [0.8, 1.2] x each turn's historical entropy (x 0.1, "
              "x the phase weight over phase_steps when set); the released penalty is a constant without gradient: "
              "ours is a hinge on the entropy (our decision, docstring); the history is a loop part, checkpointed"),
    Part("entropy_balanced", core.entropy_balanced_loss,
         paper="Agentic Entropy-Balanced Policy Optimization (AEPO, agentic; Dong et al.), arXiv:2510.14545",
         core=("entropy_balanced_loss",), methods=(72,),
         verified="hand values, paper identity (both parts off: PPO clip); the authors' code's rule and constants "
                  "(RUC-NLPIR/ARPO @81e3a5d)",
         tests="tests/core/test_policy_losses.py, tests/conformance/test_aepo_agentic.py", flags=(("entropy", True),),
         note="advantage x (1 + 0.2 x the token entropy standardised over the batch), and above 1 + eps_high a "
              "clipped ratio (1 + eps) rho / sg(rho) that keeps the token's gradient; not reproduced: the rollout "
              "side (entropy pre-monitoring of global vs branch samples, the consecutive-branch penalty)"),
    Part("aligndistil", _aligndistil, paper="AlignDistil: Token-Level Language Model Alignment as Adaptive Policy "
                                            "Distillation (Zhang et al.), arXiv:2503.02832",
         core=("aligndistil_loss", "aligndistil_teacher"), requires=frozenset({"teacher_logp", "teacher_weight"}),
         methods=(230,),
         verified="hand values, the score-function identity (the expectation over sampled tokens is the exact "
                  "reverse KL's gradient); the teacher and w from the authors' code (songmzhang/AlignDistil @f80ca4e)",
         tests="tests/core/test_policy_losses.py, tests/training/test_aligndistil.py, tests/conformance/test_aligndistil_authors.py",
         note="on-policy distillation to z* = z_dpo + w (z_dpo - z_rdpo), w = beta2 TV(pi_dpo, pi_rdpo) + 1e-3, loss "
              "(beta / w) x the reverse KL on the sampled tokens (the authors: the full vocabulary); the DPO model is "
              "model.aux_params, the reverse-DPO model model.reverse_params; advantages unused (no reward)"),
    Part("nash_md", core.nash_md_loss, paper="Nash Learning from Human Feedback (Nash-MD; Munos et al.), "
                                             "arXiv:2312.00886",
         core=("nash_md_loss", "nash_md_preference"), requires=frozenset({"ref_logp"}), methods=(200,),
         verified="TRL (a transcription of NashMDTrainer._compute_losses @054a0dab), hand values",
         tests="tests/core/test_policy_losses.py, tests/conformance/test_trl_nash_md.py, tests/training/test_nash_md.py",
         note="REINFORCE on P(y > y') - 1/2 plus beta x the score-function KL to the reference, seq-mean-token-sum; "
              "with recipe.advantage=nash_md and recipe.loop_part=nash_md (the preset recipe.name=nash_md)"),
    Part("gspo", core.gspo_loss, paper="Group Sequence Policy Optimization (Zheng et al.), arXiv:2507.18071",
         core=("gspo_loss",), defaults=(("clip_low", 3e-4), ("clip_high", 4e-4)), verified="verl, TRL",
         tests=_T_TRL, note="variant='sequence' is GSPO proper, 'token' (default) GSPO-token"),
    Part("cispo", core.cispo_loss, paper="MiniMax-M1 (CISPO), arXiv:2506.13585", core=("cispo_loss",),
         verified="verl, TRL", tests=_T_TRL, note="the paper disables the lower bound: clip_low=1.0"),
    Part("sapo", core.sapo_loss, paper="Soft Adaptive Policy Optimization, arXiv:2511.20347", core=("sapo_loss",),
         verified="verl, TRL", tests=_T_TRL),
    Part("gpg", core.gpg_loss, paper="GPG (Chu et al.), arXiv:2504.02546", core=("gpg_loss",), verified="verl",
         tests=_T),
    Part("reinforce", reinforce_surrogate, paper="Williams (1992), REINFORCE", core=("reinforce_loss",),
         verified="verl", tests=_T),
    Part("clip_cov", core.clip_cov_loss, paper="The Entropy Mechanism of RL for Reasoning LMs (Cui et al.), "
                                               "arXiv:2505.22617",
         core=("clip_cov_loss",), verified="verl", tests=_T, flags=(("needs_key", True),)),
    Part("kl_cov", core.kl_cov_loss, paper="The Entropy Mechanism of RL for Reasoning LMs (Cui et al.), "
                                           "arXiv:2505.22617",
         core=("kl_cov_loss",), verified="verl", tests=_T),
    Part("gmpo", core.gmpo_loss, paper="Geometric-Mean Policy Optimization (Zhao et al.), arXiv:2507.20673",
         core=("gmpo_loss",), verified="verl, TRL", tests=_T_TRL),
    Part("dro", core.dro_loss, paper="verl's 'dro' policy loss (a quadratic log-ratio penalty to the sampling "
                                     "policy), after Direct Reward Optimisation (Richemond et al.), arXiv:2405.19107",
         core=("dro_loss",), verified="verl", tests=_T,
         note="verl's form, not the paper's objective: see the core docstring (beta has no default)"),
    Part("dppo_tv", core.dppo_tv_loss, paper="Rethinking the Trust Region in LLM RL (Qi et al.), arXiv:2602.04879",
         core=("dppo_tv_loss",), verified="verl", tests=_T),
    Part("dppo_kl", core.dppo_kl_loss, paper="Rethinking the Trust Region in LLM RL (Qi et al.), arXiv:2602.04879",
         core=("dppo_kl_loss",), verified="verl", tests=_T),
):
    SURROGATES.register(_part)

def _hdpo(logp, old_logp, advantages, mask, *, component_scores, group_ids, answer_index: int = 0,
          format_index: int | None = None, calls_index: int = 1, answer_weight: float = 0.9,
          correct_threshold: float = 1.0, w_acc: float = 1.0, w_tool: float = 0.15, clip_low: float = 0.2,
          clip_high: float | None = None, dual_clip: float | None = 3.0, is_weights=None):
    """HDPO from the run's reward functions: ``answer_index`` (correctness), ``format_index``
    (optional; else the format channel is 1) and ``calls_index`` (tool calls) select columns of
    ``component_scores``; both channels (:func:`jaxrl_llm.core.hdpo_advantages`) feed
    :func:`jaxrl_llm.core.hdpo_loss`."""
    import jax.numpy as jnp

    k = component_scores.shape[1]
    for name, idx in (("answer_index", answer_index), ("format_index", format_index), ("calls_index", calls_index)):
        if idx is not None and not 0 <= idx < k:
            raise ValueError(f"recipe.loss.{name}={idx} but the run has {k} reward functions")
    c = component_scores
    fmt = jnp.ones(c.shape[0], jnp.float32) if format_index is None else c[:, format_index]
    valid = jnp.any(mask, axis=1)
    a_acc, a_tool = core.hdpo_advantages(c[:, answer_index], fmt, c[:, calls_index], group_ids, c.shape[0],
                                         answer_weight=answer_weight, correct_threshold=correct_threshold,
                                         valid=valid)
    return core.hdpo_loss(logp, old_logp, a_acc[:, None] * mask, mask, tool_advantages=a_tool, w_acc=w_acc,
                          w_tool=w_tool, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
                          is_weights=is_weights)


# the seed papers' surrogates (jaxrl_llm.core.batch_losses); "coupled": a loss over the whole
# mini-batch (the train step's two-pass form), reading the columns in ``requires``
_TB = "tests/core/test_batch_losses.py, tests/training/test_paper_losses.py"
_GROUP_COLS = frozenset({"scores", "group_ids"})
for _part in (
    Part("bapo", core.bapo_loss, paper="BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced "
                                       "Policy Optimization with Adaptive Clipping (Xi et al.), arXiv:2510.18927",
         core=("bapo_loss", "bapo_bounds"), methods=(61,), verified="hand values, paper identity", tests=_TB,
         flags=(("coupled", True),),
         note="bounds searched per mini-batch (paper: upper first, share 0.4; order=low_first target_kind=ratio "
              "target=1 low_max=0.8 low_step=0.05 high_max=2.0: the released config); useful with several "
              "mini-batches per rollout (off-policy), on-policy the ratio is 1 and no bound matters"),
    Part("disco", core.disco_loss, paper="DisCO: Reinforcing Large Reasoning Models with Discriminative Constrained "
                                         "Optimization (Li et al.), arXiv:2505.12366",
         core=("disco_loss",), requires=_GROUP_COLS, methods=(140,), verified="hand values, paper identity",
         tests=_TB, flags=(("coupled", True),),
         note="binary scores (1 positive, 0 negative); ignores the advantages; objective=disco_b for the "
              "mean-difference form, score=Lratio for the ratio score"),
    Part("drpo", core.drpo_loss, paper="DRPO: Efficient Reasoning via Decoupled Reward Policy Optimization, "
                                       "arXiv:2510.04474",
         core=("drpo_loss",), requires=_GROUP_COLS, methods=(162,), verified="hand values, paper identity", tests=_TB,
         flags=(("coupled", True),), note="DisCO-logL with length weights exp((1 - L/L_max)/lam) among the correct"),
    Part("thinkless", core.thinkless_loss, paper="Thinkless: LLM Learns When to Think (Fang et al.), arXiv:2505.13379",
         core=("thinkless_loss",), methods=(136,), verified="hand values", tests=_TB, flags=(("coupled", True),),
         note="the first response token (the mode-control token) weighted alpha and averaged separately; with "
              "recipe.shaping=thinkless for the mode-dependent reward"),
    Part("p3o", core.p3o_loss, paper="Pairwise Proximal Policy Optimization: Harnessing Relative Feedback for LLM "
                                     "Alignment (Wu et al.), arXiv:2310.00212",
         core=("p3o_loss",), requires=_GROUP_COLS, methods=(82,), verified="hand values, paper identity", tests=_TB,
         flags=(("coupled", True),),
         note="pairs within each prompt group, trajectory-level ratios; the clipped forms (separate / joint) are our "
              "reading of the paper (no code released)"),
    Part("hapo", core.hapo_loss, paper="From Uniform to Heterogeneous: Tailoring Policy Optimization to Every Token's "
                                       "Nature (HAPO), arXiv:2509.16591",
         core=("hapo_loss", "hapo_entropy_hat"), requires=frozenset({"old_entropy"}), methods=(3,),
         verified="hand values", tests=_TB, flags=(("coupled", True),),
         note="entropy-adaptive clip bounds and advantage redistribution, the sampling policy's entropy normalised "
              "over the mini-batch; sign=code reproduces the released normalisation"),
    Part("hdpo", _hdpo, paper="Act Wisely: Cultivating Meta-Cognitive Tool Use in Agentic Multimodal Models "
                              "(Metis / HDPO), arXiv:2604.08545",
         core=("hdpo_loss", "hdpo_advantages"), requires=frozenset({"component_scores", "group_ids"}),
         methods=(164,), verified="hand values, paper identity (w_tool = 0: GRPO on r_acc)", tests=_TB,
         flags=(("coupled", True),),
         note="both advantage channels from the reward functions by index (answer, optional format, tool-call "
              "count); the estimator's advantages are not used"),
    Part("etr", core.etr_loss, paper="ETR: Outcome-Guided Elastic Trust Regions for Policy Optimization (Zhang et "
                                     "al.), arXiv:2601.03723",
         core=("etr_loss",), requires=_GROUP_COLS, methods=(45,), verified="hand values, paper identity (alpha = beta "
                                                                            "= 0: PPO clip)",
         tests=_TB, flags=(("coupled", True),),
         note="clip bounds eps (1 + alpha min(|A|, adv_cap)) (1 + beta 4 p (1 - p)), p the group's pass rate; the "
              "paper's functional form and constants were not available (abstract only): alpha and beta have no "
              "default; aggregation agg (GRPO's seq-mean-token-mean by default)"),
    Part("r2vpo", core.r2vpo_loss, paper="Ratio-Variance Regularized Policy Optimization for Efficient LLM "
                                         "Fine-tuning (R2VPO; Luo et al.), arXiv:2601.03320",
         core=("r2vpo_loss", "r2vpo_dual_step"), requires=frozenset({"r2vpo_lambda"}), methods=(26,),
         verified="hand values, paper identity (lambda = 0: the unclipped policy gradient)", tests=_TB
         + ", tests/training/test_r2vpo_dual.py", flags=(("coupled", True),),
         note="no clip: -rho A + lambda (Var(rho) - delta) over the mini-batch's tokens; lambda is a dual variable "
              "the loop moves once per step (lambda <- max(0, lambda + lambda_lr (Var - delta)), from lambda_init) "
              "and checkpoints; delta has no default (the paper's value was not found); pair it with recipe.epochs "
              "> 1 or several mini-batches, on-policy the ratio is 1"),
    Part("vppo", core.vppo_loss, paper="Spotlight on Token Perception for Multimodal Reinforcement Learning (VPPO), "
                                       "arXiv:2510.09285",
         core=("vppo_loss",), requires=frozenset({"masked_logp"}), methods=(48,),
         verified="hand values, paper identity (beta_min = 1, top_frac = 1: PPO clip); the authors' code's "
                  "estimator and normalisation (huaixuheqing/VPPO-RL @a23c54b)",
         tests=_TB + ", tests/conformance/test_vppo.py", flags=(("coupled", True),),
         note="advantages re-weighted by each response's dependency on its prompt (k3 KL to the policy given a "
              "masked prompt, mean 1 over the mini-batch, from beta_min 0.9) and the loss kept on each response's 40% "
              "most dependent tokens; the image becomes the prompt (tokens masked with p = mask_prob 0.5)"),
    Part("mdpo", core.mdpo_loss, paper="Mirror Descent Policy Optimization (Tomar et al.), arXiv:2005.09814",
         core=("mdpo_loss",), methods=(94,), verified="hand values, paper identity", tests=_TB,
         note="no clipping; (1/t) KL(pi || pi_old) per token; use with several epochs (recipe.epochs)"),
):
    SURROGATES.register(_part)


# ------------------------------------------------------------------------------------ aggregation

AGGREGATIONS = new_registry("aggregation mode", "recipe.agg",
                            "aggregate_sum_weight(per_token, mask, mode=<name>, horizon) -> (sum, weight)")
_AGG_T = "tests/core/test_aggregation.py, tests/conformance/test_verl_conformance.py, tests/training/test_step.py"
for _name, _paper, _note in (
        ("token-mean", "DAPO (Yu et al.), arXiv:2503.14476", "every token of the batch weighs the same"),
        ("token-sum", "", "the sum over tokens (no normalisation)"),
        ("seq-mean-token-mean", "DeepSeekMath / GRPO (Shao et al.), arXiv:2402.03300",
         "each sequence's token mean, averaged over sequences"),
        ("seq-mean-token-sum", "ReMax (Li et al.), arXiv:2310.10505", "each sequence's token sum, averaged"),
        ("seq-mean-token-sum-norm", "Understanding R1-Zero-Like Training (Dr.GRPO), arXiv:2503.20783",
         "token sums over a constant horizon (recipe.horizon, default the response length)")):
    AGGREGATIONS.register(Part(_name, functools.partial(core.aggregate_sum_weight, mode=_name), paper=_paper,
                               core=("aggregate_sum_weight", "aggregate", "finalize"), verified="verl", tests=_AGG_T,
                               note=_note + "; exact over micro-batches and hosts (global weight)"))


# ------------------------------------------------------------------------------------ KL

KL_ESTIMATORS = new_registry("KL estimator", "recipe.kl.estimator",
                             "kl_penalty(logp, ref_logp, kind=<name>) -> per-token estimate [N, T]")
_KL_PAPER = "Schulman, Approximating KL Divergence (2020); verl kl_penalty"
_KL_T = "tests/core/test_kl_entropy_value.py, tests/conformance/test_verl_conformance.py"
for _name, _desc in (("k1", "logp - ref_logp"), ("kl", "alias of k1"), ("abs", "|logp - ref_logp|"),
                     ("k2", "(logp - ref_logp)^2 / 2"), ("mse", "alias of k2"),
                     ("k3", "exp(ref - logp) - 1 - (ref - logp), clamped as verl"), ("low_var_kl", "alias of k3")):
    for _plus in ("", "+"):
        KL_ESTIMATORS.register(Part(
            _name + _plus, functools.partial(core.kl_penalty, kind=_name + _plus), paper=_KL_PAPER,
            core=("kl_penalty", "kl_in_reward", "kl_importance_weight"), verified="verl, TRL", tests=_KL_T,
            note=_desc + (" with the gradient of k2 (straight-through)" if _plus else "")))

KL_CONTROLLERS = new_registry("KL coefficient controller", "recipe.kl.controller",
                              "fn(coef, **params) -> KLController (init, update)")
KL_CONTROLLERS.register(Part(
    "fixed", core.fixed_kl_controller, paper="Ziegler et al., Fine-Tuning LMs from Human Preferences, "
                                             "arXiv:1909.08593",
    core=("fixed_kl_controller",), verified="verl", tests=_KL_T, note="a constant coefficient recipe.kl.coef"))
KL_CONTROLLERS.register(Part(
    "adaptive", lambda coef, *, target=0.1, horizon=10000.0: core.adaptive_kl_controller(coef, target, horizon),
    paper="Ziegler et al., Fine-Tuning LMs from Human Preferences, arXiv:1909.08593",
    core=("adaptive_kl_controller",), verified="verl", tests=_KL_T,
    note="beta <- beta (1 + clip(KL/target - 1, +-0.2) n / horizon) once per iteration, n = rows of the batch "
         "(verl's kl_ctrl: target_kl 0.1, horizon 10000); starts at recipe.kl.coef"))


# ------------------------------------------------------------------------------------ rollout corrections

IS_CORRECTIONS = new_registry("importance-weight correction", "recipe.is_weights",
                              "fn(logp, rollout_logp, mask, **params) -> (weights [N, T], metrics)")
_IS_T = "tests/core/test_policy_losses.py, tests/conformance/test_verl_conformance.py"


def _no_weights(logp, rollout_logp, mask):
    return None, {}


IS_CORRECTIONS.register(Part("none", _no_weights, note="no correction"))
IS_CORRECTIONS.register(Part(
    "tis", functools.partial(core.rollout_is_weights, lower=None), core=("rollout_is_weights",),
    paper="Yao et al. (2025), Your Efficient RL Framework Secretly Brings You Off-Policy RL Training (TIS; a blog "
          "post, no arXiv id)",
    defaults=(("upper", 2.0),), verified="verl", tests=_IS_T,
    note="w = min(pi_train / pi_sampler, upper) per token (level='sequence': the product over the response)"))
IS_CORRECTIONS.register(Part(
    "icepop", core.rollout_is_weights, core=("rollout_is_weights",),
    paper="Ling Team, Every Step Evolves: Scaling RL for Trillion-Scale Thinking Model (IcePop), arXiv:2510.18855",
    defaults=(("lower", 0.5), ("upper", 5.0)), methods=(76,), verified="verl", tests=_IS_T,
    note="weights outside [lower, upper] are 0 (the token leaves the gradient); the bounds 0.5 / 5 are the ones "
         "recalled for the paper (METHODS.md marks them unverified)"))

REJECTIONS = new_registry("rollout rejection", "recipe.rejection",
                          "fn(logp, rollout_logp, mask, **params) -> (mask [N, T], metrics)")


def _no_rejection(logp, rollout_logp, mask):
    return None, {}


REJECTIONS.register(Part("none", _no_rejection, note="no rejection"))
REJECTIONS.register(Part(
    "mask", core.rollout_rejection_mask, core=("rollout_rejection_mask",),
    paper="verl rollout correction (RS modes); sequence masking after IcePop, arXiv:2510.18855",
    defaults=(("mode", "token_k1"), ("upper", 2.0)), verified="verl", tests=_IS_T,
    note="mode: token_k1/k2/k3, seq_sum_*, seq_mean_*, seq_max_k2/k3; rejected tokens leave the loss and its "
         "normaliser"))

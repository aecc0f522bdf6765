"""Group-relative advantage estimators of recent papers (:mod:`jaxrl_llm.core.group_advantages`)
as registered parts: ``recipe.advantage=<name>``. Each entry carries the method's METHODS.md
number; the formulas, defaults and their sources are in the core docstrings."""

from __future__ import annotations

import jax.numpy as jnp

from jaxrl_llm import core
from jaxrl_llm.algorithms.estimators import Advantages, register_estimator

__all__: list[str] = []

_T = "tests/core/test_group_advantages.py, tests/training/test_group_estimators.py"


def _lengths(x) -> jnp.ndarray:
    return jnp.sum(x["mask"].astype(jnp.float32), axis=1)


@register_estimator("agrae", paper="Unveiling Implicit Advantage Symmetry: Why GRPO Struggles with Exploration and "
                                   "Difficulty Adaptation (A-GRAE), arXiv:2602.05548",
                    core=("agrae_advantages",), group_relative=True, methods=(182,), tests=_T,
                    verified="hand values, paper identity",
                    note="scores are accuracies in [0, 1]; the authors' released trainer never enters this branch "
                         "(it trains GRPO); this is the method of the paper and of the code's branch")
def agrae(x, *, alpha_s: float = 1.0, scale_by_std: bool = True, epsilon: float = 1e-6) -> Advantages:
    """A-GRAE: GRPO re-weighted by group difficulty and batch accuracy, positives damped early."""
    return Advantages(core.agrae_advantages(x["scores"], x["mask"], x["group_ids"], x.num_groups, alpha_s=alpha_s,
                                            scale_by_std=scale_by_std, epsilon=epsilon, valid=x.get("valid")))


@register_estimator("canon", paper="Conditional Advantage Estimation for Reinforcement Learning in Large Reasoning "
                                   "Models (CANON), arXiv:2509.23962",
                    core=("canon_advantages",), group_relative=True, methods=(176,),
                    tests=_T + ", tests/conformance/test_verl_conformance.py",
                    verified="hand values; paper identity (mu = 1/2, even groups: Dr.GRPO) checked against verl",
                    note="each group split at its median response length; canon_entropy splits by mean token entropy")
def canon(x, *, mu: float = 1.0, alpha: float = 1.0, beta: float = 0.0, normalizer: float = 1.0) -> Advantages:
    """CANON with response length as the split metric."""
    return Advantages(core.canon_advantages(x["scores"], _lengths(x), x["mask"], x["group_ids"], x.num_groups, mu=mu,
                                            alpha=alpha, beta=beta, normalizer=normalizer, variant="length",
                                            valid=x.get("valid")))


@register_estimator("canon_entropy", paper="Conditional Advantage Estimation for Reinforcement Learning in Large "
                                           "Reasoning Models (CANON), arXiv:2509.23962",
                    core=("canon_advantages",), requires=("old_entropy",), group_relative=True, methods=(176,),
                    tests=_T + ", tests/conformance/test_verl_conformance.py",
                    verified="hand values; paper identity (mu = 1/2, even groups: Dr.GRPO) checked against verl",
                    note="split metric: the sampling policy's mean token entropy over the response")
def canon_entropy(x, *, mu: float = 1.0, alpha: float = 1.0, beta: float = 0.0, normalizer: float = 1.0
                  ) -> Advantages:
    """CANON with the mean token entropy as the split metric."""
    m = x["mask"].astype(jnp.float32)
    ent = jnp.sum(x["old_entropy"] * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)
    return Advantages(core.canon_advantages(x["scores"], ent, x["mask"], x["group_ids"], x.num_groups, mu=mu,
                                            alpha=alpha, beta=beta, normalizer=normalizer, variant="entropy",
                                            valid=x.get("valid")))


@register_estimator("stratified", paper="Stratified GRPO: Handling Structural Heterogeneity in Reinforcement "
                                        "Learning of LLM Search Agents, arXiv:2510.06214",
                    core=("stratified_advantages",), requires=("component_scores",), group_relative=True,
                    methods=(219,), tests=_T, verified="hand values, paper identity (one stratum: GRPO)",
                    note="the stratum of a row is the rounded score of reward function number stratum_index (e.g. a "
                         "reward that counts tool calls); alpha has no default (the paper's value was not found)")
def stratified(x, *, alpha: float, stratum_index: int = 0, num_strata: int = 16, epsilon: float = 1e-6,
               unbiased_std: bool = False) -> Advantages:
    """Stratified advantage normalisation blended with the group's."""
    comp = x["component_scores"]
    if not 0 <= stratum_index < comp.shape[1]:
        raise ValueError(f"recipe.advantage.stratum_index={stratum_index} but the run has {comp.shape[1]} reward "
                         f"functions")
    strata = jnp.clip(jnp.round(comp[:, stratum_index]), 0, num_strata - 1).astype(jnp.int32)
    return Advantages(core.stratified_advantages(x["scores"], strata, x["mask"], x["group_ids"], x.num_groups,
                                                 alpha=alpha, num_strata=num_strata, epsilon=epsilon,
                                                 unbiased_std=unbiased_std, valid=x.get("valid")))


@register_estimator("seed_grpo", paper="SEED-GRPO: Semantic Entropy Enhanced GRPO for Uncertainty-Aware Policy "
                                       "Optimization, arXiv:2505.12346",
                    core=("seed_grpo_advantages", "semantic_entropy"), requires=("answer_ids",), group_relative=True,
                    methods=(232,), tests=_T, verified="hand values, paper identity (alpha = 0: GRPO)",
                    note="answer clusters from recipe.clusterer; cluster probabilities are frequencies; f and alpha "
                         "are parameters (the authors' code is not public)")
def seed_grpo(x, *, alpha: float = 1.0, modulation: str = "linear", gamma: float = 2.0, epsilon: float = 1e-6
              ) -> Advantages:
    """SEED-GRPO: GRPO scaled by a decreasing function of the group's semantic entropy."""
    return Advantages(core.seed_grpo_advantages(x["scores"], x["answer_ids"], x["mask"], x["group_ids"], x.num_groups,
                                                alpha=alpha, modulation=modulation, gamma=gamma, epsilon=epsilon,
                                                valid=x.get("valid")))


@register_estimator("hapo", paper="From Uniform to Heterogeneous: Tailoring Policy Optimization to Every Token's "
                                  "Nature (HAPO), arXiv:2509.16591",
                    core=("hapo_token_group_advantages",), group_relative=True, methods=(3,), tests=_T,
                    verified="hand values",
                    note="token-level group average; the hapo preset pairs it with recipe.loss=hapo (entropy-adaptive "
                         "clipping and advantage redistribution)")
def hapo(x, *, epsilon: float = 1e-6, fallback: float = 5.0) -> Advantages:
    """HAPO's token-level group average (group statistics over tokens)."""
    return Advantages(core.hapo_token_group_advantages(x["scores"], x["mask"], x["group_ids"], x.num_groups,
                                                       epsilon=epsilon, fallback=fallback, valid=x.get("valid")))


@register_estimator("riskpo", paper="RiskPO: Risk-based Policy Optimization via Verifiable Reward for LLM "
                                    "Post-Training, arXiv:2510.00911",
                    core=("riskpo_advantages",), group_relative=True, methods=(34,), tests=_T,
                    verified="hand values, paper identity",
                    note="questions bundled bundle_size at a time in prompt order (rollout.prompts_per_step should be "
                         "a multiple); credit std (the MATH script) or sum_mean with nonpositive=false (DAPO-math)")
def riskpo(x, *, bundle_size: int = 5, alpha: float = 0.2, beta: float = 0.8, omega: float = 1.5,
           credit: str = "std", nonpositive: bool = True, epsilon: float = 1e-6) -> Advantages:
    """RiskPO: mixed value-at-risk advantages over bundles of questions."""
    return Advantages(core.riskpo_advantages(x["scores"], x["mask"], x["group_ids"], x.num_groups,
                                             bundle_size=bundle_size, alpha=alpha, beta=beta, omega=omega,
                                             credit=credit, nonpositive=nonpositive, epsilon=epsilon,
                                             valid=x.get("valid")))


@register_estimator("adora", paper="ADORA: Training Reasoning Models with Dynamic Advantage Estimation on "
                                   "Reinforcement Learning, Gui and Ren (2025)",
                    core=("adora_advantages",), group_relative=True, methods=(12,), tests=_T,
                    verified="hand values, paper identity (lam = 1: GRPO)",
                    note="the length criterion of the authors' code; correct = score > correct_threshold")
def adora(x, *, lam: float = 0.1, correct_threshold: float = 0.5, length_threshold: float | None = None,
          epsilon: float = 1e-6) -> Advantages:
    """ADORA: GRPO down-weighted on groups whose correct answers are all shorter than the wrong ones."""
    return Advantages(core.adora_advantages(x["scores"], x["mask"], x["group_ids"], x.num_groups, lam=lam,
                                            correct_threshold=correct_threshold, length_threshold=length_threshold,
                                            epsilon=epsilon, valid=x.get("valid")))


@register_estimator("loop", paper="Reinforcement Learning for Long-Horizon Interactive LLM Agents (LOOP), "
                                  "arXiv:2502.01600",
                    core=("rloo_advantages", "drop_small_advantages"), group_relative=True, methods=(23,), tests=_T,
                    verified="verl (the RLOO part), hand values",
                    note="leave-one-out baseline, no std; rollouts with |A| < abs_threshold dropped; the loop preset "
                         "adds the ratio bounds [1/1.1, 1.1], two epochs and seq-mean-token-mean")
def loop(x, *, abs_threshold: float = 0.01) -> Advantages:
    """LOOP: RLOO advantages, rollouts with a tiny advantage filtered out."""
    adv = core.rloo_advantages(x["scores"], x["mask"], x["group_ids"], x.num_groups, valid=x.get("valid"),
                               singleton="zero")
    return Advantages(core.drop_small_advantages(adv, x["mask"], abs_threshold))


@register_estimator("hicra", paper="Emergent Hierarchical Reasoning in LLMs through Reinforcement Learning (HICRA), "
                                   "arXiv:2509.03646",
                    core=("hicra_advantages", "grpo_advantages"), requires=("old_entropy",), group_relative=True,
                    methods=(113,), tests=_T, verified="hand values, paper identity (alpha = 0: GRPO)",
                    note="GRPO advantages amplified by (1 + alpha) on the high-entropy tokens of correct responses "
                         "longer than their group's mean (the authors' VeRL form); the paper's planning-token form is "
                         "core.hicra_advantages(form='paper', planning_mask=...)")
def hicra(x, *, alpha: float = 0.2, entropy_top: float = 0.3, epsilon: float = 1e-6) -> Advantages:
    """HICRA: credit concentrated on high-entropy (planning) tokens of long correct responses."""
    base = core.grpo_advantages(x["scores"], x["mask"], x["group_ids"], x.num_groups, epsilon=epsilon,
                                valid=x.get("valid"))
    return Advantages(core.hicra_advantages(base, x["mask"], x["group_ids"], x.num_groups, entropy=x["old_entropy"],
                                            alpha=alpha, entropy_top=entropy_top, valid=x.get("valid")))


@register_estimator("d3s", paper="Learning More with Less: A Dynamic Dual-Level Down-Sampling Framework for Efficient "
                                 "Policy Optimization (D^3S), arXiv:2509.22115",
                    core=("d3s_mask", "max_variance_subset", "grpo_advantages"), requires=("old_entropy", "iteration"),
                    group_relative=True, methods=(29,), tests=_T,
                    verified="hand values, paper identity (full sizes: GRPO); the paper's equations via third-party "
                             "notes (no code, full text not read)",
                    note="GRPO advantages on the full group; trains only the max-variance rows per group (and across the "
                         "batch) and the top |A| H tokens, the sizes moving linearly to their final values over "
                         "total_steps; the paper's sizes were not found: samples_init, tokens_init, total_steps are "
                         "required")
def d3s(x, *, total_steps: int, samples_init: int, tokens_init: float, samples_final: int | None = None,
        tokens_final: float = 1.0, batch_fraction: float = 1.0, epsilon: float = 1e-6) -> Advantages:
    """D^3S: GRPO with dual-level down-sampling on a linear schedule. At training progress
    ``p = min(iteration / total_steps, 1)``: ``samples_per_group = round((1 - p) samples_init + p
    samples_final)`` (``samples_final`` default: the group size, so training ends as GRPO),
    ``token_fraction = (1 - p) tokens_init + p tokens_final``; the cross-batch step keeps
    ``round(batch_fraction x kept rows)`` (1: off)."""
    import jax.numpy as jnp

    if total_steps < 1 or samples_init < 1:
        raise ValueError(f"total_steps and samples_init must be >= 1, got {total_steps}, {samples_init}")
    for name, k in (("tokens_init", tokens_init), ("tokens_final", tokens_final), ("batch_fraction", batch_fraction)):
        if not 0.0 < k <= 1.0:
            raise ValueError(f"{name} must be in (0, 1], got {k}")
    n, g = x["mask"].shape[0], x.num_groups
    final = -(-n // g) if samples_final is None else samples_final
    p = jnp.clip(jnp.max(x["iteration"]) / float(total_steps), 0.0, 1.0)
    size = jnp.floor((1.0 - p) * samples_init + p * final + 0.5).astype(jnp.int32)
    frac = (1.0 - p) * tokens_init + p * tokens_final
    batch = None if batch_fraction == 1.0 else jnp.maximum(jnp.floor(batch_fraction * g * size + 0.5), 1).astype(
        jnp.int32)
    adv = core.grpo_advantages(x["scores"], x["mask"], x["group_ids"], g, epsilon=epsilon, valid=x.get("valid"))
    keep = core.d3s_mask(adv, x["old_entropy"], x["mask"], x["group_ids"], g, samples_per_group=size,
                         token_fraction=frac, batch_samples=batch, valid=x.get("valid"))
    return Advantages(adv, loss_mask=keep > 0)


@register_estimator("copo", paper="COPO: Consistency-Aware Policy Optimization, arXiv:2508.04138",
                    core=("copo_advantages",), requires=("answer_ids",), group_relative=True, methods=(41,), tests=_T,
                    verified="hand values",
                    note="local (GRPO) and global (batch) advantages blended by the group's answer entropy; the "
                         "authors blend two clipped losses, we blend the advantages (equal on-policy)")
def copo(x, *, k: float = 5.0, b: float = 1.0, gate: str = "soft_with_zero", epsilon: float = 1e-6) -> Advantages:
    """COPO: consistency-aware blend of group and batch advantages."""
    return Advantages(core.copo_advantages(x["scores"], x["answer_ids"], x["mask"], x["group_ids"], x.num_groups, k=k,
                                           b=b, gate=gate, epsilon=epsilon, valid=x.get("valid")))


@register_estimator("arm", paper="Back to Basics: Revisiting Exploration in Reinforcement Learning for LLM Reasoning "
                                 "via Generative Probabilities (ProGRPO / ARM), arXiv:2602.05281",
                    core=("arm_advantages", "low_probability_confidence"), requires=("old_logp", "prompt_confidence"),
                    group_relative=True, methods=(25,), tests=_T, verified="hand values, paper identity (alpha = 0: GRPO)",
                    note="GRPO + alpha (c(prompt) - c(answer)) in groups with a correct answer, c the mean log-prob "
                         "of the least likely fraction of tokens; alpha has no default (not found)")
def arm(x, *, alpha: float, fraction: float = 0.2, correct_only: bool = False, epsilon: float = 1e-6
        ) -> Advantages:
    """ProGRPO's advantage re-weighting by prompt and answer confidence."""
    conf = core.low_probability_confidence(x["old_logp"], x["mask"], fraction=fraction)
    return Advantages(core.arm_advantages(x["scores"], x["mask"], x["group_ids"], x.num_groups, conf,
                                          x["prompt_confidence"], alpha=alpha, correct_only=correct_only,
                                          epsilon=epsilon, valid=x.get("valid")))


@register_estimator("hbpo", paper="Hierarchical Budget Policy Optimization for Adaptive Reasoning (HBPO), "
                                  "arXiv:2507.15844",
                    core=("hbpo_advantages", "hbpo_reward"), group_relative=True, methods=(2,), tests=_T,
                    verified="hand values (paper and code), paper identities",
                    note="prompt groups are (question, budget) sub-groups from data.budgets: question g // k, budget "
                         "g % k; intra (sub-group mean - the budget's full credit) + inter (GRPO over the question); "
                         "with recipe.shaping=hbpo")
def hbpo(x, *, budgets: tuple = (512, 1024, 2048, 2560), beta: float = 4.0, max_length: float = 4096.0,
         intra_coef: float = 1.0, epsilon: float = 1e-6) -> Advantages:
    """HBPO's intra- plus inter-sub-group advantage."""
    k = len(budgets)
    g = x["group_ids"]
    budget = jnp.asarray(budgets, jnp.float32)[g % k]
    return Advantages(core.hbpo_advantages(x["scores"], x["mask"], g, x.num_groups, budget, g // k, x.num_groups,
                                           beta=beta, max_length=max_length, intra_coef=intra_coef, epsilon=epsilon,
                                           valid=x.get("valid")))


@register_estimator("single_stream_po", paper="Single-stream Policy Optimization (SPO), arXiv:2509.13232",
                    core=("single_stream_advantages", "beta_tracker_update", "kl_adaptive_forgetting",
                          "mean_abs_logp_change"), requires=("spo_value",), methods=(91,),
                    tests="tests/core/test_curriculum.py, tests/training/test_selectors.py",
                    verified="hand values (the authors' code)",
                    note="rewards in [0, 1]; one sample per prompt (G > 1: one decay per visit, all rewards added); "
                         "the tracker's state (alpha, beta, the "
                         "prompt's last response and its log-probs) is in the prompt store; rho from the policy's "
                         "change on that response (forgetting=kl) or constant; prior alpha = beta = 0.5 (the code's "
                         "offline prior is not run)")
def single_stream_po(x, *, epsilon: float = 1e-8, forgetting: str = "kl", rho: float = 0.875, half_life: float = 0.06,
                     rho_min: float = 0.875, rho_max: float = 0.96, init_alpha: float = 0.5,
                     init_beta: float = 0.5) -> Advantages:
    """SPO: reward minus the prompt's tracked success probability, normalised over the batch
    (the tracker's arguments are read by the loop when it updates the tracker after the step)."""
    if forgetting not in ("kl", "constant"):
        raise ValueError(f"recipe.advantage=single_stream_po: forgetting must be 'kl' or 'constant', got {forgetting!r}")
    if not (init_alpha > 0 and init_beta > 0):
        raise ValueError(f"recipe.advantage=single_stream_po: init_alpha and init_beta must be > 0, got {init_alpha}, "
                         f"{init_beta}")
    core.kl_adaptive_forgetting(jnp.zeros(1), half_life=half_life, rho_min=rho_min, rho_max=rho_max)  # checks
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"recipe.advantage=single_stream_po: rho must be in (0, 1], got {rho}")
    return Advantages(core.single_stream_advantages(x["scores"], x["spo_value"], x["mask"], x.get("valid"),
                                                    epsilon=epsilon))


@register_estimator("treepo", paper="TreePO: Bridging the Gap of Policy Optimization and Efficacy and Inference "
                                    "Efficiency with Heuristic Tree-based Modeling (Li et al.), arXiv:2508.17445",
                    core=("treepo_advantages",), requires=("tree_prefix_ids",), group_relative=True, methods=(58,),
                    tests="tests/core/test_treepo.py, tests/training/test_tree_rollout.py",
                    verified="hand values (the authors' code's worked example), identities (no branching: "
                             "REINFORCE++-baseline)",
                    note="with the tree sampler (rollout.tree_segment, rollout.tree_branch): each leaf's reward "
                         "against the mean of every subtree it belongs to (one-leaf subtrees below the root skipped), "
                         "averaged (combine=average, the paper's runs; group_size weighs by subtree size), whitened "
                         "over the batch's tokens")
def treepo(x, *, combine: str = "average") -> Advantages:
    """TreePO's tree advantage (:func:`jaxrl_llm.core.treepo_advantages`)."""
    return Advantages(core.treepo_advantages(x["scores"], x["tree_prefix_ids"], x["mask"], valid=x.get("valid"),
                                             combine=combine))


@register_estimator("xrpo", paper="XRPO: Pushing the limits of GRPO with Targeted Exploration and Exploitation, "
                                  "arXiv:2510.06672",
                    core=("xrpo_novelty_advantages", "grpo_advantages"), requires=("old_logp",), group_relative=True,
                    methods=(65,), tests=_T, verified="hand values, paper identity (lam = 0: GRPO)",
                    note="novelty sharpening only: correct responses less likely than their group's average (mean "
                         "token log-prob of the sampling policy) get a bonus lam (1 - eta) capped at kappa A (2.5, "
                         "0.5); not reproduced: the confidence-interval rollout allocator and the in-context seeding")
def xrpo(x, *, lam: float = 2.5, kappa: float = 0.5, threshold: float = 1.0, epsilon: float = 1e-6) -> Advantages:
    """XRPO's novelty-sharpened GRPO advantages."""
    return Advantages(core.xrpo_novelty_advantages(x["scores"], x["old_logp"], x["mask"], x["group_ids"],
                                                   x.num_groups, lam=lam, kappa=kappa, threshold=threshold,
                                                   epsilon=epsilon, valid=x.get("valid")))


@register_estimator("r3", paper="R^3: Replay, Reflection, and Ranking Rewards for LLM Reinforcement Learning, "
                                "arXiv:2601.19620",
                    core=("r3_entropy_rank_rewards", "grpo_advantages"), requires=("old_entropy",),
                    group_relative=True, methods=(150,), tests=_T, verified="hand values (the paper's Algorithm 1)",
                    note="all-failed groups get R3's structural entropy ranking rewards (peak vs global entropy of the "
                         "sampling policy), then GRPO; r_max and peak_frac have no default (not found); with "
                         "recipe.replay=arpo for the cross-context replay; the self-reflection prompts are not "
                         "reproduced")
def r3(x, *, r_max: float, peak_frac: float, threshold: float = 1.0, epsilon: float = 1e-6) -> Advantages:
    """GRPO on R3's rewards: failures of all-failed groups ranked by their entropy structure."""
    r = core.r3_entropy_rank_rewards(x["scores"], x["old_entropy"], x["mask"], x["group_ids"], x.num_groups,
                                     r_max=r_max, peak_frac=peak_frac, threshold=threshold, valid=x.get("valid"))
    return Advantages(core.grpo_advantages(r, x["mask"], x["group_ids"], x.num_groups, epsilon=epsilon,
                                           valid=x.get("valid")))

"""RL recipes: named presets of parts (data), resolved once into objects the loop calls.

A recipe is a :class:`~jaxrl_llm.training.configs.RecipeSpec`: the advantage estimator, the
policy surrogate, the aggregation, the KL regulariser (estimator, placement, controller), the
entropy bonus, importance-weight corrections and rejection masks, reward shaping, group and
batch filters and the update schedule. :data:`PRESETS` holds the named recipes with their
papers' settings; :func:`resolve_spec` fills a user's spec from its preset (``None`` fields,
choices without a name) and :func:`build_recipe` looks every name up in its registry
(:mod:`jaxrl_llm.algorithms`) and returns an :class:`RLRecipe` of objects. That is the only
place where names become parts: the loop below never asks which algorithm it runs.

The requirements of the parts (:attr:`RLRecipe.requires`) say what the loop computes: a
reference pass for ``ref_logp``, a critic for ``values``, a greedy rollout for
``greedy_scores``, a log-prob recompute when ``old_logp`` must be the trainer's, and so on
(:mod:`jaxrl_llm.training.providers`).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxrl_llm.core as core
from jaxrl_llm.algorithms import (AGGREGATIONS, BATCH_FILTERS, CLUSTERERS, ESTIMATORS, GROUP_FILTERS, IS_CORRECTIONS,
                                  KL_CONTROLLERS, KL_ESTIMATORS, PROVIDED_INPUTS, REJECTIONS, SHAPING, SURROGATES,
                                  TRUNCATIONS, Bound, EstimatorInputs, GroupFilter, RegistryError)
from jaxrl_llm.algorithms.allocation import ALLOCATORS
from jaxrl_llm.algorithms.hints import HINTS, trains_in_plain_context
from jaxrl_llm.algorithms.replay import REPLAYS
from jaxrl_llm.algorithms.selection import SELECTORS
from jaxrl_llm.algorithms.losses import LOSS_INPUT_SHAPES
from jaxrl_llm.config import Choice
from jaxrl_llm.training.configs import KLSpec, RecipeSpec
from jaxrl_llm.training.objectives import PolicyObjective, ValueObjective
from jaxrl_llm.training.rl import outcome_token_rewards

__all__ = ["Preset", "PRESETS", "RECIPES", "RLRecipe", "Bound", "KLReward", "resolve_spec", "build_recipe", "recipe",
           "estimate_advantages"]


@dataclasses.dataclass(frozen=True)
class KLReward:
    """A KL penalty folded into the token rewards: ``r_t -= coef * KL_t(old_logp, ref_logp)``
    (:func:`jaxrl_llm.core.kl_in_reward`). With an adaptive controller the coefficient is
    the controller's state, passed at run time (``coef`` is then its initial value)."""

    coef: float
    estimator: str = "k1"
    adaptive: bool = False


@dataclasses.dataclass(frozen=True)
class RLRecipe:
    """A resolved recipe: parts as objects (see the module docstring).

    Attributes:
      name: the preset's name, for logs.
      estimator: the advantage estimator (:data:`jaxrl_llm.algorithms.ESTIMATORS`) with its
        arguments.
      objective: the policy objective (surrogate, importance weights, KL in the loss, entropy,
        aggregation).
      num_samples: completions per prompt (``G``).
      epochs, num_minibatches: passes over each rollout batch and optimiser steps per pass
        (1 and 1: strictly on-policy). The critic is updated on the same mini-batches.
      recompute_old_logp: the old log-probs come from a forward pass of the policy before the
        update (verl) instead of the sampler.
      kl_reward: a KL penalty in the token rewards (:class:`KLReward`), or ``None``.
      kl_controller: the adaptive KL controller (``(init, update)``, its state carried in the
        checkpoint), or ``None`` for a fixed coefficient; it drives whichever placement holds
        the KL.
      value_objective: the critic's loss (estimators that require ``values``).
      critic_warmup: iterations at the start that train only the critic.
      shaping: reward shaping applied to every score (in order).
      group_filter: which sampled groups are kept, and how many sampling rounds a step may take.
      batch_filter: a resample of the train batch after the advantages, or ``None``.
      is_correction, rejection: importance weights and rejection masks from the trainer's and
        the sampler's log-probs, or ``None``.
      paper: the preset's paper(s).
      spec: the resolved :class:`RecipeSpec` this was built from (logged with the run).
      clusterer: the answer clusterer behind the ``answer_ids`` input
        (:data:`jaxrl_llm.algorithms.CLUSTERERS`).
      truncation: a cut of the sampled responses before scoring for training
        (:data:`jaxrl_llm.algorithms.TRUNCATIONS`), or ``None``.
      selector: the prompt selector (:data:`jaxrl_llm.algorithms.SELECTORS`), or ``None``.
      allocator: the rollout budget allocator (:data:`jaxrl_llm.algorithms.ALLOCATORS`), or
        ``None`` (``num_samples`` for every prompt).
      replay: experience replay into collapsed groups (:data:`jaxrl_llm.algorithms.REPLAYS`), or
        ``None``.
      hints: hinted re-sampling of groups the policy cannot solve (:data:`jaxrl_llm.algorithms.HINTS`),
        or ``None``.
    """

    name: str
    estimator: Bound
    objective: PolicyObjective
    num_samples: int = 8
    epochs: int = 1
    num_minibatches: int = 1
    recompute_old_logp: bool = False
    kl_reward: KLReward | None = None
    kl_controller: Any = None
    value_objective: ValueObjective | None = None
    critic_warmup: int = 0
    shaping: tuple[Bound, ...] = ()
    group_filter: GroupFilter = dataclasses.field(default_factory=lambda: GROUP_FILTERS["none"].fn())
    batch_filter: Bound | None = None
    is_correction: Bound | None = None
    rejection: Bound | None = None
    paper: str = ""
    spec: RecipeSpec | None = None
    clusterer: Bound | None = None
    truncation: Bound | None = None
    selector: Bound | None = None
    allocator: Bound | None = None
    replay: Bound | None = None
    hints: Bound | None = None
    loop_part: Bound | None = None

    def __post_init__(self):
        def need(ok, field, msg):
            if not ok:
                raise ValueError(f"RLRecipe.{field} {msg}, got {getattr(self, field)!r}")

        for f in ("num_samples", "epochs", "num_minibatches"):
            need(isinstance(getattr(self, f), int) and getattr(self, f) >= 1, f, "must be an int >= 1")
        need(isinstance(self.critic_warmup, int) and self.critic_warmup >= 0, "critic_warmup", "must be an int >= 0")
        need((self.value_objective is not None) == self.needs_critic, "value_objective",
             f"must be set exactly when the estimator reads a critic's values (estimator {self.estimator.name!r})")
        need(not (self.critic_warmup and not self.needs_critic), "critic_warmup", "needs an estimator with a critic")
        need(not (self.group_filter.max_rounds > 1 and self.num_samples < 2), "num_samples",
             "must be >= 2 with dynamic sampling (a one-sample group has no reward spread)")

    @property
    def needs_critic(self) -> bool:
        return "values" in self.estimator.part.requires

    @property
    def needs_progress_model(self) -> bool:
        """SPA-RL: the estimator reads a progress estimator's per-turn contributions."""
        return "progress" in self.estimator.part.requires

    @property
    def requires(self) -> frozenset[str]:
        """What the loop must provide: the estimator's inputs, ``ref_logp`` for a KL term, and
        ``rollout_logp`` (the sampler's log-probs next to recomputed ones) for corrections."""
        req = set(self.estimator.part.requires) | (set(self.objective.loss_inputs) & set(PROVIDED_INPUTS))
        if self.objective.has_kl or self.kl_reward is not None:
            req.add("ref_logp")
        if self.is_correction is not None or self.rejection is not None:
            req.add("rollout_logp")
        if self.allocator is not None:  # statistics an allocator keeps per prompt (GVM's gradient norms)
            req |= set(self.allocator.part.requires)
        return frozenset(req)

    @property
    def needs_reference(self) -> bool:
        return "ref_logp" in self.requires or "teacher_logp" in self.requires  # AlignDistil's reverse model


# ------------------------------------------------------------------------------------ presets


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named recipe: the spec of every part, the usual samples per prompt and the paper."""

    spec: RecipeSpec
    num_samples: int
    paper: str
    note: str = ""
    #: METHODS.md numbers of the seed papers whose recipe this preset is (a recipe study)
    methods: tuple[int, ...] = ()
    #: the test files that run it (the catalogue's column; empty: the generic preset tests)
    tests: str = ""


def _ppo_loss(clip_low=0.2, clip_high=None, **kw) -> Choice:
    # a symmetric range stores clip_low only: ``recipe.loss.clip_low=0.1`` then moves both bounds
    return Choice("ppo", {"clip_low": clip_low, **({} if clip_high is None else {"clip_high": clip_high}), **kw})


def _spec(name: str, advantage: str, loss: Choice, agg: str, **kw: Any) -> RecipeSpec:
    base = dict(kl=KLSpec(coef=0.0, estimator="low_var_kl", placement="loss", controller=Choice("fixed"),
                          bias_correction="none"),
                entropy_coef=0.0, is_weights=Choice("none"), rejection=Choice("none"), shaping=Choice("none"),
                group_filter=Choice("none"), batch_filter=Choice("none"), old_logp="sampler", epochs=1,
                num_minibatches=1, value_clip=0.5, critic_warmup=0, clusterer=Choice("answer"),
                truncation=Choice("none"), selector=Choice("none"), allocator=Choice("none"),
                replay=Choice("none"), hints=Choice("none"), loop_part=Choice("none"))
    return RecipeSpec(name=name, advantage=Choice(advantage), loss=loss, agg=agg, **{**base, **kw})


PRESETS: dict[str, Preset] = {
    # DeepSeekMath used a KL penalty (beta = 0.04); TRL's default and most recent recipes use none:
    # recipe.kl.coef=0.04 adds it. The clipped surrogate keeps verl's dual clip 3.0.
    "grpo": Preset(_spec("grpo", "grpo", _ppo_loss(0.2), "seq-mean-token-mean"), 8,
                   "DeepSeekMath (Shao et al.), arXiv:2402.03300",
                   "PPO clip 0.2 with verl's dual clip 3.0; no KL (DeepSeekMath: recipe.kl.coef=0.04)"),
    "dr_grpo": Preset(_spec("dr_grpo", "dr_grpo", _ppo_loss(0.2), "seq-mean-token-sum-norm"), 8,
                      "Understanding R1-Zero-Like Training (Liu et al.), arXiv:2503.20783"),
    # the paper's full recipe: clip-higher (0.2 / 0.28) without a dual clip (its objective, eq. 8,
    # has none; verl's DAPO scripts use clip_ratio_c 10: recipe.loss.dual_clip=10), token-level
    # loss, dynamic sampling on the task reward, soft overlong punishment (buffer a fifth of the
    # max length: 4096 of 20480, factor 1), no KL; 16 samples per prompt and 16 gradient steps per
    # rollout batch (512 prompts x 16, mini-batches of 512)
    "dapo": Preset(_spec("dapo", "grpo", _ppo_loss(0.2, 0.28, dual_clip=None), "token-mean",
                         shaping=Choice("overlong"), group_filter=Choice("dynamic_sampling"), num_minibatches=16),
                   16, "DAPO (Yu et al.), arXiv:2503.14476",
                   "no dual clip (the paper's objective); dynamic sampling filters on the reward total unless "
                   "recipe.group_filter.metric names a reward function"),
    # "GRPO-TCR" of Demystifying RL in Agentic Reasoning (Gen-Verse/Open-AgentRL @1fe5dbd, recipe/demystify/
    # grpo_tcr_qwen3_4b.sh): token-level loss, clip-higher 0.2 / 0.28 with dual clip 10, DAPO's overlong shaping
    # (buffer 4096 of 20480: a fifth, the overlong part's default), no KL, no entropy bonus, no dynamic sampling,
    # 16 samples per prompt
    "grpo_tcr": Preset(_spec("grpo_tcr", "grpo", _ppo_loss(0.2, 0.28, dual_clip=10.0), "token-mean",
                             shaping=Choice("overlong")), 16,
                       "Demystifying Reinforcement Learning in Agentic Reasoning (Yu et al.), arXiv:2510.11701",
                       "GRPO-TCR from the authors' script: token-mean, clip 0.2 / 0.28, dual clip 10, overlong shaping "
                       "(buffer a fifth of the budget, factor 1), no KL; not reproduced: the SFT start, the tool-call "
                       "term of the wrong answers' reward (inactive in the released reward manager) and the data",
                       methods=(245,)),
    # Open-RS's released recipe (knoveleng/open-rs @2889c47, recipes/grpo.yaml, the third experiment): GRPO in TRL at
    # 69ad852e (clip 0.2 without dual clip, beta 0.04 k3 KL in the loss, token-level mean over the batch, std + 1e-4),
    # 6 samples per prompt, rewards format (x1) + cosine length (x2), cosine max length 3584 characters
    "open_rs": Preset(dataclasses.replace(
        _spec("open_rs", "grpo", _ppo_loss(0.2, dual_clip=None), "token-mean",
              kl=KLSpec(coef=0.04, estimator="low_var_kl", placement="loss", controller=Choice("fixed"),
                        bias_correction="none"),
              shaping=Choice("cosine_length", {"weight": 2.0, "max_length": 3584.0})),
        advantage=Choice("grpo", {"epsilon": 1e-4})), 6,
                      "Reinforcement Learning for Reasoning in Small LLMs: What Works and What Doesn't (Open-RS; "
                      "Dang and Ngo), arXiv:2503.16219",
                      "the released recipe: TRL's GRPO (clip 0.2, KL 0.04, token-mean), the correctness reward "
                      "replaced by 2 x the cosine length reward (name it in recipe.shaping.metric to keep a format "
                      "reward beside it); not reproduced: the 7k-problem data mix, the distilled 1.5B start",
                      methods=(88,)),
    # Nash-MD as TRL's NashMDTrainer runs it (@054a0dab): one response per prompt against one of the mixture
    # (mixture_coef 0.5), P = sigmoid(r - r') from the rewards, REINFORCE on P - 1/2 with beta 0.1 times the
    # score-function KL to the reference, token sums averaged over rows
    "nash_md": Preset(_spec("nash_md", "nash_md", Choice("nash_md", {"beta": 0.1}), "seq-mean-token-sum",
                            loop_part=Choice("nash_md", {"mixture_coef": 0.5})), 1,
                      "Nash Learning from Human Feedback (Nash-MD; Munos et al.), arXiv:2312.00886",
                      "TRL's NashMDTrainer: the mixture's opponents, REINFORCE on P - 1/2, beta 0.1 score-function KL"),
    "gspo": Preset(_spec("gspo", "grpo", Choice("gspo", {"clip_low": 3e-4, "clip_high": 4e-4}),
                         "seq-mean-token-mean"), 8,
                   "Group Sequence Policy Optimization (Zheng et al.), arXiv:2507.18071"),
    "rloo": Preset(_spec("rloo", "rloo", _ppo_loss(0.2), "token-mean"), 8,
                   "Back to Basics: REINFORCE style optimization (Ahmadian et al.), arXiv:2402.14740"),
    "reinforce_pp_baseline": Preset(_spec("reinforce_pp_baseline", "reinforce_pp_baseline", _ppo_loss(0.2),
                                          "token-mean"), 8, "REINFORCE++ (Hu et al.), arXiv:2501.03262"),
    # no baseline: discounted token returns whitened over the batch; the paper folds a per-token KL
    # to the reference into the reward: recipe.kl.coef=... (placement reward, estimator k1)
    "reinforce_pp": Preset(_spec("reinforce_pp", "reinforce_pp", _ppo_loss(0.2), "token-mean",
                                 kl=KLSpec(coef=0.0, estimator="k1", placement="reward", controller=Choice("fixed"),
                                          bias_correction="none")),
                           1, "REINFORCE++ (Hu et al.), arXiv:2501.03262"),
    "bnpo": Preset(_spec("bnpo", "bnpo", _ppo_loss(0.2), "token-mean"), 8,
                   "BNPO: Beta Normalization Policy Optimization (Xiao et al.), arXiv:2506.02864"),
    # one sampled and one greedy response per prompt; REINFORCE on the sequence (log-probs summed
    # over a response, averaged over responses), one on-policy update per batch (the clipped
    # ratio is then 1: plain policy gradient)
    "remax": Preset(_spec("remax", "remax", _ppo_loss(0.2), "seq-mean-token-sum",
                          kl=KLSpec(coef=0.0, estimator="k1", placement="reward", controller=Choice("fixed"),
                                          bias_correction="none")),
                    1, "ReMax (Li et al.), arXiv:2310.10505"),
    # verl's PPO defaults (ppo_trainer.yaml): GAE with gamma = lam = 1 and whitened advantages, clip
    # 0.2, value clip 0.5, token-mean for actor and critic, one epoch over 4 mini-batches, KL in the
    # reward off (InstructGPT folds a per-token k1 KL into the reward: recipe.kl.coef=0.001, verl's);
    # the critic starts from the actor and has its own optimiser (verl: lr 1e-5)
    "ppo": Preset(_spec("ppo", "gae", _ppo_loss(0.2), "token-mean", num_minibatches=4,
                        kl=KLSpec(coef=0.0, estimator="k1", placement="reward", controller=Choice("fixed"),
                                          bias_correction="none")),
                  1, "PPO (Schulman et al.), arXiv:1707.06347; GAE, arXiv:1506.02438; InstructGPT (Ouyang et al.), "
                     "arXiv:2203.02155"),
    # multi-turn agents (AgentRunConfig experiments): verl-agent's GiGPO defaults -- gamma 0.95, step
    # weight omega 1, group normalisation by the std (verl-agent's mean_std_norm; mean_norm:
    # recipe.advantage.scale_by_std=false), token-mean loss, a low-variance KL of 0.01 in the loss
    "gigpo": Preset(_spec("gigpo", "gigpo", _ppo_loss(0.2), "token-mean",
                          kl=KLSpec(coef=0.01, estimator="low_var_kl", placement="loss", controller=Choice("fixed"),
                                    bias_correction="none")),
                    8, "Group-in-Group Policy Optimization for LLM Agent Training (Feng et al.), arXiv:2505.10978",
                    "for AgentRunConfig runs (multi-turn episodes); recipe.kl.coef=0 drops the reference"),
    "flow_grpo": Preset(_spec("flow_grpo", "flow_grpo", _ppo_loss(0.2), "token-mean"), 8,
                        "In-the-Flow Agentic System Optimization (AgentFlow / Flow-GRPO, Li et al.), arXiv:2510.05592",
                        "for AgentRunConfig runs: the outcome on every turn, group-normalised"),
    # SPA-RL: PPO (critic, GAE over the policy tokens, verl's PPO defaults as the ppo preset) on the
    # fused per-turn reward alpha c_k + beta g_k; the progress estimator is trained online (the
    # authors fit it offline on rollouts of the SFT policy first; recipe.progress_lr)
    "spa": Preset(_spec("spa", "spa", _ppo_loss(0.2), "token-mean", num_minibatches=4,
                        kl=KLSpec(coef=0.0, estimator="k1", placement="reward", controller=Choice("fixed"),
                                  bias_correction="none")),
                  1, "SPA-RL: Reinforcing LLM Agents via Stepwise Progress Attribution (Wang et al.), "
                     "arXiv:2505.20732",
                  "for AgentRunConfig runs: trains a critic and a progress estimator next to the policy"),
    # ---- seed methods whose paper fixes several parts at once (each part is also selectable alone)
    # LOOP: leave-one-out advantages without std, rollouts with |A| < 0.01 dropped, PPO with the ratio
    # bounds [1/1.1, 1.1] and no dual clip, per-rollout token means, two epochs (apple/ml-loop defaults)
    "loop": Preset(_spec("loop", "loop", _ppo_loss(1.0 - 1.0 / 1.1, 0.1, dual_clip=None), "seq-mean-token-mean",
                         epochs=2), 6,
                   "Reinforcement Learning for Long-Horizon Interactive LLM Agents (LOOP), arXiv:2502.01600"),
    # SPO: one sample per prompt, the tracker's baseline, global normalisation; the authors' clip
    # 0.2 / 0.28 with dual clip 10, token-mean, no KL (prioritised sampling: recipe.selector=spo_priority
    # with rollout.candidates > 1)
    "single_stream_po": Preset(_spec("single_stream_po", "single_stream_po", _ppo_loss(0.2, 0.28, dual_clip=10.0),
                                     "token-mean"), 1,
                               "Single-stream Policy Optimization (SPO), arXiv:2509.13232",
                               "add recipe.selector=spo_priority and rollout.candidates=k for the prioritised "
                               "sampling (the code picks 1024 of 14000 prompts per step)"),
    # DisCO / DRPO: their own objective (the advantages are not used), no clipping, no reference KL
    # (the squared-hinge constraint is to the sampling policy), 8 samples, whole groups per mini-batch
    "disco": Preset(_spec("disco", "grpo", Choice("disco"), "token-mean"), 8,
                    "DisCO: Reinforcing Large Reasoning Models with Discriminative Constrained Optimization, "
                    "arXiv:2505.12366", "binary rewards; score logL, tau 10, beta 1e3, delta 1e-4"
                    "; old log-probs from the sampler (the authors' verl recomputes them: recipe.old_logp=recompute)"),
    "drpo": Preset(_spec("drpo", "grpo", Choice("drpo"), "token-mean"), 8,
                   "DRPO: Efficient Reasoning via Decoupled Reward Policy Optimization, arXiv:2510.04474",
                   "binary rewards; lam 0.1 over the response budget"
                   "; old log-probs from the sampler (the authors' verl recomputes them: recipe.old_logp=recompute)"),
    # BAPO: GRPO advantages, the searched clip bounds, several mini-batches per rollout batch (the
    # paper's staleness; its script: 2 epochs of 4 mini-batches)
    "bapo": Preset(_spec("bapo", "grpo", Choice("bapo"), "token-mean", epochs=2, num_minibatches=4), 16,
                   "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy Optimization "
                   "with Adaptive Clipping, arXiv:2510.18927",
                   "2 epochs of 4 mini-batches (the paper's staleness); old log-probs from the sampler (the "
                   "authors' verl recomputes them: recipe.old_logp=recompute)"),
    # HAPO: token-level group average with the entropy-adaptive loss (the recipe adds DAPO's dynamic
    # sampling and overlong penalty: recipe.group_filter=dynamic_sampling recipe.shaping=overlong)
    "hapo": Preset(_spec("hapo", "hapo", Choice("hapo"), "token-mean"), 16,
                   "From Uniform to Heterogeneous: Tailoring Policy Optimization to Every Token's Nature (HAPO), "
                   "arXiv:2509.16591"),
    # Thinkless: mode reward, Dr.GRPO advantages, the decoupled control-token loss, k3 KL 0.001
    "thinkless": Preset(_spec("thinkless", "dr_grpo", Choice("thinkless"), "token-mean", shaping=Choice("thinkless"),
                              kl=KLSpec(coef=0.001, estimator="low_var_kl", placement="loss",
                                        controller=Choice("fixed"), bias_correction="none")), 8,
                        "Thinkless: LLM Learns When to Think (Fang et al.), arXiv:2505.13379",
                        "completions start with <short> or <think> (recipe.shaping.short_tag)"),
    "mdpo": Preset(_spec("mdpo", "grpo", Choice("mdpo"), "token-mean", epochs=4), 8,
                   "Mirror Descent Policy Optimization (Tomar et al.), arXiv:2005.09814",
                   "GRPO advantages (the LLM port), several SGD passes per batch (recipe.epochs), step size "
                   "recipe.loss.t"),
    # DOT: outlier truncation in all-correct groups, KL-Cov (k 0.002, coefficient 1), no clipping,
    # seq-mean-token-mean, dynamic sampling (the authors' predictive oversampling is a loop feature)
    "dot": Preset(_spec("dot", "grpo", Choice("kl_cov", {"kl_cov_ratio": 0.002, "ppo_kl_coef": 1.0}),
                        "seq-mean-token-mean", truncation=Choice("dot"), group_filter=Choice("dynamic_sampling")), 32,
                  "Anti-Length Shift: Dynamic Outlier Truncation for Training Efficient Reasoning Models (DOT), "
                  "arXiv:2601.03969", "32 samples per prompt: the 3-sigma cut needs 11 or more"),
    # Guide (the authors' paper script): all-fail groups re-rolled with the hint, trained after the
    # plain prompt with the reshaped ratio; groups kept only with mixed outcomes (hinted or not)
    "guide": Preset(_spec("guide", "grpo", Choice("guide"), "seq-mean-token-mean", hints=Choice("guide"),
                          group_filter=Choice("dynamic_sampling")), 8,
                    "Adaptive Guidance Accelerates Reinforcement Learning of Reasoning Models (Guide; Nath et al.), "
                    "arXiv:2506.13923",
                    "the hint is a data column (recipe.hints.column, default 'hint': the whole hinted prompt; "
                    "recipe.hints.replace=false appends it to the prompt); the trainer needs a prompt encoder"),
    # Critique-GRPO (the authors' scripts): each prompt's first row replaced by a refinement after a
    # critique, shaped p / (p + 0.1); the own rows unclipped; token sums over the maximum length
    "critique_grpo": Preset(_spec("critique_grpo", "grpo", Choice("critique_grpo"), "seq-mean-token-sum-norm",
                                  hints=Choice("critique_grpo"), entropy_coef=0.001), 8,
                            "Critique-GRPO: Advancing LLM Reasoning with Natural Language and Numerical Feedback "
                            "(Zhang et al.), arXiv:2506.03106",
                            "the critique reads the ground truth from data column recipe.hints.column (default "
                            "'answer'); the scripts' sum over the batch's tokens / the maximum length is Dr.GRPO's "
                            "aggregation here (a constant factor apart); the trainer needs a prompt encoder"),
    # ICPO's scripts: GRPO, each group's first row re-sampled with one demonstration in context and
    # trained after the plain question (p / (p + 0.1)), PPO clip with the dual clip, KL 0.001 in the loss
    "icpo": Preset(_spec("icpo", "grpo", Choice("icpo"), "token-mean", hints=Choice("icpo"),
                         kl=KLSpec(coef=0.001, estimator="low_var_kl", placement="loss", controller=Choice("fixed"),
                                   bias_correction="none"), num_minibatches=2, old_logp="recompute"), 8,
                   "Think Outside the Policy: In-Context Steered Policy Optimization (ICPO), arXiv:2510.26519",
                   "demonstrations from recipe.hints.demos (a JSONL of solved problems) or the step's other problems' "
                   "data column recipe.hints.column (default 'solution'); the n-shot prompts must fit the largest "
                   "prompt bucket (rollout.prompt_buckets); recipe.hints.beta=1 is the -rs scripts' expert bonus; "
                   "two mini-batches per step and recomputed old log-probs as the scripts; the trainer needs a "
                   "prompt encoder and a reference model (the KL)",
                   tests="tests/training/test_icpo.py"),
    # ROVER's Math runs: GRPO's advantage, the ROVER regression (rho 1, next-value scale 1, no clip), token-mean
    "rover": Preset(_spec("rover", "grpo", Choice("rover"), "token-mean", old_logp="recompute"), 8,
                    "Random Policy Valuation is Enough for LLM Reasoning with Verifiable Rewards (ROVER; He et al.), "
                    "arXiv:2505.17618",
                    "old log-probs recomputed by the trainer before the update (the code takes them and the old "
                    "values from one pass of the actor); the authors' scripts sample at temperature 0.6 "
                    "(rollout.temperature) with several mini-batches per step (recipe.num_minibatches): in the first "
                    "the policy is still the old one, so Q and the next value are 0 up to rounding (the code sets Q "
                    "to 0 exactly with one mini-batch and epoch); the code averages each micro-batch's tokens, "
                    "token-mean here averages the mini-batch's",
                    tests="tests/training/test_rover.py, tests/training/test_shared_prefix_update.py"),
    # TreePO's released run: the DAPO trainer (clip 0.2 / 0.28, verl's clip_ratio_c = 10, token-mean,
    # overlong shaping, dynamic sampling) with the tree advantage; the tree sampler is rollout.tree_segment
    "treepo": Preset(_spec("treepo", "treepo", _ppo_loss(0.2, 0.28, dual_clip=10.0), "token-mean",
                           shaping=Choice("overlong"), group_filter=Choice("dynamic_sampling")), 16,
                     "TreePO: Bridging the Gap of Policy Optimization and Efficacy and Inference Efficiency with "
                     "Heuristic Tree-based Modeling (Li et al.), arXiv:2508.17445",
                     "sample with rollout.tree_segment=<tokens per segment> (the paper: 512, branch 2, 16 leaves)"),
    "p3o": Preset(_spec("p3o", "grpo", Choice("p3o"), "token-mean"), 2,
                  "Pairwise Proximal Policy Optimization (Wu et al.), arXiv:2310.00212",
                  "two responses per prompt; the KL control of the paper: recipe.kl.coef"),
}

#: preset names (the old ``RECIPES`` mapping, name -> builder of :class:`RLRecipe`)
RECIPES: dict[str, Callable[..., "RLRecipe"]] = {
    name: (lambda n: lambda **kw: recipe(n, **kw))(name) for name in PRESETS}


def _preset(name: str) -> Preset:
    if name not in PRESETS:
        close = difflib.get_close_matches(str(name), list(PRESETS), n=2, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise RegistryError(f"recipe.name: unknown recipe {name!r}; known: {', '.join(sorted(PRESETS))}{hint}")
    return PRESETS[name]


# ------------------------------------------------------------------------------------ resolution


def _merge_choice(preset: Choice, user: Choice) -> Choice:
    """The user's choice over the preset's: the same (or no) name keeps the preset's arguments
    and adds the user's; another name starts from that part's own defaults."""
    if user.name is None or user.name == preset.name:
        return Choice(preset.name, {**preset.args, **user.args})
    return Choice(user.name, dict(user.args))


def resolve_spec(spec: RecipeSpec) -> RecipeSpec:
    """``spec`` with every unset field taken from its preset (``spec.name``): the concrete recipe
    that is logged with the run."""
    preset = _preset(spec.name).spec
    out: dict[str, Any] = {}
    for f in dataclasses.fields(RecipeSpec):
        mine, base = getattr(spec, f.name), getattr(preset, f.name)
        if isinstance(mine, Choice):
            out[f.name] = _merge_choice(base, mine)
        elif isinstance(mine, KLSpec):
            out[f.name] = KLSpec(coef=base.coef if mine.coef is None else mine.coef,
                                 estimator=mine.estimator or base.estimator,
                                 placement=mine.placement or base.placement,
                                 controller=_merge_choice(base.controller, mine.controller),
                                 bias_correction=mine.bias_correction or base.bias_correction)
        elif f.name in ("critic_lr", "progress_lr"):
            out[f.name] = mine
        else:
            out[f.name] = base if mine is None else mine
    return RecipeSpec(**out)


def _bound(registry, choice: Choice, key: str, skip: tuple[str, ...] = ()) -> Bound:
    return Bound.of(registry[choice.name], choice.args, key=key, skip=skip)


def _optional(registry, choice: Choice, key: str) -> Bound | None:
    """The bound part, or ``None`` for the registry's ``"none"`` (an unknown name fails)."""
    if choice.name == "none":
        if choice.args:
            raise RegistryError(f"{key}=none takes no arguments, got {sorted(choice.args)}")
        return None
    return _bound(registry, choice, key)


def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise RegistryError(msg)


def build_recipe(spec: RecipeSpec, *, num_samples: int, temperature: float = 1.0, chunk_size: int = 128
                 ) -> RLRecipe:
    """The :class:`RLRecipe` of ``spec`` (resolved from its preset first) for ``num_samples``
    completions per prompt sampled at ``temperature``. Every name is looked up here; a bad
    name or argument raises :class:`~jaxrl_llm.algorithms.RegistryError` naming the config key."""
    s = resolve_spec(spec)
    paper = _preset(spec.name).paper
    est = _bound(ESTIMATORS, s.advantage, "recipe.advantage")
    _need(not (est.part.flag("group_relative") and num_samples < 2),
          f"recipe.advantage={est.name} compares the samples of one prompt with each other: rollout.num_samples must "
          f"be >= 2, got {num_samples} (for one sample per prompt use recipe.advantage=reinforce_pp, remax or gae)")
    loss = _bound(SURROGATES, s.loss, "recipe.loss",
                  skip=("is_weights", "key", "entropy", "mean_logp") + tuple(sorted(SURROGATES[s.loss.name].requires)))
    _need(s.agg in AGGREGATIONS, AGGREGATIONS.unknown(s.agg))
    _need(s.old_logp in ("sampler", "recompute"), f"recipe.old_logp must be 'sampler' or 'recompute', got "
                                                  f"{s.old_logp!r}")
    for name in ("epochs", "num_minibatches"):
        v = getattr(s, name)
        _need(isinstance(v, int) and v >= 1, f"recipe.{name} must be an int >= 1, got {v!r}")
    _need(isinstance(s.critic_warmup, int) and s.critic_warmup >= 0,
          f"recipe.critic_warmup must be an int >= 0, got {s.critic_warmup!r}")
    _need(s.entropy_coef is not None and s.entropy_coef >= 0, f"recipe.entropy_coef must be >= 0, got "
                                                              f"{s.entropy_coef!r}")

    # the KL regulariser: estimator, placement, controller
    kl = s.kl
    _need(kl.estimator in KL_ESTIMATORS, KL_ESTIMATORS.unknown(kl.estimator))
    _need(kl.placement in ("loss", "reward"), f"recipe.kl.placement must be 'loss' or 'reward', got {kl.placement!r}")
    _need(kl.coef is not None and kl.coef >= 0, f"recipe.kl.coef must be >= 0, got {kl.coef!r}")
    _need(kl.bias_correction in ("none", "token", "sequence"),
          f"recipe.kl.bias_correction must be 'none', 'token' or 'sequence', got {kl.bias_correction!r}")
    _need(kl.bias_correction == "none" or kl.placement == "loss",
          "recipe.kl.bias_correction applies to a KL term in the loss (recipe.kl.placement=loss)")
    ctl_part = KL_CONTROLLERS[kl.controller.name]
    adaptive = ctl_part.name != "fixed"
    controller = ctl_part.fn(kl.coef, **ctl_part.kwargs(kl.controller.args, key="recipe.kl.controller")) \
        if adaptive else None
    _need(not (adaptive and not kl.coef), "recipe.kl.controller=adaptive needs an initial recipe.kl.coef > 0")
    kl_on = bool(kl.coef) or adaptive
    kl_reward = None
    if kl_on and kl.placement == "reward":
        _need("token_rewards" in est.part.requires,
              f"recipe.kl.placement=reward subtracts the KL from token rewards, but recipe.advantage={est.name} reads "
              f"sequence scores; use recipe.kl.placement=loss, or an estimator of token rewards "
              f"({', '.join(n for n, p in ESTIMATORS.items() if 'token_rewards' in p.requires)})")
        kl_reward = KLReward(float(kl.coef), kl.estimator, adaptive)

    is_w = _optional(IS_CORRECTIONS, s.is_weights, "recipe.is_weights")
    rej = _optional(REJECTIONS, s.rejection, "recipe.rejection")
    _need((is_w is None and rej is None) or s.old_logp == "recompute",
          "recipe.is_weights / recipe.rejection compare the trainer's log-probs with the sampler's: set "
          "recipe.old_logp=recompute (with the sampler's log-probs as old log-probs they compare a thing with itself)")

    objective = PolicyObjective(
        loss.part.fn, loss.kwargs, agg_mode=s.agg, horizon=s.horizon,
        loss_inputs=tuple(sorted(loss.part.requires)), coupled=bool(loss.part.flag("coupled")),
        kl_coef=float(kl.coef) if kl_on and kl.placement == "loss" and not adaptive else 0.0,
        kl_estimator=kl.estimator, kl_coef_from_batch=adaptive and kl.placement == "loss",
        entropy_coef=float(s.entropy_coef), temperature=temperature, chunk_size=chunk_size,
        needs_key=bool(loss.part.flag("needs_key")), use_is_weights=is_w is not None,
        kl_bias_correction=None if kl.bias_correction == "none" else kl.bias_correction,
        entropy_input=bool(loss.part.flag("entropy")), mean_logp_input=bool(loss.part.flag("mean_logp")))

    sh = _optional(SHAPING, s.shaping, "recipe.shaping")
    shaping = () if sh is None else (sh,)
    _need(sh is None or "mc_values" not in est.part.requires,
          f"recipe.advantage={est.name} compares the final reward with Monte-Carlo values of unshaped rewards (the "
          f"reward functions on sampled continuations); recipe.shaping={sh.name if sh else ''} would put the two on "
          f"different scales: shape the reward inside a reward function instead")
    gf_part = GROUP_FILTERS[s.group_filter.name]
    try:
        group_filter = gf_part.fn(**gf_part.kwargs(s.group_filter.args, key="recipe.group_filter"))
    except (TypeError, ValueError) as e:
        raise RegistryError(str(e)) from None
    bf = _optional(BATCH_FILTERS, s.batch_filter, "recipe.batch_filter")

    needs_critic = "values" in est.part.requires
    value_objective = None
    if needs_critic:
        _need(s.value_clip is None or s.value_clip > 0, f"recipe.value_clip must be > 0, got {s.value_clip!r}")
        value_objective = ValueObjective(s.value_clip, s.agg, s.horizon)
    else:
        _need(not s.critic_warmup, f"recipe.critic_warmup={s.critic_warmup} needs an estimator with a critic "
                                   f"(recipe.advantage=gae), not {est.name}")
    clusterer = _bound(CLUSTERERS, s.clusterer, "recipe.clusterer")
    truncation = _optional(TRUNCATIONS, s.truncation, "recipe.truncation")
    selector = _optional(SELECTORS, s.selector, "recipe.selector")
    allocator = _optional(ALLOCATORS, s.allocator, "recipe.allocator")
    replay = _optional(REPLAYS, s.replay, "recipe.replay")
    hints = _optional(HINTS, s.hints, "recipe.hints")
    from jaxrl_llm.training.parts.options import loop_part_options

    loop_part = _optional(loop_part_options(), s.loop_part, "recipe.loop_part")
    _need(hints is None or (replay is None and allocator is None),
          f"recipe.hints={hints.name if hints else ''} re-samples whole groups of num_samples rows; it cannot be "
          f"combined with recipe.replay or recipe.allocator")
    _need(not trains_in_plain_context(hints) or s.old_logp != "recompute"
          or not loss.part.flag("hinted_old_logp", True),
          f"recipe.hints={hints.name if hints else ''} trains responses sampled with a hint after the plain prompt, "
          f"against the sampler's log-probs in the hinted context (the importance ratio between the contexts): "
          f"recipe.old_logp=recompute would replace them with the plain context's (leave recipe.old_logp unset)")
    _need(hints is None or not hints.part.flag("levels") or trains_in_plain_context(hints) or s.old_logp == "recompute",
          f"recipe.hints={hints.name if hints else ''} puts a response sampled after a hinted prompt into a group "
          f"trained after the plain prompt, as the authors' code does with recomputed old log-probs: set "
          f"recipe.old_logp=recompute")
    _need(not ("teacher_logp" in loss.part.requires and kl_on),
          f"recipe.loss={loss.name} puts the reverse-DPO model in the reference slot: a KL term would pull the policy "
          f"towards it (set recipe.kl.coef=0)")
    _need("hinted" not in loss.part.requires or trains_in_plain_context(hints),
          f"recipe.loss={loss.name} reshapes the ratio of rows sampled with a hint and trained after the plain "
          f"prompt: set recipe.hints to a part that does that "
          f"({', '.join(n for n, p in HINTS.items() if p.flag('context') == 'plain')})")
    _need(is_w is None or "hinted" not in loss.part.requires,
          f"recipe.loss={loss.name} trains rows sampled in another context (the hinted rows), whose sampler log-probs "
          f"are not this context's: recipe.is_weights would weigh them by that difference (leave it unset)")
    _need(replay is None or s.old_logp == "recompute",
          f"recipe.replay={replay.name if replay else ''} trains on stored responses of earlier policies: set "
          f"recipe.old_logp=recompute (the ratio's old policy is then the current one for every row; the stored "
          f"log-probs become rollout_logp for recipe.is_weights)")
    _need(allocator is None or s.num_minibatches == 1 or "group_ids" not in objective.batch_keys(),
          f"recipe.allocator={allocator.name if allocator else ''} gives prompts groups of different sizes, and "
          f"recipe.loss={loss.name} compares the rows of a prompt, so its mini-batches hold whole groups: they would "
          f"differ in size (set recipe.num_minibatches=1)")
    _trial(est, loss, kl_reward, num_samples)
    try:
        return RLRecipe(s.name, est, objective, num_samples=num_samples, epochs=s.epochs,
                        num_minibatches=s.num_minibatches, recompute_old_logp=s.old_logp == "recompute",
                        kl_reward=kl_reward, kl_controller=controller, value_objective=value_objective,
                        critic_warmup=s.critic_warmup, shaping=shaping, group_filter=group_filter, batch_filter=bf,
                        is_correction=is_w, rejection=rej, paper=paper, spec=s, clusterer=clusterer,
                        truncation=truncation, selector=selector, allocator=allocator,
                        replay=replay, hints=hints, loop_part=loop_part)
    except ValueError as e:
        raise RegistryError(str(e).replace("RLRecipe.", "recipe.")) from None


def _trial(est: Bound, loss: Bound, kl_reward: KLReward | None, num_samples: int) -> None:
    """Trace the estimator and the surrogate once on a small abstract batch (no computation):
    a bad argument value fails here, at config time, naming the config key."""
    n, t = 2 * max(num_samples, 1), 3
    f32 = jax.ShapeDtypeStruct
    inputs = {"scores": f32((n,), jnp.float32), "mask": f32((n, t), jnp.bool_), "valid": f32((n,), jnp.bool_),
              "group_ids": np.repeat(np.arange(2, dtype=np.int32), n // 2)}
    shapes = {"token": ((n, t), jnp.float32), "sequence": ((n,), jnp.float32), "components": ((n, 2), jnp.float32),
              "turn": ((n, 2), jnp.float32), "turn_mask": ((n, 2), jnp.bool_), "turn_index": ((n, 2), jnp.int32),
              "token_index": ((n, t), jnp.int32), "turn_boundary": ((n, 3), jnp.float32),
              "sequence_int": ((n,), jnp.int32), "tree_index": ((n, 3), jnp.int32)}
    need = set(est.part.requires) | ({"old_logp", "ref_logp"} if kl_reward else set())
    inputs.update({k: f32(*shapes[PROVIDED_INPUTS[k]]) for k in need if k != "token_rewards"})
    group_ids = inputs.pop("group_ids")
    try:
        jax.eval_shape(lambda x: estimate_advantages(est, kl_reward, 2, {**x, "group_ids": jnp.asarray(group_ids)}),
                       inputs)
    except (TypeError, ValueError, KeyError) as e:
        raise RegistryError(f"recipe.advantage={est.name} {dict(est.kwargs)}: {e}") from None
    tok = f32((n, t), jnp.float32)
    extra = {"key": jax.random.key(0)} if loss.part.flag("needs_key") else {}
    if loss.part.flag("entropy"):
        extra["entropy"] = jnp.zeros((n, t), jnp.float32)
    if loss.part.flag("mean_logp"):
        extra["mean_logp"] = jnp.zeros((n, t), jnp.float32)
    cols = {k: f32(*LOSS_INPUT_SHAPES[k](n, t)) for k in loss.part.requires}
    try:
        jax.eval_shape(lambda a, b, c, m, kw: loss(a, b, c, m, **kw, **extra), tok, tok, tok, f32((n, t), jnp.bool_),
                       cols)
    except (TypeError, ValueError) as e:
        raise RegistryError(f"recipe.loss={loss.name} {dict(loss.kwargs)}: {e}") from None


def _as_choice(v: Any) -> Any:
    if isinstance(v, Mapping):
        v = dict(v)
        return Choice(v.pop("name", None), v)
    if isinstance(v, str):
        return Choice(v)
    return v


def recipe(name: str, *, num_samples: int | None = None, temperature: float = 1.0, **fields: Any) -> RLRecipe:
    """The :class:`RLRecipe` of preset ``name`` with :class:`RecipeSpec` field overrides, e.g.
    ``recipe("grpo", num_samples=4, loss={"clip_high": 0.28}, kl={"coef": 0.04})`` (a choice
    field takes a name, a ``{"name": ..., <argument>: ...}`` dict or a
    :class:`~jaxrl_llm.config.Choice`; ``kl`` a dict of :class:`KLSpec` fields).
    ``num_samples`` defaults to the preset's."""
    preset = _preset(name)
    valid = {f.name for f in dataclasses.fields(RecipeSpec)} - {"name"}
    for k in fields:
        if k not in valid:
            close = difflib.get_close_matches(k, sorted(valid), n=2, cutoff=0.6)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise RegistryError(f"recipe(): unknown field {k!r}; fields: {', '.join(sorted(valid))}{hint}")
    choices = {f.name for f in dataclasses.fields(RecipeSpec) if isinstance(getattr(RecipeSpec(), f.name), Choice)}
    kw = {k: _as_choice(v) if k in choices else v for k, v in fields.items()}
    if isinstance(kw.get("kl"), Mapping):
        k = dict(kw["kl"])
        if "controller" in k:
            k["controller"] = _as_choice(k["controller"])
        kw["kl"] = KLSpec(**k)
    return build_recipe(RecipeSpec(name=name, **kw), num_samples=num_samples or preset.num_samples,
                        temperature=temperature)


def estimate_advantages(estimator: Bound, kl_reward: KLReward | None, num_groups: int, inputs: dict,
                        kl_coef: Any = None) -> tuple[jax.Array, jax.Array | None, jax.Array | None, jax.Array | None]:
    """``(advantages [N, T], returns [N, T] or None, KL in the reward [N, T] or None, the
    estimator's loss mask [N, T] or None)`` of one batch (jit-able; ``estimator``, ``kl_reward``
    and ``num_groups`` static).

    ``inputs`` hold the base inputs (``scores``, ``mask``, ``valid``, ``group_ids``) and what
    the estimator requires (completion-aligned). ``token_rewards`` are made here: each row's
    score on its last response token, minus ``kl_coef * KL(old_logp || ref_logp)`` per token
    when the recipe puts the KL in the reward (``kl_coef``: a fixed recipe's coefficient, or
    the adaptive controller's current value)."""
    inputs, kl = dict(inputs), None
    req = estimator.part.requires
    if "token_rewards" in req:
        m = inputs["mask"]
        tr = outcome_token_rewards(inputs["scores"], m)
        if kl_reward is not None:
            coef = kl_reward.coef if kl_coef is None else kl_coef
            tr, kl = core.kl_in_reward(tr, inputs["old_logp"], inputs["ref_logp"], m, coef, kl_reward.estimator)
        inputs["token_rewards"] = tr
    out = estimator(EstimatorInputs(inputs, num_groups, allowed=req, owner=f"estimator {estimator.name!r}"))
    return out.advantages, out.returns, kl, out.loss_mask

"""RL recipes and the pieces of the RL step: rollout -> rewards -> advantages -> update.

A recipe (:class:`RLRecipe`) is a frozen config that composes core functions: an advantage
estimator, a :class:`~jaxrl_llm.training.PolicyObjective` (policy loss, KL, entropy,
aggregation), the update schedule (PPO epochs and mini-batches) and the loop's options
(DAPO dynamic sampling and overlong shaping, a ReMax greedy baseline, a PPO critic). Presets
follow their papers (:func:`recipe`).

Advantage estimators come in four kinds (``RLRecipe.advantage_type``), each with the call
signature of its core function:

* ``"group"``: ``advantage(scores [N], mask [N, T], group_ids [N], num_groups, **kw) -> [N, T]``
  (GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline, BNPO, ...);
* ``"greedy_baseline"``: ``advantage(token_rewards [N, T], baseline_scores [N], mask, **kw)
  -> (adv, returns)`` with the reward of a greedy rollout of the same prompt (ReMax);
* ``"critic"``: ``advantage(token_rewards, values [N, T], mask, gamma=, lam=, whiten=, **kw)
  -> (adv, returns)`` with a learned value model (PPO with GAE);
* ``"token_rewards"``: ``advantage(token_rewards, mask, gamma=, **kw) -> (adv, returns)``
  (REINFORCE++).

Token rewards are the sequence score on the last completion token
(:func:`outcome_token_rewards`), minus ``kl_in_reward_coef * KL`` to the reference per token
when the recipe folds the KL into the reward (InstructGPT's placement).

Layout of the train batch built by :func:`build_rl_batch` from a group rollout: each row is
``left-padded prompt [P] + completion [T]``; per-token arrays are target-aligned
(``[N, P + T - 1]``, entry ``j`` belongs to token ``j + 1``), so completion token ``t`` sits at
column ``P + t - 1``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxrl_llm.core as core
from jaxrl_llm.core import aggregation, stats
from jaxrl_llm.training.objectives import PolicyObjective

__all__ = ["RLRecipe", "recipe", "RECIPES", "ADVANTAGE_TYPES", "build_rl_batch", "compute_advantages",
           "advantages_and_returns", "outcome_token_rewards", "to_target_aligned", "minibatches", "ValueObjective",
           "critic_values", "Critic", "critic_params_from_policy"]

ADVANTAGE_TYPES = ("group", "greedy_baseline", "critic", "token_rewards")


@dataclasses.dataclass(frozen=True)
class ValueObjective:
    """The critic's loss for :func:`~jaxrl_llm.training.make_train_step`: PPO's clipped value
    loss (:func:`jaxrl_llm.core.clipped_value_loss`) on the response tokens.

    Batch: ``tokens``, ``mask`` ``[B, L]``; target-aligned ``loss_mask``, ``old_values`` (the
    critic's values at rollout time) and ``returns`` (GAE targets), ``[B, L - 1]``. The value
    of completion token ``t`` is the critic's score of the position that predicts it (the
    same alignment as the policy's log-probs, :func:`critic_values`).

    Normalisation is exact across micro-batches like the policy's: ``weight`` is the
    mask-only aggregation weight of ``agg_mode`` (additive over rows), ``metric_weight`` the
    token count (the metrics are token means: ``vf_loss``, ``vf_clip_frac``, ``values_mean``;
    ``vf_explained_var`` is per micro-batch, averaged).

    Attributes:
      clip_range: value clipping around the old values (verl ``cliprange_value`` 0.5;
        ``None``: unclipped ``0.5 (V - R)^2``).
      agg_mode, horizon: aggregation (verl uses the actor's ``loss_agg_mode``, token-mean).
    """

    clip_range: float | None = 0.5
    agg_mode: str = "token-mean"
    horizon: float | None = None

    def __post_init__(self):
        if self.agg_mode not in aggregation.AGG_MODES:
            raise ValueError(f"ValueObjective.agg_mode must be one of {aggregation.AGG_MODES}, got {self.agg_mode!r}")
        if self.clip_range is not None and not self.clip_range > 0:
            raise ValueError(f"ValueObjective.clip_range must be > 0 or None, got {self.clip_range!r}")

    def weight(self, batch: dict) -> jax.Array:
        m = batch["loss_mask"]
        return aggregation.aggregate_sum_weight(jnp.zeros(m.shape, jnp.float32), m, self.agg_mode, self.horizon)[1]

    def metric_weight(self, batch: dict) -> jax.Array:
        return jnp.sum(batch["loss_mask"].astype(jnp.float32))

    def loss_sum(self, model: Any, batch: dict, key: jax.Array):
        m = batch["loss_mask"]
        values = critic_values(model, batch)
        per_token, vm = core.clipped_value_loss(values, batch["old_values"], batch["returns"], m,
                                                clip_range=self.clip_range)
        s, _ = aggregation.aggregate_sum_weight(per_token, m, self.agg_mode, self.horizon)
        metrics = {"vf_loss": stats.masked_mean(jax.lax.stop_gradient(per_token), m),
                   "values_mean": stats.masked_mean(jax.lax.stop_gradient(values), m), **vm}
        return s, metrics


def critic_values(model: Any, batch: dict) -> jax.Array:
    """``[B, L - 1]`` float32 values of a score-head model, target-aligned: entry ``j`` is the
    score of position ``j``, the state before token ``j + 1`` is generated (verl's
    ``values[:, -T - 1:-1]``)."""
    hidden, _ = model(batch["tokens"], batch["mask"])
    return model.scores(hidden[:, :-1])[..., 0]


@dataclasses.dataclass
class Critic:
    """A value model and how to train it, for recipes with ``advantage_type="critic"``.

    Attributes:
      graphdef: the score-head model's graph (``nnx.split`` of ``Transformer(cfg,
        head="score")`` with ``num_labels=1``).
      state: its :class:`~jaxrl_llm.training.TrainState` (own optimiser, own RNG).
      train_step: ``make_train_step(graphdef, optimizer, recipe.value_objective, ...)``.
      frozen: further state parts for ``nnx.merge`` (e.g. frozen base weights under LoRA).
    """

    graphdef: Any
    state: Any
    train_step: Callable
    frozen: tuple = ()

    @classmethod
    def create(cls, cfg: Any, optimizer: Any, objective: ValueObjective, *, policy_params: Any = None,
               seed: int = 0, mesh: Any = None, **step_kwargs: Any) -> "Critic":
        """A critic with the policy's architecture ``cfg`` and a fresh one-output score head.

        ``policy_params``: copy the policy's backbone weights into it (the usual PPO
        initialisation from the actor; ``None``: random weights). ``mesh``: create the critic
        in its shards there (parameters and optimiser state by the logical rules, like the
        policy's) and give its train step those shardings. ``step_kwargs`` go to
        :func:`~jaxrl_llm.training.make_train_step` (``num_microbatches``, ...).
        """
        from flax import nnx

        from jaxrl_llm.models import Transformer
        from jaxrl_llm.training.step import init_train_state, make_train_step, train_state_shardings

        if cfg.num_labels != 1:
            cfg = dataclasses.replace(cfg, num_labels=1)
        if mesh is None:
            graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed), head="score"))
        else:
            from jaxrl_llm.parallel.sharding import init_sharded

            graphdef, params = nnx.split(init_sharded(cfg, mesh, seed, head="score"))
        if policy_params is not None:
            params = critic_params_from_policy(policy_params, params)
        state = init_train_state(params, optimizer, seed=seed)
        if mesh is not None:
            sh = train_state_shardings(optimizer, state, mesh)
            state = jax.device_put(state, sh)
            step_kwargs.setdefault("state_shardings", sh)
        return cls(graphdef, state, make_train_step(graphdef, optimizer, objective, **step_kwargs))


def critic_params_from_policy(policy_params: Any, critic_params: Any) -> Any:
    """``critic_params`` with every leaf the policy has at the same path and shape (the
    backbone: embeddings, blocks, final norm) copied from ``policy_params``; the score head
    keeps its fresh initialisation."""
    from flax import nnx

    src = nnx.to_pure_dict(policy_params)

    def merge(dst, s):
        if isinstance(dst, dict):
            return {k: merge(v, s.get(k) if isinstance(s, dict) else None) for k, v in dst.items()}
        if s is not None and np.shape(s) == np.shape(dst):
            # a new buffer where ``dst`` lives (its sharding, on every process that holds a
            # part): the critic's train step donates its state, which must not delete the
            # policy's arrays
            return jax.device_put(jnp.array(s, dtype=dst.dtype, copy=True), dst.sharding)
        return dst

    out = jax.tree.map(lambda x: x, critic_params)  # a copy: the caller's state is untouched
    nnx.replace_by_pure_dict(out, merge(nnx.to_pure_dict(critic_params), src))
    return out


@dataclasses.dataclass(frozen=True)
class RLRecipe:
    """A policy-optimisation recipe.

    Attributes:
      name: for logs.
      advantage: the estimator, called as its ``advantage_type`` says (module docstring).
      advantage_kwargs: its keyword arguments (pairs).
      objective: the policy loss.
      advantage_type: ``"group"``, ``"greedy_baseline"`` (ReMax: the loop decodes each prompt
        greedily once more and scores it with the same rewards), ``"critic"`` (PPO: the
        trainer needs a :class:`Critic`) or ``"token_rewards"`` (REINFORCE++).
      num_samples: completions per prompt (``G``).
      epochs, num_minibatches: passes over each rollout batch and optimiser steps per pass
        (``epochs = num_minibatches = 1``: strictly on-policy, one update per batch). The
        critic is updated on the same mini-batches.
      old_logp: ``"sampler"`` (the sampler's log-probs; exact when sampling has no top-k /
        top-p / min-p truncation) or ``"recompute"`` (a forward pass of the current policy
        before the update, as verl does).
      gamma, lam, whiten_advantages: discount and GAE lambda (``critic``; ``gamma`` also for
        ``token_rewards``) and batch whitening of GAE advantages.
      kl_in_reward_coef, kl_in_reward_estimator: fold ``coef * KL(old_logp || ref_logp)`` per
        token into the token rewards (:func:`jaxrl_llm.core.kl_in_reward`; needs
        ``ref_params``); only for the token-reward kinds (group estimators see sequence
        scores: use ``objective.kl_coef`` there).
      value_objective: the critic's loss (``critic`` recipes).
      critic_warmup: iterations at the start that train only the critic (verl
        ``critic_warmup``).
      dynamic_sampling: DAPO's dynamic sampling: keep drawing prompt batches until the
        step's batch holds as many groups with non-zero reward spread as one data batch
        has prompts (see :class:`~jaxrl_llm.training.RLTrainer`).
      max_sampling_rounds: cap on the prompt batches drawn per step with dynamic sampling
        (10, verl's ``max_num_gen_batches``; verl raises when it is hit, we train on the
        groups kept so far).
      dynamic_sampling_metric: what the filter looks at: ``None`` the reward total before
        overlong shaping, or the name of one reward function (DAPO filters on accuracy).
      overlong_shaping: add DAPO's soft overlong penalty
        (:func:`jaxrl_llm.core.overlong_penalty`) to every score.
      overlong_max_length: its maximum length (``None``: the sampler's ``max_new_tokens``).
      overlong_buffer: its buffer in tokens (``None``: a fifth of the maximum length, the
        paper's 4096 of 20480).
      overlong_penalty_factor: the penalty at the maximum length.
      paper: title and arXiv id.
    """

    name: str
    advantage: Callable[..., Any]
    objective: PolicyObjective
    advantage_kwargs: tuple[tuple[str, Any], ...] = ()
    advantage_type: str = "group"
    num_samples: int = 8
    epochs: int = 1
    num_minibatches: int = 1
    old_logp: str = "sampler"
    gamma: float = 1.0
    lam: float = 1.0
    whiten_advantages: bool = True
    kl_in_reward_coef: float = 0.0
    kl_in_reward_estimator: str = "k1"
    value_objective: ValueObjective | None = None
    critic_warmup: int = 0
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 10
    dynamic_sampling_metric: str | None = None
    overlong_shaping: bool = False
    overlong_max_length: int | None = None
    overlong_buffer: int | None = None
    overlong_penalty_factor: float = 1.0
    paper: str = ""

    def __post_init__(self):
        def need(ok, field, msg):
            if not ok:
                raise ValueError(f"RLRecipe.{field} {msg}, got {getattr(self, field)!r}")

        need(self.old_logp in ("sampler", "recompute"), "old_logp", "must be 'sampler' or 'recompute'")
        for f in ("num_samples", "epochs", "num_minibatches", "max_sampling_rounds"):
            need(isinstance(getattr(self, f), int) and getattr(self, f) >= 1, f, "must be an int >= 1")
        need(self.advantage_type in ADVANTAGE_TYPES, "advantage_type", f"must be one of {ADVANTAGE_TYPES}")
        need(0.0 <= self.gamma <= 1.0, "gamma", "must be in [0, 1]")
        need(0.0 <= self.lam <= 1.0, "lam", "must be in [0, 1]")
        need(self.kl_in_reward_coef >= 0.0, "kl_in_reward_coef", "must be >= 0")
        base = self.kl_in_reward_estimator.rstrip("+")
        need(base in core.KL_ESTIMATORS, "kl_in_reward_estimator", f"must be one of {core.KL_ESTIMATORS}")
        need(not (self.kl_in_reward_coef and self.advantage_type == "group"), "kl_in_reward_coef",
             "must be 0 for a group estimator (it sees sequence scores; use objective.kl_coef for a KL term)")
        need((self.value_objective is not None) == (self.advantage_type == "critic"), "value_objective",
             "must be set exactly when advantage_type='critic'")
        need(isinstance(self.critic_warmup, int) and self.critic_warmup >= 0, "critic_warmup", "must be an int >= 0")
        need(not (self.critic_warmup and self.advantage_type != "critic"), "critic_warmup",
             "needs advantage_type='critic'")
        need(not self.dynamic_sampling or self.num_samples >= 2, "num_samples",
             "must be >= 2 with dynamic_sampling (a one-sample group has no reward spread)")
        need(self.overlong_max_length is None or self.overlong_max_length >= 1, "overlong_max_length",
             "must be >= 1 or None")
        need(self.overlong_buffer is None or self.overlong_buffer >= 1, "overlong_buffer", "must be >= 1 or None")
        need(self.overlong_penalty_factor >= 0.0, "overlong_penalty_factor", "must be >= 0")
        if self.overlong_max_length is not None and self.overlong_buffer is not None:
            need(self.overlong_buffer <= self.overlong_max_length, "overlong_buffer",
                 f"must be <= overlong_max_length={self.overlong_max_length}")

    def overlong_lengths(self, max_new_tokens: int) -> tuple[int, int]:
        """``(max_length, buffer)`` of the overlong penalty for a sampler budget."""
        max_len = self.overlong_max_length if self.overlong_max_length is not None else max_new_tokens
        buf = self.overlong_buffer if self.overlong_buffer is not None else max(1, max_len // 5)
        if buf > max_len:
            raise ValueError(f"RLRecipe.overlong_buffer ({buf}) must be <= the overlong max length {max_len}")
        return max_len, buf


def _ppo(clip_low=0.2, clip_high=None):
    return core.ppo_clip_loss, (("clip_low", clip_low), ("clip_high", clip_high if clip_high is not None else clip_low))


def _make_recipes() -> dict[str, Callable[..., RLRecipe]]:
    def grpo(**kw):
        loss, lkw = _ppo(0.2)
        # DeepSeekMath used a KL penalty (beta = 0.04); TRL's default and most recent recipes
        # use none: set objective=dataclasses.replace(..., kl_coef=...) to add it
        return RLRecipe("grpo", core.grpo_advantages, PolicyObjective(loss, lkw, agg_mode="seq-mean-token-mean"),
                        paper="DeepSeekMath (Shao et al.), arXiv:2402.03300", **kw)

    def dr_grpo(**kw):
        loss, lkw = _ppo(0.2)
        return RLRecipe("dr_grpo", core.dr_grpo_advantages,
                        PolicyObjective(loss, lkw, agg_mode="seq-mean-token-sum-norm"),
                        paper="Understanding R1-Zero-Like Training (Liu et al.), arXiv:2503.20783", **kw)

    def dapo(**kw):
        # the paper's full recipe: clip-higher (0.2 / 0.28), token-level loss, dynamic sampling
        # (filter on the task reward, not the shaped one), soft overlong punishment (buffer a
        # fifth of the max length: 4096 of 20480, factor 1), no KL; 16 samples per prompt and
        # 16 gradient steps per rollout batch (512 prompts x 16, mini-batches of 512)
        loss, lkw = _ppo(0.2, 0.28)
        kw = {"num_samples": 16, "num_minibatches": 16, "dynamic_sampling": True, "overlong_shaping": True, **kw}
        return RLRecipe("dapo", core.grpo_advantages, PolicyObjective(loss, lkw, agg_mode="token-mean"),
                        paper="DAPO (Yu et al.), arXiv:2503.14476", **kw)

    def gspo(**kw):
        return RLRecipe("gspo", core.grpo_advantages,
                        PolicyObjective(core.gspo_loss, (("clip_low", 3e-4), ("clip_high", 4e-4)),
                                        agg_mode="seq-mean-token-mean"),
                        paper="Group Sequence Policy Optimization (Zheng et al.), arXiv:2507.18071", **kw)

    def rloo(**kw):
        loss, lkw = _ppo(0.2)
        return RLRecipe("rloo", core.rloo_advantages, PolicyObjective(loss, lkw, agg_mode="token-mean"),
                        paper="Back to Basics: REINFORCE style optimization (Ahmadian et al.), arXiv:2402.14740",
                        **kw)

    def reinforce_pp_baseline(**kw):
        loss, lkw = _ppo(0.2)
        return RLRecipe("reinforce_pp_baseline", core.reinforce_pp_baseline_advantages,
                        PolicyObjective(loss, lkw, agg_mode="token-mean"),
                        paper="REINFORCE++ (Hu et al.), arXiv:2501.03262", **kw)

    def reinforce_pp(**kw):
        # REINFORCE++ without a baseline: discounted token returns whitened over the batch;
        # the paper folds a per-token KL to the reference into the reward: set
        # kl_in_reward_coef (and pass ref_params) to add it
        loss, lkw = _ppo(0.2)
        kw = {"num_samples": 1, **kw}
        return RLRecipe("reinforce_pp", core.reinforce_pp_advantages, PolicyObjective(loss, lkw, agg_mode="token-mean"),
                        advantage_type="token_rewards", paper="REINFORCE++ (Hu et al.), arXiv:2501.03262", **kw)

    def bnpo(**kw):
        loss, lkw = _ppo(0.2)
        return RLRecipe("bnpo", core.bnpo_advantages, PolicyObjective(loss, lkw, agg_mode="token-mean"),
                        paper="BNPO: Beta Normalization Policy Optimization (Xiao et al.), arXiv:2506.02864", **kw)

    def remax(**kw):
        # one sampled and one greedy response per prompt; REINFORCE on the sequence (the loss
        # sums log-probs over a response, averaged over responses: seq-mean-token-sum), one
        # on-policy update per batch (the clipped ratio is then 1: plain policy gradient)
        loss, lkw = _ppo(0.2)
        kw = {"num_samples": 1, **kw}
        return RLRecipe("remax", core.remax_advantages, PolicyObjective(loss, lkw, agg_mode="seq-mean-token-sum"),
                        advantage_type="greedy_baseline",
                        paper="ReMax (Li et al.), arXiv:2310.10505", **kw)

    def ppo(**kw):
        # verl's PPO defaults (verl/trainer/config/ppo_trainer.yaml): one sample per prompt, GAE
        # with gamma = lam = 1 and whitened advantages, clip 0.2, value clip 0.5, token-mean for
        # actor and critic, one PPO epoch over 4 mini-batches (256 of 1024), KL-in-reward off
        # (InstructGPT, arXiv:2203.02155, folds a per-token k1 KL into the reward: set
        # kl_in_reward_coef, verl's kl_coef is 0.001, and pass ref_params); the critic is
        # initialised from the actor (Critic.create(..., policy_params=...)) and trained with its
        # own optimiser (verl: lr 1e-5, ten times the actor's)
        loss, lkw = _ppo(0.2)
        kw = {"num_samples": 1, "num_minibatches": 4, "value_objective": ValueObjective(0.5, "token-mean"), **kw}
        return RLRecipe("ppo", core.gae_advantages, PolicyObjective(loss, lkw, agg_mode="token-mean"),
                        advantage_type="critic",
                        paper="PPO (Schulman et al.), arXiv:1707.06347; GAE, arXiv:1506.02438; "
                              "InstructGPT (Ouyang et al.), arXiv:2203.02155", **kw)

    return {"grpo": grpo, "dr_grpo": dr_grpo, "dapo": dapo, "gspo": gspo, "rloo": rloo,
            "reinforce_pp_baseline": reinforce_pp_baseline, "reinforce_pp": reinforce_pp, "bnpo": bnpo,
            "remax": remax, "ppo": ppo}


RECIPES = _make_recipes()


def recipe(name: str, **overrides: Any) -> RLRecipe:
    """A preset recipe by name (see :data:`RECIPES`), with field overrides."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}")
    return RECIPES[name](**overrides)


def to_target_aligned(values: np.ndarray | jax.Array, prompt_len: int) -> Any:
    """``[N, T]`` completion-aligned values to ``[N, P + T - 1]`` target-aligned (zeros over
    the prompt)."""
    if prompt_len < 1:
        raise ValueError(f"prompt_len must be >= 1, got {prompt_len}")
    xp = jnp if isinstance(values, jax.Array) else np
    n = values.shape[0]
    pad = xp.zeros((n, prompt_len - 1) + values.shape[2:], values.dtype)
    return xp.concatenate([pad, values], axis=1)


def build_rl_batch(prompt_ids: Sequence[Sequence[int]], rollout: Any, prompt_len: int, pad_id: int
                   ) -> dict[str, np.ndarray]:
    """Train arrays from a group rollout (host numpy, from :class:`~jaxrl_llm.rollout.Sampler`).

    Returns ``tokens [N, P + T]`` int32, ``mask [N, P + T]``, ``loss_mask``/``old_logp``
    ``[N, P + T - 1]`` (the sampler's log-probs), ``completion_mask [N, T]`` and
    ``group_ids [N]`` (the prompt of each row).
    """
    toks, cmask = np.asarray(rollout.tokens), np.asarray(rollout.mask).astype(bool)
    n, t = toks.shape
    group = np.asarray(rollout.prompt_index).astype(np.int32)
    prompts = np.full((n, prompt_len), pad_id, np.int32)
    pmask = np.zeros((n, prompt_len), bool)
    for i, g in enumerate(group):
        p = prompt_ids[g]
        if len(p) > prompt_len:
            raise ValueError(f"prompt {g} has {len(p)} tokens > prompt_len={prompt_len}")
        prompts[i, prompt_len - len(p):] = p
        pmask[i, prompt_len - len(p):] = True
    return {
        "tokens": np.concatenate([prompts, toks.astype(np.int32)], axis=1),
        "mask": np.concatenate([pmask, cmask], axis=1),
        "loss_mask": to_target_aligned(cmask, prompt_len),
        "old_logp": to_target_aligned(np.where(cmask, np.asarray(rollout.logprobs, np.float32), 0.0), prompt_len),
        "completion_mask": cmask,
        "group_ids": group,
    }


def outcome_token_rewards(scores: jax.Array, completion_mask: jax.Array) -> jax.Array:
    """``[N, T]`` token rewards: each row's score on its last completion token, 0 elsewhere
    (and 0 for a row with no completion token)."""
    m = jnp.asarray(completion_mask).astype(bool)
    t = m.shape[1]
    last = t - 1 - jnp.argmax(m[:, ::-1], axis=1)
    at_last = (jnp.arange(t)[None] == last[:, None]) & m
    return jnp.where(at_last, jnp.asarray(scores, jnp.float32)[:, None], 0.0)


def advantages_and_returns(rec: RLRecipe, scores: jax.Array, completion_mask: jax.Array, group_ids: jax.Array,
                           num_groups: int, *, valid: jax.Array | None = None, token_rewards: jax.Array | None = None,
                           baseline_scores: jax.Array | None = None, values: jax.Array | None = None
                           ) -> tuple[jax.Array, jax.Array | None]:
    """``([N, T] advantages, [N, T] returns or None)`` of the recipe's estimator (jit-able;
    ``num_groups`` static).

    ``valid``: ``[N]`` rows that take part (group estimators; the others see the rows through
    ``completion_mask``, which must then be zero on invalid rows). ``token_rewards``
    (token-reward kinds; default :func:`outcome_token_rewards` of ``scores``),
    ``baseline_scores`` (``[N]``, ``greedy_baseline``: the greedy reward of each row's
    prompt), ``values`` (``[N, T]``, ``critic``).
    """
    kw = dict(rec.advantage_kwargs)
    kind = rec.advantage_type
    if kind == "group":
        if valid is not None:
            kw["valid"] = valid
        return rec.advantage(scores, completion_mask, group_ids, num_groups, **kw), None
    if token_rewards is None:
        token_rewards = outcome_token_rewards(scores, completion_mask)
    if kind == "greedy_baseline":
        if baseline_scores is None:
            raise ValueError(f"recipe {rec.name!r} (advantage_type='greedy_baseline') needs baseline_scores")
        return rec.advantage(token_rewards, baseline_scores, completion_mask, **kw)
    if kind == "critic":
        if values is None:
            raise ValueError(f"recipe {rec.name!r} (advantage_type='critic') needs values")
        return rec.advantage(token_rewards, values, completion_mask, gamma=rec.gamma, lam=rec.lam,
                             whiten=rec.whiten_advantages, **kw)
    return rec.advantage(token_rewards, completion_mask, gamma=rec.gamma, **kw)


def compute_advantages(rec: RLRecipe, scores: jax.Array, completion_mask: jax.Array, group_ids: jax.Array,
                       num_groups: int, **inputs: Any) -> jax.Array:
    """``[N, T]`` advantages of the recipe's estimator (see :func:`advantages_and_returns`)."""
    return advantages_and_returns(rec, scores, completion_mask, group_ids, num_groups, **inputs)[0]


def minibatches(batch: dict, num_minibatches: int, key: jax.Array | None) -> list[dict]:
    """The rows of ``batch`` shuffled (when ``key`` is given) and split into equal parts."""
    n = next(iter(batch.values())).shape[0]
    if n % num_minibatches:
        raise ValueError(f"{n} rows are not divisible into {num_minibatches} mini-batches")
    order = np.arange(n) if key is None else np.asarray(jax.random.permutation(key, n))
    size = n // num_minibatches
    return [{k: v[order[i * size:(i + 1) * size]] for k, v in batch.items()} for i in range(num_minibatches)]

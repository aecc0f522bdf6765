"""Advantage estimators as registered parts: ``recipe.advantage=<name>``.

An estimator is a pure function ``fn(x: EstimatorInputs, **params) -> Advantages`` over the
arrays the training loop provides (completion-aligned, ``[N, T]`` for ``N`` rows of ``T``
response tokens) and a :class:`~jaxrl_llm.algorithms.registry.Part` that says what it needs
(``requires``). Every estimator sees

* ``scores [N]`` float32: sequence rewards after the recipe's shaping;
* ``mask [N, T]`` bool: the response tokens that are trained on (rows that do not take part
  are all-zero);
* ``valid [N]`` bool: the rows that take part, given when some may not (dynamic sampling fills
  a batch with dropped groups that are not valid); absent, every row takes part, so read it
  with ``x.get("valid")``;
* ``group_ids [N]`` int32 and the static ``x.num_groups``: the prompt of each row;

and, only when it lists them in ``requires``:

* ``token_rewards [N, T]``: the score on each row's last response token, minus the per-token
  KL to the reference when the recipe puts the KL in the reward (``recipe.kl.placement=reward``);
* ``values [N, T]``: a critic's values (the loop trains a critic for such a recipe);
* ``greedy_scores [N]``: the reward of a greedy completion of each row's prompt (the loop
  decodes and scores it);
* ``old_logp [N, T]``: log-probs of the sampled tokens under the sampling policy;
* ``ref_logp [N, T]``: log-probs under the frozen reference policy;
* ``sum_pi_squared [N, T]``: ``sum_v pi(v)^2`` of the sampling policy at each response position;
* ``old_entropy [N, T]``: the token entropy of the sampling policy (at the sampling temperature)
  at each response position;
* ``mc_cuts [N, T]``, ``mc_values [N, T]``: SPO's cut points (1 where the prefix before the
  token is a cut point: before every ``interval``-th token of probability below ``threshold``)
  and there the mean reward of ``rollouts`` continuations sampled from that prefix (the
  estimator's arguments of those names set the provider);
* ``prompt_confidence [N]``: the mean log-prob of the least likely ``fraction`` (the estimator's
  argument, default 0.2) of each row's prompt tokens under the sampling policy (ProGRPO);
* ``aux_logp [N, T]``: log-probs of the sampled tokens under the auxiliary policy
  (``model.aux_params``, e.g. a DPO-trained model: RTO's token rewards);
* ``component_scores [N, K]``: the score of each reward function separately (unweighted; a
  function that does not apply to a row counts 0);
* ``truncated [N]`` float32: 1 where the response was cut by the length budget (no stop token),
  0 where it finished;
* ``tree_prefix_ids [N, D + 1]`` int32: with TreePO's tree sampler (``rollout.tree_segment``),
  the dense id of the subtree holding each row's first ``d`` segments (column 0: the prompt),
  ``-1`` past the row's depth;
* ``answer_ids [N]`` int32: the answer cluster of each row (the recipe's clusterer over the
  decoded completions, :mod:`jaxrl_llm.algorithms.answers`), in ``[0, N)``, equal only for rows
  of one prompt with equivalent answers;

and in agent runs (multi-turn episodes; ``K`` = the most policy turns of any episode, the
response is every token after the first prompt, ``mask`` its policy tokens):

* ``turn_rewards [N, K]`` float32: the environment's reward after each policy turn;
* ``turn_mask [N, K]`` bool: the turns each episode has (a prefix);
* ``turn_ids [N, T]`` int32: the turn of each response token (-1 for observation tokens);
* ``state_ids [N, K]`` int32: ids of ``(group, state key)`` pairs, equal for the same state of
  the same environment seed, in ``[0, N * K)`` (-1 past the last turn);
* ``turn_entropy [N, K]`` float32: the sampling policy's mean token entropy over each turn;
* ``agent_ids [N, K]`` int32: the agent that acted at each turn (``info["agent_id"]``, 0 by
  default);
* ``turn_tool_calls [N, K]`` float32: the tool calls the environment counted at each turn
  (``info["tool_calls"]``);
* ``matchtir_rewards [N, K]`` float32: MatchTIR's turn rewards, each turn's tool calls matched to
  the episode's gold calls (``reset``'s ``info["gold_calls"]``; the environment's reward for a turn
  without calls), :func:`jaxrl_llm.rewards.tool_matching.turn_rewards`;
* ``rlvmr_rewards [N, K]`` float32 and ``rlvmr_tags [N, K]`` int32: RLVMR's meta-reasoning rule
  reward of each turn and its tag (:func:`jaxrl_llm.training.agent_loop.rlvmr_turn_rewards`);
* ``gt_logp [N, K + 1]`` float32: the sampling policy's mean log-prob per token of the gold
  answer (``reset``'s ``info["answer"]``) after the first prompt and after each turn.

Reading an input that is not declared raises at trace time, so an estimator cannot silently
depend on something the loop would not compute. ``Advantages.returns`` are the critic's
targets where the estimator has them (GAE).

Add an estimator: write the function, register it with :func:`register_estimator` (one
entry), add a test; the loop needs no change if it only reads what is listed above
(``docs/extending.md`` walks through one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

import jaxrl_llm.core as core
from jaxrl_llm.algorithms.registry import Part, new_registry

__all__ = ["Advantages", "EstimatorInputs", "ESTIMATORS", "BASE_INPUTS", "PROVIDED_INPUTS", "AGENT_KINDS",
           "register_estimator", "budget_bounds"]

#: inputs every estimator receives
BASE_INPUTS = frozenset({"scores", "mask", "valid", "group_ids"})
#: inputs the loop can provide on request (``Part.requires``) and their kind: ``"token"`` ``[N, T]``,
#: ``"sequence"`` ``[N]``, ``"components"`` ``[N, K]`` (the loop's providers compute them:
#: :mod:`jaxrl_llm.training.providers`)
PROVIDED_INPUTS: dict[str, str] = {"token_rewards": "token", "values": "token", "greedy_scores": "sequence",
                                   "old_logp": "token", "ref_logp": "token", "sum_pi_squared": "token",
                                   "old_entropy": "token", "aux_logp": "token",
                                   # ROVER: the sampling policy's vocabulary-mean log-prob at each position
                                   "old_mean_logp": "token",
                                   # PAPO: the sampled tokens' log-probs given a masked prompt (no gradient)
                                   "masked_logp": "token",
                                   # Monte-Carlo values at cut points inside the responses (SPO, PAV):
                                   # the cut points (1 before a cut token) and the value there
                                   "mc_cuts": "token", "mc_values": "token",
                                   # the prompt's low-probability confidence under the sampling policy, [N]
                                   "prompt_confidence": "sequence",
                                   # the training iteration the batch was sampled at (0-based), [N]: a schedule's clock
                                   "iteration": "sequence",
                                   "component_scores": "components",
                                   # the run's per-prompt statistics before this step (prompt_store.STORE_INPUTS), [N]
                                   "prompt_seen": "sequence", "prompt_pass_rate": "sequence",
                                   "prompt_reward_mean": "sequence", "prompt_reward_var": "sequence",
                                   "prompt_length_mean": "sequence", "prompt_last_step": "sequence",
                                   # SPO's tracked success probability of the row's prompt (before the step), [N]
                                   "spo_value": "sequence",
                                   # the answer cluster of each row (recipe.clusterer), [N] int
                                   "answer_ids": "sequence_int",
                                   # 1 where the response did not finish (cut by the length budget), [N]
                                   "truncated": "sequence",
                                   # TreePO: the dense id of each row's depth-d subtree, [N, D + 1] int
                                   # (column 0 the prompt, -1 past the row's depth; tree rollouts only)
                                   "tree_prefix_ids": "tree_index",
                                   # multi-turn episodes (the agent loop only): [N, K] per policy turn,
                                   # [N, T] turn index of each response token (-1: observation)
                                   "turn_rewards": "turn", "turn_mask": "turn_mask", "state_ids": "turn_index",
                                   "turn_ids": "token_index", "turn_entropy": "turn", "agent_ids": "turn_index",
                                   "gt_logp": "turn_boundary", "turn_tool_calls": "turn", "matchtir_rewards": "turn",
                                   # DECS: the decoupled token rewards (necessary vs redundant thinking), [N, T]
                                   "decs_token_rewards": "token",
                                   # BRPO: per row, the mean summary score after each thinking budget, [N, S]
                                   "budget_scores": "components",
                                   # AlignDistil: the teacher's log-prob of each sampled token and its weight w
                                   "teacher_logp": "token", "teacher_weight": "token",
                                   # Nash-MD: each row's preference over its mixture opponent, [N]
                                   "nash_pref": "sequence",
                                   # SPA-RL: the progress estimator's per-turn contributions and
                                   # the environment's grounding signal (action executed), [N, K]
                                   "progress": "turn", "grounding": "turn",
                                   # RLVMR: each turn's meta-reasoning rule reward and tag (0 none, 1 planning,
                                   # 2 explore, 3 reflection)
                                   "rlvmr_rewards": "turn", "rlvmr_tags": "turn_index"}
#: the kinds only the agent loop provides (multi-turn episodes)
AGENT_KINDS = frozenset({"turn", "turn_mask", "turn_index", "token_index", "turn_boundary"})


class Advantages(NamedTuple):
    """An estimator's output: ``advantages [N, T]`` float32 (zero outside the mask) and, for
    estimators that have them, ``returns [N, T]`` (a critic's regression targets); ``loss_mask
    [N, T]`` bool restricts the loss to a subset of the response tokens (SPO's probability mask:
    the others leave the loss and its normaliser), ``None`` keeps the response mask."""

    advantages: jax.Array
    returns: jax.Array | None = None
    loss_mask: jax.Array | None = None


class EstimatorInputs(Mapping):
    """The arrays an estimator may read, with the static ``num_groups``.

    Reading a key outside :data:`BASE_INPUTS` and the estimator's ``requires`` raises a
    ``KeyError`` that names the estimator and the key.
    """

    def __init__(self, arrays: Mapping[str, Any], num_groups: int, *, allowed: frozenset[str] | None = None,
                 owner: str = "estimator"):
        self._arrays = dict(arrays)
        self.num_groups = int(num_groups)
        self._allowed = None if allowed is None else frozenset(allowed) | BASE_INPUTS
        self._owner = owner

    def __getitem__(self, key: str) -> Any:
        if self._allowed is not None and key not in self._allowed:
            raise KeyError(f"{self._owner} reads {key!r} but does not list it in requires "
                           f"(declared: {sorted(self._allowed - BASE_INPUTS) or 'nothing beyond the base inputs'})")
        if key not in self._arrays:
            raise KeyError(f"{self._owner} needs {key!r}, which the loop did not provide (provided: "
                           f"{sorted(self._arrays)})")
        return self._arrays[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)


ESTIMATORS = new_registry("advantage estimator", "recipe.advantage",
                          "fn(x: EstimatorInputs, **params) -> Advantages(advantages [N, T], returns | None)")


def register_estimator(name: str, *, paper: str, core: tuple[str, ...] = (), requires: tuple[str, ...] = (),
                       group_relative: bool = False, methods: tuple[int, ...] = (), verified: str = "",
                       tests: str = "tests/core/test_advantages.py", note: str = "",
                       defaults: tuple[tuple[str, Any], ...] = ()) -> Callable:
    """Decorator: register ``fn(x, **params) -> Advantages`` as estimator ``name``.

    ``requires``: inputs beyond :data:`BASE_INPUTS` (each must be in :data:`PROVIDED_INPUTS`);
    ``group_relative``: the estimator compares the samples of one prompt, so a recipe using it
    needs at least two samples per prompt.
    """
    unknown = set(requires) - set(PROVIDED_INPUTS)
    if unknown:
        raise ValueError(f"estimator {name!r}: the loop cannot provide {sorted(unknown)}; it provides "
                         f"{sorted(PROVIDED_INPUTS)} (add a provider to jaxrl_llm.training.providers first)")

    def deco(fn: Callable) -> Callable:
        ESTIMATORS.register(Part(name, fn, paper=paper, core=core, requires=frozenset(requires), defaults=defaults,
                                 methods=methods, verified=verified, tests=tests, note=note,
                                 flags=(("group_relative", group_relative),)))
        return fn
    return deco


# ------------------------------------------------------------------------------------ outcome, group-relative

_DSM = "DeepSeekMath (Shao et al.), arXiv:2402.03300"
_GROUP_TESTS = "tests/core/test_advantages.py, tests/conformance/test_verl_conformance.py"


def _group(fn, x, **kw):
    return Advantages(fn(x["scores"], x["mask"], x["group_ids"], x.num_groups, valid=x.get("valid"), **kw))


@register_estimator("grpo", paper=_DSM, core=("grpo_advantages",), group_relative=True, verified="verl, TRL",
                    tests=_GROUP_TESTS)
def grpo(x, *, scale_by_std: bool = True, epsilon: float = 1e-6, unbiased_std: bool = True) -> Advantages:
    """GRPO: ``(r - mean_g r) / (std_g r + epsilon)`` per prompt group."""
    return _group(core.grpo_advantages, x, scale_by_std=scale_by_std, epsilon=epsilon, unbiased_std=unbiased_std)


@register_estimator("dr_grpo", paper="Understanding R1-Zero-Like Training (Liu et al.), arXiv:2503.20783",
                    core=("dr_grpo_advantages",), group_relative=True, verified="verl, TRL", tests=_GROUP_TESTS)
def dr_grpo(x) -> Advantages:
    """Dr.GRPO: ``r - mean_g r`` (no std division)."""
    return _group(core.dr_grpo_advantages, x)


@register_estimator("rloo", paper="Back to Basics: REINFORCE style optimization (Ahmadian et al.), arXiv:2402.14740",
                    core=("rloo_advantages",), group_relative=True, verified="verl", tests=_GROUP_TESTS)
def rloo(x, *, singleton: str = "score") -> Advantages:
    """RLOO: the leave-one-out group mean as baseline."""
    return _group(core.rloo_advantages, x, singleton=singleton)


@register_estimator("reinforce_pp_baseline", paper="REINFORCE++ (Hu et al.), arXiv:2501.03262",
                    core=("reinforce_pp_baseline_advantages",), group_relative=True, verified="verl",
                    tests=_GROUP_TESTS)
def reinforce_pp_baseline(x) -> Advantages:
    """REINFORCE++-baseline: group-mean baseline, then batch whitening."""
    return _group(core.reinforce_pp_baseline_advantages, x)


@register_estimator("opo", paper="On-Policy RL with Optimal Reward Baseline (Hao et al.), arXiv:2505.23585",
                    core=("opo_advantages",), group_relative=True, verified="verl", tests=_GROUP_TESTS)
def opo(x) -> Advantages:
    """OPO: length-weighted group baseline."""
    return _group(core.opo_advantages, x)


@register_estimator("grpo_passk", paper="Optimizing Language Models for Inference Time Objectives using "
                                        "Reinforcement Learning (Tang et al.), arXiv:2503.19595",
                    core=("grpo_passk_advantages",), group_relative=True, verified="verl", tests=_GROUP_TESTS)
def grpo_passk(x, *, scale_by_std: bool = True, epsilon: float = 1e-6) -> Advantages:
    """Pass@k: only each group's best sample learns, by its margin over the second best."""
    return _group(core.grpo_passk_advantages, x, scale_by_std=scale_by_std, epsilon=epsilon)


@register_estimator("gpg", paper="GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning "
                                 "(Chu et al.), arXiv:2504.02546",
                    core=("gpg_advantages",), group_relative=True, verified="verl", tests=_GROUP_TESTS)
def gpg(x, *, f_norm: float = 1.0) -> Advantages:
    """GPG: group-mean baseline rescaled by the batch's share of non-zero rewards."""
    return _group(core.gpg_advantages, x, f_norm=f_norm)


@register_estimator("nash_md", paper="Nash Learning from Human Feedback (Nash-MD; Munos et al.), arXiv:2312.00886",
                    core=("nash_md_preference",), requires=("nash_pref",), methods=(200,),
                    verified="TRL (NashMDTrainer: probability - 0.5 as the REINFORCE weight)",
                    tests="tests/training/test_nash_md.py",
                    note="A = P(y > y') - 1/2 on every response token, P from recipe.loop_part=nash_md (the mixture's "
                         "samples scored by the run's rewards)")
def nash_md(x) -> Advantages:
    """Nash-MD's REINFORCE weight: the preference over the mixture's sample minus 1/2."""
    import jax.numpy as jnp

    m = x["mask"].astype(jnp.float32)
    return Advantages((x["nash_pref"].astype(jnp.float32) - 0.5)[:, None] * m)


@register_estimator("brpo", paper="Optimizing Anytime Reasoning via Budget Relative Policy Optimization "
                                  "(AnytimeReasoner / BRPO), arXiv:2505.13438",
                    core=("brpo_advantages", "brpo_budget_prior"), requires=("budget_scores",), group_relative=True,
                    methods=(13,), verified="hand values; the authors' code's formula (sail-sg/AnytimeReasoner @7e3f5bb)",
                    tests="tests/core/test_group_advantages.py, tests/training/test_brpo.py, tests/conformance/test_brpo_authors.py",
                    note="with recipe.loop_part=brpo (the summaries after each budget); the thinking tokens of segment "
                         "j (between budgets j-1 and j, budgets (j+1) T / S of the response length T) get BRPO's "
                         "advantage; the summaries are scored, not trained (the paper trains them too)")
def brpo(x, *, prior: str = "linear", variant: str = "brpo") -> Advantages:
    """BRPO's segment advantages on the thinking tokens (the number of budgets is the loop
    part's: the width of ``budget_scores``)."""
    import jax.numpy as jnp

    m = x["mask"]
    t = m.shape[1]
    sc = x["budget_scores"]
    num_budgets = sc.shape[1]
    adv = core.brpo_advantages(sc, x["group_ids"], x.num_groups, prior=core.brpo_budget_prior(num_budgets, prior),
                               variant=variant, valid=x.get("valid"))
    bounds = jnp.asarray(budget_bounds(t, num_budgets))
    seg = jnp.clip(jnp.searchsorted(bounds, jnp.arange(t), side="right"), 0, num_budgets - 1)
    return Advantages(jnp.where(m > 0, adv[:, seg], 0.0))


def budget_bounds(length: int, num_budgets: int) -> list[int]:
    """BRPO's budgets for responses of ``length`` tokens: ``b_j = ceil((j + 1) length / S)``, the
    last the whole length (the thinking is cut after ``b_j`` tokens)."""
    return [int(-(-(j + 1) * length // num_budgets)) for j in range(num_budgets)]


@register_estimator("decs", paper="Overthinking Reduction with Decoupled Rewards and Curriculum Data Scheduling "
                                  "(DECS), arXiv:2509.25827",
                    core=("decs_advantages", "decs_token_rewards"), requires=("decs_token_rewards",),
                    group_relative=True, methods=(178,),
                    verified="hand values (the authors' code's rewards and per-position normalisation)",
                    tests="tests/core/test_group_advantages.py, tests/training/test_decs.py, tests/conformance/test_decs_authors.py",
                    note="token rewards 1 + beta up to the first thinking chunk that already holds a correct answer, "
                         "1 + beta (1 - L / L_max) after it, 0 for wrong responses, normalised per position across the "
                         "group; the detector is the run's verifier on the chunk prefixes (the paper: a trained NRP "
                         "model); the curriculum of easy prompts is not reproduced")
def decs(x, *, beta: float = 0.1, epsilon: float = 1e-6, pad_in_stats: bool = True, threshold: float = 1.0,
         metric: str | None = None, max_length: float | None = None) -> Advantages:
    """DECS's per-position group-normalised advantages of its decoupled token rewards (``beta``,
    ``threshold``, ``metric``, ``max_length`` are read by the loop's reward pass)."""
    del beta, threshold, metric, max_length
    return Advantages(core.decs_advantages(x["decs_token_rewards"], x["mask"], x["group_ids"], x.num_groups,
                                           epsilon=epsilon, pad_in_stats=pad_in_stats, valid=x.get("valid")))


@register_estimator("lite_ppo", paper="Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning "
                                      "(Liu et al.), arXiv:2508.08221",
                    core=("lite_ppo_advantages",), group_relative=True, methods=(237,), verified="hand values")
def lite_ppo(x, *, epsilon: float = 1e-6, unbiased_std: bool = True) -> Advantages:
    """Lite PPO: group mean, batch standard deviation."""
    return _group(core.lite_ppo_advantages, x, epsilon=epsilon, unbiased_std=unbiased_std)


@register_estimator("bnpo", paper="BNPO: Beta Normalization Policy Optimization (Xiao et al.), arXiv:2506.02864",
                    core=("bnpo_advantages",), group_relative=True, methods=(147,),
                    verified="paper identity, hand values")
def bnpo(x, *, r_min: float = 0.0, r_max: float = 1.0, alpha: float | None = None, beta: float | None = None,
         max_weight: float = 1e6) -> Advantages:
    """BNPO on the total score: Beta-normalised group advantage with an adaptive Beta fit."""
    return _group(core.bnpo_advantages, x, r_min=r_min, r_max=r_max, alpha=alpha, beta=beta, max_weight=max_weight)


@register_estimator("bnpo_decomposed", paper="BNPO: Beta Normalization Policy Optimization (Xiao et al.), "
                                             "arXiv:2506.02864",
                    core=("bnpo_advantages",), requires=("component_scores",), group_relative=True, methods=(147,),
                    verified="paper identity, hand values",
                    note="the paper's advantage decomposition: each reward function normalised separately and "
                         "the advantages averaged; r_min / r_max may be lists, one per reward function")
def bnpo_decomposed(x, *, r_min: Any = 0.0, r_max: Any = 1.0, alpha: float | None = None, beta: float | None = None,
                    max_weight: float = 1e6) -> Advantages:
    """BNPO with advantage decomposition over the reward functions (``component_scores``)."""
    return Advantages(core.bnpo_advantages(x["component_scores"], x["mask"], x["group_ids"], x.num_groups,
                                           r_min=_static(r_min), r_max=_static(r_max), alpha=alpha, beta=beta,
                                           max_weight=max_weight, valid=x.get("valid")))


@register_estimator("ngrpo", paper="NGRPO: Negative-enhanced Group Relative Policy Optimization, arXiv:2509.18851",
                    core=("ngrpo_advantages",), group_relative=True, methods=(188,),
                    verified="paper identity, hand values")
def ngrpo(x, *, r_max: float = 1.0, epsilon: float = 1e-6) -> Advantages:
    """NGRPO: GRPO statistics with one virtual maximum-reward sample per group."""
    return _group(core.ngrpo_advantages, x, r_max=r_max, epsilon=epsilon)


@register_estimator("gdpo", paper="GDPO: Group reward-Decoupled Normalization Policy Optimization, arXiv:2601.05242",
                    core=("gdpo_advantages",), requires=("component_scores",), group_relative=True, verified="verl",
                    tests=_GROUP_TESTS,
                    note="weights: one per reward function in the order of the run's rewards (default: ones)")
def gdpo(x, *, weights: Any = None, scale_by_std: bool = True, epsilon: float = 1e-6) -> Advantages:
    """GDPO: each reward function group-normalised separately, summed with weights, whitened."""
    w = None if weights is None else jnp.asarray(weights, jnp.float32)
    return Advantages(core.gdpo_advantages(x["component_scores"], x["mask"], x["group_ids"], x.num_groups, weights=w,
                                           scale_by_std=scale_by_std, epsilon=epsilon, valid=x.get("valid")))


def _static(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


# ------------------------------------------------------------------------------------ token-level


@register_estimator("reinforce_pp", paper="REINFORCE++ (Hu et al.), arXiv:2501.03262",
                    core=("reinforce_pp_advantages",), requires=("token_rewards",), verified="verl",
                    tests=_GROUP_TESTS)
def reinforce_pp(x, *, gamma: float = 1.0) -> Advantages:
    """REINFORCE++: discounted token returns whitened over the batch."""
    adv, ret = core.reinforce_pp_advantages(x["token_rewards"], x["mask"], gamma=gamma)
    return Advantages(adv, ret)


@register_estimator("remax", paper="ReMax (Li et al.), arXiv:2310.10505", core=("remax_advantages",),
                    requires=("token_rewards", "greedy_scores"), methods=(69,), verified="verl", tests=_GROUP_TESTS)
def remax(x) -> Advantages:
    """ReMax: reward-to-go minus the reward of the greedy completion of the same prompt."""
    adv, ret = core.remax_advantages(x["token_rewards"], x["greedy_scores"], x["mask"])
    return Advantages(adv, ret)


@register_estimator("gae", paper="PPO (Schulman et al.), arXiv:1707.06347; GAE, arXiv:1506.02438",
                    core=("gae_advantages", "clipped_value_loss"), requires=("token_rewards", "values"),
                    verified="verl", tests=_GROUP_TESTS,
                    note="the loop trains a critic (clipped value loss, recipe.value_clip) initialised from the policy")
def gae(x, *, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True) -> Advantages:
    """GAE with a learned critic (PPO); returns are the critic's targets."""
    adv, ret = core.gae_advantages(x["token_rewards"], x["values"], x["mask"], gamma=gamma, lam=lam, whiten=whiten)
    return Advantages(adv, ret)


@register_estimator("optimal_token_baseline", paper="The Optimal Token Baseline: Variance Reduction for Long-Horizon "
                                                    "LLM-RL (Li et al.), arXiv:2602.07078",
                    core=("optimal_token_baseline_advantages", "sum_pi_squared_from_logits"),
                    requires=("token_rewards", "old_logp", "sum_pi_squared"), group_relative=True, verified="verl",
                    tests=_GROUP_TESTS,
                    note="align='response' is verl's tir_optimal_token_baseline (multi-turn masks with holes)")
def optimal_token_baseline(x, *, align: str = "position", handle_zero_tail: bool = True,
                           epsilon: float = 1e-8) -> Advantages:
    """Optimal Token Baseline: per-token group baseline weighted by the path variance."""
    adv, ret = core.optimal_token_baseline_advantages(
        x["token_rewards"], x["old_logp"], x["sum_pi_squared"], x["mask"], x["group_ids"], x.num_groups,
        align=align, handle_zero_tail=handle_zero_tail, epsilon=epsilon, valid=x.get("valid"))
    return Advantages(adv, ret)


@register_estimator("egae", paper="Truncated Proximal Policy Optimization (T-PPO), arXiv:2506.15050",
                    core=("egae_advantages", "clipped_value_loss"), requires=("token_rewards", "values", "truncated"),
                    methods=(24,), verified="hand values, paper identity (no truncation: GAE)", tests=_GROUP_TESTS,
                    note="GAE that bootstraps responses cut by the length budget (V(s_l) = V(s_{l-1})) instead of "
                         "scoring them; the paper's windowed successive sampling is not implemented")
def egae(x, *, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True) -> Advantages:
    """T-PPO's Extended GAE with a learned critic; truncated responses are bootstrapped (their
    score is left out of the token rewards, a KL penalty in the reward stays)."""
    m = x["mask"].astype(bool)
    t = m.shape[1]
    last = t - 1 - jnp.argmax(m[:, ::-1], axis=1)
    at_last = (jnp.arange(t)[None] == last[:, None]) & m
    trunc = x["truncated"] > 0
    rewards = x["token_rewards"] - jnp.where(at_last & trunc[:, None], x["scores"][:, None], 0.0)
    adv, ret = core.egae_advantages(rewards, x["values"], x["mask"], trunc, gamma=gamma, lam=lam, whiten=whiten)
    return Advantages(adv, ret)


@register_estimator("rto", paper="DPO Meets PPO: Reinforced Token Optimization for RLHF (RTO, Zhong et al.), "
                                 "arXiv:2404.18922",
                    core=("rto_token_rewards", "gae_advantages"), requires=("token_rewards", "values", "aux_logp",
                                                                            "ref_logp"),
                    methods=(139,), verified="hand values (the authors' code's reward), GAE: verl",
                    tests="tests/core/test_advantages.py, tests/training/test_aux_policy.py",
                    note="dense token rewards beta1 clip(log pi_dpo - log pi_ref, +-c) from the auxiliary policy "
                         "(model.aux_params: a DPO model) plus the outcome and the recipe's KL in the reward, then "
                         "PPO's GAE with a critic")
def rto(x, *, scale: float = 0.05, clip: float = 0.05, gamma: float = 1.0, lam: float = 0.95,
        whiten: bool = True) -> Advantages:
    """RTO: PPO on the DPO model's token-level implicit rewards (plus the outcome and the KL)."""
    dense = core.rto_token_rewards(x["aux_logp"], x["ref_logp"], x["mask"], scale=scale, clip=clip)
    adv, ret = core.gae_advantages(x["token_rewards"] + dense, x["values"], x["mask"], gamma=gamma, lam=lam,
                                   whiten=whiten)
    return Advantages(adv, ret)


@register_estimator("kepo", paper="KEPO: Knowledge-Enhanced Preference Optimization for Reinforcement Learning with "
                                  "Reasoning, arXiv:2602.00400",
                    core=("grpo_advantages", "gated_distillation_advantages"), requires=("old_logp", "aux_logp"),
                    group_relative=True, methods=(49,),
                    verified="hand values, identity (coef 0: GRPO); the form is our reading of the abstract (no code)",
                    tests="tests/core/test_advantages.py, tests/training/test_aux_policy.py",
                    note="GRPO's advantage plus coef x (log pi_teacher - log pi_old) per token on the responses scoring "
                         ">= threshold only (quality-gated on-policy distillation; the teacher is model.aux_params); coef "
                         "has no default; not reproduced: the teacher-hint rejection sampling (recipe.hints=ghpo gives "
                         "reference-solution hints instead)")
def kepo(x, *, coef: float, threshold: float = 1.0, scale_by_std: bool = True, epsilon: float = 1e-6) -> Advantages:
    """KEPO: GRPO plus the teacher's reverse-KL token reward on the good responses."""
    adv = core.grpo_advantages(x["scores"], x["mask"], x["group_ids"], x.num_groups, valid=x.get("valid"),
                               scale_by_std=scale_by_std, epsilon=epsilon)
    gate = jnp.asarray(x["scores"]) >= threshold
    if x.get("valid") is not None:
        gate = gate & jnp.asarray(x["valid"], bool)
    return Advantages(core.gated_distillation_advantages(adv, x["old_logp"], x["aux_logp"], x["mask"], gate,
                                                         coef=coef))


@register_estimator("ares", paper="ARES: Multimodal Adaptive Reasoning via Difficulty-Aware Token-Level Entropy "
                                  "Shaping (AEPO, adaptive entropy), arXiv:2510.08457",
                    core=("window_entropy_counts", "ares_entropy_reward", "grpo_advantages"),
                    requires=("old_entropy",), group_relative=True, methods=(90,),
                    verified="hand values; the authors' code's reward, buckets, window and percentile "
                             "(shawn0728/ARES @146620e)",
                    tests="tests/core/test_reward_shaping.py, tests/conformance/test_ares.py",
                    note="GRPO on the score plus the hierarchical entropy reward: each response's high window-entropy "
                         "token count against its difficulty bucket's target (prompt pass rate >= 2/3 easy, >= 1/3 "
                         "medium, else hard; the target is the bucket's mean count); not reproduced: the trigger-word "
                         "list (every response token counts), the threshold's smoothing over batches, the moving cap "
                         "alpha and the per-bucket KL controller, the cold-start data")
def ares(x, *, alpha: float = 0.5, window: int = 4, threshold: float | None = None, correct_threshold: float = 1.0,
         scale_by_std: bool = True, epsilon: float = 1e-6) -> Advantages:
    """ARES: GRPO on ``score + r_entropy`` (:func:`jaxrl_llm.core.ares_entropy_reward`)."""
    from jaxrl_llm.core.stats import group_stats

    valid = x.get("valid")
    v = jnp.ones(x["scores"].shape, bool) if valid is None else jnp.asarray(valid, bool)
    counts, _ = core.window_entropy_counts(x["old_entropy"], x["mask"] * v[:, None], window=window,
                                           threshold=threshold)
    correct = jnp.asarray(x["scores"]) >= correct_threshold
    _, rate, _ = group_stats(correct.astype(jnp.float32), x["group_ids"], x.num_groups, v)
    level = jnp.where(rate >= 2.0 / 3.0, 0, jnp.where(rate >= 1.0 / 3.0, 1, 2)).astype(jnp.int32)
    _, prompt_mean, _ = group_stats(counts, x["group_ids"], x.num_groups, v)
    # each bucket's target: the mean over its prompts of their mean count (each prompt once: its first row)
    gid, rows = jnp.asarray(x["group_ids"]), jnp.arange(counts.shape[0], dtype=jnp.int32)
    first = jnp.full(x.num_groups, counts.shape[0], jnp.int32).at[gid].min(jnp.where(v, rows, counts.shape[0]))
    is_first = (rows == first[gid]) & v
    onehot = (level[:, None] == jnp.arange(3)[None]) & is_first[:, None]
    bucket = jnp.sum(onehot * prompt_mean[:, None], 0) / jnp.maximum(jnp.sum(onehot, 0), 1)
    targets = jnp.round(bucket)[level]
    bonus = core.ares_entropy_reward(counts, targets, correct, level, alpha=alpha)
    shaped = jnp.where(v, jnp.asarray(x["scores"], jnp.float32) + bonus, 0.0)
    return Advantages(core.grpo_advantages(shaped, x["mask"], x["group_ids"], x.num_groups, valid=valid,
                                           scale_by_std=scale_by_std, epsilon=epsilon))


_SEG_T = "tests/core/test_segments.py, tests/training/test_group_estimators.py"


@register_estimator("spo_chain", paper="Segment Policy Optimization: Effective Segment-Level Credit Assignment in RL "
                                       "for Large Language Models (SPO), arXiv:2505.23564",
                    core=("spo_chain_advantages", "spo_cut_points"), requires=("old_logp", "mc_cuts", "mc_values"),
                    methods=(55,), verified="hand values (the authors' code), paper identity (telescoping)",
                    tests=_SEG_T,
                    note="cut points before every interval-th low-probability token; the loop samples rollouts "
                         "continuations from each cut prefix for its value; only low-probability tokens train")
def spo_chain(x, *, threshold: float = 0.9, interval: int = 5, rollouts: int = 4, prob_mask: bool = True,
              whiten: bool = True) -> Advantages:
    """SPO-chain: segment advantages from Monte-Carlo values at cut points (``rollouts`` is read by
    the ``mc_values`` provider)."""
    adv, keep = core.spo_chain_advantages(x["scores"], x["mc_values"], x["mc_cuts"] > 0, x["mask"], x["old_logp"],
                                          threshold=threshold, prob_mask=prob_mask, whiten=whiten)
    return Advantages(adv, None, keep)


@register_estimator("pav", paper="Rewarding Progress: Scaling Automated Process Verifiers for LLM Reasoning (PAV, "
                                 "Setlur et al.), arXiv:2410.08146",
                    core=("pav_advantages", "best_of_k_value", "spo_cut_points"),
                    requires=("old_logp", "mc_cuts", "mc_values"), methods=(226,),
                    verified="hand values (the SPO authors' PAV baseline), paper identity (alpha = 0: MC Q-value)",
                    tests=_SEG_T,
                    note="process advantage: each step's MC value plus alpha x its progress for a Best-of-K prover of "
                         "the policy, on SPO-chain's cut points (the authors' code is not public)")
def pav(x, *, alpha: float = 5.0, k: int = 4, threshold: float = 0.9, interval: int = 5, rollouts: int = 4,
        prob_mask: bool = True, whiten: bool = True) -> Advantages:
    """PAV: Q^pi + alpha x progress under a Best-of-K prover, per segment."""
    adv, keep = core.pav_advantages(x["scores"], x["mc_values"], x["mc_cuts"] > 0, x["mask"], x["old_logp"],
                                    alpha=alpha, k=k, threshold=threshold, prob_mask=prob_mask, whiten=whiten)
    return Advantages(adv, None, keep)

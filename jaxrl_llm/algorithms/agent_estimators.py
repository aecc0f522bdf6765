"""Turn-level advantage estimators for multi-turn agents: ``recipe.advantage=gigpo`` and friends.

They read the agent loop's inputs (:data:`~jaxrl_llm.algorithms.estimators.PROVIDED_INPUTS`:
``turn_rewards``, ``turn_mask``, ``turn_ids``, ``state_ids``, and on request ``turn_entropy``,
``agent_ids``, ``gt_logp``, ``progress``, ``grounding``), compute turn-level advantages with :mod:`jaxrl_llm.core.turns` and put them on the
policy tokens of each turn (:func:`~jaxrl_llm.core.broadcast_turns`); observation tokens get 0
(they are not in the loss). Only :class:`~jaxrl_llm.training.agent_loop.AgentTrainer` provides
these inputs; the single-turn loop refuses such a recipe at construction.
"""

from __future__ import annotations

from jaxrl_llm import core
from jaxrl_llm.algorithms.estimators import Advantages, register_estimator

__all__: list[str] = []

_TURN = ("turn_rewards", "turn_mask", "turn_ids")
_TESTS = "tests/core/test_turns.py, tests/training/test_agent_loop.py"


def _tokens(x, turn_adv):
    return Advantages(core.broadcast_turns(turn_adv, x["turn_ids"], x["mask"]))


@register_estimator("gigpo", paper="Group-in-Group Policy Optimization for LLM Agent Training (Feng et al.), "
                                   "arXiv:2505.10978",
                    core=("gigpo_advantages", "broadcast_turns", "turn_returns"), methods=(80,), requires=_TURN + ("state_ids",),
                    group_relative=True, verified="hand values, verl-agent's computation (numpy port in the test)",
                    tests=_TESTS,
                    note="episode-level GRPO + omega x step-level advantage within anchor-state groups (states "
                         "equal across the episodes of one environment seed); scale_by_std=false is verl-agent's "
                         "mean_norm; episode_stats=turns weights episodes by their turns as verl-agent's code does")
def gigpo(x, *, gamma: float = 0.95, omega: float = 1.0, scale_by_std: bool = True, epsilon: float = 1e-6,
          episode_stats: str = "episodes") -> Advantages:
    """GiGPO: ``A = A^E + omega * A^S`` per turn, on the turn's tokens."""
    n, k = x["turn_mask"].shape
    adv = core.gigpo_advantages(x["scores"], x["turn_rewards"], x["turn_mask"], x["state_ids"], x["group_ids"],
                                x.num_groups, n * k, gamma=gamma, omega=omega, scale_by_std=scale_by_std,
                                epsilon=epsilon, episode_stats=episode_stats, valid=x.get("valid"))
    return _tokens(x, adv)


@register_estimator("turn_baseline", paper="REINFORCE (Williams, Machine Learning (1992)) with a per-turn group-mean baseline: "
                                           "the turn-level credit of multi-turn GRPO variants (no single paper)",
                    core=("turn_group_baseline_advantages", "broadcast_turns"), requires=_TURN, group_relative=True,
                    verified="hand values", tests=_TESTS)
def turn_baseline(x, *, gamma: float = 1.0, scale_by_std: bool = False, epsilon: float = 1e-6) -> Advantages:
    """Turn-level discounted returns minus the group's mean return at the same turn index."""
    adv = core.turn_group_baseline_advantages(x["turn_rewards"], x["turn_mask"], x["group_ids"], x.num_groups,
                                              gamma=gamma, scale_by_std=scale_by_std, epsilon=epsilon,
                                              valid=x.get("valid"))
    return _tokens(x, adv)


@register_estimator("flow_grpo", paper="In-the-Flow Agentic System Optimization for Effective Planning and Tool "
                                       "Use (AgentFlow / Flow-GRPO, Li et al.), arXiv:2510.05592",
                    core=("flow_grpo_advantages", "broadcast_turns"), methods=(73,), requires=("turn_mask", "turn_ids"),
                    group_relative=True, verified="paper identity (equals GRPO on the episode), hand values",
                    tests=_TESTS, note="episode_stats=turns: the authors' code (one row per turn in the statistics)")
def flow_grpo(x, *, scale_by_std: bool = True, epsilon: float = 1e-6, episode_stats: str = "episodes"
              ) -> Advantages:
    """Flow-GRPO: the episode's group-normalised outcome on every turn."""
    adv = core.flow_grpo_advantages(x["scores"], x["turn_mask"], x["group_ids"], x.num_groups,
                                    scale_by_std=scale_by_std, epsilon=epsilon, episode_stats=episode_stats,
                                    valid=x.get("valid"))
    return _tokens(x, adv)


@register_estimator("empg", paper="Harnessing Uncertainty: Entropy-Modulated Policy Gradients for Long-Horizon "
                                  "LLM Agents (EMPG), arXiv:2509.09265",
                    core=("empg_advantages", "flow_grpo_advantages", "broadcast_turns"),
                    methods=(207,), requires=("turn_mask", "turn_ids", "turn_entropy"), group_relative=True, verified="hand values",
                    tests=_TESTS,
                    note="the base advantage is Flow-GRPO's (group-normalised outcome per turn); turn_entropy is the "
                         "sampling policy's mean token entropy over each turn")
def empg(x, *, k: float = 1.0, k_prime: float = 1.0, zeta: float = 0.05, final_norm: str = "mean",
         scale_by_std: bool = True, epsilon: float = 1e-6) -> Advantages:
    """EMPG: the outcome advantage per turn, scaled by the turn's confidence, plus the bonus of a
    confident next turn."""
    base = core.flow_grpo_advantages(x["scores"], x["turn_mask"], x["group_ids"], x.num_groups,
                                     scale_by_std=scale_by_std, epsilon=epsilon, valid=x.get("valid"))
    adv = core.empg_advantages(base, x["turn_entropy"], x["turn_mask"], k=k, k_prime=k_prime, zeta=zeta,
                               final_norm=final_norm, valid=x.get("valid"))
    return _tokens(x, adv)


@register_estimator("igpo", paper="Information Gain-based Policy Optimization: A Simple and Effective Approach for "
                                  "Multi-Turn LLM Agents (IGPO, Wang et al.), arXiv:2510.14967",
                    core=("igpo_turn_rewards", "igpo_advantages", "broadcast_turns"),
                    requires=("turn_mask", "turn_ids", "gt_logp"), group_relative=True, methods=(205,),
                    verified="hand values", tests=_TESTS,
                    note="needs an environment whose reset gives info['answer'] (the gold final answer as the policy "
                         "writes it: tool_arith, search_qa); the loop scores the policy's probability of it after "
                         "each turn (one teacher-forced pass per turn boundary); the last turn gets the episode's "
                         "return as its outcome")
def igpo(x, *, gain: str = "prob", gamma: float = 1.0, scale_by_std: bool = True, epsilon: float = 1e-6,
         norm_mode: str = "joint") -> Advantages:
    """IGPO: information-gain turn rewards (the outcome at the last turn), group-normalised, then
    discounted cumulative sums, on each turn's tokens."""
    r = core.igpo_turn_rewards(x["gt_logp"], x["turn_mask"], x["scores"], gain=gain, valid=x.get("valid"))
    adv = core.igpo_advantages(r, x["turn_mask"], x["group_ids"], x.num_groups, gamma=gamma,
                               scale_by_std=scale_by_std, epsilon=epsilon, norm_mode=norm_mode, valid=x.get("valid"))
    return _tokens(x, adv)


@register_estimator("mars", paper="MARS / MARSHAL: multi-agent reasoning through self-play in strategic games, "
                                  "arXiv:2510.15414",
                    core=("mars_advantages", "broadcast_turns"), methods=(187,), requires=_TURN + ("agent_ids",), group_relative=True,
                    verified="hand values", tests=_TESTS,
                    note="agent_ids: info['agent_id'] of each step (0 when the environment has one agent); "
                         "num_agents: the largest id + 1 the environment uses")
def mars(x, *, num_agents: int = 2, gamma: float = 1.0, scale_by_std: bool = False, epsilon: float = 1e-6
         ) -> Advantages:
    """MARS: each agent's own return-to-go, normalised within (group, agent)."""
    adv = core.mars_advantages(x["turn_rewards"], x["turn_mask"], x["agent_ids"], x["group_ids"], x.num_groups,
                               num_agents, gamma=gamma, scale_by_std=scale_by_std, epsilon=epsilon,
                               valid=x.get("valid"))
    return _tokens(x, adv)


@register_estimator("multiturn_gae", paper="PPO (Schulman et al.), arXiv:1707.06347; GAE, arXiv:1506.02438 "
                                           "(over policy tokens only: observation tokens are skipped)",
                    core=("multiturn_gae_advantages", "place_turn_rewards"),
                    requires=("turn_rewards", "turn_ids", "values"), verified="equals gae_advantages (tested)",
                    tests=_TESTS,
                    note="each turn's environment reward sits on the turn's last policy token; the loop trains a "
                         "critic (clipped value loss) initialised from the policy")
def multiturn_gae(x, *, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True) -> Advantages:
    """Multi-turn PPO: GAE over the policy tokens of the whole episode with a learned critic."""
    rewards = core.place_turn_rewards(x["turn_rewards"], x["turn_ids"], x["mask"])
    adv, ret = core.multiturn_gae_advantages(rewards, x["values"], x["mask"], gamma=gamma, lam=lam, whiten=whiten)
    return Advantages(adv, ret)


@register_estimator("spa", paper="SPA-RL: Reinforcing LLM Agents via Stepwise Progress Attribution (Wang et al.), "
                                 "arXiv:2505.20732",
                    core=("spa_turn_rewards", "spa_progress_loss", "place_turn_rewards", "multiturn_gae_advantages"),
                    methods=(215,), requires=("turn_mask", "turn_ids", "progress", "grounding", "values"),
                    verified="fused reward and estimator loss as the authors' code (prm/rl_data_org.py, "
                             "prm/train_our_progress_model.py); hand values",
                    tests=_TESTS,
                    note="the loop trains a progress estimator (a score-head copy of the policy, recipe.progress_lr) "
                         "online: each step it scores the turns with the estimator before its update, then fits "
                         "sum_k c_k to the episode return on the same batch (the paper fits it offline on SFT "
                         "rollouts first); grounding = the environment executed the action (Episodes.grounded); "
                         "PPO as the paper: GAE over the policy tokens with the loop's critic")
def spa(x, *, alpha: float = 1.0, beta: float = 0.5, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True
        ) -> Advantages:
    """SPA-RL: per-turn rewards ``alpha c_k + beta g_k`` (progress contribution, grounding), on
    each turn's last policy token, through multi-turn GAE with the critic."""
    r = core.spa_turn_rewards(x["progress"], x["turn_mask"], x["grounding"], alpha=alpha, beta=beta)
    rewards = core.place_turn_rewards(r, x["turn_ids"], x["mask"])
    adv, ret = core.multiturn_gae_advantages(rewards, x["values"], x["mask"], gamma=gamma, lam=lam, whiten=whiten)
    return Advantages(adv, ret)


@register_estimator("poad", paper="Reinforcing Language Agents via Policy Optimization with Action Decomposition "
                                  "(POAD, Wen et al.), arXiv:2405.15821",
                    core=("poad_advantages", "place_turn_rewards"), requires=("turn_rewards", "turn_ids", "values"),
                    methods=(84,), verified="hand values (the authors' code's recursion), paper identity (one-token "
                                            "actions: turn-level GAE)", tests=_TESTS,
                    note="token-level GAE inside each action (no discount), gamma across actions; with a critic")
def poad(x, *, gamma: float = 0.95, lam: float = 0.95, whiten: bool = True) -> Advantages:
    """POAD: Bellman backup with action decomposition over the policy tokens of an episode."""
    rewards = core.place_turn_rewards(x["turn_rewards"], x["turn_ids"], x["mask"])
    adv, ret = core.poad_advantages(rewards, x["values"], x["mask"], x["turn_ids"], gamma=gamma, lam=lam,
                                    whiten=whiten)
    return Advantages(adv, ret)


@register_estimator("eapo", paper="IterResearch: Rethinking Long-Horizon Agents via Markovian State Reconstruction "
                                  "(EAPO), arXiv:2511.07327",
                    core=("eapo_turn_advantages", "broadcast_turns"), requires=("turn_mask", "turn_ids"),
                    group_relative=True, methods=(1,), verified="hand values, paper identity (gamma = 1)",
                    tests=_TESTS,
                    note="each round rewarded gamma^(rounds to go) x outcome, normalised over the group's rounds; "
                         "gamma has no default (the paper's value was not found)")
def eapo(x, *, gamma: float, scale_by_std: bool = True, epsilon: float = 1e-6) -> Advantages:
    """IterResearch's efficiency-aware per-round credit."""
    adv = core.eapo_turn_advantages(x["scores"], x["turn_mask"], x["group_ids"], x.num_groups, gamma=gamma,
                                    scale_by_std=scale_by_std, epsilon=epsilon, valid=x.get("valid"))
    return _tokens(x, adv)


@register_estimator("aspo", paper="Understanding Tool-Integrated Reasoning (ASPO, Advantage Shaping Policy "
                                  "Optimization), arXiv:2508.19201",
                    core=("aspo_advantages", "grpo_advantages"), requires=("turn_mask", "turn_ids", "turn_tool_calls"),
                    group_relative=True, methods=(16,),
                    verified="hand values (the paper's Eq. 2), paper identity (the sign is kept for k < 1)",
                    tests=_TESTS,
                    note="GRPO on the episode outcome, then correct tool-using episodes shaped by the position of their "
                         "first tool call (the first token of the first turn whose step called a tool)")
def aspo(x, *, delta: float = -2.0, k: float = 0.7, correct_threshold: float = 1.0, epsilon: float = 1e-6
         ) -> Advantages:
    """ASPO: earlier tool calls in correct episodes earn a clipped advantage bonus."""
    import jax.numpy as jnp

    m = x["mask"]
    base = core.grpo_advantages(x["scores"], m, x["group_ids"], x.num_groups, epsilon=epsilon, valid=x.get("valid"))
    row = jnp.sum(base, axis=1) / jnp.maximum(jnp.sum(base != 0, axis=1), 1)
    tid = x["turn_ids"]
    t = tid.shape[1]
    calls = x["turn_tool_calls"] * x["turn_mask"]
    k_first = jnp.argmax(calls > 0, axis=1)  # the first turn that called a tool
    has = jnp.any(calls > 0, axis=1)
    at = (tid == k_first[:, None]) & (tid >= 0)
    first_pos = jnp.where(has & jnp.any(at, axis=1), jnp.argmax(at, axis=1), -1)
    length = jnp.sum(jnp.cumsum(m[:, ::-1], axis=1)[:, ::-1] > 0, axis=1)  # up to the last policy token
    return Advantages(core.aspo_advantages(row, x["scores"] >= correct_threshold, first_pos, length, m,
                                           x["group_ids"], x.num_groups, delta=delta, k=k, valid=x.get("valid")))


#: the matchings jaxrl_llm.rewards.tool_matching offers (the loop computes the turn rewards with it)
MATCHTIR_ASSIGNMENTS = ("hungarian", "greedy")


@register_estimator("matchtir", paper="MatchTIR: Fine-Grained Supervision for Tool-Integrated Reasoning via Bipartite "
                                      "Matching (Qu et al.), arXiv:2601.10712",
                    core=("matchtir_advantages", "flow_grpo_advantages", "turn_group_baseline_advantages",
                          "broadcast_turns"),
                    requires=("turn_mask", "turn_ids", "matchtir_rewards"), group_relative=True, methods=(165,),
                    verified="hand values; the authors' code's similarity, turn rewards and fused advantage "
                             "(quchangle1/MatchTIR @f614ce1)",
                    tests=_TESTS + ", tests/rewards/test_tool_matching.py, tests/conformance/test_matchtir.py",
                    note="turn rewards from matching each episode's tool calls to the environment's gold calls "
                         "(assignment=hungarian: scipy's maximum-weight matching, the paper's; greedy: the authors' "
                         "release); the advantage averages the group-normalised trajectory return and the per-turn "
                         "group-normalised discounted return (gamma 0.9); the soft (OT) assignment is not provided")
def matchtir(x, *, gamma: float = 0.9, traj_weight: float = 0.5, epsilon: float = 1e-6,
             assignment: str = "hungarian", unmatched: float = 0.0) -> Advantages:
    """MatchTIR's dual-level advantage on its matched turn rewards (``assignment`` and
    ``unmatched`` are read by the loop, which computes the turn rewards)."""
    if assignment not in MATCHTIR_ASSIGNMENTS:
        raise ValueError(f"recipe.advantage.assignment must be one of {MATCHTIR_ASSIGNMENTS}, got {assignment!r}")
    adv = core.matchtir_advantages(x["matchtir_rewards"], x["turn_mask"], x["group_ids"], x.num_groups, gamma=gamma,
                                   traj_weight=traj_weight, epsilon=epsilon, valid=x.get("valid"))
    return _tokens(x, adv)


@register_estimator("rlvmr", paper="RLVMR: Reinforcement Learning with Verifiable Meta-Reasoning Rewards for Robust "
                                   "Long-Horizon Agents, arXiv:2507.22844",
                    core=("rlvmr_advantages", "broadcast_turns"),
                    requires=("turn_mask", "turn_ids", "grounding", "rlvmr_rewards", "rlvmr_tags"), group_relative=True,
                    methods=(239,),
                    verified="hand values; the authors' code's rule rewards and normalisation (Tencent/DigitalHuman "
                             "RLVMR, mirror zzjweb/digitalhuman @789ccd6)",
                    tests=_TESTS + ", tests/conformance/test_rlvmr.py",
                    note="turns tagged <planning> (rewarded in successful episodes), <explore> (a new action), "
                         "<reflection> (a new action after an invalid one) earn rule rewards 1.0, normalised among the "
                         "group's turns of the same tag and added (x weight, 1.0 in the scripts) to the outcome "
                         "advantage of every turn (the return minus 0.1 for an invalid action); not reproduced: the "
                         "cold-start SFT on tagged trajectories and ALFWorld / ScienceWorld")
def rlvmr(x, *, weight: float = 1.0, invalid_penalty: float = 0.1, scale_by_std: bool = True,
          epsilon: float = 1e-6, planning: float = 1.0, exploration: float = 1.0, reflection: float = 1.0
          ) -> Advantages:
    """RLVMR: outcome plus tag-normalised meta-reasoning advantages per turn (``planning``,
    ``exploration``, ``reflection``: the rule rewards, read by the loop)."""
    del planning, exploration, reflection
    adv = core.rlvmr_advantages(x["scores"], x["rlvmr_rewards"], x["rlvmr_tags"], x["grounding"], x["turn_mask"],
                                x["group_ids"], x.num_groups, weight=weight, invalid_penalty=invalid_penalty,
                                scale_by_std=scale_by_std, epsilon=epsilon, valid=x.get("valid"))
    return _tokens(x, adv)

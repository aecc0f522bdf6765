"""The RL loop with environments: :class:`AgentTrainer`.

The phases and loop parts of :class:`~jaxrl_llm.training.loop.RLTrainer` (it is one), with the
round's rows being episodes instead of single-turn completions; it overrides only what is about
rows::

    play         # G episodes of each of B environment seeds, multi-turn, KV cache carried across
                 #   turns (jaxrl_llm.agents.rollout.rollout_episodes); scores = episode returns
    build_batch  # train arrays: first prompt + the episode's context tokens, observation tokens in
                 #   the attention mask but not in the loss; the turn-level inputs (turn rewards,
                 #   turn ids, anchor-state ids) for estimators that require them
    own_providers, record, round_metrics   # turn entropies and gold-answer log-probs; the prompt
                 #   store keyed by environment seed; the episodes' metrics

Parts that act on single-turn completions (selectors, allocators, hints, replay, shaping, group
filters, truncation, staleness, the tree sampler, SPO's tracker) declare that they cannot run on
episodes and are refused in one line.

Rows are prompt-major as in the single-turn loop: the ``G`` episodes of one seed form a group
(same first observation, independent samples), so every group-relative estimator applies to
episode returns unchanged.

**SPA-RL.** A recipe whose estimator reads ``progress`` (``recipe.advantage=spa``) needs a
progress estimator (``progress=``, a :class:`~jaxrl_llm.training.Critic` whose train step runs
:class:`~jaxrl_llm.training.ProgressObjective`); its loop part
(:mod:`jaxrl_llm.training.parts.progress`) scores each turn with it in the assemble phase (the
model before this step's update), fits it after the update on the same batch (epochs x
mini-batches as the policy's, its own shuffling key), and it is checkpointed with the rest.

**Resume.** Episodes never span iterations: a checkpoint is written between iterations, when
no episode is open, so there is no environment state to save. Each episode restarts from its
seed (environments are deterministic in it) and each turn samples with a key derived from
``(seed, iteration, turn)``; the seed stream's position is the data state. A resumed run is
bitwise the uninterrupted one (tested).
"""

from __future__ import annotations

import re
import time
from functools import partial
from typing import Any

import jax
import numpy as np

from jaxrl_llm.agents.env import EnvSpec
from jaxrl_llm.agents.rollout import ChatFormat, Episodes, rollout_episodes
from jaxrl_llm.shapes import bucket
from jaxrl_llm.training.loop import RLTrainer
from jaxrl_llm.training.providers import StepBatch
from jaxrl_llm.training.rl import to_target_aligned

__all__ = ["AgentTrainer", "SeedStream", "AGENT_INPUTS", "state_ids_of", "build_episode_batch"]


@partial(jax.jit, static_argnums=(0, 1, 2))
def _entropy(graphdef, chunk_size, temperature, params, others, tokens, mask):
    """``[N, L - 1]`` entropies of the next-token distributions (teacher-forced)."""
    from flax import nnx

    from jaxrl_llm.training.objectives import policy_logprobs

    _, ent = policy_logprobs(nnx.merge(graphdef, params, *others), {"tokens": tokens, "mask": mask},
                             chunk_size=chunk_size, temperature=temperature, with_entropy=True)
    return jax.lax.stop_gradient(ent)

#: estimator inputs only an agent run provides (kind in PROVIDED_INPUTS): filled by the assemble phase
AGENT_INPUTS = ("turn_rewards", "turn_mask", "turn_ids", "state_ids", "turn_entropy", "agent_ids", "gt_logp",
                "progress", "grounding", "turn_tool_calls", "matchtir_rewards", "rlvmr_rewards", "rlvmr_tags")


def _in_batch(tr, step) -> None:
    """A turn-level input the episode batch holds already."""


def _turn_entropy_input(tr, step) -> None:
    k = step.extra["turn_mask"].shape[1]
    step.inputs["turn_entropy"] = tr._turn_entropy(step.arrays, step.extra["turn_ids"], k)


def _gt_logp_input(tr, step) -> None:
    step.inputs["gt_logp"] = tr._gt_logp(step.extra["episodes"], step.extra["turn_mask"].shape[1])


class SeedStream:
    """Batches of ``batch`` training seeds of an environment family, checkpointable.

    The pool is ``spec.split_seeds("train", pool, seed)``; each pass over it is a fresh
    permutation (``numpy`` generator seeded with ``(seed, pass)``). State: the position.
    """

    def __init__(self, spec: EnvSpec, batch: int, *, seed: int = 0, pool: int = 4096):
        self.spec, self.batch, self.seed = spec, int(batch), int(seed)
        self.pool = [int(s) for s in spec.split_seeds("train", int(pool), self.seed)]
        if len(self.pool) < self.batch:
            raise ValueError(f"environment {spec.name!r} gave {len(self.pool)} training seeds, fewer than a batch "
                             f"of {self.batch}")
        self.position = 0

    def _order(self, epoch: int) -> list[int]:
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.pool))
        return [self.pool[i] for i in perm]

    def __iter__(self):
        return self

    def __next__(self) -> list[int]:
        out = []
        while len(out) < self.batch:
            epoch, i = divmod(self.position, len(self.pool))
            out.append(self._order(epoch)[i])
            self.position += 1
        return out

    def get_state(self) -> dict:
        return {"position": self.position}

    def set_state(self, state: dict) -> None:
        self.position = int(state["position"])


def state_ids_of(ep: Episodes, num_turns: int) -> np.ndarray:
    """``[N, K]`` int32 ids of ``(group, state key)`` pairs, dense from 0 in order of first
    appearance (-1 past an episode's last turn): equal ids are the same state of the same
    environment seed, the anchor states GiGPO groups by."""
    ids: dict[Any, int] = {}
    out = np.full((len(ep.state_keys), num_turns), -1, np.int32)
    group = ep.group_ids
    for i, keys in enumerate(ep.state_keys):
        for k, key in enumerate(keys[:num_turns]):
            out[i, k] = ids.setdefault((int(group[i]), key), len(ids))
    return out


def build_episode_batch(ep: Episodes, prompt_len: int, episode_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """Train arrays of the episodes, in the layout of :func:`~jaxrl_llm.training.rl.build_rl_batch`
    (left-padded prompt ``[P]`` + episode region ``[E]``, target-aligned per-token arrays), with
    the observation tokens in ``mask`` (context) but not in ``loss_mask`` / ``completion_mask``.

    Returns ``tokens``, ``mask`` ``[N, P + E]``, ``loss_mask``, ``old_logp`` ``[N, P + E - 1]``,
    ``completion_mask``, ``turn_ids`` ``[N, E]``, ``group_ids [N]``, and turn-level
    ``turn_rewards``, ``turn_mask``, ``grounding`` ``[N, K]`` (``K`` = the most turns of any
    episode) and ``turn_end`` ``[N, K]`` int32, the position in ``tokens`` of each turn's last
    policy token (of the context it acted on for a turn of no tokens; 0 past an episode's turns).
    """
    n = len(ep.tokens)
    group = ep.group_ids
    tokens = np.full((n, prompt_len + episode_len), pad_id, np.int32)
    mask = np.zeros_like(tokens, bool)
    cmask = np.zeros((n, episode_len), bool)
    lp = np.zeros((n, episode_len), np.float32)
    tids = np.full((n, episode_len), -1, np.int32)
    for i in range(n):
        p = ep.prompt_ids[group[i]]
        if len(p) > prompt_len:
            raise ValueError(f"episode {i}: first prompt of {len(p)} tokens > prompt_len={prompt_len}")
        e = len(ep.tokens[i])
        if e > episode_len:
            raise ValueError(f"episode {i}: {e} context tokens after the prompt > episode_len={episode_len}")
        tokens[i, prompt_len - len(p):prompt_len] = p
        mask[i, prompt_len - len(p):prompt_len] = True
        tokens[i, prompt_len:prompt_len + e] = ep.tokens[i]
        mask[i, prompt_len:prompt_len + e] = True
        cmask[i, :e] = ep.policy[i]
        lp[i, :e] = ep.logprobs[i]
        tids[i, :e] = ep.turn_ids[i]
    k = max(1, max(len(r) for r in ep.rewards))
    turn_rewards = np.zeros((n, k), np.float32)
    turn_mask = np.zeros((n, k), bool)
    grounding = np.zeros((n, k), np.float32)
    turn_end = np.zeros((n, k), np.int32)
    for i in range(n):
        t = len(ep.actions[i])
        turn_mask[i, :t] = True
        r = ep.rewards[i]
        turn_rewards[i, :len(r)] = r
        g = ep.grounded[i][:k]
        grounding[i, :len(g)] = g
        last = prompt_len - 1
        for j in range(min(t, k)):
            at = np.flatnonzero(tids[i] == j)
            if at.size:
                last = prompt_len + int(at[-1])
            elif j > 0 and j - 1 < len(ep.boundaries[i]):  # a turn of no tokens: the context it acted on
                last = prompt_len + ep.boundaries[i][j - 1] - 1
            turn_end[i, j] = last
    lp = np.where(cmask, lp, 0.0).astype(np.float32)
    return {"tokens": tokens, "mask": mask, "loss_mask": to_target_aligned(cmask, prompt_len),
            "old_logp": to_target_aligned(lp, prompt_len), "completion_mask": cmask, "turn_ids": tids,
            "group_ids": group, "turn_rewards": turn_rewards, "turn_mask": turn_mask, "grounding": grounding,
            "turn_end": turn_end}


def matchtir_turn_rewards(ep, k: int, *, assignment: str = "hungarian", unmatched: float = 0.0) -> np.ndarray:
    """``[N, K]`` MatchTIR's turn rewards of the episodes (:func:`jaxrl_llm.rewards.tool_matching.turn_rewards`):
    an episode whose environment gave no gold calls keeps its environment rewards."""
    from jaxrl_llm.rewards.tool_matching import turn_rewards

    out = np.zeros((len(ep.tokens), k), np.float32)
    for i, env_r in enumerate(ep.rewards):
        gold = ep.gold_calls[i] if i < len(ep.gold_calls) else None
        calls = ep.turn_calls[i] if i < len(ep.turn_calls) else []
        if gold is None or len(calls) != len(env_r):
            r = list(env_r)
        else:
            r = turn_rewards(calls, gold, env_r, assignment=assignment, unmatched=unmatched)
        out[i, :min(len(r), k)] = r[:k]
    return out


_ACTION = re.compile(r"<action>(.*?)</action>")


def rlvmr_turn_rewards(ep, k: int, *, planning: float = 1.0, exploration: float = 1.0,
                       reflection: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``([N, K] rewards, [N, K] tags)``: RLVMR's meta-reasoning rule reward of each turn (the
    authors' ``process_trajectory_rlvmr_rewards``). A turn whose action was invalid (not
    grounded) gets tag 0 and reward 0; otherwise its text's first tag among ``<planning>``,
    ``<explore>``, ``<reflection>`` (in that order of precedence) sets the tag (none: 0) and

    - planning (1): ``planning`` when the episode succeeded (return ``> 0``);
    - explore (2): ``exploration`` when no earlier valid turn had the same ``<action>`` blocks;
    - reflection (3): ``reflection`` when the previous turn was invalid (or there is none) and
      its actions differ from this turn's.
    """
    n = len(ep.tokens)
    rewards, tags = np.zeros((n, k), np.float32), np.zeros((n, k), np.int32)
    for i in range(n):
        texts, ok = ep.actions[i], ep.grounded[i]
        acts = [_ACTION.findall(t) for t in texts]
        success = sum(ep.rewards[i]) > 0
        for t in range(min(len(texts), len(ok), k)):
            if not ok[t]:
                continue
            text = texts[t]
            if "<planning>" in text:
                tags[i, t], rewards[i, t] = 1, planning if success else 0.0
            elif "<explore>" in text:
                seen = any(acts[j] == acts[t] and ok[j] for j in range(t))
                tags[i, t], rewards[i, t] = 2, 0.0 if seen else exploration
            elif "<reflection>" in text:
                prev_ok = t > 0 and ok[t - 1]
                differs = t == 0 or acts[t - 1] != acts[t]
                tags[i, t], rewards[i, t] = 3, reflection if (not prev_ok and differs) else 0.0
    return rewards, tags


class AgentTrainer(RLTrainer):
    """Multi-turn RL on an environment family (module docstring): the loop of
    :class:`~jaxrl_llm.training.RLTrainer` with episodes as its rounds' rows. Its parts are the
    same registry's (the critic, the KL controller, the batch filter, SPA-RL's progress
    estimator, the ``env.horizon`` schedule, ...); parts that act on single-turn completions
    declare that they cannot run on episodes and are refused in one line.

    Args:
      graphdef, state, train_step: as :class:`~jaxrl_llm.training.RLTrainer`.
      sampler: a :class:`~jaxrl_llm.rollout.multiturn.MultiTurnSampler` (its config's
        ``num_samples`` is the group size, its temperature the objective's).
      seeds: a :class:`SeedStream` of training seeds (the data iterator).
      spec: the :class:`~jaxrl_llm.agents.EnvSpec`.
      fmt: the :class:`~jaxrl_llm.agents.rollout.ChatFormat` of observations.
      recipe, tokenizer, seed, frozen, ref_params, critic: as ``RLTrainer``.
      episode_buckets: lengths the episode region is padded to (one train-step compilation per
        bucket used); an episode longer than the largest is padded to the sampler's
        ``context_len``, which bounds every episode.
      max_turns: the policy-turn cap (default: each environment's ``max_turns``).
      horizon: a schedule of the cap over training steps (``horizon(iteration) -> turns``,
        :data:`jaxrl_llm.algorithms.HORIZONS`), or ``None``; with ``max_turns`` the smaller applies.
      step_timeout_s: wall-clock limit of one environment call.
      progress: SPA-RL's progress estimator, required exactly when the recipe's estimator reads
        ``progress``: a :class:`~jaxrl_llm.training.Critic` built with
        :class:`~jaxrl_llm.training.ProgressObjective` (``Critic.create(cfg, optimizer,
        ProgressObjective(), policy_params=...)``).
    """

    progress_metric = "episodes/success_rate"
    progress_desc = "agent RL"
    own_inputs = AGENT_INPUTS
    episodes = True

    def __init__(self, graphdef, state, train_step, sampler, seeds: SeedStream, spec: EnvSpec, fmt: ChatFormat,
                 recipe, tokenizer, *, episode_buckets=(64, 128, 256, 512, 1024, 2048), max_turns: int | None = None,
                 step_timeout_s: float = 30.0, **kw: Any):
        if "greedy_scores" in recipe.requires:
            raise ValueError(f"recipe {recipe.name!r} needs a greedy baseline rollout (greedy_scores), which the agent "
                             f"loop does not run; choose another estimator")
        super().__init__(graphdef, state, train_step, sampler, seeds, None, recipe, tokenizer, **kw)
        self.spec, self.fmt = spec, fmt
        self.episode_buckets = tuple(sorted(episode_buckets))
        self.max_turns, self.step_timeout_s = max_turns, float(step_timeout_s)
        self.last_episodes: Episodes | None = None

    def play(self, rnd) -> None:
        """One round of episodes: ``G`` of each of ``B`` environment seeds; scores = returns."""
        t = self.timings
        t0 = time.perf_counter()
        rnd.batch = next(self.data)
        t["time/data"] += time.perf_counter() - t0
        self.current.target = self.current.target or len(rnd.batch)
        t0 = time.perf_counter()
        cap = self.max_turns
        if rnd.turn_cap is not None:  # a horizon schedule's cap for this step
            cap = rnd.turn_cap if cap is None else min(cap, rnd.turn_cap)
            t["env/max_turns"] = float(cap)
        ep = rollout_episodes(self.sampler, rnd.params, self.spec, rnd.batch, self.fmt, rnd.key, *self.frozen,
                              max_turns=cap, step_timeout_s=self.step_timeout_s)
        t["time/rollout"] += time.perf_counter() - t0
        rnd.roll, rnd.scores = ep, ep.returns.astype(np.float32)
        self.last_episodes = ep

    def build_batch(self, key) -> StepBatch:
        """Train arrays of the episodes: first prompt + the episode's context tokens, observation
        tokens in the attention mask but not in the loss; the turn-level inputs the recipe
        requires in ``step.inputs`` (all of them in ``step.extra`` for the parts)."""
        rec = self.recipe
        rnd = self.current.rounds[0]
        ep = rnd.roll
        prompt_len = bucket(max(len(p) for p in ep.prompt_ids), self.sampler.length_buckets)
        # the cache bounds an episode: past the largest bucket, the context length is the last one
        buckets = tuple(b for b in self.episode_buckets if b < self.sampler.context_len) + (self.sampler.context_len,)
        episode_len = bucket(max(1, max(len(x) for x in ep.tokens)), buckets)
        arrays = build_episode_batch(ep, prompt_len, episode_len, self.sampler.config.pad_token_id)
        turn_inputs = {"turn_rewards": arrays.pop("turn_rewards"), "turn_mask": arrays.pop("turn_mask"),
                       "turn_ids": arrays.pop("turn_ids"), "grounding": arrays.pop("grounding")}
        turn_end = arrays.pop("turn_end")
        k = turn_inputs["turn_mask"].shape[1]
        turn_inputs["state_ids"] = state_ids_of(ep, k)
        turn_inputs["agent_ids"] = np.zeros((len(ep.tokens), k), np.int32)
        for i, ids in enumerate(ep.agent_ids):
            turn_inputs["agent_ids"][i, :len(ids)] = ids[:k]
        turn_inputs["turn_tool_calls"] = np.zeros((len(ep.tokens), k), np.float32)
        for i, calls in enumerate(ep.turn_tool_calls):
            turn_inputs["turn_tool_calls"][i, :len(calls)] = calls[:k]
        if "rlvmr_rewards" in rec.requires or "rlvmr_tags" in rec.requires:
            turn_inputs["rlvmr_rewards"], turn_inputs["rlvmr_tags"] = rlvmr_turn_rewards(ep, k, **{
                a: v for a, v in rec.estimator.kwargs if a in ("planning", "exploration", "reflection")})
        if "matchtir_rewards" in rec.requires:
            turn_inputs["matchtir_rewards"] = matchtir_turn_rewards(ep, k, **{
                a: v for a, v in rec.estimator.kwargs if a in ("assignment", "unmatched")})
        n = len(ep.tokens)
        step = StepBatch(arrays, rnd.scores, np.ones(n, bool), prompt_len, ep.prompts, ep.prompt_ids,
                         {"seed": list(ep.seeds)}, {}, inputs={k: v for k, v in turn_inputs.items()
                                                               if k in rec.requires}, key=key,
                         keys=[f"{self.spec.name}:seed {s}" for s in ep.seeds],
                         extra={**turn_inputs, "turn_end": turn_end, "episodes": ep})
        step.metrics.update(ep.metrics())
        return step

    def own_providers(self) -> dict:
        """The turn-level inputs are in the batch already; ``turn_entropy`` and ``gt_logp`` are
        computed with the sampling policy (SPA-RL's ``progress``: its loop part)."""
        return {**{name: _in_batch for name in AGENT_INPUTS}, "turn_entropy": _turn_entropy_input,
                "gt_logp": _gt_logp_input}

    def record(self, step: StepBatch) -> None:
        """The prompt store sees each training seed of the environment as a prompt: episode
        returns as scores, policy tokens as lengths."""
        seen = self.store.lookup(step.keys)["prompt_seen"]
        arrays, _, _ = step.rows_as_sampled()  # the episodes' rows, in the order of the round's scores
        self.store.observe(self.iteration, step.keys, self.current.rounds[0].scores, arrays["completion_mask"].sum(1),
                           arrays["group_ids"])
        step.metrics.update(self.store.summary())
        step.metrics["prompts/new_frac"] = float(np.mean(seen == 0))

    def round_metrics(self, step: StepBatch) -> dict[str, float]:
        scores, ep = self.current.rounds[0].scores, self.current.rounds[0].roll
        pol = np.array([sum(p) for p in ep.policy], np.float32)
        return {"rewards/total/mean": float(scores.mean()), "rewards/total/std": float(scores.std()),
                "response/length_mean": float(pol.mean()), "response/length_max": float(pol.max()),
                "tokens_per_s": float(step.completion_mask.sum()) / max(self.timings["time/rollout"], 1e-9)}

    def _turn_entropy(self, arrays: dict, turn_ids: np.ndarray, k: int) -> np.ndarray:
        """``[N, K]`` mean token entropy of the sampling policy (the params before the update, at
        the sampling temperature) over each turn's policy tokens."""
        obj = self.recipe.objective
        ent = np.asarray(_entropy(self.graphdef, obj.chunk_size, obj.temperature, self.state.params, self.frozen,
                                  arrays["tokens"], arrays["mask"]))
        c0 = arrays["tokens"].shape[1] - turn_ids.shape[1] - 1
        ent = ent[:, c0:]
        pol = arrays["completion_mask"]
        out = np.zeros((len(ent), k), np.float32)
        for t in range(k):
            sel = pol & (turn_ids == t)
            cnt = sel.sum(1)
            out[:, t] = np.where(cnt > 0, (ent * sel).sum(1) / np.maximum(cnt, 1), 0.0)
        return out

    def _gt_logp(self, ep: Episodes, k: int) -> np.ndarray:
        """``[N, K + 1]`` the sampling policy's mean log-prob per token of the gold answer
        (``info["answer"]`` of ``reset``) teacher-forced after the first prompt (column 0) and
        after each turn's observation (column ``k + 1``); columns past an episode's last
        observation repeat its last value (IGPO does not read them)."""
        if any(a is None for a in ep.answers):
            raise ValueError(f"recipe {self.recipe.name!r} requires gt_logp (IGPO), but environment "
                             f"{self.spec.name!r} gives no gold answer (info['answer'] at reset)")
        n, g = len(ep.tokens), ep.num_samples
        probes, where = [], []
        for i in range(n):
            gt = self.fmt.encode(ep.answers[i])
            head = ep.prompt_ids[i // g]
            for j, cut in enumerate([0] + ep.boundaries[i][:k]):
                probes.append((head + ep.tokens[i][:cut], gt))
                where.append((i, j))
        out = np.zeros((n, k + 1), np.float32)
        seen = np.zeros((n, k + 1), bool)
        buckets = tuple(self.episode_buckets) + (self.sampler.context_len * 2,)
        length = bucket(max(len(a) + len(b) for a, b in probes), buckets)
        for lo in range(0, len(probes), n):  # chunks of N rows: the shape of the other passes
            chunk = probes[lo:lo + n]
            toks = np.full((n, length), self.sampler.config.pad_token_id, np.int32)
            mask = np.zeros((n, length), bool)
            tgt = np.zeros((n, length - 1), bool)
            for r, (ctx, gt) in enumerate(chunk):
                toks[r, :len(ctx) + len(gt)] = ctx + gt
                mask[r, :len(ctx) + len(gt)] = True
                tgt[r, len(ctx) - 1:len(ctx) + len(gt) - 1] = True
            lp = np.asarray(self.logp(self.state.params, self.frozen, toks, mask))
            for r in range(len(chunk)):
                i, j = where[lo + r]
                out[i, j] = float(lp[r][tgt[r]].mean())
                seen[i, j] = True
        for i in range(n):  # repeat the last computed column
            for j in range(1, k + 1):
                if not seen[i, j]:
                    out[i, j] = out[i, j - 1]
        return out

    def last_samples(self, n: int = 4) -> list[dict]:
        """Up to ``n`` transcripts of the last step's episodes (one per group first)."""
        ep = self.last_episodes
        if ep is None:
            return []
        g = ep.num_samples
        order = [i for k in range(g) for i in range(k, len(ep.tokens), g)][:n]
        return [{"seed": ep.seeds[i // g], "return": float(ep.returns[i]), "success": ep.success[i],
                 "turns": int(ep.turns[i]), "error": ep.error[i], "transcript": ep.transcript(i)} for i in order]

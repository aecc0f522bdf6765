"""Running environments with the policy: token in, token out.

:func:`rollout_episodes` plays ``G`` episodes of each environment seed with a
:class:`~jaxrl_llm.rollout.multiturn.MultiTurnSampler`: policy turn -> environment step ->
observation tokens prefilled onto the KV cache -> next policy turn, until every episode has
ended (terminated, truncated at its turn limit, out of context, or failed).

**The tokens trained on are the tokens the sampler produced and saw.** Nothing is decoded and
re-encoded: each episode's record is the exact id sequence of its context (first prompt,
then policy tokens and observation tokens in order) with a mask of the policy tokens and the
sampler's log-probs. The text of a turn is decoded only to give it to the environment.

:class:`ChatFormat` turns an observation into the tokens that follow a policy turn. With a
chat template they are the template's own rendering: the end-of-turn text after the assistant
message (whatever the sampled stop token did not already cover, e.g. ChatML's newline after
``<|im_end|>``), the observation as a message of ``observation_role`` and the generation
prompt of the next assistant turn, found by rendering a conversation with and without the new
message. Templates that are not append-only (the rendering of earlier turns changes when a
message is added) are refused with an error. ``tests/agents/test_token_in_token_out.py``
checks for SmolLM2's, a Qwen2-style and a Llama-3-style template that the assembled ids equal
the template applied to the whole conversation, separators included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import numpy as np

from jaxrl_llm.agents.env import EnvSpec, EpisodeBatch
from jaxrl_llm.rollout.multiturn import MultiTurnSampler

__all__ = ["ChatFormat", "Episodes", "rollout_episodes"]

_SENTINEL = "\u2063SENTINEL\u2063"
_TRUNCATED = " [truncated]"


class ChatFormat:
    """The token ids of a first prompt and of each observation (see the module docstring).

    Args:
      tokenizer: a ``transformers`` tokenizer.
      chat: apply the tokenizer's chat template (False: plain text, as the tiny models use:
        the prompt is the observation's tokens; an observation is ``separator + text +
        separator``, preceded by ``end_token_id`` when the turn ended without a stop token).
      system_prompt: a system message before the first observation (chat only).
      observation_role: the role of observation messages (``"user"`` or ``"tool"``).
      max_observation_tokens: longer observation texts are cut so that their text, followed by
        ``" [truncated]"``, has at most this many tokens; the template's tokens around them are
        always kept (:meth:`overhead`).
      end_token_id: the token that closes a turn cut by ``max_new_tokens`` (default: the
        tokenizer's end of turn: ``<|im_end|>``, ``<|eot_id|>`` or eos).
    """

    def __init__(self, tokenizer: Any, *, chat: bool = True, system_prompt: str | None = None,
                 observation_role: str = "user", separator: str = "\n", max_observation_tokens: int = 256,
                 end_token_id: int | None = None):
        self.tok, self.chat, self.system_prompt = tokenizer, bool(chat), system_prompt
        self.role, self.separator = observation_role, separator
        self.max_observation_tokens = int(max_observation_tokens)
        if end_token_id is None:
            from jaxrl_llm.data.pipeline import end_of_turn_id

            end_token_id = end_of_turn_id(tokenizer, self.chat)
        self.end_token_id = int(end_token_id)
        if self.chat:
            self._closing_text, self._stop_text = self._assistant_closing()

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def _render(self, msgs: list[dict], generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation_prompt)

    def _head(self) -> list[dict]:
        return [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []

    def _assistant_closing(self) -> tuple[str, str]:
        """The text the template puts after an assistant message's content, and the part of it
        the sampled stop token stands for."""
        msgs = self._head() + [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
        text = self._render(msgs, False)
        if _SENTINEL not in text:
            raise ValueError("ChatFormat: the chat template drops the assistant message's content; it cannot be "
                             "used for multi-turn rollouts")
        closing = text[text.index(_SENTINEL) + len(_SENTINEL):]
        stop = self.tok.convert_ids_to_tokens(self.end_token_id)
        return closing, (stop if closing.startswith(stop) else "")

    def prompt_ids(self, observation: str) -> list[int]:
        """Tokens of the conversation's start: (system,) first observation as the user message,
        generation prompt."""
        obs = self._fit(observation)
        if not self.chat:
            return self.encode(obs)
        return self.encode(self._render(self._head() + [{"role": "user", "content": obs}], True))

    def observation_ids(self, observation: str, stopped: bool) -> list[int]:
        """Tokens after a policy turn: the turn's closing, the observation message, the next
        generation prompt. ``stopped``: the turn ended with its stop token (else the closing
        starts with ``end_token_id``)."""
        obs = self._fit(observation)
        if not self.chat:
            return ([] if stopped else [self.end_token_id]) + self.encode(self.separator + obs + self.separator)
        base = self._head() + [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
        before = self._render(base, False)
        after = self._render(base + [{"role": self.role, "content": obs}], True)
        if not after.startswith(before):
            raise ValueError(f"ChatFormat: the chat template is not append-only (adding a {self.role!r} message "
                             f"changes the rendering of the earlier turns); multi-turn token-in-token-out needs an "
                             f"append-only template")
        closing = self._closing_text[len(self._stop_text):] if stopped else self._closing_text
        ids = self.encode(closing + after[len(before):])
        if not stopped and not self._stop_text:  # the template has no end-of-turn token of its own
            ids = [self.end_token_id] + ids
        return ids

    def _fit(self, observation: str) -> str:
        ids = self.encode(observation)
        if len(ids) <= self.max_observation_tokens:
            return observation
        keep = max(0, self.max_observation_tokens - len(self.encode(_TRUNCATED)))
        return self.tok.decode(ids[:keep]) + _TRUNCATED

    def overhead(self) -> int:
        """The most tokens an observation's rendering adds around its text (closing of a cut
        turn, role header, generation prompt): an observation takes at most
        ``max_observation_tokens + overhead()`` tokens."""
        return len(self.observation_ids("", stopped=False))


@dataclasses.dataclass
class Episodes:
    """``N = len(seeds) * G`` episodes (rows group-major: episode ``i`` belongs to group
    ``i // G``), as host lists and arrays.

    Per row: ``tokens`` (the context after the first prompt: policy and observation tokens in
    order), ``policy`` (which of them the policy sampled), ``logprobs`` (the sampler's, 0 for
    observation tokens), ``turn_ids`` (turn of each policy token, -1 for observation tokens),
    ``rewards`` (per turn), ``state_keys`` (key of the state each turn acted in),
    ``actions`` / ``observations`` (texts), ``error`` (the environment failure that ended it),
    ``success`` (the environment's info, when it says), ``terminated`` / ``truncated`` /
    ``context_truncated``, ``stopped`` (per turn: ended with a stop token), ``agent_ids`` (per
    turn: ``info["agent_id"]``, 0 by default), ``tool_calls`` / ``tool_errors`` (summed from the
    steps' ``info``), ``answers`` (the environment's ``reset`` ``info["answer"]``: the gold final
    answer as text, when it gives one), ``boundaries`` (per turn: the length of ``tokens`` after
    the turn's observation, i.e. the context the next turn starts from), ``grounded`` (per turn:
    the environment executed the action -- ``info["grounded"]`` when it says, else neither
    ``info["invalid"]`` (unparsable) nor ``info["blocked"]`` (no effect, "nothing happens");
    False for a step that failed: SPA-RL's grounding signal), ``turn_tool_calls`` (per turn: the
    step's ``info["tool_calls"]``).
    """

    seeds: list[int]
    num_samples: int
    prompt_ids: list[list[int]]
    prompts: list[str]
    tokens: list[list[int]]
    policy: list[list[bool]]
    logprobs: list[list[float]]
    turn_ids: list[list[int]]
    rewards: list[list[float]]
    state_keys: list[list[Hashable]]
    actions: list[list[str]]
    observations: list[list[str]]
    stopped: list[list[bool]]
    error: list[str | None]
    success: list[bool | None]
    terminated: list[bool]
    truncated: list[bool]
    context_truncated: list[bool]
    tool_calls: list[int]
    tool_errors: list[int]
    agent_ids: list[list[int]]
    answers: list[str | None]
    boundaries: list[list[int]]
    grounded: list[list[bool]]
    turn_tool_calls: list[list[int]] = dataclasses.field(default_factory=list)
    #: per turn, the step's ``info["calls"]`` (the turn's tool calls as ``{"name", "arguments"}``)
    turn_calls: list[list[list[dict]]] = dataclasses.field(default_factory=list)
    #: per episode, the ``reset``'s ``info["gold_calls"]`` (a reference solution's calls), or None
    gold_calls: list[list[dict] | None] = dataclasses.field(default_factory=list)

    @property
    def group_ids(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.seeds), dtype=np.int32), self.num_samples)

    @property
    def returns(self) -> np.ndarray:
        return np.array([sum(r) for r in self.rewards], np.float32)

    @property
    def turns(self) -> np.ndarray:
        return np.array([len(a) for a in self.actions], np.int32)

    def metrics(self) -> dict[str, float]:
        """Per-turn telemetry of the batch."""
        n = len(self.tokens)
        turns = self.turns
        pol = [sum(p) for p in self.policy]
        succ = [bool(s) for s in self.success]
        return {"episodes/return_mean": float(self.returns.mean()),
                "episodes/success_rate": float(np.mean(succ)),
                "episodes/turns_mean": float(turns.mean()), "episodes/turns_max": float(turns.max()),
                "episodes/policy_tokens_per_turn": float(sum(pol) / max(int(turns.sum()), 1)),
                "episodes/context_tokens_mean": float(np.mean([len(t) for t in self.tokens])),
                "episodes/env_errors": float(sum(e is not None for e in self.error)),
                "episodes/context_truncated": float(sum(self.context_truncated)),
                "episodes/turn_limit_truncated": float(sum(self.truncated)),
                "episodes/tool_calls_per_episode": float(sum(self.tool_calls) / max(n, 1)),
                "episodes/tool_errors": float(sum(self.tool_errors)),
                "episodes/grounded_rate": float(sum(map(sum, self.grounded)) / max(int(turns.sum()), 1))}

    def transcript(self, i: int) -> list[dict]:
        """Episode ``i`` as messages: the first observation, then action / observation pairs."""
        out = [{"role": "user", "content": self.prompts[i // self.num_samples]}]
        for k, a in enumerate(self.actions[i]):
            out.append({"role": "assistant", "content": a})
            if k < len(self.observations[i]):
                out.append({"role": "observation", "content": self.observations[i][k]})
        return out


def rollout_episodes(sampler: MultiTurnSampler, params: Any, spec: EnvSpec, seeds: Sequence[int], fmt: ChatFormat,
                     key: jax.Array, *others: Any, max_turns: int | None = None,
                     step_timeout_s: float = 30.0) -> Episodes:
    """Play ``sampler.config.num_samples`` episodes of each seed to their end (module docstring).

    Turn ``k`` samples with ``fold_in(key, k)``. Environment failures end only their episode
    (:class:`~jaxrl_llm.agents.EpisodeBatch`): the episode keeps the tokens it has, its rewards
    are zeroed and ``error`` says what happened; an episode whose ``reset`` failed or whose first
    observation differs from its group's (a ``reset`` that is not deterministic in the seed)
    trains on nothing.
    """
    g = sampler.config.num_samples
    row_seeds = [int(s) for s in seeds for _ in range(g)]
    n = len(row_seeds)
    tok = fmt.tok
    with EpisodeBatch(spec, row_seeds, max_turns=max_turns, step_timeout_s=step_timeout_s) as eb:
        first = eb.reset()
        prompts = []
        for b in range(len(seeds)):
            rows = range(b * g, (b + 1) * g)
            ok = [i for i in rows if first[i].error is None]
            text = first[ok[0]].observation if ok else "(the environment failed to reset)"
            for i in ok[1:]:
                if first[i].observation != text:
                    eb._fail(i, _reset_mismatch(spec, b, i, row_seeds[i]))
            prompts.append(text)
        excluded = [eb.errors[i] is not None for i in range(n)]  # trains on nothing
        answers = [first[i].info.get("answer") if first[i].error is None else None for i in range(n)]
        prompt_ids = [fmt.prompt_ids(p) for p in prompts]
        rec = _Recorder(n)
        turn = sampler.start(params, prompt_ids, jax.random.fold_in(key, 0), *others)
        k = 0
        while True:
            live = [not eb.done[i] for i in range(n)]
            actions: list[str | None] = [None] * n
            for i in range(n):
                if live[i]:
                    ids = turn.tokens[i][turn.mask[i]]
                    rec.add_turn(i, ids.tolist(), turn.logprobs[i][turn.mask[i]].tolist(), k, bool(turn.stopped[i]))
                    actions[i] = tok.decode(ids, skip_special_tokens=True)
                    rec.actions[i].append(actions[i])
            outcomes = eb.step(actions)
            k += 1
            obs_ids: list[list[int] | None] = [None] * n
            for i, o in enumerate(outcomes):
                if o is None:
                    continue
                info = o.info or {}
                rec.agent_ids[i].append(int(info.get("agent_id", 0)) if o.error is None else 0)
                rec.grounded[i].append(o.error is None and bool(info.get(
                    "grounded", not (info.get("invalid") or info.get("blocked")))))
                rec.tool_calls[i] += int(info.get("tool_calls", 0))
                rec.turn_tool_calls[i].append(int(info.get("tool_calls", 0)) if o.error is None else 0)
                rec.turn_calls[i].append(list(info.get("calls", [])) if o.error is None else [])
                rec.tool_errors[i] += int(info.get("tool_errors", 0))
                if not o.done:
                    rec.observations[i].append(o.observation)
                    obs_ids[i] = fmt.observation_ids(o.observation, bool(turn.stopped[i]))
            if not any(o is not None for o in obs_ids):
                break
            if not sampler.room(sampler.obs_width(obs_ids)):
                for i, o in enumerate(obs_ids):
                    if o is not None:
                        rec.context_truncated[i] = True
                        eb.done[i] = True
                        rec.observations[i].pop()
                break
            for i, o in enumerate(obs_ids):
                if o is not None:
                    rec.add_observation(i, o)
            turn = sampler.extend(params, obs_ids, jax.random.fold_in(key, k), *others)
        sampler.release()
        for i in range(n):
            if excluded[i]:
                rec.policy[i] = [False] * len(rec.policy[i])
        return Episodes(
            seeds=[int(s) for s in seeds], num_samples=g, prompt_ids=prompt_ids, prompts=prompts,
            tokens=rec.tokens, policy=rec.policy, logprobs=rec.logprobs, turn_ids=rec.turn_ids,
            rewards=[list(r) for r in eb.rewards], state_keys=[list(s)[:len(rec.actions[i])]
                                                               for i, s in enumerate(eb.state_keys)],
            actions=rec.actions, observations=rec.observations, stopped=rec.stopped, error=list(eb.errors),
            success=list(eb.success), terminated=list(eb.terminated), truncated=list(eb.truncated),
            context_truncated=rec.context_truncated, tool_calls=rec.tool_calls, tool_errors=rec.tool_errors,
            agent_ids=rec.agent_ids, answers=answers, boundaries=rec.boundaries, grounded=rec.grounded,
            turn_tool_calls=rec.turn_tool_calls, turn_calls=rec.turn_calls,
            gold_calls=[first[i].info.get("gold_calls") if first[i].error is None else None for i in range(n)])


def _reset_mismatch(spec: EnvSpec, group: int, i: int, seed: int):
    from jaxrl_llm.agents.env import EnvError

    return EnvError(f"environment {spec.name!r} episode {i} (seed {seed}): reset gave another first observation than "
                    f"the first episode of group {group} with the same seed (reset must be deterministic in the seed)")


class _Recorder:
    def __init__(self, n: int):
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.policy: list[list[bool]] = [[] for _ in range(n)]
        self.logprobs: list[list[float]] = [[] for _ in range(n)]
        self.turn_ids: list[list[int]] = [[] for _ in range(n)]
        self.stopped: list[list[bool]] = [[] for _ in range(n)]
        self.actions: list[list[str]] = [[] for _ in range(n)]
        self.observations: list[list[str]] = [[] for _ in range(n)]
        self.context_truncated = [False] * n
        self.tool_calls = [0] * n
        self.tool_errors = [0] * n
        self.agent_ids: list[list[int]] = [[] for _ in range(n)]
        self.boundaries: list[list[int]] = [[] for _ in range(n)]
        self.grounded: list[list[bool]] = [[] for _ in range(n)]
        self.turn_tool_calls: list[list[int]] = [[] for _ in range(n)]
        self.turn_calls: list[list[list[dict]]] = [[] for _ in range(n)]

    def add_turn(self, i: int, ids: list[int], lps: list[float], k: int, stopped: bool) -> None:
        self.tokens[i] += ids
        self.policy[i] += [True] * len(ids)
        self.logprobs[i] += lps
        self.turn_ids[i] += [k] * len(ids)
        self.stopped[i].append(stopped)

    def add_observation(self, i: int, ids: list[int]) -> None:
        self.tokens[i] += ids
        self.policy[i] += [False] * len(ids)
        self.logprobs[i] += [0.0] * len(ids)
        self.turn_ids[i] += [-1] * len(ids)
        self.boundaries[i].append(len(self.tokens[i]))

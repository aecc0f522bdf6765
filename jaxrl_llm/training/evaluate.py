"""Held-out evaluation inside a training run: greedy decoding of fixed prompts, scored.

:class:`Evaluator` tokenises its prompts once and keeps one greedy
:class:`~jaxrl_llm.rollout.Sampler`, so evaluating every N steps compiles once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxrl_llm.data.pipeline import render_prompt
from jaxrl_llm.rollout.sampler import Sampler
from jaxrl_llm.rollout.sampling import SamplingConfig

__all__ = ["Evaluator"]


class Evaluator:
    """``evaluator(params, *frozen) -> {"eval/accuracy", "eval/length_mean", ...}``.

    Args:
      graphdef: the policy's graph.
      tokenizer: renders and tokenises the prompts, decodes completions.
      rows: evaluation rows (``prompt`` plus the columns ``score`` needs).
      score: ``score(completion, row) -> float`` (e.g. a task's ``score``); accuracy is the
        mean of ``score >= 1``, ``eval/score`` the mean score.
      max_new_tokens, stop_token_ids, pad_token_id: greedy decoding settings.
      chat, system_prompt: prompt rendering (as the training data).
      batch_size: prompts per sampler call (rows are padded to it: one compile).
      prefix: metric name prefix.
      unroll_layers: the sampler's layer unrolling (:class:`~jaxrl_llm.rollout.Sampler`).
    """

    def __init__(self, graphdef: Any, tokenizer: Any, rows: Sequence[dict], score: Callable[[str, dict], float], *,
                 max_new_tokens: int, stop_token_ids: Sequence[int], pad_token_id: int, chat: bool = True,
                 system_prompt: str | None = None, batch_size: int = 64, length_buckets: Sequence[int] = (32, 64, 128,
                                                                                                           256, 512),
                 prefix: str = "eval", unroll_layers: bool | str = "auto"):
        if not rows:
            raise ValueError("Evaluator needs at least one row")
        self.rows, self.score, self.tokenizer, self.prefix = list(rows), score, tokenizer, prefix
        self.prompt_ids = [list(tokenizer(render_prompt(tokenizer, r["prompt"], chat=chat, system_prompt=system_prompt),
                                          add_special_tokens=not chat)["input_ids"]) for r in self.rows]
        self.batch_size = min(batch_size, len(self.rows))
        cfg = SamplingConfig(max_new_tokens=max_new_tokens, greedy=True, stop_token_ids=tuple(stop_token_ids),
                             pad_token_id=pad_token_id)
        self.sampler = Sampler(graphdef, cfg, length_buckets=length_buckets, batch_buckets=(self.batch_size,),
                               unroll_layers=unroll_layers)
        self.last_completions: list[str] = []

    def completions(self, params: Any, *frozen: Any) -> list[str]:
        out = []
        for s in range(0, len(self.prompt_ids), self.batch_size):
            r = self.sampler(params, self.prompt_ids[s:s + self.batch_size], jax.random.key(0), *frozen)
            toks, mask = np.asarray(r.tokens), np.asarray(r.mask).astype(bool)
            out += [self.tokenizer.decode(toks[i][mask[i]], skip_special_tokens=True) for i in range(len(toks))]
        return out

    def __call__(self, params: Any, *frozen: Any) -> dict[str, float]:
        comps = self.completions(params, *frozen)
        self.last_completions = comps
        scores = np.array([float(self.score(c, r)) for c, r in zip(comps, self.rows)])
        lengths = [len(self.tokenizer(c, add_special_tokens=False)["input_ids"]) for c in comps]
        p = self.prefix
        return {f"{p}/accuracy": float(np.mean(scores >= 1.0)), f"{p}/score": float(scores.mean()),
                f"{p}/length_mean": float(np.mean(lengths)), f"{p}/n": float(len(scores))}

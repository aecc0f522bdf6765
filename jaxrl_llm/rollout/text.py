"""Text in, text out: chat-templated generation and pass@k evaluation for notebooks and evals.

These are host-side conveniences over :class:`~jaxrl_llm.rollout.sampler.Sampler`: they
tokenise (with the tokenizer's chat template), sample, detokenise and score. Training
loops use the sampler directly on token ids.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx

from jaxrl_llm.rollout.sampler import Sampler
from jaxrl_llm.rollout.sampling import SamplingConfig

__all__ = ["encode_prompts", "sampling_config", "generate_text", "pass_at_k", "evaluate"]


def sampling_config(tokenizer: Any, **overrides) -> SamplingConfig:
    """A :class:`SamplingConfig` whose stop and pad tokens come from ``tokenizer``."""
    stop = overrides.pop("stop_token_ids", None)
    if stop is None:
        ids = {tokenizer.eos_token_id}
        # chat models often end a turn with a token other than eos (e.g. <|im_end|>)
        for name in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
            tid = tokenizer.convert_tokens_to_ids(name) if name in tokenizer.get_vocab() else None
            if tid is not None:
                ids.add(tid)
        stop = tuple(sorted(i for i in ids if i is not None))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return SamplingConfig(stop_token_ids=stop, pad_token_id=int(pad), **overrides)


def encode_prompts(tokenizer: Any, prompts: Sequence[str | Sequence[dict]], *, chat: bool = True,
                   system_prompt: str | None = None) -> list[list[int]]:
    """Token ids of each prompt: a string (a user turn when ``chat``) or a list of chat
    messages; with ``chat``, the tokenizer's chat template and the generation prompt are
    applied."""
    out = []
    for p in prompts:
        if not chat:
            if not isinstance(p, str):
                raise ValueError("chat=False needs string prompts")
            out.append(list(tokenizer(p)["input_ids"]))
            continue
        msgs = [{"role": "user", "content": p}] if isinstance(p, str) else list(p)
        if system_prompt is not None and msgs[0].get("role") != "system":
            msgs = [{"role": "system", "content": system_prompt}] + msgs
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


def generate_text(model: Any, tokenizer: Any, prompts: Sequence[str | Sequence[dict]], config: SamplingConfig,
                  *, key: jax.Array, chat: bool = True, system_prompt: str | None = None,
                  sampler: Sampler | None = None, batch_size: int = 64) -> list[list[str]]:
    """``config.num_samples`` completions (strings, special tokens removed) per prompt."""
    gd, params = nnx.split(model)
    sampler = sampler or Sampler(gd, config)
    ids = encode_prompts(tokenizer, prompts, chat=chat, system_prompt=system_prompt)
    out: list[list[str]] = []
    for start in range(0, len(ids), batch_size):
        chunk = ids[start:start + batch_size]
        r = sampler(params, chunk, jax.random.fold_in(key, start))
        toks, mask = np.asarray(r.tokens), np.asarray(r.mask)
        g = config.num_samples
        for i in range(len(chunk)):
            out.append([tokenizer.decode(toks[i * g + j][mask[i * g + j]], skip_special_tokens=True)
                        for j in range(g)])
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct: ``1 - C(n - c, k) / C(n, k)``.

    Chen et al., "Evaluating Large Language Models Trained on Code", arXiv:2107.03374.
    """
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def evaluate(model: Any, tokenizer: Any, prompts: Sequence[str | Sequence[dict]], answers: Sequence[Any],
             score: Callable[[str, Any], float | bool], *, key: jax.Array, k: int = 1, num_samples: int | None = None,
             max_new_tokens: int = 256, temperature: float = 1.0, chat: bool = True,
             system_prompt: str | None = None, batch_size: int = 64) -> dict[str, Any]:
    """Greedy pass@1 and sampled pass@k of ``model`` on ``(prompts, answers)``.

    ``score(completion, answer)`` says whether a completion is correct (truthy). Greedy
    decoding gives ``greedy_pass@1``; with ``k > 1``, ``num_samples`` (default ``2 k``)
    completions per prompt at ``temperature`` give the unbiased ``pass@k`` (and ``pass@1``).

    Returns:
      ``{"greedy_pass@1", "pass@1", "pass@k" (k > 1), "k", "n", "greedy": [completion per
      prompt], "correct": [bool per prompt (greedy)]}``.
    """
    if len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
    kw = dict(chat=chat, system_prompt=system_prompt, batch_size=batch_size)
    greedy_cfg = sampling_config(tokenizer, max_new_tokens=max_new_tokens, greedy=True)
    greedy = [c[0] for c in generate_text(model, tokenizer, prompts, greedy_cfg, key=key, **kw)]
    correct = [bool(score(c, a)) for c, a in zip(greedy, answers)]
    out: dict[str, Any] = {"greedy_pass@1": float(np.mean(correct)), "greedy": greedy, "correct": correct, "k": k}
    if k > 1:
        n = num_samples or 2 * k
        cfg = sampling_config(tokenizer, max_new_tokens=max_new_tokens, num_samples=n, temperature=temperature)
        samples = generate_text(model, tokenizer, prompts, cfg, key=jax.random.fold_in(key, 1), **kw)
        counts = [sum(bool(score(c, a)) for c in cs) for cs, a in zip(samples, answers)]
        out.update({"n": n, "pass@1": float(np.mean([pass_at_k(n, c, 1) for c in counts])),
                    f"pass@{k}": float(np.mean([pass_at_k(n, c, k) for c in counts]))})
    return out

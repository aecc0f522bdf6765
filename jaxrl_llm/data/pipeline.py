"""grain pipelines: prompt datasets for RL, preference pairs (and unpaired KTO examples) and SFT examples.

One shape for all three::

    source (jsonl / parquet / saved HF dataset / rows)            random access, streamed
      -> grain.MapDataset: shuffle by seed (a new order every epoch) -> repeat (epochs)
      -> this host's share: elements process_index, process_index + process_count, ...
      -> map: render (chat template), tokenise, check fields and length
      -> to_iter_dataset (optional prefetch threads)
      -> DataIterator: batches of valid examples; malformed / too-long ones skipped and counted

Each host reads a disjoint ``1 / process_count`` of every global batch (all hosts compute the
same permutation). The iterator is checkpointable: ``get_state()`` is a small JSON-able dict
(grain's position plus the skip counters) and ``set_state`` resumes at exactly the next
element. Errors name the file and line: a missing field raises :class:`DataError` (or is
skipped and counted with ``on_error="skip"``); a prompt over ``max_prompt_tokens`` is always
skipped and counted (``filtered_too_long``), the standard length filter of RL recipes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grain
import numpy as np

from jaxrl_llm.data.sources import WHERE, DataError, Malformed
from jaxrl_llm.shapes import bucket, pad_rows  # pad_rows is re-exported (its home was here)

__all__ = ["PromptDataConfig", "PromptBatch", "DataIterator", "prompt_dataset", "PreferenceDataConfig",
           "PreferenceBatch", "preference_dataset", "KTODataConfig", "KTOBatch", "kto_dataset", "SFTDataConfig",
           "SFTBatch", "sft_dataset", "render_prompt", "encode_prompt", "end_of_turn_id", "repeat_columns", "pad_rows"]


@dataclasses.dataclass(frozen=True)
class _Skip:
    kind: str  # "malformed" or "too_long"
    where: str
    reason: str


def end_of_turn_id(tokenizer: Any, chat: bool = True) -> int:
    """The token that ends an assistant turn (``<|im_end|>``, ``<|eot_id|>``, ...) or eos."""
    if chat:
        vocab = tokenizer.get_vocab()
        for name in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
            if name in vocab:
                return int(vocab[name])
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has no eos token and no known end-of-turn token")
    return int(tokenizer.eos_token_id)


def render_prompt(tokenizer: Any, prompt: str | Sequence[dict], *, chat: bool = True,
                  system_prompt: str | None = None) -> str:
    """The prompt text the model sees: with ``chat``, the chat template with the generation
    prompt (a string is one user turn; a list is chat messages); else the string itself."""
    if not chat:
        if not isinstance(prompt, str):
            raise TypeError(f"chat=False needs a string prompt, got {type(prompt).__name__}")
        return prompt
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if system_prompt is not None and (not msgs or msgs[0].get("role") != "system"):
        msgs = [{"role": "system", "content": system_prompt}] + msgs
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def _tokens(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(tokenizer: Any, prompt: str | Sequence[dict], *, chat: bool = True,
                  system_prompt: str | None = None) -> tuple[list[int], str]:
    """``(token ids, rendered text)`` of a prompt as the RL data pipeline encodes it: the text of
    :func:`render_prompt`, tokenised without special tokens under a chat template (the template
    has them) and with the tokenizer's own ones otherwise."""
    text = render_prompt(tokenizer, prompt, chat=chat, system_prompt=system_prompt)
    return (_tokens(tokenizer, text) if chat else list(tokenizer(text)["input_ids"])), text


def _field(rec: dict, name: str) -> Any:
    if name not in rec:
        fields = sorted(k for k in rec if k != WHERE)
        raise DataError(f"{rec.get(WHERE, '?')}: missing field {name!r} (the row has {fields})")
    return rec[name]


def _check_prompt(value: Any, rec: dict, name: str) -> None:
    ok = isinstance(value, str) or (isinstance(value, list) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in value))
    if not ok:
        raise DataError(f"{rec.get(WHERE, '?')}: field {name!r} must be a string or a list of chat messages "
                        f"({{'role', 'content'}}), got {type(value).__name__}")


class DataIterator:
    """Batches of examples from a grain iterator, skipping (and counting) skip markers.

    ``next(it)`` returns the batch built by ``collate`` from ``batch_size`` valid examples;
    ``get_state()`` / ``set_state()`` checkpoint the exact position and the counters;
    ``stats`` has ``examples`` (delivered), ``skipped_malformed``, ``filtered_too_long`` and
    the first few skip reasons with file and line (``skip_examples``).
    """

    def __init__(self, dataset: grain.IterDataset, batch_size: int, collate: Callable[[list], Any],
                 drop_remainder: bool = True):
        self._dataset = dataset
        self._it = iter(dataset)
        self.batch_size, self.collate, self.drop_remainder = batch_size, collate, drop_remainder
        self.stats: dict[str, Any] = {"examples": 0, "skipped_malformed": 0, "filtered_too_long": 0,
                                      "skip_examples": []}

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        items = []
        while len(items) < self.batch_size:
            try:
                x = next(self._it)
            except StopIteration:
                if items and not self.drop_remainder:
                    break
                raise
            if isinstance(x, _Skip):
                self.stats["skipped_malformed" if x.kind == "malformed" else "filtered_too_long"] += 1
                if len(self.stats["skip_examples"]) < 5:
                    self.stats["skip_examples"].append(f"{x.where}: {x.reason}")
                continue
            items.append(x)
        self.stats["examples"] += len(items)
        return self.collate(items)

    def get_state(self) -> dict[str, Any]:
        return {"grain": self._it.get_state(), "stats": {k: (list(v) if isinstance(v, list) else v)
                                                         for k, v in self.stats.items()}}

    def set_state(self, state: dict[str, Any]) -> None:
        self._it.set_state(state["grain"])
        self.stats = {k: (list(v) if isinstance(v, list) else v) for k, v in state["stats"].items()}


def _build(source: Any, encode: Callable[[Any], Any], *, seed: int, shuffle: bool, num_epochs: int | None,
           process_index: int | None, process_count: int | None, prefetch_threads: int) -> grain.IterDataset:
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index must be in [0, process_count={process_count}), got {process_index}")
    if len(source) == 0:
        raise DataError(f"the data source is empty: {source!r}")
    ds = grain.MapDataset.source(source)
    if shuffle:
        ds = ds.shuffle(seed=seed)
    if num_epochs != 1:
        ds = ds.repeat(num_epochs)
    if process_count > 1:
        ds = ds[process_index::process_count]
    ds = ds.map(encode)
    opts = grain.ReadOptions(num_threads=prefetch_threads, prefetch_buffer_size=max(prefetch_threads * 4, 1)) \
        if prefetch_threads > 0 else grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
    return ds.to_iter_dataset(read_options=opts)


def _guard(on_error: str, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def encode(rec):
        if isinstance(rec, Malformed):
            return _Skip("malformed", rec.where, rec.reason)
        try:
            return fn(rec)
        except DataError as e:
            if on_error == "skip":
                where = rec.get(WHERE, "?")
                msg = str(e)
                return _Skip("malformed", where, msg[len(where) + 2:] if msg.startswith(where + ": ") else msg)
            raise
    return encode


def _iterator(source: Any, encode: Callable[[Any], Any], collate: Callable[[list], Any], cfg: _PipelineConfig,
              process_index: int | None, process_count: int | None) -> DataIterator:
    local = _local_batch(cfg.batch_size, process_count)
    ds = _build(source, _guard(cfg.on_error, encode), seed=cfg.seed, shuffle=cfg.shuffle, num_epochs=cfg.num_epochs,
                process_index=process_index, process_count=process_count, prefetch_threads=cfg.prefetch_threads)
    return DataIterator(ds, local, collate, cfg.drop_remainder)


def _local_batch(batch_size: int, process_count: int | None) -> int:
    if process_count is None:
        import jax

        process_count = jax.process_count()
    if batch_size % process_count:
        raise ValueError(f"batch_size={batch_size} must be divisible by the number of hosts ({process_count})")
    return batch_size // process_count


# ----------------------------------------------------------------------------- prompts (RL)


@dataclasses.dataclass(frozen=True)
class _PipelineConfig:
    """Fields every pipeline shares (see :class:`PromptDataConfig`)."""

    chat: bool = True
    system_prompt: str | None = None
    batch_size: int = 8
    seed: int = 0
    shuffle: bool = True
    num_epochs: int | None = None
    drop_remainder: bool = True
    on_error: str = "raise"
    prefetch_threads: int = 0

    def __post_init__(self):
        name = type(self).__name__
        if self.batch_size < 1:
            raise ValueError(f"{name}.batch_size must be >= 1, got {self.batch_size}")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"{name}.on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise ValueError(f"{name}.num_epochs must be >= 1 or None, got {self.num_epochs}")
        if self.prefetch_threads < 0:
            raise ValueError(f"{name}.prefetch_threads must be >= 0, got {self.prefetch_threads}")
        for f in ("max_prompt_tokens", "max_length"):
            if getattr(self, f, 1) < 1:
                raise ValueError(f"{name}.{f} must be >= 1, got {getattr(self, f)}")


@dataclasses.dataclass(frozen=True)
class PromptDataConfig(_PipelineConfig):
    """Prompt datasets for RL.

    Attributes:
      prompt_field: the column with the prompt (a string, one user turn, or chat messages).
      columns: extra columns passed to reward functions (``None``: all other columns).
      required: columns that must be present in every row (e.g. ``("answer",)``).
      max_prompt_tokens: longer prompts are skipped and counted.
      chat, system_prompt: chat-template rendering (see :func:`render_prompt`).
      batch_size: prompts per step, over all hosts (each host gets ``batch_size / hosts``).
      seed, shuffle, num_epochs (``None``: repeat forever), drop_remainder.
      on_error: ``"raise"`` (malformed rows raise :class:`DataError` with file and line) or
        ``"skip"`` (skipped and counted).
      prefetch_threads: grain read threads (0: read in the caller's thread).
      budgets: HBPO's budget variants: each prompt becomes ``len(budgets)`` consecutive prompts,
        the ``j``-th with ``budget_template`` (``{prompt}`` and ``{budget}``) applied to its text
        with ``budgets[j]`` (a batch then holds ``batch_size x len(budgets)`` prompts: prompt
        ``g`` of it asks question ``g // k`` under budget ``g % k``); every variant gets a
        ``budget`` column. Empty: no variants.
    """

    prompt_field: str = "prompt"
    columns: tuple[str, ...] | None = None
    required: tuple[str, ...] = ()
    max_prompt_tokens: int = 512
    budgets: tuple[int, ...] = ()
    budget_template: str = "{prompt}\n(Answer within {budget} tokens.)"


@dataclasses.dataclass
class PromptBatch:
    """Prompts of one step on this host: ``prompt_ids`` (token lists, ready for the
    :class:`~jaxrl_llm.rollout.Sampler`), ``prompts`` (the rendered text), ``raw_prompts``
    (the field as in the data), ``columns`` (name -> list, for reward functions) and
    ``where`` (file:line of each)."""

    prompt_ids: list[list[int]]
    prompts: list[str]
    raw_prompts: list[Any]
    columns: dict[str, list]
    where: list[str]

    def __len__(self) -> int:
        return len(self.prompt_ids)


def repeat_columns(columns: dict[str, list], g: int) -> dict[str, list]:
    """Each column's entries repeated ``g`` times in place (prompt-major), to line up with the
    ``[B * G]`` completions of a group rollout."""
    return {k: [x for x in v for _ in range(g)] for k, v in columns.items()}


def prompt_dataset(source: Any, tokenizer: Any, config: PromptDataConfig = PromptDataConfig(), *,
                   process_index: int | None = None, process_count: int | None = None) -> DataIterator:
    """A checkpointable iterator of :class:`PromptBatch` (see the module docstring). ``source``
    is a random-access source (:func:`~jaxrl_llm.data.open_source`, a task's rows in a
    :class:`~jaxrl_llm.data.ListSource`, ...); process index and count default to JAX's."""
    cfg = config
    if cfg.budgets:
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in cfg.budgets):
            raise ValueError(f"PromptDataConfig.budgets must be positive ints, got {cfg.budgets!r}")
        if "{prompt}" not in cfg.budget_template or "{budget}" not in cfg.budget_template:
            raise ValueError(f"PromptDataConfig.budget_template must contain {{prompt}} and {{budget}}, got "
                             f"{cfg.budget_template!r}")

    def encode_one(rec: dict, prompt: Any, cols: dict):
        ids, text = encode_prompt(tokenizer, prompt, chat=cfg.chat, system_prompt=cfg.system_prompt)
        if len(ids) > cfg.max_prompt_tokens:
            return _Skip("too_long", rec[WHERE], f"prompt has {len(ids)} tokens > max_prompt_tokens="
                                                 f"{cfg.max_prompt_tokens}")
        return {"ids": ids, "text": text, "raw": prompt, "cols": cols, "where": rec[WHERE]}

    def encode(rec: dict):
        prompt = _field(rec, cfg.prompt_field)
        _check_prompt(prompt, rec, cfg.prompt_field)
        for name in cfg.required:
            _field(rec, name)
        if cfg.columns is None:
            cols = {k: v for k, v in rec.items() if k not in (cfg.prompt_field, WHERE)}
        else:
            cols = {k: _field(rec, k) for k in cfg.columns}
        if not cfg.budgets:
            return encode_one(rec, prompt, cols)
        if not isinstance(prompt, str):
            raise DataError(f"{rec[WHERE]}: budget variants (PromptDataConfig.budgets) need a text prompt, got "
                            f"{type(prompt).__name__}")
        variants = []
        for b in cfg.budgets:
            one = encode_one(rec, cfg.budget_template.format(prompt=prompt, budget=b), {**cols, "budget": int(b)})
            if isinstance(one, _Skip):
                return one
            variants.append(one)
        return {"variants": variants}

    def collate(items: list[dict]) -> PromptBatch:
        if cfg.budgets:  # each question's budget variants, consecutive
            items = [v for it in items for v in it["variants"]]
        names = list(items[0]["cols"])
        for it in items:
            if list(it["cols"]) != names:
                raise DataError(f"{it['where']}: columns {sorted(it['cols'])} differ from the batch's {sorted(names)}; "
                                f"set PromptDataConfig.columns to the ones the rewards need")
        return PromptBatch([it["ids"] for it in items], [it["text"] for it in items], [it["raw"] for it in items],
                           {k: [it["cols"][k] for it in items] for k in names}, [it["where"] for it in items])

    return _iterator(source, encode, collate, cfg, process_index, process_count)


# ----------------------------------------------------------------------------- shared for pairs / SFT


def _completion_ids(tokenizer: Any, text: Any, rec: dict, name: str, end_id: int) -> list[int]:
    if isinstance(text, list):  # a conversation's final assistant message (HF preference format)
        if not text or not isinstance(text[-1], dict) or "content" not in text[-1]:
            raise DataError(f"{rec.get(WHERE, '?')}: field {name!r} as messages must end with an assistant message")
        text = text[-1]["content"]
    if not isinstance(text, str):
        raise DataError(f"{rec.get(WHERE, '?')}: field {name!r} must be a string, got {type(text).__name__}")
    return _tokens(tokenizer, text) + [end_id]


def _bucket(n: int, buckets: Sequence[int], max_length: int) -> int:
    """The smallest of ``buckets`` (capped at ``max_length``) that fits ``n <= max_length``."""
    return bucket(n, tuple(b for b in buckets if b < max_length) + (max_length,))


# ----------------------------------------------------------------------------- preference pairs


@dataclasses.dataclass(frozen=True)
class PreferenceDataConfig(_PipelineConfig):
    """Preference pairs ``(prompt, chosen, rejected)`` for DPO-style losses.

    ``chosen`` / ``rejected`` are completion strings, or conversations whose last message is
    the assistant's answer (HF's format; the prompt field then holds the shared turns). Pairs
    whose prompt + longer answer exceed ``max_length`` tokens are skipped and counted.
    Batches are right-padded to the smallest of ``length_buckets`` that fits (bounded
    compilation). Other fields as :class:`PromptDataConfig`.
    """

    prompt_field: str = "prompt"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    max_length: int = 1024
    length_buckets: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096)
    #: C3PO: the field giving each pair's scope, ``in`` / ``near`` / ``out`` (or 0 / 1 / 2); None: no scope
    scope_field: str | None = None
    #: rationale-enriched preference learning: the field with each pair's rationale (a third row per
    #: pair: ``rationale_template`` of the prompt and the two answers as the prompt, the rationale as
    #: the completion); None: no rationale
    rationale_field: str | None = None
    rationale_template: str = ""


#: the scope names of C3PO's pairs, in the order of their codes
SCOPES = ("in", "near", "out")


#: the rationale's prompt (the authors' judging question: reds-lab/preference-learning-with-rationales
#: @16111a1, dataloader.py; the chosen answer always shown first)
RATIONALE_TEMPLATE = ("Given the prompt: {prompt}. Which of the following assistant's response is more preferable "
                      "and strictly follows with the prompt question? Response above: \"{chosen}\" or Response "
                      "below: \"{rejected}\"?")


def _text(x: Any) -> str:
    """A prompt or answer as text: a string, or a conversation's messages' contents joined."""
    if isinstance(x, str):
        return x
    if isinstance(x, list):
        return "\n".join(str(m.get("content", "")) for m in x if isinstance(m, dict))
    return str(x)


def rationale_prompt(template: str, prompt: str, chosen: str, rejected: str) -> str:
    """The prompt of a pair's rationale row (``template`` with ``{prompt}``, ``{chosen}``,
    ``{rejected}``; empty: :data:`RATIONALE_TEMPLATE`)."""
    return (template or RATIONALE_TEMPLATE).format(prompt=prompt, chosen=chosen, rejected=rejected)


def _scope(rec: dict, field: str) -> int:
    v = _field(rec, field)
    if isinstance(v, str) and v.strip().lower() in SCOPES:
        return SCOPES.index(v.strip().lower())
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(SCOPES):
        return v
    raise DataError(f"{rec[WHERE]}: field {field!r} must be one of {', '.join(SCOPES)} (or 0, 1, 2), got {v!r}")


@dataclasses.dataclass
class PreferenceBatch:
    """``[2B, L]`` arrays: rows ``0..B-1`` are prompt + chosen, rows ``B..2B-1`` prompt +
    rejected (one forward pass for both). ``mask`` marks real tokens, ``loss_mask`` the
    answer tokens whose log-probs form the sequence log-likelihood; ``where`` file:line."""

    tokens: np.ndarray
    mask: np.ndarray
    loss_mask: np.ndarray
    where: list[str]
    #: ``[B]`` C3PO's scope code of each pair (``PreferenceDataConfig.scope_field``), or None
    scope: np.ndarray | None = None
    #: rows per pair: 2 (chosen, rejected), 3 with a rationale row after them (rows ``2B..3B-1``)
    slots: int = 2

    @property
    def num_pairs(self) -> int:
        return self.tokens.shape[0] // self.slots


def _pair_collate(pad: int, buckets: Sequence[int], max_length: int):
    def collate(items: list[dict]) -> PreferenceBatch:
        rows = [it["prompt"] + it["chosen"] for it in items] + [it["prompt"] + it["rejected"] for it in items]
        starts = [len(it["prompt"]) for it in items] * 2
        slots = 3 if "rationale" in items[0] else 2
        if slots == 3:  # the rationale after its own prompt (the pair shown to a judge)
            rows += [it["rationale_prompt"] + it["rationale"] for it in items]
            starts += [len(it["rationale_prompt"]) for it in items]
        length = _bucket(max(len(r) for r in rows), buckets, max_length)
        tokens, mask = pad_rows(rows, length, pad)
        loss = mask.copy()
        for i, s in enumerate(starts):
            loss[i, :s] = False
        scope = np.array([it["scope"] for it in items], np.int32) if "scope" in items[0] else None
        return PreferenceBatch(tokens, mask, loss, [it["where"] for it in items], scope, slots)
    return collate


def preference_dataset(source: Any, tokenizer: Any, config: PreferenceDataConfig = PreferenceDataConfig(), *,
                       process_index: int | None = None, process_count: int | None = None) -> DataIterator:
    """A checkpointable iterator of :class:`PreferenceBatch` (see :func:`prompt_dataset`)."""
    cfg = config
    end_id = end_of_turn_id(tokenizer, cfg.chat)

    def encode(rec: dict):
        prompt = _field(rec, cfg.prompt_field)
        _check_prompt(prompt, rec, cfg.prompt_field)
        p = _tokens(tokenizer, render_prompt(tokenizer, prompt, chat=cfg.chat, system_prompt=cfg.system_prompt))
        c = _completion_ids(tokenizer, _field(rec, cfg.chosen_field), rec, cfg.chosen_field, end_id)
        r = _completion_ids(tokenizer, _field(rec, cfg.rejected_field), rec, cfg.rejected_field, end_id)
        n = len(p) + max(len(c), len(r))
        if n > cfg.max_length:
            return _Skip("too_long", rec[WHERE], f"pair has {n} tokens > max_length={cfg.max_length}")
        item = {"prompt": p, "chosen": c, "rejected": r, "where": rec[WHERE]}
        if cfg.scope_field is not None:
            item["scope"] = _scope(rec, cfg.scope_field)
        if cfg.rationale_field is not None:
            why = _field(rec, cfg.rationale_field)
            if not isinstance(why, str) or not why.strip():
                raise DataError(f"{rec[WHERE]}: field {cfg.rationale_field!r} must be a non-empty string (the pair's "
                                f"rationale), got {why!r:.80}")
            judge = rationale_prompt(cfg.rationale_template, _text(_field(rec, cfg.prompt_field)),
                                     _text(_field(rec, cfg.chosen_field)), _text(_field(rec, cfg.rejected_field)))
            item["rationale_prompt"] = _tokens(tokenizer, render_prompt(tokenizer, judge, chat=cfg.chat,
                                                                         system_prompt=cfg.system_prompt))
            item["rationale"] = _completion_ids(tokenizer, why, rec, cfg.rationale_field, end_id)
            n = max(n, len(item["rationale_prompt"]) + len(item["rationale"]))
            if n > cfg.max_length:
                return _Skip("too_long", rec[WHERE], f"pair with its rationale has {n} tokens > max_length="
                                                     f"{cfg.max_length}")
        return item

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id
    collate = _pair_collate(pad, cfg.length_buckets, cfg.max_length)
    return _iterator(source, encode, collate, cfg, process_index, process_count)


# ----------------------------------------------------------------------------- unpaired (KTO)


@dataclasses.dataclass(frozen=True)
class KTODataConfig(_PipelineConfig):
    """Unpaired examples ``(prompt, completion, label)`` for KTO (TRL's unpaired preference
    format): ``label`` is True for a desirable completion, False for an undesirable one.
    Examples over ``max_length`` tokens are skipped and counted. Other fields as
    :class:`PromptDataConfig`."""

    prompt_field: str = "prompt"
    completion_field: str = "completion"
    label_field: str = "label"
    max_length: int = 1024
    length_buckets: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096)


@dataclasses.dataclass
class KTOBatch:
    """``[B, L]`` right-padded ``tokens``, ``mask`` (real tokens), ``loss_mask`` (the
    completion tokens, end of turn included), ``desirable [B]`` bool, ``where`` file:line."""

    tokens: np.ndarray
    mask: np.ndarray
    loss_mask: np.ndarray
    desirable: np.ndarray
    where: list[str]


def kto_dataset(source: Any, tokenizer: Any, config: KTODataConfig = KTODataConfig(), *,
                process_index: int | None = None, process_count: int | None = None) -> DataIterator:
    """A checkpointable iterator of :class:`KTOBatch` (see :func:`prompt_dataset`)."""
    cfg = config
    end_id = end_of_turn_id(tokenizer, cfg.chat)

    def encode(rec: dict):
        prompt = _field(rec, cfg.prompt_field)
        _check_prompt(prompt, rec, cfg.prompt_field)
        label = _field(rec, cfg.label_field)
        if not isinstance(label, (bool, np.bool_)) and label not in (0, 1):
            raise DataError(f"{rec.get(WHERE, '?')}: field {cfg.label_field!r} must be a bool (True: desirable), "
                            f"got {label!r}")
        p = _tokens(tokenizer, render_prompt(tokenizer, prompt, chat=cfg.chat, system_prompt=cfg.system_prompt))
        c = _completion_ids(tokenizer, _field(rec, cfg.completion_field), rec, cfg.completion_field, end_id)
        if len(p) + len(c) > cfg.max_length:
            return _Skip("too_long", rec[WHERE], f"example has {len(p) + len(c)} tokens > max_length={cfg.max_length}")
        return {"prompt": p, "completion": c, "label": bool(label), "where": rec[WHERE]}

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id

    def collate(items: list[dict]) -> KTOBatch:
        rows = [it["prompt"] + it["completion"] for it in items]
        tokens, mask = pad_rows(rows, _bucket(max(len(r) for r in rows), cfg.length_buckets, cfg.max_length), pad)
        loss = mask.copy()
        for i, it in enumerate(items):
            loss[i, :len(it["prompt"])] = False
        return KTOBatch(tokens, mask, loss, np.array([it["label"] for it in items], bool),
                        [it["where"] for it in items])

    return _iterator(source, encode, collate, cfg, process_index, process_count)


# ----------------------------------------------------------------------------- SFT


@dataclasses.dataclass(frozen=True)
class SFTDataConfig(_PipelineConfig):
    """Supervised fine-tuning examples: ``(prompt, completion)`` fields, or a ``messages``
    conversation (every assistant turn is trained on; set ``messages_field``). Examples over
    ``max_length`` tokens are skipped and counted. Other fields as :class:`PromptDataConfig`."""

    prompt_field: str = "prompt"
    completion_field: str = "completion"
    messages_field: str | None = None
    max_length: int = 1024
    length_buckets: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096)


@dataclasses.dataclass
class SFTBatch:
    """``[B, L]`` right-padded ``tokens``, ``mask`` (real tokens) and ``loss_mask`` (the
    tokens to predict: the completion / assistant turns, end-of-turn token included)."""

    tokens: np.ndarray
    mask: np.ndarray
    loss_mask: np.ndarray
    where: list[str]


def _conversation(tokenizer: Any, msgs: list[dict], rec: dict, name: str, end_id: int,
                  system_prompt: str | None) -> tuple[list[int], list[bool]]:
    """Tokens of a conversation and which are assistant content (+ end of turn): each turn's
    rendering is the difference between the template applied to the prefix and the prefix
    before it, so the result equals the template applied to the whole conversation."""
    if not msgs or not all(isinstance(m, dict) and "role" in m and "content" in m for m in msgs):
        raise DataError(f"{rec.get(WHERE, '?')}: field {name!r} must be a non-empty list of chat messages")
    if system_prompt is not None and msgs[0]["role"] != "system":
        msgs = [{"role": "system", "content": system_prompt}] + msgs
    ids: list[int] = []
    train: list[bool] = []
    for k, m in enumerate(msgs):
        if m["role"] == "assistant":
            head = _tokens(tokenizer, tokenizer.apply_chat_template(msgs[:k], tokenize=False,
                                                                   add_generation_prompt=True))
            body = _tokens(tokenizer, m["content"]) + [end_id]
            if head[:len(ids)] != ids:
                raise DataError(f"{rec.get(WHERE, '?')}: the chat template does not render turn {k} as a prefix "
                                f"extension; cannot mark assistant tokens")
            ids, train = ids + head[len(ids):], train + [False] * (len(head) - len(ids))
            ids, train = ids + body, train + [True] * len(body)
            full = _tokens(tokenizer, tokenizer.apply_chat_template(msgs[:k + 1], tokenize=False))
            extra = full[len(ids):] if full[:len(ids)] == ids else []
            ids, train = ids + extra, train + [False] * len(extra)  # e.g. a newline after end of turn
    if not any(train):
        raise DataError(f"{rec.get(WHERE, '?')}: field {name!r} has no assistant message to train on")
    return ids, train


def sft_dataset(source: Any, tokenizer: Any, config: SFTDataConfig = SFTDataConfig(), *,
                process_index: int | None = None, process_count: int | None = None) -> DataIterator:
    """A checkpointable iterator of :class:`SFTBatch` (see :func:`prompt_dataset`)."""
    cfg = config
    end_id = end_of_turn_id(tokenizer, cfg.chat)

    def encode(rec: dict):
        if cfg.messages_field is not None:
            ids, train = _conversation(tokenizer, _field(rec, cfg.messages_field), rec, cfg.messages_field, end_id,
                                       cfg.system_prompt)
        else:
            prompt = _field(rec, cfg.prompt_field)
            _check_prompt(prompt, rec, cfg.prompt_field)
            p = _tokens(tokenizer, render_prompt(tokenizer, prompt, chat=cfg.chat, system_prompt=cfg.system_prompt))
            c = _completion_ids(tokenizer, _field(rec, cfg.completion_field), rec, cfg.completion_field, end_id)
            ids, train = p + c, [False] * len(p) + [True] * len(c)
        if len(ids) > cfg.max_length:
            return _Skip("too_long", rec[WHERE], f"example has {len(ids)} tokens > max_length={cfg.max_length}")
        return {"ids": ids, "train": train, "where": rec[WHERE]}

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id

    def collate(items: list[dict]) -> SFTBatch:
        length = _bucket(max(len(it["ids"]) for it in items), cfg.length_buckets, cfg.max_length)
        tokens, mask = pad_rows([it["ids"] for it in items], length, pad)
        loss = np.zeros_like(mask)
        for i, it in enumerate(items):
            loss[i, :len(it["train"])] = it["train"]
        return SFTBatch(tokens, mask, loss, [it["where"] for it in items])

    return _iterator(source, encode, collate, cfg, process_index, process_count)

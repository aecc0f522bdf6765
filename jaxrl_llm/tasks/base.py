"""The :class:`Task` protocol: seeded generator, verifier and train/eval split of a built-in task.

A task is a frozen dataclass whose fields are its difficulty knobs. It produces rows (plain
dicts, JSON-serialisable) and scores completions:

``rows(split, n, seed)``
    ``n`` rows of ``split`` (``"train"`` or ``"eval"``). Every row has

    - ``"prompt"``: the user message (no chat template; the data pipeline applies it),
    - ``"answer"``: the ground truth (JSON-serialisable),
    - ``"solution"``: a correct completion text, in the format the verifier rewards (SFT
      warm-up of tiny models); ``task.score(row["solution"], row) == 1.0`` always,
    - task-specific columns (e.g. ``"numbers"`` and ``"target"`` for countdown).

``score(completion, row)``
    1.0 for a correct completion, 0.0 otherwise (the formatting task documents a partial
    credit).

``reward(prompts, completions, **columns)``
    TRL's reward-function protocol (``GRPOTrainer(reward_funcs=[task.reward])``): the
    dataset's extra columns arrive as lists aligned with ``completions``.

Determinism
    Rows depend only on ``(task config, split, n, seed)``: the generator is a
    :class:`random.Random` seeded with a BLAKE2 hash of ``(repr(task), split, seed)``, never on
    Python's randomised ``hash()``, so the same call gives identical rows in every process.
    ``rows(split, m, seed)`` is a prefix of ``rows(split, n, seed)`` for ``m <= n``.

Split rule
    Each problem has a canonical key (:meth:`Task.problem_key`; e.g. ``("+", 3, 5)`` for
    both ``3 + 5`` and ``5 + 3``). A problem belongs to ``"eval"`` iff
    ``blake2b(task name, key) % eval_modulus == 0`` (``eval_modulus = 5``: about 20% of the
    problem space), else to ``"train"``. The rule ignores the difficulty knobs, so a problem
    is on the same side for every configuration of the same task family: an eval problem
    never appears in any train split.

Uniqueness and repeats
    Within one call the problems are distinct while the split has unused problems. When a
    split is exhausted (its exact size when the task can count it, else after
    ``max_draws = 10_000`` consecutive draws that found no new problem), ``"train"`` starts a
    new pass over the problem space (repeats, e.g. one-digit addition has only 55 distinct
    problems) while ``"eval"`` never repeats: :meth:`Task.rows` raises a ``ValueError`` naming
    ``n`` and the split size, and :meth:`Task.iter_rows` simply ends.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import random
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["Task", "SPLITS", "stable_hash", "message_text"]

SPLITS = ("train", "eval")


def stable_hash(*parts: Any) -> int:
    """A 64-bit hash of ``repr`` of ``parts``, identical across processes and Python runs.

    Only use it on values with a stable ``repr`` (ints, strings, tuples of them).
    """
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(repr(p).encode("utf-8"))
        h.update(b"\x1f")
    return int.from_bytes(h.digest(), "big")


def message_text(x: Any) -> str:
    """The text of a completion or prompt in either TRL format.

    Standard format: a string. Conversational format: a list of ``{"role", "content"}``
    messages; the content of the last message is used (the assistant turn of a completion,
    the last user turn of a prompt).
    """
    if isinstance(x, str):
        return x
    if isinstance(x, Mapping):
        return str(x.get("content", ""))
    if isinstance(x, Sequence) and len(x) > 0:
        return message_text(x[-1])
    if isinstance(x, Sequence):
        return ""
    raise TypeError(f"expected a string or a list of chat messages, got {type(x).__name__}")


@dataclass(frozen=True)
class Task:
    """Base class of the built-in tasks (see the module docstring for the protocol).

    Subclasses define the class attributes ``name`` and ``PRESETS`` and implement
    :meth:`_propose`, :meth:`_realize`, :meth:`problem_key` and :meth:`score`; they may
    implement :meth:`_split_size` when the split sizes are cheap to count exactly.
    """

    #: Registry / family name; also salts the split hash.
    name: ClassVar[str] = "task"
    #: A problem is in ``"eval"`` iff ``stable_hash(name, key) % eval_modulus == 0``.
    eval_modulus: ClassVar[int] = 5
    #: Consecutive unsuccessful draws after which a split counts as exhausted.
    max_draws: ClassVar[int] = 10_000
    #: Dataset columns :meth:`score` reads from the row (checked by :meth:`reward`).
    required_columns: ClassVar[tuple[str, ...]] = ("answer",)
    #: Named configurations: ``preset name -> constructor keyword arguments``.
    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(cls, preset: str | None = None, **kwargs: Any) -> Task:
        """Construct from an optional preset plus keyword overrides, with clear errors.

        Unknown keyword names raise a ``ValueError`` listing the valid ones.
        """
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(kwargs) - set(valid))
        if unknown:
            raise ValueError(
                f"unknown argument(s) {', '.join(map(repr, unknown))} for {cls.__name__}; "
                f"valid arguments: {', '.join(valid)}"
            )
        base: dict[str, Any] = {}
        if preset is not None:
            if preset not in cls.PRESETS:
                raise ValueError(
                    f"unknown {cls.__name__} preset {preset!r}; known presets: "
                    f"{', '.join(sorted(cls.PRESETS)) or '(none)'}"
                )
            base = dict(cls.PRESETS[preset])
        return cls(**{**base, **kwargs})

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Task:
        """The named configuration from ``PRESETS``, with keyword ``overrides`` applied."""
        return cls.create(name, **overrides)

    # ------------------------------------------------------------------ subclass hooks

    def _propose(self, rng: random.Random) -> tuple[Hashable, Any]:
        """Draw a candidate problem: ``(canonical key, payload)``. Must be cheap."""
        raise NotImplementedError

    def _realize(self, key: Hashable, payload: Any, rng: random.Random) -> dict | None:
        """The row of a proposed problem, or ``None`` when it is not a valid problem."""
        raise NotImplementedError

    def _split_size(self, split: str) -> int | None:
        """Exact number of distinct problems in ``split`` if cheap to count, else ``None``."""
        return None

    def problem_key(self, row: Mapping[str, Any]) -> Hashable:
        """The canonical key of the problem of ``row`` (what the split and dedup use)."""
        raise NotImplementedError

    def score(self, completion: str, row: Mapping[str, Any]) -> float:
        """1.0 if ``completion`` solves the problem of ``row``, else 0.0."""
        raise NotImplementedError

    # ------------------------------------------------------------------ generation

    def split_of(self, key: Hashable) -> str:
        """``"eval"`` or ``"train"``: the split a canonical problem key belongs to."""
        return "eval" if stable_hash("split", self.name, key) % self.eval_modulus == 0 else "train"

    def iter_rows(self, split: str, seed: int = 0) -> Iterator[dict]:
        """Stream of rows of ``split``: infinite for ``"train"``; ``"eval"`` ends when exhausted.

        ``rows(split, n, seed)`` is exactly the first ``n`` items of this stream.
        """
        _check_split(split)
        seed = _check_int("seed", seed)
        rng = random.Random(stable_hash("rows", repr(self), split, seed))
        capacity = self._split_size(split)
        seen: set[Hashable] = set()
        dead: set[Hashable] = set()  # proposed keys that turned out invalid
        while True:
            row = key = None
            if capacity is None or len(seen) < capacity:
                for _ in range(self.max_draws):
                    key, payload = self._propose(rng)
                    if key in seen or key in dead or self.split_of(key) != split:
                        continue
                    row = self._realize(key, payload, rng)
                    if row is None:
                        dead.add(key)
                        continue
                    break
            if row is None:  # exhausted
                if split == "eval" or not seen:
                    return
                seen.clear()  # train: start a new pass over the problem space
                continue
            seen.add(key)
            yield row

    def rows(self, split: str, n: int, seed: int = 0) -> list[dict]:
        """``n`` rows of ``split`` (``"train"`` or ``"eval"``), deterministic in the arguments.

        Raises ``ValueError`` when ``"eval"`` has fewer than ``n`` distinct problems (eval
        rows never repeat) or the split is empty.
        """
        _check_split(split)
        n = _check_int("n", n)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        out = list(itertools.islice(self.iter_rows(split, seed), n))
        if len(out) < n:
            size = self._split_size(split)
            size_txt = f"{size}" if size is not None else f"about {len(out)} (found by sampling)"
            raise ValueError(
                f"{self!r}: the {split!r} split has only {size_txt} distinct problems, cannot "
                f"produce n={n} rows ({split!r} rows never repeat); ask for fewer rows or use "
                f"a larger configuration"
            )
        return out

    # ------------------------------------------------------------------ reward protocol

    def reward(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        """TRL reward-function protocol: one score per completion.

        ``columns`` are the dataset's extra fields as lists aligned with ``completions``
        (e.g. ``answer=[...]``); non-list keyword arguments that TRL adds (such as
        ``trainer_state``) are ignored. Prompts and completions may be strings or
        conversational message lists. Row ``i`` is ``{"prompt": prompts[i], **{k: v[i]}}``.
        """
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"prompts and completions must have the same length, got {len(prompts)} and {n}")
        cols: dict[str, Sequence[Any]] = {}
        for k, v in columns.items():
            if isinstance(v, (str, bytes, Mapping)) or not (hasattr(v, "__len__") and hasattr(v, "__getitem__")):
                continue  # not a column (e.g. TRL's trainer_state); numpy arrays count as columns
            if len(v) != n:
                raise ValueError(f"column {k!r} has {len(v)} entries, expected {n} (one per completion)")
            cols[k] = v
        missing = [c for c in self.required_columns if c not in cols]
        if missing:
            raise ValueError(
                f"{type(self).__name__}.reward needs the dataset column(s) {', '.join(map(repr, missing))}; "
                f"got {', '.join(map(repr, sorted(cols))) or 'none'}"
            )
        out = []
        for i in range(n):
            row = {k: v[i] for k, v in cols.items()}
            row["prompt"] = message_text(prompts[i])
            out.append(float(self.score(message_text(completions[i]), row)))
        return out


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import numpy as np  # numpy ints are fine

            if isinstance(value, np.integer):
                return int(value)
        except ImportError:  # pragma: no cover
            pass
        raise ValueError(f"{name} must be an int, got {value!r}")
    return int(value)

"""reasoning-gym's procedural task families as a :class:`~jaxrl_llm.tasks.base.Task`.

`reasoning-gym <https://pypi.org/project/reasoning-gym/>`_ (optional dependency, extra
``tasks``) generates problems of over a hundred families (arithmetic chains, puzzles, logic,
graphs, ...) with difficulty settings and a verifier per family, offline. This adapter draws
problems from one or several families (uniformly per problem), labels each row with its family
in the ``level`` column (the arms of a curriculum such as ``recipe.selector=sec``) and scores a
completion with the family's own ``score_answer``.

Rows: ``prompt`` (the question, plus ``instruction``), ``question``, ``answer``, ``solution``
(the answer in ``answer_format``, for SFT), ``level`` (the family) and ``entry`` (the
generator's item as JSON, which the verifier reads). A problem's key is ``(family, question)``;
the train/eval split hashes it like the built-in tasks, so eval questions are never trained on.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from jaxrl_llm.tasks.base import Task

__all__ = ["ReasoningGym"]

_FORMATS = ("plain", "tag")


def _rg():
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError("the reasoning_gym task needs the reasoning-gym package: pip install 'jaxrl_llm[tasks]' "
                          "(or pip install reasoning-gym)") from None
    return reasoning_gym


@dataclass(frozen=True)
class ReasoningGym(Task):
    """Problems of reasoning-gym families (module docstring).

    Args:
        datasets: family names (``reasoning_gym.factory.DATASETS``), drawn uniformly per problem.
        config: family name -> its generator's keyword arguments (difficulty settings).
        answer_format: ``"plain"`` (the stripped completion is the answer) or ``"tag"`` (the last
            ``<answer>...</answer>``; no tag scores 0).
        instruction: text after the question (default: none for ``plain``, a tag instruction for
            ``tag``).
        pool: problems are items ``0 .. pool - 1`` of each family's generator.
        generator_seed: the generators' seed (the row streams' own seeds choose among items).
    """

    datasets: tuple[str, ...] = ("chain_sum",)
    config: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    answer_format: str = "plain"
    instruction: str | None = None
    pool: int = 100_000
    generator_seed: int = 0

    name: ClassVar[str] = "reasoning_gym"
    required_columns: ClassVar[tuple[str, ...]] = ("answer", "entry")
    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        # three arithmetic families of increasing difficulty for the tiny models: one-digit sums,
        # two- and three-term mixed operations, products
        "arith_mix": dict(datasets=("chain_sum", "basic_arithmetic", "products"),
                          config={"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
                                  "basic_arithmetic": {"min_terms": 2, "max_terms": 3, "min_digits": 1,
                                                       "max_digits": 2},
                                  "products": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}}),
    }

    def __post_init__(self) -> None:
        names = (self.datasets,) if isinstance(self.datasets, str) else tuple(self.datasets)
        if not names or len(set(names)) != len(names):
            raise ValueError(f"datasets must name one or more distinct reasoning-gym families, got {self.datasets!r}")
        object.__setattr__(self, "datasets", names)
        known = _rg().factory.DATASETS
        bad = [n for n in names if n not in known]
        if bad:
            raise ValueError(f"datasets: unknown reasoning-gym famil{'y' if len(bad) == 1 else 'ies'} {bad}; "
                             f"known: {', '.join(sorted(known))}")
        if not isinstance(self.config, Mapping) or any(k not in names for k in self.config):
            raise ValueError(f"config must map some of the datasets {list(names)} to generator arguments, got "
                             f"{self.config!r}")
        if self.answer_format not in _FORMATS:
            raise ValueError(f"answer_format must be one of {_FORMATS}, got {self.answer_format!r}")
        if isinstance(self.pool, bool) or not isinstance(self.pool, int) or self.pool < 1:
            raise ValueError(f"pool must be an int >= 1, got {self.pool!r}")
        for n in names:  # a bad difficulty setting fails here, naming the family
            try:
                self._generators[n]
            except Exception as e:  # noqa: BLE001 -- reasoning-gym raises assertion and value errors
                raise ValueError(f"config[{n!r}] = {dict(self.config.get(n, {}))!r}: reasoning-gym refused it: "
                                 f"{type(e).__name__}: {e}") from None

    @functools.cached_property
    def _generators(self) -> dict[str, Any]:
        rg = _rg()
        return _LazyGenerators(lambda n: rg.create_dataset(n, size=self.pool, seed=self.generator_seed,
                                                            **dict(self.config.get(n, {}))))

    def _instruction(self) -> str:
        if self.instruction is not None:
            return self.instruction
        return "" if self.answer_format == "plain" else "Give the final answer as <answer>...</answer>."

    def _propose(self, rng: random.Random) -> tuple[Hashable, Any]:
        fam = rng.choice(self.datasets)
        entry = self._generators[fam][rng.randrange(self.pool)]
        return (fam, entry["question"]), (fam, entry)

    def _realize(self, key: Hashable, payload: Any, rng: random.Random) -> dict | None:
        fam, entry = payload
        answer = str(entry["answer"])
        ins = self._instruction()
        return {"prompt": entry["question"] + (f" {ins}" if ins else ""), "question": entry["question"],
                "answer": answer, "solution": answer if self.answer_format == "plain" else f"<answer>{answer}</answer>",
                "level": fam, "entry": json.dumps(entry, sort_keys=True, default=str)}

    def problem_key(self, row: Mapping[str, Any]) -> Hashable:
        return (row["level"], row["question"])

    def score(self, completion: str, row: Mapping[str, Any]) -> float:
        """The family's verifier on the answer of ``completion`` (0 when a tag is required and missing)."""
        if self.answer_format == "tag":
            from reasoning_gym.utils import extract_answer

            answer = extract_answer(completion)
            if answer is None:
                return 0.0
        else:
            answer = completion
        entry = json.loads(row["entry"])
        fam = row.get("level") or entry.get("metadata", {}).get("source_dataset")
        if fam not in self.datasets:
            raise ValueError(f"reasoning_gym: a row of family {fam!r} scored by a task of {list(self.datasets)}")
        return float(self._generators[fam].score_answer(answer.strip(), entry))


class _LazyGenerators(dict):
    """family -> generator, built on first use (building one validates its config)."""

    def __init__(self, make):
        super().__init__()
        self._make = make

    def __missing__(self, name):
        self[name] = self._make(name)
        return self[name]

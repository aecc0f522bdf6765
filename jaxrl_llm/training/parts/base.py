"""Loop parts: a loop-level method (a prompt selector, a rollout allocator, hints, replay, a
stale or asynchronous sampler, ...) as one object that declares where it hooks into the RL loop.

A part declares, on its class:

- ``key``: the config key that turns it on (``"recipe.selector"``, ``"rollout.staleness"``);
- ``phases``: the phases of the loop it hooks into (:data:`PHASES`), one method per phase named
  like it. Defining a hook method for a phase that is not declared is an error when the class
  is defined, and the loop calls a part only in the phases it declared (:class:`Parts`);
- ``requires``: capabilities it needs (:class:`Need`: the capability and what to set when it is
  missing), provided by the run's settings (``"old_logp=recompute"``, ``"one_process"``) or by
  another part (``provides``);
- ``provides``: capabilities it gives the others;
- ``conflicts``: part keys or capabilities it cannot be combined with (:class:`Clash`: the
  other and why).

:func:`validate` checks a set of parts against the run's capabilities once, at config time,
and raises a one-line :class:`~jaxrl_llm.config.ConfigError` naming the keys and the reason.
:func:`conflict_table` writes the same declarations as the guide's table.

A part's state is checkpointed with the loop: JSON-able state (``state_dict`` /
``load_state_dict``) in the checkpoint's record, arrays (``arrays`` / ``load_arrays``) beside the
train state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from jaxrl_llm.config import ConfigError

__all__ = ["PHASES", "Need", "Clash", "LoopPart", "PhaseError", "Parts", "only_in", "validate", "conflict_table",
           "LOOP_PARTS", "loop_part"]

#: the loop's phases, in the order a step runs them
PHASES: tuple[str, ...] = (
    "select",       # choose the step's prompts among candidates
    "allocate",     # rollouts per prompt
    "sample",       # the policy that samples, and how (stale, asynchronous, tree)
    "score",        # rewards of a round
    "truncate",     # cut responses before training, scored again
    "resample",     # hints, replay: rows of a round replaced
    "shape",        # per-row score shaping (stateful shaping reads and writes its per-prompt state)
    "keep",         # which groups a round keeps (group filters)
    "assemble",     # the train batch and what the recipe requires
    "estimate",     # advantages
    "filter",       # a resample of the train batch
    "update",       # the optimiser steps
    "after_update",  # trackers and models updated from the step (SPO's tracker, the prompt value model)
    "observe",      # the step's outcome recorded (prompt statistics, the KL controller)
)


@dataclasses.dataclass(frozen=True)
class Need:
    """A capability a part requires, and the setting that provides it (the error message's end:
    ``"<part> needs <what>: <fix>"``)."""

    what: str
    fix: str


@dataclasses.dataclass(frozen=True)
class Clash:
    """A part key or capability a part cannot be combined with, and why."""

    other: str
    why: str


class PhaseError(RuntimeError):
    """A part used in a phase it did not declare."""


class LoopPart:
    """Base class of loop parts (see the module docstring). Subclasses set the class
    attributes and define one method per declared phase: ``def <phase>(self, ctx, value)``,
    returning the phase's value (what the next part in the phase receives)."""

    key: ClassVar[str] = ""
    phases: ClassVar[frozenset[str]] = frozenset()
    requires: ClassVar[tuple[Need, ...]] = ()
    provides: ClassVar[frozenset[str]] = frozenset()
    conflicts: ClassVar[tuple[Clash, ...]] = ()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.phases = frozenset(cls.phases)
        unknown = sorted(cls.phases - set(PHASES))
        if unknown:
            raise TypeError(f"{cls.__name__} declares unknown phases {unknown}; the phases are {', '.join(PHASES)}")
        undeclared = sorted(p for p in PHASES if p not in cls.phases and callable(getattr(cls, p, None)))
        if undeclared:
            raise TypeError(f"{cls.__name__} defines hook(s) {undeclared} for phases it does not declare "
                            f"(phases = {sorted(cls.phases)})")
        missing = sorted(p for p in cls.phases if not callable(getattr(cls, p, None)))
        if missing:
            raise TypeError(f"{cls.__name__} declares phases {missing} but defines no method for them")

    #: step inputs the part reads that the loop only keeps on request (``"rollout_logp"``: the
    #: sampler's log-probs kept beside recomputed ones)
    reads: ClassVar[frozenset[str]] = frozenset()
    #: the part's arrays' key in the checkpoint's train state (``"critic"``); "" without arrays
    array_key: ClassVar[str] = ""
    #: the trainer argument that carries the part's model (``"critic"``, ``"prompt_value"``): an
    #: object given for it without the part is refused
    model_arg: ClassVar[str] = ""
    #: the error when that model is given but the run has no use for it (``{recipe}``: the recipe)
    model_unused: ClassVar[str] = ""
    #: the part keeps per-prompt state in the prompt store (a checkpoint without the store cannot
    #: resume it)
    keeps_prompt_state: bool = False
    #: at most this many sampling rounds per step (a group filter's rounds); the loop runs the
    #: largest any part allows
    max_rounds: int = 1
    #: the part's update works with packed micro-batches (``train.max_tokens_per_microbatch``);
    #: False: the run refuses packing at config time
    packed_update: ClassVar[bool] = True

    #: the part's name within its key (``recipe.selector=<name>``); "" for a plain setting
    name: str = ""

    @classmethod
    def from_run(cls, run: Any) -> "LoopPart | None":
        """The part for a run's settings (:class:`~jaxrl_llm.training.parts.registry.LoopSettings`),
        or None when the run does not use it."""
        return None

    def attach(self, ctx: Any) -> None:
        """Called once by the trainer ``ctx`` when it is built (fetch the models it holds, check
        them, make state slots)."""

    def restored(self, ctx: Any) -> None:
        """Called after the trainer ``ctx`` restored a checkpoint (drop work in flight)."""

    @property
    def label(self) -> str:
        return f"{self.key}={self.name}" if self.name else self.key

    # state, checkpointed with the loop
    def state_dict(self) -> dict:
        """JSON-able state (the checkpoint's record)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"{self.label} keeps no state but the checkpoint holds {sorted(state)}")

    def arrays(self) -> Any:
        """Array state (beside the train state in the checkpoint), or None."""
        return None

    def load_arrays(self, arrays: Any) -> None:
        if arrays is not None:
            raise ValueError(f"{self.label} keeps no arrays but the checkpoint holds some")

    def metrics(self) -> dict[str, float]:
        """The part's metrics of the step (read after the step)."""
        return {}


class Parts:
    """The run's parts, validated, and the loop's way of calling them: ``parts(phase, ctx,
    value)`` passes ``value`` through every part that declared ``phase``, in order. ``ctx``
    (any object with a ``phase`` attribute) tells the services a part may use which phase runs,
    so a service of another phase can refuse (:func:`only_in`)."""

    def __init__(self, parts: Iterable[LoopPart], capabilities: Mapping[str, str] | None = None):
        self.parts = tuple(parts)
        validate(self.parts, capabilities or {})

    def __iter__(self):
        return iter(self.parts)

    def __len__(self) -> int:
        return len(self.parts)

    def get(self, key: str) -> LoopPart | None:
        return next((p for p in self.parts if p.key == key), None)

    def provider(self, capability: str) -> LoopPart | None:
        """The part that provides ``capability`` (None: no part does)."""
        return next((p for p in self.parts if capability in p.provides), None)

    @property
    def reads(self) -> frozenset[str]:
        return frozenset().union(*(p.reads for p in self.parts))

    @property
    def max_rounds(self) -> int:
        return max((p.max_rounds for p in self.parts), default=1)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in self.parts:
            out.update(p.metrics())
        return out

    def arrays(self) -> dict[str, Any]:
        """The parts' array state by :attr:`LoopPart.array_key` (the checkpoint's train state)."""
        return {p.array_key: p.arrays() for p in self.parts if p.array_key}

    def load_arrays(self, arrays: Mapping[str, Any]) -> None:
        for p in self.parts:
            if p.array_key:
                p.load_arrays(arrays[p.array_key])

    def in_phase(self, phase: str) -> tuple[LoopPart, ...]:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; the phases are {', '.join(PHASES)}")
        return tuple(p for p in self.parts if phase in p.phases)

    def __call__(self, phase: str, ctx: Any, value: Any = None) -> Any:
        for p in self.in_phase(phase):
            before = getattr(ctx, "phase", None), getattr(ctx, "part", None)
            ctx.phase, ctx.part = phase, p
            try:
                value = getattr(p, phase)(ctx, value)
            finally:
                ctx.phase, ctx.part = before
        return value

    def state_dict(self) -> dict:
        states = {p.key: p.state_dict() for p in self.parts}
        return {k: v for k, v in states.items() if v}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for p in self.parts:
            p.load_state_dict(state.get(p.key, {}))
        unknown = sorted(set(state) - {p.key for p in self.parts})
        if unknown:
            raise ValueError(f"the checkpoint holds the state of {unknown}, which this run does not have")


#: the loop parts, in the order they run within a phase (:func:`loop_part` adds one)
LOOP_PARTS: list[type[LoopPart]] = []


def loop_part(cls: type[LoopPart]) -> type[LoopPart]:
    """Register a loop part class (a decorator): the trainer builds it from the run's settings
    with :meth:`LoopPart.from_run`. A part registered under a key already taken replaces nothing:
    it is an error."""
    if not cls.key:
        raise TypeError(f"{cls.__name__} has no key (the config key that turns it on)")
    if any(c.key == cls.key and c.__qualname__ != cls.__qualname__ for c in LOOP_PARTS):
        raise ValueError(f"loop part key {cls.key!r} is registered twice")
    LOOP_PARTS[:] = [c for c in LOOP_PARTS if c.key != cls.key] + [cls]
    return cls


def only_in(ctx: Any, service: str, *phases: str) -> None:
    """Raise :class:`PhaseError` unless ``ctx`` is running one of ``phases`` (a service of the
    loop that a part may only use there)."""
    phase = getattr(ctx, "phase", None)
    if phase not in phases:
        part = getattr(ctx, "part", None)
        who = part.label if part is not None else "the loop"
        raise PhaseError(f"{who} used {service} in phase {phase!r}; it belongs to phase(s) {', '.join(phases)}")


def validate(parts: Iterable[LoopPart], capabilities: Mapping[str, str]) -> None:
    """Check ``parts`` against each other and the run's ``capabilities`` (name -> the setting
    that gives it, for messages). One-line :class:`ConfigError` on the first problem: a key
    used twice, a missing capability, a conflict."""
    parts = tuple(parts)
    by_key: dict[str, LoopPart] = {}
    for p in parts:
        if p.key in by_key:
            raise ConfigError(f"{p.key} is set twice ({by_key[p.key].label} and {p.label})")
        by_key[p.key] = p
    provided: dict[str, str] = dict(capabilities)
    for p in parts:
        for c in p.provides:
            provided.setdefault(c, p.label)
    for p in parts:
        for need in p.requires:
            if need.what not in provided:
                raise ConfigError(f"{p.label} needs {need.what}: {need.fix}")
        for clash in p.conflicts:
            other = by_key.get(clash.other)
            if other is not None and other is not p:
                raise ConfigError(f"{p.label} cannot be combined with {other.label}: {clash.why}")
            if other is None and clash.other in provided:
                raise ConfigError(f"{p.label} cannot be combined with {provided[clash.other]}: {clash.why}")


def conflict_table(classes: Iterable[type[LoopPart]]) -> str:
    """The declarations of ``classes`` as a Markdown table (key, phases, requires, provides,
    cannot be combined with), for the guide."""
    rows = ["| part | phases | requires | provides | cannot be combined with |", "|---|---|---|---|---|"]
    for cls in classes:
        phases = ", ".join(p for p in PHASES if p in cls.phases) or "-"
        req = "; ".join(f"{n.what}: {n.fix}" for n in cls.requires) or "-"
        prov = ", ".join(sorted(cls.provides)) or "-"
        clash = "; ".join(f"`{c.other}`: {c.why}" for c in cls.conflicts) or "-"
        rows.append(f"| `{cls.key}` | {phases} | {req} | {prov} | {clash} |")
    return "\n".join(rows)

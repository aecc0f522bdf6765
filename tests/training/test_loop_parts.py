"""The loop-part protocol: declarations checked at class definition, parts called only in the
phases they declare, services refused outside their phase, validation from declarations."""

import types

import pytest

from jaxrl_llm.config import ConfigError
from jaxrl_llm.training.parts import (PHASES, Clash, LoopPart, Need, PhaseError, Parts, conflict_table, only_in,
                                      validate)


class Counter(LoopPart):
    key = "recipe.counter"
    phases = {"score", "observe"}
    provides = frozenset({"counted"})

    def __init__(self):
        self.seen = 0

    def score(self, ctx, value):
        return value + 1

    def observe(self, ctx, value):
        self.seen += 1
        return value

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.seen = state["seen"]


class Sampler(LoopPart):
    key = "rollout.special"
    phases = {"sample"}
    requires = (Need("old_logp=recompute", "set recipe.old_logp=recompute"),)
    conflicts = (Clash("recipe.counter", "it counts rows the sampler replaces"),)

    def sample(self, ctx, value):
        only_in(ctx, "the sampler", "sample", "resample")
        return value


def test_a_hook_for_an_undeclared_phase_fails_when_the_class_is_defined():
    with pytest.raises(TypeError, match=r"defines hook\(s\) \['observe'\] for phases it does not declare"):
        class Bad(LoopPart):  # noqa: F841
            key = "x"
            phases = {"score"}

            def score(self, ctx, v):
                return v

            def observe(self, ctx, v):
                return v
    with pytest.raises(TypeError, match="declares unknown phases"):
        class Bad2(LoopPart):  # noqa: F841
            phases = {"scoring"}
    with pytest.raises(TypeError, match=r"declares phases \['select'\] but defines no method"):
        class Bad3(LoopPart):  # noqa: F841
            phases = {"select"}


def test_parts_run_only_in_their_phases_and_services_refuse_other_phases():
    c = Counter()
    parts = Parts([c])
    ctx = types.SimpleNamespace(phase=None, part=None)
    assert parts("score", ctx, 1) == 2
    assert parts("sample", ctx, 1) == 1 and c.seen == 0  # not declared: not called
    parts("observe", ctx)
    assert c.seen == 1 and ctx.phase is None
    assert [p.key for p in parts.in_phase("observe")] == ["recipe.counter"]
    with pytest.raises(ValueError, match="unknown phase"):
        parts.in_phase("scoring")
    # a part that reaches for a service of another phase is refused, naming itself
    s = Sampler()
    ctx.phase, ctx.part = "update", s
    with pytest.raises(PhaseError, match=r"rollout.special used the sampler in phase 'update'"):
        s.sample(ctx, 0)
    ctx.phase = "sample"
    assert s.sample(ctx, 5) == 5


def test_validation_from_declarations_is_one_line():
    with pytest.raises(ConfigError, match=r"^rollout.special needs old_logp=recompute: set recipe.old_logp=recompute$"):
        validate([Sampler()], {})
    validate([Sampler()], {"old_logp=recompute": "recipe.old_logp=recompute"})
    with pytest.raises(ConfigError, match=r"^rollout.special cannot be combined with recipe.counter: it counts rows"):
        validate([Counter(), Sampler()], {"old_logp=recompute": "recipe.old_logp=recompute"})

    class NeedsCount(LoopPart):
        key = "recipe.needs"
        requires = (Need("counted", "set recipe.counter"),)
        conflicts = (Clash("one_process", "it runs on one host only"),)

    validate([Counter(), NeedsCount()], {})  # provided by another part
    with pytest.raises(ConfigError, match=r"cannot be combined with mesh over 2 processes: it runs on one host only"):
        validate([Counter(), NeedsCount()], {"one_process": "mesh over 2 processes"})
    with pytest.raises(ConfigError, match="recipe.counter is set twice"):
        validate([Counter(), Counter()], {})


def test_state_round_trip_and_the_table():
    a, b = Counter(), Counter()
    a.seen = 3
    Parts([b]).load_state_dict(Parts([a]).state_dict())
    assert b.seen == 3
    with pytest.raises(ValueError, match=r"holds the state of \['recipe.gone'\]"):
        Parts([b]).load_state_dict({"recipe.counter": {"seen": 1}, "recipe.gone": {"x": 1}})
    table = conflict_table([Counter, Sampler])
    assert "| `rollout.special` | sample | old_logp=recompute (set recipe.old_logp=recompute) | - | " \
           "`recipe.counter`: it counts rows the sampler replaces |" in table
    assert table.count("\n") == 3 and set(PHASES) >= Counter.phases

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
    assert "| `rollout.special` | sample | old_logp=recompute: set recipe.old_logp=recompute | - | " \
           "`recipe.counter`: it counts rows the sampler replaces |" in table
    assert table.count("\n") == 3 and set(PHASES) >= Counter.phases


def _bare(cls):
    """An instance of a registered part class for validation only (its declarations)."""
    p = object.__new__(cls)
    p.name = "x"
    return p


def test_every_declared_need_and_conflict_of_the_registered_parts_is_refused_in_one_line():
    """Generated from the declarations: for each registered part, each need left unmet and each
    conflict present gives one line naming both keys and the reason."""
    from jaxrl_llm.training.parts.registry import part_classes

    classes = part_classes()
    by_key = {c.key: c for c in classes}
    checked = 0
    for cls in classes:
        for need in cls.requires:
            with pytest.raises(ConfigError) as e:
                validate([_bare(cls)], {n.what: "given" for n in cls.requires if n is not need})
            msg = str(e.value)
            assert "\n" not in msg and msg.startswith(_bare(cls).label) and need.fix in msg
            checked += 1
        full = {n.what: "given" for n in cls.requires}
        validate([_bare(cls)], full)  # every need met, no other part: accepted
        for clash in cls.conflicts:
            other = by_key.get(clash.other)
            parts, caps = [_bare(cls)], dict(full)
            if other is not None:
                parts.append(_bare(other))
                caps.update({n.what: "given" for n in other.requires})
            else:  # a capability of the run (an agent run's episodes)
                caps[clash.other] = "an agent run"
            with pytest.raises(ConfigError) as e:
                validate(parts, caps)
            msg = str(e.value)
            assert "\n" not in msg and clash.why in msg and "cannot be combined with" in msg
            checked += 1
    assert checked >= 30


def test_the_guide_holds_the_generated_table():
    from pathlib import Path

    from jaxrl_llm.training.parts.table import table, with_table

    guide = (Path(__file__).parents[2] / "docs" / "guide.md").read_text()
    assert with_table(guide) == guide, "run: python -m jaxrl_llm.training.parts.table --write"
    assert "| `rollout.asynchronous` | sample, update, after_update |" in table()


def test_a_part_using_the_sampler_outside_its_phases_fails_in_a_real_step():
    """A registered part whose observe hook reaches for the sampler: the step stops with a
    PhaseError naming the part; one that only declares observe is never called elsewhere."""
    from jaxrl_llm.algorithms.registry import Part
    from jaxrl_llm.training.parts import LOOP_PARTS, loop_part
    from jaxrl_llm.training.parts.options import LOOP_PART_OPTIONS
    from test_rl_recipes_extra import make

    calls = []

    @loop_part
    class Peek(LoopPart):
        key = "recipe.loop_part=peek"
        phases = {"observe"}

        def __init__(self, sample=False):
            self.name, self.sample_it = "", sample

        @classmethod
        def from_run(cls, run):
            b = run.recipe.loop_part
            return b() if b is not None and b.part.fn is cls else None

        def observe(self, ctx, step):
            calls.append(ctx.phase)
            if self.sample_it:
                ctx.sample(ctx.state.params, step.prompt_ids, ctx.rollout_key(0))
            return step

    LOOP_PART_OPTIONS.register(Part("peek", Peek))
    try:
        tr = make("grpo", g=4, loop_part="peek")
        tr.step()
        assert calls == ["observe"]
        tr = make("grpo", g=4, loop_part={"name": "peek", "sample": True})
        with pytest.raises(PhaseError, match=r"recipe.loop_part=peek used the sampler in phase 'observe'; it belongs "
                                             r"to phase\(s\) sample, allocate, resample"):
            tr.step()
    finally:
        LOOP_PARTS.remove(Peek)
        del LOOP_PART_OPTIONS._parts["peek"]


def test_a_model_given_to_a_run_without_its_part_is_refused():
    from jaxrl_llm.training import recipe
    from jaxrl_llm.training.parts.registry import LoopSettings, build_parts

    rec = recipe("grpo", num_samples=4)
    with pytest.raises(ConfigError, match=r"^critic given but recipe 'grpo' \(estimator 'grpo'\) uses no critic$"):
        build_parts(LoopSettings(rec, critic=object()))
    with pytest.raises(ConfigError, match="prompt_value given but the recipe's selector reads no prompt value model"):
        build_parts(LoopSettings(rec, prompt_value=object()))
    with pytest.raises(ConfigError, match=r"^recipe\.critic needs|^recipe 'ppo' estimates advantages from a critic"):
        build_parts(LoopSettings(recipe("ppo", num_samples=4)))
    build_parts(LoopSettings(recipe("ppo", num_samples=4), models=False))  # config time: models not built yet

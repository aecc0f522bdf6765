"""``recipe.loop_part``: loop parts turned on by name, a registry like the estimators'. An entry
is a :class:`~jaxrl_llm.algorithms.registry.Part` whose ``fn`` is the
:class:`~jaxrl_llm.training.parts.LoopPart` class; its keyword arguments are the part's
(``recipe.loop_part.<arg>=...``), checked against the class's constructor when the recipe is
built. ``jaxrl-llm methods`` lists the entries with their papers."""

from __future__ import annotations

from jaxrl_llm.algorithms.registry import Part, Registry, new_registry
from jaxrl_llm.training.parts.base import LoopPart

__all__ = ["LOOP_PART_OPTIONS", "loop_part_options", "NamedLoopPart"]

LOOP_PART_OPTIONS = new_registry("loop part", "recipe.loop_part",
                                 "a LoopPart class (jaxrl_llm.training.parts) whose constructor takes the arguments")


def _none() -> None:
    return None


LOOP_PART_OPTIONS.register(Part("none", _none, note="no further loop part"))


class NamedLoopPart(LoopPart):
    """Base of the parts turned on by ``recipe.loop_part=<name>``: the run builds one when its
    recipe's bound loop part is this class (with the bound arguments); its label is its key
    (``recipe.loop_part=<name>``); :meth:`metrics` returns ``self._metrics``, which the hooks fill."""

    _metrics: dict[str, float] = {}

    @property
    def label(self) -> str:
        return self.key

    @classmethod
    def from_run(cls, run):
        bound = run.recipe.loop_part
        return bound() if bound is not None and bound.part.fn is cls else None

    def metrics(self):
        return dict(self._metrics)


def loop_part_options() -> Registry:
    """The registry, with the built-in parts' entries registered."""
    import jaxrl_llm.training.parts  # noqa: F401  (its modules register their entries)

    return LOOP_PART_OPTIONS

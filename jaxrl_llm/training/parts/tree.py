"""``rollout.tree_segment``: TreePO's tree sampler, each prompt's responses one tree of shared
segments (:class:`~jaxrl_llm.rollout.TreeSampler`)."""

from __future__ import annotations

from jaxrl_llm.training.parts.base import Clash, LoopPart, loop_part

__all__ = ["TreeSampling"]

_WHY = "they replace or re-divide a prompt's responses, which the tree samples together"


@loop_part
class TreeSampling(LoopPart):
    """Counts the tokens the tree decoded against its responses' tokens (``tree/*``) and puts each
    response's segment nodes (``tree_paths``) into the train arrays."""

    key = "rollout.tree_segment"
    phases = frozenset({"score", "assemble"})
    conflicts = (Clash("recipe.hints", _WHY), Clash("recipe.replay", _WHY), Clash("recipe.allocator", _WHY),
                 Clash("rollout.sampler_dtype", "the segment-tree sampler decodes with the model's own weights"),
                 Clash("episodes", "the agent loop samples episodes, not trees"))

    def __init__(self, segment):
        self.name = str(segment)
        self._stats: dict[str, float] = {}

    @classmethod
    def from_run(cls, run):
        return None if run.tree is None else cls(run.tree)

    def score(self, ctx, rnd):
        if rnd.index == 0:
            self._stats = {}
        if not rnd.ahead:
            for k, v in getattr(ctx.sampler, "last_stats", {}).items():
                self._stats[k] = self._stats.get(k, 0.0) + v
        return rnd

    def assemble(self, ctx, step):
        step.arrays["tree_paths"] = step.cat(lambda x: x.t_roll.paths)
        return step

    def metrics(self):
        sm = dict(self._stats)
        if "tree/leaf_tokens" in sm:
            sm["tree/saved_frac"] = 1.0 - sm["tree/decoded_tokens"] / max(sm["tree/leaf_tokens"], 1.0)
        return sm

"""``train.shared_prefix`` (Prefix Grouper): the update encodes each prompt group's prompt once;
its mini-batches hold whole groups in blocks of one prompt's rows."""

from __future__ import annotations

from jaxrl_llm.training.parts.base import Clash, LoopPart, loop_part
from jaxrl_llm.training.prefix import check_blocks, microbatch_order

__all__ = ["SharedPrefix"]

_WHY = "the shared-prefix update needs every prompt group's rows to share one prompt and one size"


@loop_part
class SharedPrefix(LoopPart):
    key = "train.shared_prefix"
    phases = frozenset({"update"})
    conflicts = (Clash("recipe.allocator", _WHY), Clash("recipe.batch_filter", _WHY), Clash("recipe.hints", _WHY),
                 Clash("episodes", "an episode's rows share only its first prompt; agent runs train row by row"))

    def __init__(self, plan):
        self.plan, self.name = plan, "true"

    @classmethod
    def from_run(cls, run):
        plan = run.shared_prefix
        want = getattr(plan, "rows_per_prompt", 0) if plan else 0
        if run.models and run.recipe.objective.rows_per_prompt != want:
            raise ValueError(f"the objective encodes prompts in blocks of rows_per_prompt="
                             f"{run.recipe.objective.rows_per_prompt} rows but shared_prefix={plan} gives {want}: "
                             f"build both from one plan (jaxrl_llm.training.prefix.plan_shared_prefix)")
        return cls(plan) if plan else None

    def update(self, ctx, plan):
        a = plan.arrays
        a["prefix_mask"] = a["mask"][:, :plan.prompt_len]  # the prompt's mask (its width is the prompt length)
        plan.whole_groups = True
        plan.keys.add("group_ids")
        prefix, prompt_len = self.plan, plan.prompt_len

        def order(mb):
            """Whole groups (group-contiguous) in the row order of the shared-prefix train step, checked:
            every block of its micro-batches has one prompt."""
            idx = microbatch_order(len(mb["tokens"]), prefix)
            mb = {k: v[idx] for k, v in mb.items()}
            why = check_blocks(mb["tokens"], mb["mask"], prompt_len, prefix.rows_per_prompt, prefix.num_microbatches)
            if why:
                raise RuntimeError(f"train.shared_prefix: {why} (the rows of a prompt group must share its prompt); "
                                   f"run with train.shared_prefix=false")
            return mb
        plan.order.append(order)
        return plan

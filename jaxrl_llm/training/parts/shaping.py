"""``recipe.shaping``: per-row score shaping added to the reward total
(:data:`jaxrl_llm.algorithms.SHAPING`); a stateful part keeps per-prompt state in the prompt
store's slot ``shaping/<name>``."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxrl_llm.algorithms.sampling import ShapingInputs
from jaxrl_llm.training.parts.base import Clash, LoopPart, loop_part
from jaxrl_llm.training.rounds import completion_ids, decode_completions

__all__ = ["Shaping", "ShapeJob"]


@dataclasses.dataclass
class ShapeJob:
    """Scores being shaped: the shape phase's value. ``update=False``: stateful parts read their
    state as it was when the step began and keep it (a baseline's completions)."""

    scores: np.ndarray
    out: Any
    roll: Any
    prompts: tuple
    keys: tuple
    update: bool = True


def _slot(name: str) -> str:
    return f"shaping/{name}"


@loop_part
class Shaping(LoopPart):
    key = "recipe.shaping"
    phases = frozenset({"sample", "shape", "observe"})
    conflicts = (Clash("episodes", "reward shaping acts on single-turn completions; the agent loop does not run it "
                                   "(set recipe.shaping=[])"),)

    def __init__(self, bounds: tuple):
        self.bounds = tuple(bounds)
        self.name = ",".join(b.name for b in self.bounds)
        self.stateful = [b.name for b in self.bounds if b.part.flag("stateful")]
        self.keeps_prompt_state = bool(self.stateful)
        self.at_step: dict[str, Any] = {}

    @classmethod
    def from_run(cls, run):
        return cls(run.recipe.shaping) if run.recipe.shaping else None

    def attach(self, ctx):
        for name in self.stateful:
            ctx.store.slot(_slot(name))
        names = [s.name for s in getattr(ctx.rewards, "specs", ())]
        for sh in self.bounds:  # a bad shaping argument fails here, not after the first rollout
            sh(ShapingInputs(np.zeros(1, np.float32), np.ones(1, np.int32), np.zeros(1, np.int32), 1,
                             ctx.sampler.config.max_new_tokens, {n: np.zeros(1, np.float32) for n in names},
                             ("",) if sh.part.flag("needs_text") else (), ("",), 0,
                             {} if sh.part.flag("stateful") else None, ("",),
                             (np.zeros(1, np.int32),) if sh.part.flag("needs_ids") else ()))

    def sample(self, ctx, rnd):
        if rnd.index == 0:  # the stateful parts' state as the step begins
            self.at_step = {n: dict(ctx.store.slot(_slot(n))) for n in self.stateful}
        return rnd

    def shape(self, ctx, job: ShapeJob) -> ShapeJob:
        decoded: dict[bool, tuple[str, ...]] = {}
        roll, out = job.roll, job.out

        def texts(flag) -> tuple[str, ...]:  # needs_text=True: plain text; "raw": special tokens kept
            if not flag:
                return ()
            skip = flag != "raw"
            if skip not in decoded:
                decoded[skip] = decode_completions(roll, ctx.tokenizer, skip_special_tokens=skip)
            return decoded[skip]
        scores = job.scores
        for sh in self.bounds:
            stateful = bool(sh.part.flag("stateful"))
            state = None
            if stateful:
                state = ctx.store.slot(_slot(sh.name)) if job.update else self.at_step[sh.name]
            ids = completion_ids(roll) if sh.part.flag("needs_ids") else ()
            x = ShapingInputs(scores, np.asarray(roll.lengths), np.asarray(roll.prompt_index), len(job.prompts),
                              ctx.sampler.config.max_new_tokens, out.per_fn, texts(sh.part.flag("needs_text")),
                              tuple(job.prompts), ctx.iteration, state, tuple(job.keys), ids)
            bonus = sh(x)
            if stateful:
                bonus, new = bonus
                if job.update:
                    ctx.store.slots[_slot(sh.name)] = dict(new)
            scores = (scores + np.asarray(bonus)).astype(np.float32)
        job.scores = scores
        return job

    def observe(self, ctx, step):
        step.metrics["rewards/shaped/mean"] = float(np.concatenate([x.scores for x in ctx.current.rounds]).mean())
        return step

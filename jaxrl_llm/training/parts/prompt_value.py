"""PCL's prompt value model: a score-head model of each prompt's pass rate at its last token,
read by a selector that scores candidates (``recipe.selector=pcl``), fitted after every step
and checkpointed as ``prompt_value``."""

from __future__ import annotations

import jax
import numpy as np

from jaxrl_llm.config import ConfigError
from jaxrl_llm.parallel.multihost import gather
from jaxrl_llm.training.parts.base import LoopPart, loop_part
from jaxrl_llm.training.rounds import last_scores

__all__ = ["PromptValue"]


@loop_part
class PromptValue(LoopPart):
    key = "model.prompt_value"
    phases = frozenset({"after_update"})
    provides = frozenset({"prompt_value"})
    array_key = "prompt_value"
    model_arg = "prompt_value"
    model_unused = "prompt_value given but the recipe's selector reads no prompt value model"

    def __init__(self, model, selector_name: str):
        self.model, self.name = model, f"for recipe.selector={selector_name}"
        self.ctx = None

    @property
    def label(self) -> str:
        return f"the prompt value model ({self.name})"

    @classmethod
    def from_run(cls, run):
        sel = run.recipe.selector
        if sel is None or "prompt_value" not in sel.part.requires:
            return None
        if run.models and run.prompt_value is None:
            raise ConfigError(f"recipe.selector={sel.name} scores candidates with a prompt value model: pass "
                              f"prompt_value=Critic.create(...) (a score-head model; objective ValueObjective(None))")
        return cls(run.prompt_value, sel.name)

    def attach(self, ctx):
        self.ctx = ctx

    def predict(self, prompt_ids) -> np.ndarray:
        """The model's score at the last token of each prompt."""
        pv = self.model
        tokens, mask = self.ctx.prompt_tokens(prompt_ids)
        return np.asarray(gather(last_scores(pv.graphdef, pv.state.params, pv.frozen, tokens, mask)), np.float64)

    def after_update(self, ctx, step):
        """One step of the model on this step's trained prompts, towards each one's mean reward
        total (before shaping) over its valid rows."""
        gid, valid = np.asarray(step.arrays["group_ids"]), np.asarray(step.valid)
        totals = np.asarray(step.totals, np.float64)
        g = len(step.prompt_ids)
        has = np.array([((gid == k) & valid).any() for k in range(g)])
        target = np.array([totals[(gid == k) & valid].mean() if has[k] else 0.0 for k in range(g)], np.float32)
        before = self.predict(step.prompt_ids)
        tokens, mask = ctx.prompt_tokens(step.prompt_ids, extra=1)
        width = tokens.shape[1] - 1  # the target-aligned columns; the last prompt token is column width - 1
        lm = np.zeros((g, width), bool)
        lm[:, width - 1] = has
        ret = np.zeros((g, width), np.float32)
        ret[:, width - 1] = target
        batch = {"tokens": tokens, "mask": mask, "loss_mask": lm, "old_values": np.zeros_like(ret), "returns": ret}
        pv = self.model
        pv.state, m = pv.train_step(pv.state, batch, *pv.frozen)
        m = jax.device_get(m)
        step.metrics.update({"pcl/value_loss": float(m["vf_loss"]),
                             "pcl/abs_error": float(np.abs(before - target)[has].mean()) if has.any() else 0.0})
        return step

    def arrays(self):
        return self.model.state

    def load_arrays(self, arrays):
        self.model.state = arrays

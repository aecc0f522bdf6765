"""R²VPO's dual variable (``recipe.loss=r2vpo``, METHODS.md #26) as a loop part.

The loss (:func:`jaxrl_llm.core.r2vpo_loss`) penalises ``lambda (Var(rho) - delta)``; ``lambda`` is
the Lagrange multiplier of the constraint ``Var(rho) <= delta`` and moves by projected dual
ascent between steps. This part holds it:

- **assemble**: the batch column ``r2vpo_lambda [N]`` (every row the current value), so the
  compiled step reads it as data and a new value never recompiles;
- **observe**: ``lambda <- max(0, lambda + lambda_lr (Var - delta))`` with ``Var`` the mean of the
  step's optimiser steps' measured ratio variances (``policy/r2vpo_ratio_var``), logged as
  ``r2vpo/lambda``.

``lambda`` is checkpointed with the loop (a resumed run continues with the same value).
"""

from __future__ import annotations

import numpy as np

from jaxrl_llm.training.parts.base import LoopPart, loop_part

__all__ = ["RatioVarianceDual"]


@loop_part
class RatioVarianceDual(LoopPart):
    key = "recipe.loss=r2vpo"
    phases = frozenset({"assemble", "observe"})

    def __init__(self, *, delta: float, lambda_init: float = 1.0, lambda_lr: float = 1.0):
        self.delta, self.lr = float(delta), float(lambda_lr)
        self.lam = float(lambda_init)
        self.name = ""

    @classmethod
    def from_run(cls, run):
        from jaxrl_llm.core import r2vpo_loss

        obj = run.recipe.objective
        if obj.policy_loss is not r2vpo_loss:
            return None
        kw = dict(obj.policy_kwargs)
        return cls(**{k: kw[k] for k in ("delta", "lambda_init", "lambda_lr") if k in kw})

    def assemble(self, ctx, step):
        step.arrays["r2vpo_lambda"] = np.full((step.arrays["tokens"].shape[0],), self.lam, np.float32)
        return step

    def observe(self, ctx, step):
        from jaxrl_llm.core import r2vpo_dual_step

        ms = [m["policy/r2vpo_ratio_var"] for m in ctx.current.policy_metrics if "policy/r2vpo_ratio_var" in m]
        if ms:
            self.lam = r2vpo_dual_step(self.lam, float(np.mean(ms)), delta=self.delta, lambda_lr=self.lr)
        step.metrics["r2vpo/lambda"] = self.lam
        return step

    def state_dict(self) -> dict:
        return {"lambda": self.lam}

    def load_state_dict(self, state) -> None:
        if "lambda" in state:
            self.lam = float(state["lambda"])

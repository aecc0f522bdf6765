"""EPO's entropy history (``recipe.loss=epo``, METHODS.md #203) as a loop part.

EPO keeps, for every turn index ``k`` of an episode, the mean over the run's steps of the
batch's mean token entropy at turn ``k`` (the sampling policy's, measured at rollout), and
penalises tokens whose entropy leaves a band around their turn's history
(:func:`jaxrl_llm.core.epo_loss`). This part:

- **estimate** (after the providers, so the sampling policy's ``old_entropy`` is there): adds this
  step's per-turn mean entropies to the history (the authors' code records them at rollout, so
  the current step counts), then writes the batch columns ``epo_entropy_ref`` (each response
  token: its turn's historical mean) and ``epo_phase_weight`` (every row: the phase weight of
  this step, 1 without ``phase_steps``);
- keeps the history's sums and counts in the checkpoint (a resumed run continues it).

Single-turn runs have one turn (index 0); agent runs take each token's turn from the episode
batch (``turn_ids``).
"""

from __future__ import annotations

import numpy as np

from jaxrl_llm.training.parts.base import LoopPart, loop_part

__all__ = ["EntropyHistory"]


@loop_part
class EntropyHistory(LoopPart):
    key = "recipe.loss=epo"
    phases = frozenset({"estimate"})

    def __init__(self, *, phase_steps: int | None = None):
        if phase_steps is not None and not (isinstance(phase_steps, int) and phase_steps >= 2):
            raise ValueError(f"recipe.loss.phase_steps must be an int >= 2 or unset, got {phase_steps!r}")
        self.phase_steps = phase_steps
        self.sums: list[float] = []
        self.counts: list[int] = []
        self.name = ""

    @classmethod
    def from_run(cls, run):
        from jaxrl_llm.algorithms.losses import epo_surrogate

        obj = run.recipe.objective
        if obj.policy_loss is not epo_surrogate:
            return None
        return cls(phase_steps=dict(obj.policy_kwargs).get("phase_steps"))

    def _turns(self, step) -> np.ndarray:
        """``[N, L - 1]`` the turn index of each target position (-1 outside the responses)."""
        lm = np.asarray(step.arrays["loss_mask"], bool)
        turns = np.full(lm.shape, -1, np.int64)
        tid = step.extra.get("turn_ids") if step.extra else None
        c0 = step.prompt_len - 1
        if tid is None:
            turns[lm] = 0
        else:
            tid = np.asarray(tid)
            turns[:, c0:c0 + tid.shape[1]] = tid
            turns[~lm] = -1
        return turns

    def estimate(self, ctx, step):
        from jaxrl_llm.core import epo_phase_weight

        ent = np.asarray(step.arrays["old_entropy"], np.float64)
        turns = self._turns(step)
        k = int(turns.max()) + 1 if (turns >= 0).any() else 0
        while len(self.sums) < k:
            self.sums.append(0.0)
            self.counts.append(0)
        for j in range(k):
            at = turns == j
            if at.any():  # this step's batch mean at turn j joins the history
                self.sums[j] += float(ent[at].mean())
                self.counts[j] += 1
        hist = np.array([s / c if c else 0.0 for s, c in zip(self.sums, self.counts)] or [0.0])
        ref = np.where(turns >= 0, hist[np.clip(turns, 0, len(hist) - 1)], 0.0).astype(np.float32)
        step.arrays["epo_entropy_ref"] = ref
        w = 1.0 if self.phase_steps is None else epo_phase_weight(ctx.iteration, self.phase_steps)
        step.arrays["epo_phase_weight"] = np.full((ref.shape[0],), w, np.float32)
        step.metrics["epo/entropy_history_turn0"] = float(hist[0])
        step.metrics["epo/phase_weight"] = w
        return step

    def state_dict(self) -> dict:
        return {"sums": list(self.sums), "counts": list(self.counts)}

    def load_state_dict(self, state) -> None:
        if state:
            self.sums = [float(x) for x in state["sums"]]
            self.counts = [int(x) for x in state["counts"]]

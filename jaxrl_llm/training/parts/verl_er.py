"""VERL, effective-rank advantage shaping (METHODS.md #166), as a loop part:
``recipe.loop_part=verl_er``.

VERL ("Beyond the Exploration-Exploitation Trade-off: A Hidden State Approach for LLM Reasoning",
arXiv:2509.23808) reads the diversity of a response's hidden states as its effective rank and adds
a bonus for responses whose rank, velocity or acceleration is above the run's recent average to the
advantage, capped so that it never outweighs the outcome. The authors' code (hf618/VERL @3de68f1)
does, every step (after the first):

1. per response: the effective rank ``ER`` of its final-norm hidden states, its velocity ``ERV``
   and acceleration ``ERA`` over growing prefixes (stride 40, the last 512 tokens)
   (:func:`jaxrl_llm.core.effective_rank_dynamics`);
2. the relative deviation of each from a baseline ``b``, and the bonus ``tau tanh(rel_ER) +
   (1 - tau) tanh(rel_ERV)`` with ``tau = sigmoid(2 rel_ERA)`` (:func:`jaxrl_llm.core.effective_rank_bonus`);
3. ``A = A + min(relu(bonus), |A| / kappa)`` (``kappa`` 2) on the response's last token
   (:func:`jaxrl_llm.core.capped_bonus_advantages`);
4. then the baseline moves: ``b <- (1 - ema) b + ema m`` with ``m`` the previous step's batch means
   of ``(ERA, ERV, ER)`` (``ema`` 0.3; ``b`` starts at 0, so the first bonus, at step 2, compares with
   0). At step 1 there is no bonus.

This part does exactly that in the **estimate** phase, after the recipe's estimator (GRPO in the
paper): it runs the policy before the update (the sampling policy when on-policy) on the batch for
the hidden states of the response tokens (the state whose next-token distribution sampled each
token; the code's patched vLLM saves the same), computes the statistics on the device one row at a
time, and shapes the advantages of the rows that take part. The baseline and the previous means are
checkpointed (a resume is exact). Decisions: the released script passes ``--add_reward False``,
under which the code's signal is zero and the shaping a no-op; this part computes the signal, as
the paper describes. Not reproduced: the signal also added to the reward (the code's
``add_reward``), the performance-scaled weight (``aux_fix=False``), the ``FixOne`` / ``FixTwo``
ablations, the bfloat16 rounding of the code's ranks and rewards.
Metrics: ``verl_er/er``, ``verl_er/erv``, ``verl_er/era`` (batch means), ``verl_er/bonus`` (mean
signal), ``verl_er/shaped`` (rows whose advantage moved), ``verl_er/baseline_er``.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.algorithms.registry import Part
from jaxrl_llm.config import ConfigError
from jaxrl_llm.core.representation import capped_bonus_advantages, effective_rank_bonus, effective_rank_dynamics
from jaxrl_llm.parallel.multihost import gather
from jaxrl_llm.training.parts.base import Clash, loop_part
from jaxrl_llm.training.parts.options import LOOP_PART_OPTIONS, NamedLoopPart

__all__ = ["VerlEffectiveRank", "response_rank_stats"]


@partial(jax.jit, static_argnums=(0, 1, 2, 3))
def response_rank_stats(graphdef, c0, stride, max_len, params, others, tokens, mask, completion_mask, routes=None):
    """``[N, 3]`` ``(ER, ERV, ERA)`` of each row's response hidden states under the policy
    (``completion_mask [N, T]``: the response tokens, completion token ``t`` at target column
    ``c0 + t``, sampled from the hidden state at position ``c0 + t``)."""
    from flax import nnx

    model = nnx.merge(graphdef, params, *others)
    kw = {} if routes is None else {"routes": routes}
    hidden, _ = model(tokens, mask, **kw)
    h = jax.lax.stop_gradient(hidden[:, c0:c0 + completion_mask.shape[1]])
    er, erv, era = effective_rank_dynamics(h, completion_mask, stride=stride, max_len=max_len)
    return jnp.stack([er, erv, era], -1)


def _number(name: str, v, *, low: float, strict: bool = True) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (v > low if strict else v >= low)
    if not ok:
        raise ConfigError(f"recipe.loop_part.{name} must be a number {'>' if strict else '>='} {low}, got {v!r}")
    return float(v)


@loop_part
class VerlEffectiveRank(NamedLoopPart):
    key = "recipe.loop_part=verl_er"
    phases = frozenset({"estimate"})
    conflicts = (Clash("episodes", "it reads single-turn responses' hidden states; the agent loop does not run it"),)

    def __init__(self, *, stride: int = 40, max_len: int = 512, gain: float = 2.0, weight: float = 1.0,
                 ema: float = 0.3, kappa: float = 2.0, at: str = "last"):
        for name, v, low in (("stride", stride, 1), ("max_len", max_len, 2)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"recipe.loop_part.{name} must be an int >= {low}, got {v!r}")
        self.gain = _number("gain", gain, low=0.0, strict=False)
        self.weight = _number("weight", weight, low=0.0, strict=False)
        self.kappa = _number("kappa", kappa, low=0.0)
        self.ema = _number("ema", ema, low=0.0)
        if self.ema > 1:
            raise ConfigError(f"recipe.loop_part.ema must be in (0, 1], got {ema!r}")
        if at not in ("last", "all"):
            raise ConfigError(f"recipe.loop_part.at must be 'last' (the code: the response's last token) or 'all' "
                              f"(every response token), got {at!r}")
        self.stride, self.max_len, self.at = stride, max_len, at
        self.name = "verl_er"
        self.baseline = [0.0, 0.0, 0.0]  # (ERA, ERV, ER): the code's mids, starting at 0
        self.previous: list[float] | None = None  # the previous step's batch means (the code's metrics_old)
        self._metrics: dict[str, float] = {}

    def estimate(self, ctx, step):
        a = step.arrays
        c0 = step.prompt_len - 1
        cm = np.asarray(step.completion_mask, bool)
        routes = a.get("routes") if ctx.recipe.objective.routing_replay else None
        stats = np.asarray(gather(response_rank_stats(ctx.graphdef, c0, self.stride, self.max_len, ctx.state.params,
                                                      ctx.frozen, a["tokens"], a["mask"], cm, routes)), np.float64)
        adv = np.asarray(a["advantages"], np.float32)
        new, self._metrics = self.advance(stats, np.asarray(step.valid, bool), adv[:, c0:], cm)
        if new is not None:
            adv = adv.copy()
            adv[:, c0:] = new
            a["advantages"] = adv
        return step

    def advance(self, stats, valid, advantages, mask):
        """One step of the rule on host arrays: ``stats [N, 3]`` ``(ER, ERV, ERA)``, ``valid [N]``
        the rows that take part, ``advantages`` / ``mask [N, T]`` response-aligned (``mask``: the
        response tokens; the bonus goes on each row's last, where the code's reward sits, whether or
        not the loss trains it). Returns the shaped advantages (None at the first step: no bonus
        yet; and for a step without rows, which leaves the state as it was) and the step's
        metrics, and moves the baseline."""
        stats = np.asarray(stats, np.float64)
        er, erv, era = stats[:, 0], stats[:, 1], stats[:, 2]
        any_valid = bool(np.asarray(valid).any())
        if not any_valid:
            return None, {"verl_er/er": 0.0, "verl_er/erv": 0.0, "verl_er/era": 0.0, "verl_er/bonus": 0.0,
                          "verl_er/shaped": 0.0, "verl_er/baseline_er": float(self.baseline[2])}
        m = {"verl_er/er": float(er[valid].mean()), "verl_er/erv": float(erv[valid].mean()),
             "verl_er/era": float(era[valid].mean())}
        new, shaped, bonus_mean = None, 0, 0.0
        if self.previous is not None:
            bonus = np.asarray(effective_rank_bonus(er, erv, era, np.asarray(self.baseline), gain=self.gain,
                                                    weight=self.weight), np.float64)
            bonus = np.where(valid, bonus, 0.0)
            bonus_mean = float(bonus[valid].mean())
            adv = np.asarray(advantages, np.float32)
            new = np.asarray(capped_bonus_advantages(adv, bonus.astype(np.float32), mask, kappa=self.kappa,
                                                     at=self.at))
            shaped = int(np.any(new != adv, axis=1).sum())
            self.baseline = [(1.0 - self.ema) * b + self.ema * p for b, p in zip(self.baseline, self.previous)]
        self.previous = [m["verl_er/era"], m["verl_er/erv"], m["verl_er/er"]]
        m.update({"verl_er/bonus": bonus_mean, "verl_er/shaped": float(shaped),
                  "verl_er/baseline_er": float(self.baseline[2])})
        return new, m

    def state_dict(self) -> dict:
        return {"baseline": list(self.baseline), "previous": None if self.previous is None else list(self.previous)}

    def load_state_dict(self, state) -> None:
        if state:
            self.baseline = [float(x) for x in state["baseline"]]
            self.previous = None if state["previous"] is None else [float(x) for x in state["previous"]]


LOOP_PART_OPTIONS.register(Part(
    "verl_er", VerlEffectiveRank,
    paper="Beyond the Exploration-Exploitation Trade-off: A Hidden State Approach for LLM Reasoning (VERL, "
          "effective-rank shaping), arXiv:2509.23808",
    core=("effective_rank", "effective_rank_dynamics", "effective_rank_bonus", "capped_bonus_advantages"),
    methods=(166,), verified="hand values; the authors' code's rank, dynamics, signal and shaping (hf618/VERL @3de68f1)",
    tests="tests/core/test_representation.py, tests/conformance/test_verl_er_authors.py, tests/training/test_verl_er.py",
    note="the effective rank of each response's hidden states, its velocity and acceleration over growing prefixes; "
         "a bonus tau tanh(rel ER) + (1 - tau) tanh(rel ERV), tau = sigmoid(gain rel ERA), against an EMA of past "
         "batch means, added to the advantage's last token capped at |A| / kappa; not reproduced: the signal in the "
         "reward too (add_reward), the performance-scaled weight, the FixOne/FixTwo ablations"))

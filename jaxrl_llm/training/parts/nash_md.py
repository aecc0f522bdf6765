"""Nash-MD's opponents (METHODS.md #200) as a loop part: ``recipe.loop_part=nash_md``.

Nash-MD (Munos et al., "Nash Learning from Human Feedback", arXiv:2312.00886) improves the
policy against a *mixture* of itself and the reference policy: each response ``y`` of the policy
is compared with a response ``y'`` of the geometric mixture ``pi^(1 - m) pi_ref^m`` to the same
prompt, and the policy is pushed up in proportion to ``P(y > y') - 1/2``. TRL's NashMDTrainer
(``trl/experimental/nash_md`` @054a0dab) samples one response of each per prompt, with
``mixture_coef`` ``m = 0.5``, and takes ``P = sigmoid(r(y) - r(y'))`` from a reward model.

This part, in the **resample** phase of each round: samples the mixture's responses to the
round's prompts (as many as the policy's, from :func:`jaxrl_llm.rollout.generate_mixture` with
the reference policy), scores them with the run's reward functions, and pairs row ``i`` of the
policy with row ``i`` of the mixture: ``P_i = sigmoid((r_i - r'_i) / temperature)``
(:func:`jaxrl_llm.core.nash_md_preference`); in the **assemble** phase it hands ``P`` to the
estimator as the input ``nash_pref`` (``recipe.advantage=nash_md``). Metrics: ``nash/preference``
(mean ``P``), ``nash/mixture_reward``. The preset ``recipe.name=nash_md`` turns on the three
parts with TRL's settings. Not reproduced: a judge model's pairwise preference (the run's reward
functions stand in for the reward model), the per-epoch schedule of ``mixture_coef``.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxrl_llm.algorithms.registry import Part
from jaxrl_llm.config import ConfigError
from jaxrl_llm.training.parts.base import Clash, loop_part
from jaxrl_llm.training.parts.options import LOOP_PART_OPTIONS, NamedLoopPart

__all__ = ["NashMD"]


@loop_part
class NashMD(NamedLoopPart):
    key = "recipe.loop_part=nash_md"
    phases = frozenset({"resample", "assemble"})
    conflicts = (Clash("episodes", "it samples single-turn opponents; the agent loop does not run it"),
                 Clash("rollout.asynchronous", "the opponents are sampled with the step's policy"),
                 Clash("recipe.allocator", "each policy response is paired with a mixture response of the same row: "
                                           "the rounds need num_samples responses per prompt"),
                 Clash("rollout.tree_segment", "the tree sampler does not sample a mixture"))

    def __init__(self, *, mixture_coef: float = 0.5, temperature: float = 1.0):
        if not (isinstance(mixture_coef, (int, float)) and 0.0 <= mixture_coef <= 1.0):
            raise ConfigError(f"recipe.loop_part.mixture_coef must be in [0, 1], got {mixture_coef!r}")
        if not (isinstance(temperature, (int, float)) and temperature > 0):
            raise ConfigError(f"recipe.loop_part.temperature must be > 0, got {temperature!r}")
        self.coef, self.temperature, self.name = float(mixture_coef), float(temperature), "nash_md"
        self._pref: dict[int, np.ndarray] = {}
        self._metrics: dict[str, float] = {}

    def attach(self, ctx) -> None:
        if getattr(getattr(ctx, "sampler", None), "mesh", None) is not None:
            raise ConfigError("recipe.loop_part=nash_md samples its mixture on one device: it cannot run with a sampler "
                              "mesh")
        if getattr(ctx, "ref_params", None) is None:
            raise ConfigError("recipe.loop_part=nash_md samples from a mixture with the reference policy: the run needs "
                              "one (a KL term, e.g. recipe.loss=nash_md)")


    def resample(self, ctx, rnd):
        from jaxrl_llm.core import nash_md_preference

        if rnd.index == 0:
            self._pref, self._metrics = {}, {}
        batch, out = rnd.t_batch, rnd.t_out
        sub = ctx.sample(rnd.params, [list(p) for p in batch.prompt_ids], jax.random.fold_in(rnd.key, 0x4A54),
                         mixture=(ctx.ref_params, self.coef))
        sub_out = ctx.score(list(batch.prompts), dict(batch.columns), sub)
        r = np.nan_to_num(np.asarray(out.total, np.float32), nan=0.0)
        r2 = np.nan_to_num(np.asarray(sub_out.total, np.float32)[:len(r)], nan=0.0)
        self._pref[rnd.index] = np.asarray(nash_md_preference(r, r2, temperature=self.temperature), np.float32)
        self._metrics = {"nash/preference": float(self._pref[rnd.index].mean()),
                         "nash/mixture_reward": float(r2.mean())}
        return rnd

    def assemble(self, ctx, step):
        if "nash_pref" not in ctx.recipe.requires:
            return step
        rounds, groups, rows = step.origin
        step.inputs["nash_pref"] = np.concatenate([self._pref[r][np.asarray(ix)] for (r, _), ix in zip(groups, rows)])
        return step


LOOP_PART_OPTIONS.register(Part(
    "nash_md", NashMD,
    paper="Nash Learning from Human Feedback (Nash-MD; Munos et al.), arXiv:2312.00886",
    methods=(200,), verified="the mixture sampler tested against teacher forcing; TRL's pairing and preference",
    tests="tests/training/test_nash_md.py, tests/rollout/test_sampler.py",
    note="each policy response paired with a response of the geometric mixture pi^(1-m) pi_ref^m (m = 0.5, TRL's) "
         "to the same prompt, P = sigmoid(r(y) - r(y')) from the run's rewards, handed to recipe.advantage=nash_md"))

"""AnytimeReasoner's budget summaries (METHODS.md #13) as a loop part: ``recipe.loop_part=brpo``.

BRPO trains the thinking so that it can be stopped at any of ``S`` budgets and still lead to a
right answer. For each sampled trace the authors (``sail-sg/AnytimeReasoner`` @7e3f5bb) cut the
thinking after ``b_j`` tokens (``b_j = (j + 1) L / S``), force the end of the thinking and sample
``A`` summaries (the final answer) from there, and score them; ``s_{g,j}`` is their mean. BRPO's
advantages (``recipe.advantage=brpo``, :func:`jaxrl_llm.core.brpo_advantages`) then weigh each
thinking segment by the budget-weighted return that follows it.

This part, in the **resample** phase of each round: for every budget, the prompts ``prompt +
trace[:b_j] + summary_text`` (a trace that ended earlier: all of it) are sampled ``num_samples``
times by the round's policy and the first ``summaries`` responses of each are scored by the run's
reward functions (the answer is in the summary); in the **assemble** phase their mean, ``[N, S]``,
is the estimator's input ``budget_scores``. Defaults: 4 budgets and 4 summaries (the authors'),
``summary_text`` a closing of the thinking followed by a final-answer cue. Not reproduced: the
summaries are scored but not trained (the paper trains the summary policy too, with the mean of
the same budget's summaries as baseline), and they are sampled with the run's length budget
(the paper: at most 128 tokens). Metrics: ``brpo/score_b<j>`` (mean over rows at budget j).
"""

from __future__ import annotations

import jax
import numpy as np

from jaxrl_llm.algorithms.estimators import budget_bounds
from jaxrl_llm.algorithms.registry import Part
from jaxrl_llm.config import ConfigError
from jaxrl_llm.training.parts.base import Clash, loop_part
from jaxrl_llm.training.parts.options import LOOP_PART_OPTIONS, NamedLoopPart
from jaxrl_llm.training.rounds import take_rollout_rows

__all__ = ["BudgetSummaries", "SUMMARY_TEXT"]

#: what ends a cut thinking trace before its summary (the authors force the end of the thinking
#: and a "**Final Answer**" header)
SUMMARY_TEXT = "\n</think>\n\n**Final Answer**\n"


@loop_part
class BudgetSummaries(NamedLoopPart):
    key = "recipe.loop_part=brpo"
    phases = frozenset({"resample", "assemble"})
    conflicts = (Clash("episodes", "it cuts single-turn responses; the agent loop does not run it"),
                 Clash("rollout.asynchronous", "the summaries are sampled with the step's policy"))

    def __init__(self, *, num_budgets: int = 4, summaries: int = 4, summary_text: str = SUMMARY_TEXT):
        for name, v in (("num_budgets", num_budgets), ("summaries", summaries)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"recipe.loop_part.{name} must be an int >= 1, got {v!r}")
        self.num_budgets, self.summaries, self.summary_text = num_budgets, summaries, str(summary_text)
        self.name = "brpo"
        self._scores: dict[int, np.ndarray] = {}
        self._metrics: dict[str, float] = {}

    def resample(self, ctx, rnd):
        if rnd.index == 0:
            self._scores, self._metrics = {}, {}
        g = ctx.recipe.num_samples
        if self.summaries > g:
            raise ConfigError(f"recipe.loop_part.summaries={self.summaries} exceeds the samples per prompt ({g}): the "
                              f"summaries are drawn with the run's sampler")
        batch, roll = rnd.t_batch, rnd.t_roll
        toks, mask = np.asarray(roll.tokens), np.asarray(roll.mask).astype(bool)
        stopped = np.asarray(roll.stopped).astype(bool)
        pidx = np.asarray(roll.prompt_index)
        n, length = toks.shape
        tail = _encode(ctx.tokenizer, self.summary_text)
        # each trace without its stop token (the summary continues the thinking, not an ended turn)
        traces = [toks[i][mask[i]][:-1] if stopped[i] and mask[i].any() else toks[i][mask[i]] for i in range(n)]
        width = max(len(p) for p in batch.prompt_ids) + length + len(tail)
        sampler = self._sampler(ctx, width)
        out = np.zeros((n, self.num_budgets), np.float32)
        for j, b in enumerate(budget_bounds(length, self.num_budgets)):
            prompts = [list(batch.prompt_ids[pidx[i]]) + traces[i][:b].tolist() + tail for i in range(n)]
            sub = sampler(rnd.params, prompts, jax.random.fold_in(rnd.key, 0xB290 + j), *ctx.frozen)
            keep = (np.arange(n)[:, None] * g + np.arange(self.summaries)[None]).ravel()
            sub = take_rollout_rows(sub, keep)._replace(prompt_index=np.repeat(np.arange(n), self.summaries)
                                                        .astype(np.int32))
            cols = {c: [list(v)[pidx[i]] for i in range(n)] for c, v in batch.columns.items()}
            res = ctx.score([batch.prompts[pidx[i]] for i in range(n)], cols, sub)
            tot = np.nan_to_num(np.asarray(res.total, np.float32), nan=0.0).reshape(n, self.summaries)
            out[:, j] = tot.mean(1)
            self._metrics[f"brpo/score_b{j}"] = float(out[:, j].mean())
        self._scores[rnd.index] = out
        return rnd

    @staticmethod
    def _sampler(ctx, width: int):
        """The summaries' sampler: the run's, with one length bucket that holds a prompt, a whole
        trace and the summary text (built once per width, its batch sizes bucketed)."""
        import dataclasses

        from jaxrl_llm.rollout import Sampler
        from jaxrl_llm.shapes import bucket

        width = bucket(width, tuple(2 ** k for k in range(4, 20)))
        key = ("brpo", width)
        sampler = ctx.aux_samplers.get(key)
        if sampler is None:
            base = ctx.sampler
            sampler = ctx.aux_samplers[key] = Sampler(base.graphdef, dataclasses.replace(base.config),
                                                      length_buckets=(width,),
                                                      batch_buckets=tuple(2 ** k for k in range(3, 17)),
                                                      mesh=base.mesh, unroll_layers=base.unroll_layers)
        return sampler

    def assemble(self, ctx, step):
        if "budget_scores" not in ctx.recipe.requires:
            return step
        rounds, groups, rows = step.origin
        step.inputs["budget_scores"] = np.concatenate([self._scores[r][np.asarray(ix)]
                                                       for (r, _), ix in zip(groups, rows)])
        return step


def _encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (an HF tokenizer or one with ``encode``)."""
    if not text:
        return []
    if callable(tokenizer):
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer.encode(text))


LOOP_PART_OPTIONS.register(Part(
    "brpo", BudgetSummaries,
    paper="Optimizing Anytime Reasoning via Budget Relative Policy Optimization (AnytimeReasoner / BRPO), "
          "arXiv:2505.13438",
    methods=(13,), verified="hand values (the budgets, the summary prompts, their scores)",
    tests="tests/training/test_brpo.py",
    note="each trace cut after b_j = (j+1) T / S tokens (S = 4), A = 4 summaries sampled after a forced end of the "
         "thinking and scored; their means feed recipe.advantage=brpo; the summaries are not trained"))

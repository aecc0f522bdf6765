"""``recipe.hints``: groups of a scored round sampled again with hinted prompts
(:data:`jaxrl_llm.algorithms.HINTS`): stage after stage, or one response per hint level (Scaf-GRPO)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxrl_llm.algorithms.hints import HintInputs, trains_in_plain_context
from jaxrl_llm.algorithms.sampling import metric_values
from jaxrl_llm.data.pipeline import PromptBatch
from jaxrl_llm.rewards.base import RewardOutput
from jaxrl_llm.training.parts.base import Clash, LoopPart, Need, loop_part
from jaxrl_llm.training.rounds import decode_completions, put_result, take_rollout_rows

__all__ = ["Hints"]


@loop_part
class Hints(LoopPart):
    """Re-samples the groups the hint part names with hinted prompts, by the round's policy. A
    plain-context part's hinted groups keep their plain prompts in the batch (the responses and
    their hinted-context log-probs change) and are marked ``hinted`` for the loss."""

    key = "recipe.hints"
    phases = frozenset({"resample", "assemble"})
    requires = (Need("prompt_encoder", "it samples hinted prompts: pass prompt_encoder (raw prompt -> (token ids, "
                                       "rendered text), the data pipeline's rendering)"),)
    conflicts = (Clash("episodes", "hints re-sample single-turn prompts; the agent loop does not run them"),)

    def attach(self, ctx) -> None:
        if self.bound.part.flag("keep_failed") and self.bound.part.flag("needs_text"):  # a refinement holds a response
            need = ctx.sampler.config.max_new_tokens
            if max(ctx.sampler.length_buckets) <= need:
                from jaxrl_llm.config import ConfigError

                raise ConfigError(f"recipe.hints={self.name} asks again with prompts that hold a whole response (up to "
                                  f"rollout.max_new_tokens={need} tokens): the largest prompt bucket "
                                  f"(rollout.prompt_buckets, {max(ctx.sampler.length_buckets)}) must be longer; "
                                  f"refinement prompts that do not fit are not asked (hints/too_long)")

    def __init__(self, bound):
        self.bound, self.name = bound, bound.name
        self.metric = dict(bound.kwargs).get("metric")
        self._metrics: dict[str, float] = {}
        self._marked: dict[int, set] = {}  # a plain-context levels part: round -> rows replaced

    @classmethod
    def from_run(cls, run):
        h = run.recipe.hints
        return None if h is None else cls(h)

    def metrics(self):
        return dict(self._metrics)

    def _add(self, name: str, value: float) -> None:
        self._metrics[name] = self._metrics.get(name, 0.0) + value

    def resample(self, ctx, rnd):
        if rnd.index == 0:
            self._metrics, self._marked = {}, {}
        if self.bound.part.flag("levels"):
            self._levels(ctx, rnd)
            return rnd
        plain = trains_in_plain_context(self.bound)
        batch, roll, out = rnd.t_batch, rnd.t_roll, rnd.t_out
        raw = tuple(batch.raw_prompts)
        ids, texts = list(batch.prompt_ids), list(batch.prompts)
        hinted: set[int] = set()
        too_long = 0
        for stage in range(64):
            x = HintInputs(metric_values(out.total, out.per_fn, self.metric, "recipe.hints"),
                           np.asarray(roll.prompt_index), batch.columns, raw, frozenset(hinted), stage, ctx.iteration)
            todo = {}
            for grp, hint_raw in self.bound(x).items():
                enc = _encode_fitting(ctx, hint_raw)
                if enc is None:  # the hinted prompt does not fit the sampler's buckets: not hinted
                    too_long += 1
                    continue
                todo[int(grp)] = enc
            if not todo:
                break
            groups = sorted(todo)
            sub, sub_out = _sample_hinted(ctx, rnd.params, [todo[k] for k in groups], groups, batch,
                                          jax.random.fold_in(rnd.key, 0x41C7 + stage), ctx.recipe.num_samples)
            pidx = np.asarray(roll.prompt_index)
            rows = np.concatenate([np.flatnonzero(pidx == k) for k in groups])
            roll, out = put_result(roll, out, rows, sub, sub_out)
            if not plain:
                for k in groups:
                    ids[k], texts[k] = todo[k]
            hinted |= set(groups)
            self._add(f"hints/stage{stage}_groups", len(groups))
        self._add("hints/groups", len(hinted))
        self._add("hints/too_long", too_long)
        if hinted:
            rnd.train_roll, rnd.train_out = roll, out
            if plain:
                rnd.hinted = frozenset(hinted)
            else:
                rnd.train_batch = PromptBatch(ids, texts, list(batch.raw_prompts), batch.columns, list(batch.where))
        return rnd

    def _levels(self, ctx, rnd) -> None:
        """A levels part (Scaf-GRPO, Critique-GRPO): one response per hint level of each group the
        part names, and the mildest level's success (outcome ``> 0``) in the group's first row,
        trained after the plain prompt; a ``keep_failed`` part puts the first level's response
        there when none succeeds. A plain-context part's replaced rows are marked ``hinted``."""
        batch, roll, out = rnd.batch, rnd.roll, rnd.out
        pidx = np.asarray(roll.prompt_index)
        texts = decode_completions(roll, ctx.tokenizer) if self.bound.part.flag("needs_text") else ()
        x = HintInputs(metric_values(out.total, out.per_fn, self.metric, "recipe.hints"), pidx, batch.columns,
                       tuple(batch.raw_prompts), frozenset(), 0, ctx.iteration, texts)
        items, too_long = [], 0
        asked = self.bound(x)
        for grp, levels in asked.items():
            for lv, raw in enumerate(levels):
                enc = _encode_fitting(ctx, raw)
                if enc is None:  # does not fit the sampler's buckets: not tried
                    too_long += 1
                    continue
                items.append((int(grp), lv, enc))
        if asked and not items and self.bound.part.flag("keep_failed"):  # a part that replaces a row of every group
            from jaxrl_llm.config import ConfigError

            raise ConfigError(f"recipe.hints={self.name}: none of the step's {len(asked)} rebuilt prompts fits the "
                              f"largest prompt bucket (rollout.prompt_buckets, {max(ctx.sampler.length_buckets)} "
                              f"tokens): the run would train without them; raise the bucket or shorten the prompts")
        best: dict[int, tuple[int, Any, Any, int]] = {}  # group -> (level, sub rollout, sub rewards, row)
        first: dict[int, tuple[int, Any, Any, int]] = {}  # group -> its first level's, kept when none succeeds
        for c0 in range(0, len(items), len(batch)):
            chunk = items[c0:c0 + len(batch)]
            sub, sub_out = _sample_hinted(ctx, rnd.params, [e[2] for e in chunk], [e[0] for e in chunk], batch,
                                          jax.random.fold_in(rnd.key, 0x5CAF + c0), 1)
            ok = metric_values(sub_out.total, sub_out.per_fn, self.metric, "recipe.hints") > 0
            for j, (grp, lv, _) in enumerate(chunk):
                if ok[j] and (grp not in best or lv < best[grp][0]):
                    best[grp] = (lv, sub, sub_out, j)
                if grp not in first or lv < first[grp][0]:
                    first[grp] = (lv, sub, sub_out, j)
        self._add("hints/rescued_groups", len(best))
        if best:
            self._metrics["hints/level_mean"] = float(np.mean([b[0] + 1 for b in best.values()]))
        if self.bound.part.flag("keep_failed"):
            best = {**first, **best}
        marked = set()
        bonus = self._expert_bonus(ctx)
        paid = 0
        for grp, (lv, sub, sub_out, j) in best.items():
            one = take_rollout_rows(sub, [j])
            dst = np.flatnonzero(pidx == grp)[:1]
            marked.update(int(r) for r in dst)
            total = np.asarray(sub_out.total, np.float32)[[j]]
            if bonus and metric_values(sub_out.total, sub_out.per_fn, self.metric, "recipe.hints")[j] > 0:
                total = total + np.float32(bonus)  # ICPO: a correct guided response's annealed bonus
                paid += 1
            roll, out = put_result(roll, out, dst, one,
                                   RewardOutput(total,
                                                {k: np.asarray(v)[[j]] for k, v in sub_out.per_fn.items()},
                                                {k: np.asarray(v)[[j]] for k, v in sub_out.failed.items()},
                                                sub_out.metrics))
        if self.bound.part.flag("expert_bonus"):
            self._metrics["hints/expert_bonus"] = float(bonus)
            self._add("hints/expert_bonus_rows", paid)
        self._add("hints/groups", len(asked))
        self._add("hints/levels_sampled", len(items))
        self._add("hints/too_long", too_long)
        if trains_in_plain_context(self.bound):
            self._marked[rnd.index] = marked
        if roll is not rnd.roll:
            rnd.train_roll, rnd.train_out = roll, out

    def _expert_bonus(self, ctx) -> float:
        """A part flagged ``expert_bonus`` (ICPO): ``beta max(0, 1 - step / anneal_steps)`` added to
        the score of a replaced row whose outcome is ``> 0``; 0 otherwise."""
        if not self.bound.part.flag("expert_bonus"):
            return 0.0
        kw = {**_defaults(self.bound.part.fn), **dict(self.bound.kwargs)}  # the part's own defaults, not copies
        beta, steps = float(kw["beta"]), kw["anneal_steps"]
        return beta * max(0.0, 1.0 - ctx.iteration / steps) if beta else 0.0

    def assemble(self, ctx, step):
        """The rows a plain-context part re-sampled (Guide's ``hinted`` loss input)."""
        if "hinted" in ctx.recipe.objective.loss_inputs:
            rounds, groups, rows = step.origin
            if self.bound.part.flag("levels"):  # the rows a levels part replaced
                step.inputs["hinted"] = np.concatenate([
                    np.array([int(row) in self._marked.get(r, ()) for row in ix], np.float32)
                    for (r, _), ix in zip(groups, rows)])
            else:
                step.inputs["hinted"] = np.concatenate([np.full(len(ix), i in rounds[r].hinted, np.float32)
                                                        for (r, i), ix in zip(groups, rows)])
            valid = step.valid
            step.metrics["hints/hinted_rows_frac"] = float(step.inputs["hinted"][valid].mean()) if valid.any() else 0.0
        return step


def _defaults(fn) -> dict:
    """The keyword defaults of a hint part's function."""
    import inspect

    return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}


def _encode_fitting(ctx, raw):
    """A hinted raw prompt as ``(token ids, text)``, or ``None`` if it is longer than the
    sampler's largest prompt bucket."""
    enc = ctx.prompt_encoder(raw)
    return None if len(enc[0]) > max(ctx.sampler.length_buckets) else enc


def _sample_hinted(ctx, params, encs: list, groups: list, batch, key, per_prompt: int):
    """``(rollout, rewards)`` of ``per_prompt`` responses (``<= num_samples``) to each encoded
    prompt, sampled in the round's shape (padded to its batch size: no new compilation) and
    scored with the data columns of its group in ``groups``."""
    g = ctx.recipe.num_samples
    pad = [e[0] for e in encs]
    pad += [pad[0]] * (len(batch) - len(pad))
    sub = ctx.sample(params, pad, key)
    take = (np.arange(len(encs))[:, None] * g + np.arange(per_prompt)[None]).ravel()
    sub = take_rollout_rows(sub, take)._replace(prompt_index=np.repeat(np.arange(len(encs)), per_prompt).astype(np.int32))
    sub_out = ctx.score([e[1] for e in encs], {c: [list(v)[k] for k in groups] for c, v in batch.columns.items()}, sub)
    return sub, sub_out

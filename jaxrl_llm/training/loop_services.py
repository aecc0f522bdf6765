"""What the RL loop offers its phases and parts: log-prob passes, sampling, scoring, shaping,
prompt batches, keys, and the step's metrics (:class:`LoopServices`, the base of
:class:`~jaxrl_llm.training.RLTrainer`), plus the checks of a trainer's arguments that are not
loop parts' (the recipe's inputs and models)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jaxrl_llm.algorithms.estimators import AGENT_KINDS, PROVIDED_INPUTS
from jaxrl_llm.parallel.multihost import allgather_objects, gather
from jaxrl_llm.parallel.sharding import in_host_memory
from jaxrl_llm.rewards.base import RewardOutput
from jaxrl_llm.rollout.sampler import Sampler, bucket, pad_prompts
from jaxrl_llm.training.host_loop import HostLoop
from jaxrl_llm.training.parts.base import only_in
from jaxrl_llm.training.parts.shaping import ShapeJob
from jaxrl_llm.training.prefix import block_rows, check_blocks
from jaxrl_llm.training.providers import INTRINSIC, PROVIDERS, StepBatch, policy_logp
from jaxrl_llm.training.rl import align_routes
from jaxrl_llm.training.rounds import merge_reward_metrics

__all__ = ["LoopServices", "check_recipe_inputs", "greedy_baseline", "apply_corrections"]


def check_recipe_inputs(recipe, sampler, ref_params, aux_params, own_inputs) -> None:
    """The sampler matches the recipe (samples per prompt, temperature) and the models the
    recipe's inputs read are given."""
    if sampler.config.num_samples != recipe.num_samples:
        raise ValueError(f"sampler samples {sampler.config.num_samples} completions per prompt but the recipe "
                         f"expects num_samples={recipe.num_samples}")
    temp = 1.0 if sampler.config.greedy else sampler.config.temperature
    if recipe.objective.temperature != temp:
        raise ValueError(f"the recipe's objective computes log-probs at temperature {recipe.objective.temperature} "
                         f"but the sampler samples at {temp}: the importance ratios would be biased; build both "
                         f"from one value (build_recipe(..., temperature=sampler.config.temperature))")
    if "teacher_logp" in recipe.requires and (aux_params is None or ref_params is None):
        raise ValueError(f"recipe {recipe.name!r} distils AlignDistil's teacher: pass aux_params (the DPO model) and "
                         f"ref_params (the reverse-DPO model)")
    if recipe.needs_reference and ref_params is None:
        raise ValueError(f"recipe {recipe.name!r} has a KL term (it requires ref_logp): pass ref_params")
    if "aux_logp" in recipe.requires and aux_params is None:
        raise ValueError(f"recipe {recipe.name!r} (estimator {recipe.estimator.name!r}) reads an auxiliary "
                         f"policy's log-probs: pass aux_params (model.aux_params in a run config)")
    agent_only = {k for k in recipe.requires if PROVIDED_INPUTS.get(k) in AGENT_KINDS} - set(own_inputs)
    if agent_only:
        raise ValueError(f"recipe {recipe.name!r} requires {sorted(agent_only)}, which only an agent run provides "
                         f"(multi-turn episodes: AgentTrainer, an AgentRunConfig experiment)")
    missing = recipe.requires - set(PROVIDERS) - set(INTRINSIC) - set(own_inputs)
    if missing:
        raise ValueError(f"recipe {recipe.name!r} requires {sorted(missing)}, which no provider computes")


def greedy_baseline(recipe, sampler, given: Sampler | None) -> Sampler | None:
    """The greedy sampler of recipes that require ``greedy_scores`` (ReMax): ``given``, or the
    sampler's config with ``greedy=True, num_samples=1`` and the same buckets."""
    if "greedy_scores" not in recipe.requires:
        return given
    if given is None:
        given = Sampler(sampler.graphdef, dataclasses.replace(sampler.config, greedy=True, num_samples=1),
                        length_buckets=sampler.length_buckets, batch_buckets=sampler.batch_buckets, mesh=sampler.mesh,
                        unroll_layers=sampler.unroll_layers, param_rules=sampler.param_rules)
    if not given.config.greedy or given.config.num_samples != 1:
        raise ValueError("baseline_sampler must decode greedily (SamplingConfig.greedy=True) with num_samples=1, got "
                         f"greedy={given.config.greedy}, num_samples={given.config.num_samples}")
    return given


def apply_corrections(recipe, step: StepBatch) -> None:
    """Importance weights and rejection masks from the recomputed and the sampler's log-probs.
    Rejected tokens leave the loss, its normaliser and the advantages (verl masks the response
    before computing them)."""
    import jax.numpy as jnp

    a = step.arrays
    for part, kind in ((recipe.is_correction, "weights"), (recipe.rejection, "reject")):
        if part is None:
            continue
        out, met = part(jnp.asarray(a["old_logp"]), jnp.asarray(a["rollout_logp"]), jnp.asarray(a["loss_mask"]))
        out = np.asarray(out, np.float32)
        if kind == "weights":
            a["is_weights"] = out
        else:
            kept = out > 0
            a["loss_mask"] = a["loss_mask"] & kept
            a["completion_mask"] = a["completion_mask"] & kept[:, step.prompt_len - 1:]
        step.metrics.update({f"correction/{k}": float(v) for k, v in met.items()})


class LoopServices(HostLoop):
    """The services of the RL loop (see the module docstring). ``phase`` / ``part``: the phase
    being run and the part being called (set by :class:`~jaxrl_llm.training.parts.Parts`); a part
    that uses a service outside the phases it belongs to gets a
    :class:`~jaxrl_llm.training.parts.PhaseError`."""

    phase: str | None = None
    part: Any = None

    def _guard(self, service: str, *phases: str) -> None:
        if self.part is not None:
            only_in(self, service, *phases)

    def logp(self, params, others, tokens, mask, prompt_len: int | None = None, routes=None) -> np.ndarray:
        """``[N, L - 1]`` teacher-forced log-probs of ``params`` at the sampling temperature.

        With ``shared_prefix`` and the batch's ``prompt_len``, each prompt group is encoded once
        when its rows are consecutive and share the prompt (checked here); only the completion
        targets then hold log-probs (0 over the prompt's own). ``routes``: the sampler's experts
        (mixture of experts), replayed when the objective replays routing."""
        obj = self.recipe.objective
        kw = {}
        if obj.routing_replay:
            if routes is None:
                raise ValueError("train.routing_replay: this log-prob pass has no routes to replay")
            kw["routes"] = routes
        if self.logprob_packing is not None and not kw:  # packed passes (train.max_tokens_per_microbatch)
            return self.logprob_packing(obj.chunk_size, obj.temperature, in_host_memory(params), params, others,
                                        tokens, mask)
        if self.prefix_plan is not None and prompt_len:
            r = block_rows(self.recipe.num_samples, tokens.shape[0], self.prefix_plan.batch_ways)
            if r > 1 and not check_blocks(tokens, mask, prompt_len, r):
                kw = dict(prompt_len=int(prompt_len), rows_per_prompt=r)
        return gather(policy_logp(self.graphdef, obj.chunk_size, obj.temperature, in_host_memory(params), params,
                                  others, tokens, mask, **kw))

    def sample(self, params, prompt_ids, key, **kw):
        """The sampler's rollout of ``prompt_ids`` with ``params`` (phases sample, allocate, resample)."""
        self._guard("the sampler", "sample", "allocate", "resample")
        return self.sampler(params, prompt_ids, key, *self.frozen, **kw)

    def rollout_key(self, iteration: int) -> jax.Array:
        """The key of ``iteration``; split into ``(rollout key, mini-batch key)``."""
        return jax.random.fold_in(jax.random.key(self.seed), iteration)

    @staticmethod
    def round_key(rollout_key: jax.Array, round_index: int) -> jax.Array:
        """The sampling key of round ``round_index`` of a step (group filters)."""
        return rollout_key if round_index == 0 else jax.random.fold_in(rollout_key, round_index)

    def next_batch(self, round_index: int):
        """The next data batch, through the select phase (a selector picks among candidates)."""
        self.round_index = round_index
        return self.parts("select", self, next(self.data))

    def data_state(self) -> Any:
        return self.data.get_state() if self.data_state_ahead is None else self.data_state_ahead

    @staticmethod
    def _row_prompts(prompts, roll) -> np.ndarray:
        """``[N]`` the position in ``prompts`` of each row's prompt: the rollout's distinct prompt
        ids in increasing order are the prompts (each prompt has at least one row)."""
        pidx = np.asarray(roll.prompt_index)
        ids = np.unique(pidx)
        if len(ids) != len(prompts):
            raise ValueError(f"internal: a rollout of {len(ids)} distinct prompts scored against {len(prompts)} prompts")
        return np.searchsorted(ids, pidx)

    def _score_groups(self, prompts, columns: dict, roll, lo: int, hi: int):
        """Rewards of the rows of prompts ``lo:hi`` (whole groups, of any sizes)."""
        pos = self._row_prompts(prompts, roll)
        rows = np.flatnonzero((pos >= lo) & (pos < hi))
        toks, cmask = np.asarray(roll.tokens)[rows], np.asarray(roll.mask)[rows].astype(bool)
        completions = [self.tokenizer.decode(toks[i][cmask[i]], skip_special_tokens=True) for i in range(len(toks))]
        cols = {k: list(v) for k, v in columns.items()}
        return self.rewards([prompts[pos[i]] for i in rows], completions,
                            completion_ids=[toks[i][cmask[i]].tolist() for i in range(len(toks))],
                            completion_lengths=np.asarray(roll.lengths)[rows].tolist(),
                            group_ids=np.asarray(roll.prompt_index)[rows].tolist(),
                            **{k: [v[pos[i]] for i in rows] for k, v in cols.items()})

    def score(self, prompts, columns: dict, roll):
        """Rewards of every row. With several processes each scores a contiguous share of
        the groups (reward functions are the host-side cost that grows with the batch) and
        the outputs are exchanged, so every process ends with the same scores."""
        self._guard("the reward functions", "score", "truncate", "resample", "assemble")
        n_proc = jax.process_count()
        if n_proc == 1:
            return self._score_groups(prompts, columns, roll, 0, len(prompts))
        bounds = np.linspace(0, len(prompts), n_proc + 1).round().astype(int)
        lo, hi = bounds[jax.process_index()], bounds[jax.process_index() + 1]
        mine = self._score_groups(prompts, columns, roll, lo, hi) if hi > lo else None
        outs = [o for o in allgather_objects(mine) if o is not None]
        if len(outs) == 1:
            return outs[0]
        return RewardOutput(total=np.concatenate([o.total for o in outs]),
                            per_fn={k: np.concatenate([o.per_fn[k] for o in outs]) for k in outs[0].per_fn},
                            failed={k: np.concatenate([o.failed[k] for o in outs]) for k in outs[0].failed},
                            metrics=merge_reward_metrics(outs))

    def shape(self, out, roll, prompts, keys=(), *, update: bool = True) -> np.ndarray:
        """``[N]`` float32 scores after the shape phase (the recipe's shaping, added to the reward
        total) of the completions of ``prompts`` (one group each; ``keys``: their store keys).
        ``update=False``: stateful parts read their state as it was when the step began and keep
        it (a baseline's completions)."""
        job = ShapeJob(np.asarray(out.total, np.float32), out, roll, tuple(prompts), tuple(keys), update)
        return self.parts("shape", self, job).scores

    def prompt_tokens(self, prompt_ids, extra: int = 0):
        """Left-padded ``[B, P + extra]`` prompts (``P``: the sampler's bucket) and their mask."""
        length = bucket(max(len(p) for p in prompt_ids), self.sampler.length_buckets)
        tokens, mask = pad_prompts(prompt_ids, length, len(prompt_ids), self.sampler.config.pad_token_id)
        if extra:
            tokens = np.concatenate([tokens, np.full((len(tokens), extra), self.sampler.config.pad_token_id,
                                                     tokens.dtype)], 1)
            mask = np.concatenate([mask, np.ones((len(mask), extra), bool)], 1)
        return tokens, mask

    def merged_routes(self, rounds, cat):
        """The rounds' sampler routes (mixture of experts) for the train batch, when the update
        replays them (``train.routing_replay``); None otherwise."""
        obj = self.recipe.objective
        if not (obj.routing_replay or obj.router_mismatch):
            return None
        if any(r.t_roll is not r.roll or getattr(r.t_roll, "routes", None) is None for r in rounds):
            raise RuntimeError("a mixture of experts' update reads the sampler's expert routes, but a rollout came back "
                               "without them (a transformed rollout: hints, replay; or a sampler that does not record "
                               "them)")
        # rounds may have used different prompt buckets: align each to the widest before joining
        width = max(np.asarray(r.t_roll.routes).shape[1] - np.asarray(r.t_roll.tokens).shape[1] for r in rounds)
        return cat(lambda x: align_routes(np.asarray(x.t_roll.routes), np.asarray(x.t_roll.tokens).shape[1], width))

    def update_metrics(self, step_metrics: list) -> dict[str, Any]:
        """Step and iteration, and the update's metrics (means over mini-batches)."""
        metrics: dict[str, Any] = {"step": int(self.state.step), "iteration": self.iteration}
        if step_metrics:
            metrics.update({k: float(np.mean([m[k] for m in step_metrics])) for k in step_metrics[0]})
        metrics["skipped_updates"] = float(sum(m["skipped"] for m in step_metrics))
        return metrics

    @staticmethod
    def advantage_metrics(step: StepBatch) -> dict[str, float]:
        """Mean and standard deviation of the advantages over the trained response tokens, and the
        mean length of the responses whose mean advantage is negative / positive (the responses
        the update pushes down / up: Dr.GRPO's length bias shows in the first), and the fraction
        of trained responses whose advantage is 0 on every token (no gradient from the policy
        term: GRPO's groups without a reward spread)."""
        adv = step.arrays["advantages"][:, step.prompt_len - 1:]
        cmask = step.completion_mask
        out = {"advantages/mean": float(adv[cmask].mean()) if cmask.any() else 0.0,
               "advantages/std": float(adv[cmask].std()) if cmask.any() else 0.0}
        lens = cmask.sum(1)
        row_adv = np.where(cmask, adv, 0.0).sum(1) / np.maximum(lens, 1)
        if (lens > 0).any():
            zero = ~np.any(cmask & (np.abs(adv) > 0), axis=1)
            out["advantages/zero_frac"] = float(zero[lens > 0].mean())
        for name, rows in (("neg_adv", (lens > 0) & (row_adv < 0)), ("pos_adv", (lens > 0) & (row_adv > 0))):
            if rows.any():
                out[f"response/length_mean_{name}"] = float(lens[rows].mean())
        return out

    def last_samples(self, n: int = 4) -> list[dict]:
        """Up to ``n`` rows of the last train batch, one per group first: ``prompt``,
        ``completion`` (decoded), ``reward`` (the shaped score) and ``advantage`` (its mean
        over the completion), for sample logs."""
        b = self.last_batch
        if b is None:
            return []
        # sample k of every group, k = 0, 1, ... (groups of any size: by rank within the group)
        gid = np.asarray(b["group_ids"])
        rank = np.zeros(len(gid), np.int64)
        for grp in np.unique(gid):
            rows = np.flatnonzero(gid == grp)
            rank[rows] = np.arange(len(rows))
        order = np.lexsort((np.arange(len(gid)), rank)).tolist()
        cmask = b["completion_mask"]
        p = b["tokens"].shape[1] - cmask.shape[1]
        out = []
        for i in [i for i in order if b["valid"][i]][:n]:
            adv = b["advantages"][i, p - 1:][cmask[i]]
            out.append({"prompt": self._last_prompts[b["group_ids"][i]],
                        "completion": self.tokenizer.decode(b["tokens"][i, p:][cmask[i]], skip_special_tokens=True),
                        "reward": float(b["scores"][i]), "advantage": float(adv.mean()) if adv.size else 0.0})
        return out

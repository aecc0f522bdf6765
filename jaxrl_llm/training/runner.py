"""A whole RL run from one config: model -> data -> (optional SFT warm-up) -> RL -> export.

:func:`run_rl` is what ``jaxrl-llm train`` calls for an experiment whose ``config()`` returns an
:class:`~jaxrl_llm.training.configs.RLRunConfig`. It is a short sequence of readable steps over
the library's pieces (:func:`load_policy`, :func:`~jaxrl_llm.training.sft.sft_warmup`,
:func:`~jaxrl_llm.training.recipes.build_recipe`, :class:`~jaxrl_llm.training.RLTrainer`): copy
it into a notebook and change any step. The resolved config (the recipe's preset filled in) is
stored in ``out/config.json`` and with every checkpoint.

Re-running the same command resumes from the newest checkpoint in ``out/ckpt`` (train state,
optimiser, RNG, data-iterator position and metric history), bit for bit; the held-out accuracy
before training is kept in ``out/eval_before.json`` so a resumed run still reports it. SIGTERM
saves and exits.

Outputs in ``run.out``: ``config.json``, ``metrics.jsonl`` and ``tb/`` (TensorBoard),
``samples.jsonl`` (completions every ``log_samples_every`` steps), ``ckpt/``, ``hf/`` (an HF
model directory with LoRA merged; transformers loads it), ``reward_curve.png`` (with
matplotlib) and ``summary.json``.

Several processes (one per host): start the same command on every host after
:func:`jaxrl_llm.parallel.initialize` (``jaxrl-llm train --multihost``, or the
``$JAXRL_COORDINATOR`` / ``$JAXRL_NUM_PROCESSES`` / ``$JAXRL_PROCESS_ID`` variables); ``mesh.*``
spans every device of every process. Each process holds the global batch and scores its share
of it (:mod:`jaxrl_llm.training.loop`), process 0 writes the side files, and checkpoints are
written collectively, so the run equals a one-process run on the same mesh.

:func:`check_rl` validates a config without weights or data (model shapes, mesh divisibility,
recipe, optimiser, sampling): how large TPU/GPU experiment files are checked here. Every
mistake in a config is a :class:`~jaxrl_llm.config.ConfigError` naming the key, the value and
the fix (the command line prints it in one line and exits with code 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_llm.config import ConfigError, to_dict
from jaxrl_llm.training.configs import (DataSpec, KLSpec, MeshSpec, ModelSpec, OptimSpec, RecipeSpec, RLRunConfig,
                                        RolloutSpec, RunSpec, SFTSpec, TrainSpec)
from jaxrl_llm.training.loading import load_policy, model_config
from jaxrl_llm.training.optim import make_optimizer
from jaxrl_llm.training.prompt_store import PromptStore
from jaxrl_llm.training.recipes import RLRecipe, build_recipe
from jaxrl_llm.training.telemetry import jsonable

__all__ = ["ModelSpec", "DataSpec", "RolloutSpec", "KLSpec", "RecipeSpec", "OptimSpec", "TrainSpec", "SFTSpec",
           "MeshSpec", "RunSpec", "RLRunConfig", "run_rl", "check_rl", "make_optimizer", "load_policy", "rl_recipe",
           "shared_prefix_plan"]

log = logging.getLogger("jaxrl_llm")


# ----------------------------------------------------------------------------- pieces


def _rows(cfg: RLRunConfig) -> tuple[Any, list[dict], list[dict], Any, Any]:
    """``(train_source, eval_rows, sft_rows, reward_fn, score_fn)``."""
    from jaxrl_llm.data import ListSource

    d, seed = cfg.data, cfg.run.seed
    if d.dataset:
        from jaxrl_llm.data import load_gsm8k, open_source
        from jaxrl_llm.rewards import math_reward

        opener = load_gsm8k if d.dataset_format == "gsm8k" else open_source
        train, ev = opener(d.dataset), opener(d.eval_dataset)
        for key, src in (("data.dataset", train), ("data.eval_dataset", ev)):
            if len(src) == 0:
                raise ConfigError(f"{key}={getattr(d, key.split('.')[1])!r} has no rows")
        eval_rows = [ev[i] for i in range(min(d.eval_rows, len(ev)))]
        return train, eval_rows, [], math_reward, (lambda c, r: float(math_reward([str(r.get("prompt", ""))], [c], answer=[r["answer"]])[0]))
    from jaxrl_llm.tasks import get_task

    task = get_task(d.task, **dict(d.task_args))
    train_rows = task.rows("train", d.train_rows, seed=seed)
    eval_rows = task.rows("eval", d.eval_rows, seed=0)  # the same held-out set for every seed
    sft_rows = [{"prompt": r["prompt"], "completion": r["solution"]} for r in train_rows]
    return ListSource(train_rows, f"{d.task}:train"), eval_rows, sft_rows, task.reward, task.score


def _rewards(cfg: RLRunConfig, reward_fn):
    from jaxrl_llm.rewards import RewardSpec, Rewards, TagFormatReward

    specs = [RewardSpec(reward_fn, name="correct")]
    if cfg.data.format_weight > 0:
        specs.append(RewardSpec(TagFormatReward(), weight=cfg.data.format_weight, name="format"))
    return Rewards(specs)


def rl_recipe(cfg: RLRunConfig) -> RLRecipe:
    """The run's :class:`~jaxrl_llm.training.RLRecipe`: ``cfg.recipe`` resolved from its preset,
    with the rollout's samples per prompt and its temperature (the one source of both)."""
    ro = cfg.rollout
    return build_recipe(cfg.recipe, num_samples=ro.num_samples, temperature=ro.temperature)


def shared_prefix_plan(cfg: RLRunConfig, rec: RLRecipe, batch_ways: int = 1, moe: bool = False):
    """``(plan, why)``: the run's Prefix Grouper layout (``train.shared_prefix``,
    :func:`jaxrl_llm.training.prefix.plan_shared_prefix`), or ``None`` and the reason it is off.
    ``train.shared_prefix=true`` where it cannot hold is a :class:`ConfigError`. ``moe``: the
    policy is a mixture of experts, whose update runs each row's own forward pass (it replays or
    compares the sampler's routes and computes the routers' statistics): off unless asked for."""
    from jaxrl_llm.training.prefix import plan_shared_prefix

    want = cfg.train.shared_prefix
    if want is False:
        return None, "train.shared_prefix=false"
    if cfg.train.max_tokens_per_microbatch:
        if want:
            raise ConfigError("train.shared_prefix=true and train.max_tokens_per_microbatch (packing) cannot be "
                              "combined: packed rows are separate segments (set one of them off)")
        return None, "train.max_tokens_per_microbatch packs the rows' own tokens"
    if cfg.mesh.context > 1:
        if want:
            raise ConfigError("train.shared_prefix=true and mesh.context > 1 cannot be combined: the context axis "
                              "splits each row's own tokens (set one of them off)")
        return None, "mesh.context splits each row's own tokens"
    if (cfg.train.routing_replay or moe) and want is None:
        return None, ("a mixture of experts: each row's own forward pass replays or compares the sampler's routes "
                      "and computes the routers' statistics")
    if rec.objective.mean_logp_input:
        if want:
            raise ConfigError("train.shared_prefix=true cannot hold: the recipe's loss (ROVER's) reads each position's "
                              "vocabulary-mean log-prob from the row's own forward pass (set train.shared_prefix=false)")
        return None, "the recipe's loss (ROVER's) reads each position's vocabulary-mean log-prob from the row's own pass"
    from jaxrl_llm.training.parts.shared_prefix import SharedPrefix

    parts = loop_parts(cfg, rec)
    on = {p.key for p in parts}  # what the shared-prefix part declares it cannot run with
    clash = [c.other for c in SharedPrefix.conflicts if c.other in on]
    # parts that declare they cannot run with it (their own forward passes)
    refuse = [f"{p.key}: {c.why}" for p in parts for c in type(p).conflicts if c.other == "train.shared_prefix"]
    ppm = cfg.rollout.prompts_per_step * max(1, len(cfg.data.budgets))  # prompt groups per step
    if refuse:
        why = refuse[0]
    elif clash:
        why = f"{', '.join(clash)} gives the rows of a prompt group different prompts or counts"
    elif want is None and rec.num_minibatches > 1 and "group_ids" not in rec.objective.batch_keys():
        why = (f"recipe.num_minibatches={rec.num_minibatches} deals rows, not whole prompt groups, into mini-batches "
               f"(train.shared_prefix=true deals whole groups instead)")
    elif ppm % rec.num_minibatches:
        why = (f"the {ppm} prompt groups of a step do not split into recipe.num_minibatches={rec.num_minibatches} "
               f"mini-batches of whole groups")
    else:
        plan, why = plan_shared_prefix(rec.num_samples, ppm // rec.num_minibatches, cfg.optim.num_microbatches,
                                       batch_ways)
        if plan is not None:
            return plan, ""
    if want is True:
        raise ConfigError(f"train.shared_prefix=true cannot hold: {why} (set train.shared_prefix=false, or leave it "
                          f"unset to use it where it holds)")
    return None, why


def _unroll_choice(cfg: RLRunConfig) -> bool | str:
    """``rollout.unroll_layers`` as the samplers take it (unset, in a config not resolved by
    :func:`resolve_execution`: their ``"auto"`` rule)."""
    u = cfg.rollout.unroll_layers
    return "auto" if u is None else u


def _sampling(cfg: RLRunConfig, stop_ids, pad_id):
    from jaxrl_llm.rollout import SamplingConfig

    ro = cfg.rollout
    return SamplingConfig(max_new_tokens=ro.max_new_tokens, num_samples=ro.num_samples, temperature=ro.temperature,
                          top_p=ro.top_p, stop_token_ids=tuple(stop_ids), pad_token_id=pad_id,
                          weight_dtype=ro.sampler_dtype, shared_prompt_kv=bool(ro.shared_prompt_kv))


def _check_fields(cfg: RLRunConfig, *, files: bool = False) -> None:
    """Field-level checks with one-line errors naming the key, the value and the fix (``files``:
    also that the data files exist, which only the machine that runs needs)."""
    ro, d, s = cfg.rollout, cfg.data, cfg.sft

    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(msg)

    need(isinstance(ro.staleness, int) and not isinstance(ro.staleness, bool) and ro.staleness >= 0,
         f"rollout.staleness must be an int >= 0, got {ro.staleness!r}")
    for key in ("prompts_per_step", "num_samples", "max_new_tokens", "candidates"):
        v = getattr(ro, key)
        need(isinstance(v, int) and v >= 1, f"rollout.{key} must be an int >= 1, got {v!r}")
    need(ro.candidates == 1 or not d.budgets, f"rollout.candidates={ro.candidates} (a prompt selector) and data.budgets "
                                              f"(HBPO's consecutive budget variants) cannot be combined")
    need(ro.temperature > 0, f"rollout.temperature must be > 0, got {ro.temperature} (the policy is trained on what "
                             f"it samples; greedy decoding is for evaluation)")
    need(0 < ro.top_p <= 1, f"rollout.top_p must be in (0, 1], got {ro.top_p}")
    need(bool(ro.prompt_buckets) and all(b >= 1 for b in ro.prompt_buckets),
         f"rollout.prompt_buckets must be lengths >= 1, got {list(ro.prompt_buckets)}")
    need(isinstance(ro.sampler_devices, int) and not isinstance(ro.sampler_devices, bool) and ro.sampler_devices >= 0,
         f"rollout.sampler_devices must be an int >= 0, got {ro.sampler_devices!r}")
    need(isinstance(ro.asynchronous, bool), f"rollout.asynchronous must be true or false, got {ro.asynchronous!r}")
    need(ro.unroll_layers is None or isinstance(ro.unroll_layers, bool),
         f"rollout.unroll_layers must be true, false or unset, got {ro.unroll_layers!r}")
    need(ro.shared_prompt_kv is None or isinstance(ro.shared_prompt_kv, bool),
         f"rollout.shared_prompt_kv must be true, false or unset, got {ro.shared_prompt_kv!r}")
    from jaxrl_llm.models.config import REMAT

    need(cfg.model.remat == "auto" or cfg.model.remat in REMAT,
         f"model.remat must be auto or one of {', '.join(REMAT)}, got {cfg.model.remat!r}")
    need(not ro.asynchronous or (ro.sampler_devices and ro.staleness),
         "rollout.asynchronous=true samples the next step on the sampler's own devices during this step's update: "
         f"set rollout.sampler_devices >= 1 and rollout.staleness >= 1 (got {ro.sampler_devices} and {ro.staleness})")
    need(ro.tree_segment is None or (isinstance(ro.tree_segment, int) and not isinstance(ro.tree_segment, bool)
                                     and ro.tree_segment >= 1),
         f"rollout.tree_segment must be an int >= 1 (tokens per segment) or null, got {ro.tree_segment!r}")
    need(isinstance(ro.tree_branch, int) and not isinstance(ro.tree_branch, bool) and ro.tree_branch >= 1,
         f"rollout.tree_branch must be an int >= 1, got {ro.tree_branch!r}")
    need(ro.tree_segment is None or (not ro.sampler_devices and ro.sampler_weights == "train"),
         "rollout.tree_segment (TreePO's tree sampler) runs on the trainer's devices and weights: leave "
         "rollout.sampler_devices=0 and rollout.sampler_weights=train")
    need(ro.sampler_weights in ("train", "tensor"),
         f"rollout.sampler_weights must be 'train' or 'tensor', got {ro.sampler_weights!r}")
    from jaxrl_llm.models.config import ATTENTION

    need(cfg.model.attention in ATTENTION, f"model.attention must be one of {ATTENTION}, got {cfg.model.attention!r}")
    if d.dataset:
        need(d.dataset_format in ("gsm8k", "rows"), f"data.dataset_format must be 'gsm8k' or 'rows', got "
                                                    f"{d.dataset_format!r}")
        need(bool(d.eval_dataset), f"data.eval_dataset is required with data.dataset={d.dataset!r} (held-out prompts "
                                   f"for evaluation): set data.eval_dataset=<file>")
        for key in ("dataset", "eval_dataset") if files else ():
            need(Path(getattr(d, key)).exists(), f"data.{key}={getattr(d, key)!r}: no such file or directory")
    else:
        from jaxrl_llm.tasks import get_task

        try:
            get_task(d.task, **dict(d.task_args))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"data.task={d.task!r} with data.task_args={dict(d.task_args)}: {e}") from None
    need(d.eval_rows >= 1 and d.train_rows >= 1, f"data.train_rows and data.eval_rows must be >= 1, got "
                                                 f"{d.train_rows}, {d.eval_rows}")
    need(0.0 <= s.target_accuracy <= 1.0, f"sft.target_accuracy must be in [0, 1], got {s.target_accuracy}")
    need(not s.target_accuracy or (s.probe_every >= 1 and s.probe_rows >= 1),
         "sft.probe_every and sft.probe_rows must be >= 1 when sft.target_accuracy is set")
    need(not (s.steps and d.dataset), "sft.steps > 0 needs a task with reference solutions (data.task), not "
                                      "data.dataset")
    for key, (lr, steps, warm, sched) in (("optim", (cfg.optim.lr, cfg.run.steps, cfg.optim.warmup_steps,
                                                     cfg.optim.schedule)),
                                          ("sft", (s.lr, s.steps, s.warmup_steps, s.schedule))):
        if key == "sft" and not s.steps:
            continue
        try:
            make_optimizer(lr, steps, warmup_steps=warm, schedule=sched)
        except ValueError as e:
            raise ConfigError(str(e).replace("optim.", f"{key}.")) from None


def moe_routes(cfg: RLRunConfig, rec: RLRecipe, model_cfg) -> tuple[bool, str]:
    """``(available, why not)``: whether every trained row of a mixture of experts comes with
    the sampler's expert routes (replayed with ``train.routing_replay``, compared to the
    trainer's routing otherwise: ``moe/router_mismatch``)."""
    if not model_cfg.is_moe:
        return False, "not a mixture of experts"
    ro = cfg.rollout
    why = ("rollout.shared_prompt_kv=true (the prompts' routes are not recorded)" if ro.shared_prompt_kv else
           "rollout.tree_segment (TreePO)" if ro.tree_segment is not None else
           "train.shared_prefix=true" if cfg.train.shared_prefix else
           "recipe.replay (stored responses have no routes)" if rec.replay is not None else
           "recipe.hints (re-sampled rows)" if rec.hints is not None else "")
    return not why, why


def update_objective(cfg: RLRunConfig, rec: RLRecipe, model_cfg, batch_ways: int):
    """``(recipe, shared-prefix plan or None, why it is off)``: the recipe with the objective the
    run's update compiles (``train.*``: the shared prefix, routing replay, the router mismatch
    metric where the sampler's routes are at hand, the load-balancing weight). The runner and
    the planner (:func:`jaxrl_llm.plan.plan_spec_of`) both build it here."""
    prefix, why = shared_prefix_plan(cfg, rec, batch_ways, model_cfg.is_moe)
    rec = dataclasses.replace(rec, objective=dataclasses.replace(
        rec.objective, rows_per_prompt=prefix.rows_per_prompt if prefix else 0,
        routing_replay=bool(cfg.train.routing_replay), router_mismatch=moe_routes(cfg, rec, model_cfg)[0],
        router_aux_coef=float(cfg.train.router_aux_coef)))
    return rec, prefix, why


def longest_row(cfg: RLRunConfig) -> int:
    """Tokens of the longest training row a run can build: its largest prompt bucket that the
    data's prompts can fill, plus ``rollout.max_new_tokens``."""
    ro = cfg.rollout
    longest = min(max(ro.prompt_buckets), cfg.data.max_prompt_tokens)
    return min(b for b in ro.prompt_buckets if b >= longest) + ro.max_new_tokens


def _check_long(cfg: RLRunConfig, rec: RLRecipe, model_cfg) -> None:
    """Sequence lengths against the model, packing and context parallelism: one-line errors."""
    t, m, ro = cfg.train, cfg.mesh, cfg.rollout
    backend = jax.default_backend()
    for impl, needs in (("splash", ("tpu",)), ("cudnn", ("gpu", "cuda", "rocm"))):
        if cfg.model.attention == impl and backend not in needs:
            raise ConfigError(f"model.attention={impl} runs on {needs[0].upper()} only (this backend: {backend}); use "
                              "model.attention=auto or blockwise")
    if not (isinstance(cfg.model.attention_block, int) and cfg.model.attention_block >= 1):
        raise ConfigError(f"model.attention_block must be an int >= 1, got {cfg.model.attention_block!r}")
    longest = longest_row(cfg)
    if longest > model_cfg.max_position_embeddings:
        raise ConfigError(f"rows of up to {longest} tokens (prompt bucket {longest - ro.max_new_tokens} + "
                          f"rollout.max_new_tokens={ro.max_new_tokens}) exceed the model's max_position_embeddings="
                          f"{model_cfg.max_position_embeddings}: lower rollout.max_new_tokens or "
                          f"rollout.prompt_buckets")
    for key in ("max_tokens_per_microbatch", "logprob_tokens_per_microbatch"):
        v = getattr(t, key)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            raise ConfigError(f"train.{key} must be an int >= 0, got {v!r}")
    if not (isinstance(m.context, int) and m.context >= 1):
        raise ConfigError(f"mesh.context must be an int >= 1, got {m.context!r}")
    budget = t.max_tokens_per_microbatch
    if t.logprob_tokens_per_microbatch and not budget:
        raise ConfigError("train.logprob_tokens_per_microbatch is the packed log-prob passes' budget: set "
                          "train.max_tokens_per_microbatch too")
    if budget:
        for key, v in (("max_tokens_per_microbatch", budget),
                       ("logprob_tokens_per_microbatch", t.logprob_tokens_per_microbatch or 2 * budget)):
            if v < longest:
                raise ConfigError(f"train.{key}={v} is smaller than one row: the longest row has {longest} tokens "
                                  f"(prompt bucket {longest - ro.max_new_tokens} + rollout.max_new_tokens="
                                  f"{ro.max_new_tokens})")
        if cfg.optim.num_microbatches > 1:
            raise ConfigError(f"optim.num_microbatches={cfg.optim.num_microbatches} and "
                              "train.max_tokens_per_microbatch (packing) both set the micro-batches: keep one "
                              "(packing's follow the batch's tokens)")
        if model_cfg.is_moe:
            raise ConfigError("train.max_tokens_per_microbatch (packing) does not take a mixture of experts yet (its "
                              "routes and router statistics are per padded row): unset it")
        if rec.needs_critic:
            raise ConfigError("train.max_tokens_per_microbatch (packing) does not pack the critic's update yet: unset "
                              "it for a recipe with a critic")
        if rec.objective.mean_logp_input:
            raise ConfigError("train.max_tokens_per_microbatch (packing) does not compute the vocabulary-mean "
                              "log-probs the recipe's loss (ROVER's) reads: unset it")
        unpacked = [p.label for p in loop_parts(cfg, rec) if not type(p).packed_update]
        if unpacked:
            raise ConfigError(f"train.max_tokens_per_microbatch (packing) cannot be combined with {unpacked[0]} (its "
                              f"update's forward pass is not a packed one): unset it")
        if m.context > 1:
            for key, v in (("max_tokens_per_microbatch", budget),
                           ("logprob_tokens_per_microbatch", t.logprob_tokens_per_microbatch or 2 * budget)):
                if v % m.context:
                    raise ConfigError(f"mesh.context={m.context} must divide train.{key}={v} (each packed row's "
                                      "tokens are split over the context axis)")
    if m.context > 1:  # padded rows reach attention too (the providers' passes, the evaluator's prefill)
        bad = [b for b in ro.prompt_buckets if (b + ro.max_new_tokens) % m.context]
        if bad:
            raise ConfigError(f"mesh.context={m.context} must divide every row length: prompt bucket {bad[0]} + "
                              f"rollout.max_new_tokens={ro.max_new_tokens} = {bad[0] + ro.max_new_tokens}")


def _check_moe(cfg: RLRunConfig, rec: RLRecipe, model_cfg) -> None:
    """``train.routing_replay`` / ``train.router_aux_coef`` need a mixture of experts, and replay
    needs the sampler's routes of every trained row."""
    t = cfg.train
    if not (t.router_aux_coef >= 0):
        raise ConfigError(f"train.router_aux_coef must be >= 0, got {t.router_aux_coef!r}")
    if (t.routing_replay or t.router_aux_coef) and not model_cfg.is_moe:
        raise ConfigError(f"train.routing_replay / train.router_aux_coef apply to a mixture of experts; the model "
                          f"({model_cfg.family}) has none")
    if t.router_aux_coef and t.shared_prefix:
        raise ConfigError("train.router_aux_coef needs each row's own forward pass (the routers' statistics); it "
                          "cannot be combined with train.shared_prefix=true")
    if not t.routing_replay:
        return
    ok, why = moe_routes(cfg, rec, model_cfg)
    if not ok:
        raise ConfigError(f"train.routing_replay=true needs the sampler's routes of every trained row; it cannot be "
                          f"combined with {why}")


def _check_mesh(cfg: RLRunConfig, rec: RLRecipe, model_cfg, n_devices: int) -> None:
    m = cfg.mesh
    n = m.devices
    if n != n_devices:
        raise ConfigError(f"mesh: data*fsdp*tensor*expert*context = {m.data}*{m.fsdp}*{m.tensor}*{m.expert}*"
                          f"{m.context} = {n} must equal the number of devices ({n_devices})")
    if m.expert > 1 and not model_cfg.is_moe:
        raise ConfigError(f"mesh.expert={m.expert} splits the experts of a mixture of experts, but the model "
                          f"({model_cfg.family}) has none")
    if m.expert > 1 and model_cfg.num_experts % m.expert:
        raise ConfigError(f"mesh.expert={m.expert} must divide the model's {model_cfg.num_experts} experts")
    rows = cfg.rollout.prompts_per_step * cfg.rollout.num_samples
    batch_ways = m.batch_ways
    if rows % rec.num_minibatches:
        raise ConfigError(f"recipe.num_minibatches={rec.num_minibatches} must divide the rollout rows "
                          f"prompts_per_step*num_samples={rows}")
    per_update = rows // rec.num_minibatches
    if not cfg.train.max_tokens_per_microbatch and per_update % (batch_ways * cfg.optim.num_microbatches):
        raise ConfigError(f"each update has {per_update} rows, which must divide into optim.num_microbatches="
                          f"{cfg.optim.num_microbatches} micro-batches across data*fsdp*expert={batch_ways} devices")
    if m.tensor > 1:
        for name in ("num_heads", "num_kv_heads", "moe_intermediate_size" if model_cfg.is_moe else "intermediate_size"):
            v = getattr(model_cfg, name)
            if v % m.tensor:
                raise ConfigError(f"mesh.tensor={m.tensor} must divide model {name}={v}")


def loop_parts(cfg: RLRunConfig, rec: RLRecipe, prefix=None):
    """The run's loop parts at config time (no models yet), validated from their declarations:
    a missing need or a conflict is a one-line :class:`~jaxrl_llm.config.ConfigError`."""
    from jaxrl_llm.training.parts.registry import LoopSettings, build_parts

    ro = cfg.rollout
    return build_parts(LoopSettings(rec, candidates=ro.candidates, staleness=ro.staleness,
                                    asynchronous=bool(ro.asynchronous), sampler_dtype=ro.sampler_dtype,
                                    tree=ro.tree_segment, shared_prefix=prefix,
                                    processes=jax.process_count(), models=False))


def check_rl(cfg: RLRunConfig, *, n_devices: int | None = None) -> dict:
    """Validate ``cfg`` without loading weights or data; returns a summary (parameter count,
    rows per step, mesh, the resolved recipe). Raises :class:`~jaxrl_llm.config.ConfigError`
    naming the field that is wrong."""
    from flax import nnx

    from jaxrl_llm.models import Transformer

    _check_fields(cfg)
    cfg, execution = resolve_execution(cfg)
    try:
        model_cfg = model_config(cfg.model)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    rec = rl_recipe(cfg)
    ro = cfg.rollout
    from jaxrl_llm.rollout.sampling import WEIGHT_DTYPES

    if ro.sampler_dtype is not None and ro.sampler_dtype not in WEIGHT_DTYPES:
        raise ConfigError(f"rollout.sampler_dtype={ro.sampler_dtype!r}: must be one of {WEIGHT_DTYPES} or unset")
    if ro.shared_prompt_kv and ro.tree_segment is not None:
        raise ConfigError("rollout.shared_prompt_kv=true is not supported with rollout.tree_segment (the segment-tree "
                          "sampler copies the prompt's cache into its branches); unset one of them")
    hbpo = [f"recipe.{k}" for k, p in (("advantage", rec.estimator), *(("shaping", x) for x in rec.shaping))
            if p.name == "hbpo"]
    for key in hbpo:
        part = rec.estimator if key == "recipe.advantage" else next(x for x in rec.shaping if x.name == "hbpo")
        want = tuple(dict(part.kwargs)["budgets"])
        if tuple(cfg.data.budgets) != want:
            raise ConfigError(f"{key}=hbpo reads budgets {list(want)} by prompt group; data.budgets must be the same "
                              f"(the prompts' budget variants), got {list(cfg.data.budgets)}")
    if cfg.data.budgets and rec.group_filter.max_rounds > 1:
        raise ConfigError("data.budgets (budget variants of each question in consecutive prompt groups) cannot be "
                          "combined with a group filter, which reorders the groups")
    if "teacher_logp" in rec.requires and not (cfg.model.aux_params and cfg.model.reverse_params):
        raise ConfigError("recipe.loss=aligndistil distils a teacher made of a DPO model and a reverse-DPO model: set "
                          "model.aux_params and model.reverse_params (parameter directories of preference runs)")
    if "aux_logp" in rec.requires and not cfg.model.aux_params:
        raise ConfigError(f"recipe.advantage={rec.estimator.name} reads an auxiliary policy (a DPO-trained model): set "
                          f"model.aux_params=<a parameter directory, e.g. a preference run's final_params>")
    m_ = cfg.mesh
    if n_devices is not None and ro.sampler_devices:
        if ro.sampler_devices >= n_devices:
            raise ConfigError(f"rollout.sampler_devices={ro.sampler_devices} leaves none of the {n_devices} devices to "
                              f"the trainer")
        n_devices -= ro.sampler_devices
    _check_mesh(cfg, rec, model_cfg, n_devices or m_.devices)
    _check_moe(cfg, rec, model_cfg)
    _check_long(cfg, rec, model_cfg)
    prefix, prefix_off = shared_prefix_plan(cfg, rec, m_.batch_ways, model_cfg.is_moe)
    loop_parts(cfg, rec, prefix)
    abstract = nnx.eval_shape(lambda: Transformer(model_cfg, rngs=nnx.Rngs(0)))
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    variants = max(1, len(cfg.data.budgets))  # data.budgets: every question comes once per budget
    return {"params": n_params, "rows_per_step": cfg.rollout.prompts_per_step * variants * cfg.rollout.num_samples,
            "mesh": dataclasses.asdict(cfg.mesh), "model": model_cfg.to_dict(), "recipe": to_dict(rec.spec),
            "shared_prefix": (f"blocks of {prefix.rows_per_prompt} rows" if prefix else f"off: {prefix_off}"),
            "execution": execution.to_dict()}


def resolve_execution(cfg: RLRunConfig, platform: str | None = None, rec: RLRecipe | None = None):
    """``(cfg with its auto execution settings resolved, the Execution)``: ``model.remat=auto``,
    ``rollout.shared_prompt_kv`` and ``rollout.unroll_layers`` unset become the values
    :func:`jaxrl_llm.training.auto.choose` picks for the run's shapes on ``platform`` (default:
    JAX's backend); values the config sets are kept. ``rec``: the run's resolved recipe, when the
    caller has it."""
    from jaxrl_llm.training.auto import resolve_rl
    from jaxrl_llm.training.loading import shapes_of

    try:
        shapes = shapes_of(cfg.model)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return resolve_rl(cfg, rec if rec is not None else rl_recipe(cfg), shapes, platform)


# ----------------------------------------------------------------------------- the run


@dataclasses.dataclass
class _Setup:
    """What the phases of :func:`run_rl` share."""

    cfg: RLRunConfig
    out: Path
    host0: bool
    mesh: Any
    gd: Any
    params: Any
    frozen_state: Any
    base_cfg: Any
    tok: Any
    stop: int
    pad: int
    sampler_mesh: Any = None  # rollout.sampler_devices: the sampler's own devices

    @property
    def frozen(self) -> tuple:
        return (self.frozen_state,)

    def evaluator(self, rows, score_fn):
        from jaxrl_llm.training.evaluate import Evaluator

        c = self.cfg
        return Evaluator(self.gd, self.tok, rows, score_fn, max_new_tokens=c.rollout.max_new_tokens,
                         stop_token_ids=(self.stop,), pad_token_id=self.pad, chat=c.data.chat,
                         system_prompt=c.data.system_prompt, batch_size=c.run.eval_batch_size,
                         length_buckets=tuple(c.rollout.prompt_buckets), unroll_layers=_unroll_choice(c))


def _setup(cfg: RLRunConfig, resolved: dict) -> _Setup:
    """Output folder, mesh, policy (split into trained and frozen parts), tokenizer."""
    from flax import nnx

    from jaxrl_llm.data import end_of_turn_id
    from jaxrl_llm.models import trainable

    out = Path(cfg.run.out)
    host0 = jax.process_index() == 0
    out.mkdir(parents=True, exist_ok=True)
    if host0:
        (out / "config.json").write_text(json.dumps(resolved, indent=1))
    mesh = sampler_mesh = None
    m_ = cfg.mesh
    k = cfg.rollout.sampler_devices
    from jaxrl_llm.parallel import make_mesh

    if k:  # the sampler's devices first, the trainer's after them
        devs = jax.devices()
        if k >= len(devs) or (len(devs) - k) != m_.devices:
            raise ConfigError(f"rollout.sampler_devices={k} of {len(devs)} devices leaves {len(devs) - k} to the "
                              f"trainer; mesh data*fsdp*tensor*expert = {m_.devices} must equal that")
        mesh = make_mesh(*m_.shape_axes(), devices=devs[k:])
        sampler_mesh = make_mesh((k, 1, 1), devices=devs[:k])
    elif m_.devices > 1:
        mesh = make_mesh(*m_.shape_axes())
    model, tok = load_policy(cfg.model, seed=cfg.run.seed, mesh=mesh)
    gd, params, frozen_state = nnx.split(model, trainable(model.cfg), ...)
    if cfg.model.init_params:  # the policy (and so the reference) starts from another run's parameters
        from jaxrl_llm.training.loading import load_aux_params

        params = load_aux_params(cfg.model.init_params, params, "model.init_params")
    stop = end_of_turn_id(tok, cfg.data.chat)
    pad = tok.pad_token_id if tok.pad_token_id is not None else stop
    return _Setup(cfg, out, host0, mesh, gd, params, frozen_state, model.cfg, tok, stop, pad, sampler_mesh)


def _before_rl(s: _Setup, evaluate, train_src, sft_rows, score_fn, tel, resuming: bool) -> tuple[Any, dict]:
    """Held-out accuracy before training and the optional SFT warm-up (both skipped on resume,
    where ``eval_before.json`` holds them)."""
    from jaxrl_llm.training.sft import sft_warmup

    import orbax.checkpoint as ocp

    cfg, params = s.cfg, s.params
    before_path, start_path = s.out / "eval_before.json", (s.out / "sft_params").absolute()
    if resuming and before_path.exists():
        if cfg.sft.steps:  # the post-SFT policy: the frozen reference of a KL term starts from it
            if not start_path.exists():
                raise ConfigError(f"run.out={str(s.out)!r} resumes a run with an SFT warm-up but has no sft_params/ "
                                  f"(written by runs of this version): start in a new run.out")
            with ocp.StandardCheckpointer() as c:
                params = c.restore(start_path, params)
        return params, json.loads(before_path.read_text())
    summary: dict[str, Any] = {"eval_before": evaluate(params, *s.frozen)}
    summary["eval_before_samples"] = [{"prompt": r["prompt"], "completion": c}
                                      for r, c in zip(evaluate.rows[:8], evaluate.last_completions[:8])]
    if cfg.sft.steps:
        probe = None
        if cfg.sft.target_accuracy:
            p_eval = s.evaluator([train_src[i] for i in range(min(cfg.sft.probe_rows, len(train_src)))], score_fn)
            probe = lambda p: p_eval(p, *s.frozen)  # noqa: E731
        params, summary["sft"] = sft_warmup(cfg, s.gd, params, s.frozen, s.tok, sft_rows, tel, probe=probe)
        summary["eval_after_sft"] = evaluate(params, *s.frozen)
        with ocp.StandardCheckpointer() as c:  # for a resumed run's reference policy
            c.save(start_path, params, force=True)
    if s.host0:
        before_path.write_text(json.dumps(jsonable(summary)))
    return params, summary


def _trainer(s: _Setup, rec: RLRecipe, params, train_src, reward_fn, evaluate, tel, ckpt, resolved):
    """The :class:`~jaxrl_llm.training.RLTrainer` of the run: optimiser, train state (sharded on a
    mesh), reference policy and critic when the recipe requires them, data, sampler."""
    from flax import nnx

    from jaxrl_llm.data import PromptDataConfig, prompt_dataset
    from jaxrl_llm.rollout import Sampler
    from jaxrl_llm.training.loop import RLTrainer
    from jaxrl_llm.training.rl import Critic
    from jaxrl_llm.training.step import init_train_state, make_train_step, train_state_shardings

    cfg, o, mesh = s.cfg, s.cfg.optim, s.mesh
    opt = make_optimizer(o.lr, cfg.run.steps, warmup_steps=o.warmup_steps, schedule=o.schedule,
                         weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, max_grad_norm=o.max_grad_norm)
    state = init_train_state(params, opt, seed=cfg.run.seed)
    shard_kw = {}
    if mesh is not None:
        from jaxrl_llm.parallel import state_shardings

        st_sh = train_state_shardings(opt, state, mesh)
        state = jax.device_put(state, st_sh)
        shard_kw = dict(state_shardings=st_sh, frozen_shardings=(state_shardings(s.frozen_state, mesh),))
    ref_params = None
    if rec.needs_reference:
        if cfg.model.offload_reference:
            from jaxrl_llm.parallel import to_host_memory

            ref_params = to_host_memory(params)
        else:
            ref_params = jax.tree.map(lambda x: x.copy(), params)
    rec, prefix, why = update_objective(cfg, rec, s.base_cfg, cfg.mesh.batch_ways if mesh is not None else 1)
    log.info("train.shared_prefix: %s", f"on, blocks of {prefix.rows_per_prompt} rows" if prefix else f"off ({why})")
    budget = cfg.train.max_tokens_per_microbatch
    ways = cfg.mesh.batch_ways if mesh is not None else 1
    if budget:  # packing: micro-batches of one packed row per batch device (data/packing.py)
        from jaxrl_llm.training.packed_step import make_packed_train_step

        train_step = make_packed_train_step(s.gd, opt, rec.objective, budget=budget, ways=ways, mesh=mesh,
                                            **shard_kw)
    else:
        train_step = make_train_step(s.gd, opt, rec.objective, num_microbatches=o.num_microbatches, **shard_kw)
    data = prompt_dataset(train_src, s.tok,
                          PromptDataConfig(batch_size=cfg.rollout.prompts_per_step * cfg.rollout.candidates,
                                           chat=cfg.data.chat,
                                           budgets=tuple(cfg.data.budgets), budget_template=cfg.data.budget_template,
                                           system_prompt=cfg.data.system_prompt, seed=cfg.run.seed + 1,
                                           max_prompt_tokens=cfg.data.max_prompt_tokens),
                          process_index=0, process_count=1)  # the global batch on every host (loop docstring)
    sampler_rules = None
    if mesh is not None and cfg.rollout.sampler_weights == "tensor":
        from jaxrl_llm.parallel import SAMPLER_RULES as sampler_rules
    sampler_mesh = mesh
    if s.sampler_mesh is not None:  # its own devices: the weights are copied there at every rollout
        from jaxrl_llm.parallel import DEFAULT_RULES

        sampler_mesh, sampler_rules = s.sampler_mesh, sampler_rules or DEFAULT_RULES
    if cfg.rollout.tree_segment is not None:  # TreePO: responses share their first segments
        from jaxrl_llm.rollout import TreeSampler

        sampler = TreeSampler(s.gd, _sampling(cfg, (s.stop,), s.pad), segment=cfg.rollout.tree_segment,
                              branch=cfg.rollout.tree_branch, length_buckets=tuple(cfg.rollout.prompt_buckets),
                              unroll_layers=_unroll_choice(cfg))
    else:
        sampler = Sampler(s.gd, _sampling(cfg, (s.stop,), s.pad), length_buckets=tuple(cfg.rollout.prompt_buckets),
                          mesh=sampler_mesh, param_rules=sampler_rules, unroll_layers=_unroll_choice(cfg))
    critic = None
    if rec.needs_critic:
        base = nnx.state(nnx.merge(s.gd, params, s.frozen_state), nnx.Param)  # backbone (LoRA adapters excluded)
        critic = Critic.create(s.base_cfg.replace(lora=None),
                               make_optimizer(cfg.recipe.critic_lr, cfg.run.steps, warmup_steps=o.warmup_steps,
                                              max_grad_norm=o.max_grad_norm),
                               rec.value_objective, policy_params=base, seed=cfg.run.seed,
                               num_microbatches=o.num_microbatches, mesh=mesh)
    prompt_value = None
    if rec.selector is not None and "prompt_value" in rec.selector.part.requires:  # PCL's value model of prompts
        from jaxrl_llm.training.objectives import ValueObjective

        base = nnx.state(nnx.merge(s.gd, params, s.frozen_state), nnx.Param)
        prompt_value = Critic.create(s.base_cfg.replace(lora=None),
                                     make_optimizer(cfg.recipe.critic_lr, cfg.run.steps, max_grad_norm=o.max_grad_norm),
                                     ValueObjective(None, "token-mean"), policy_params=base, seed=cfg.run.seed + 7,
                                     mesh=mesh)
    trainer = None

    def log_fn(metrics: dict) -> None:
        tel(metrics)
        it = metrics["iteration"]
        if cfg.run.log_samples_every and (it == 1 or it % cfg.run.log_samples_every == 0):
            tel.log_samples(it, trainer.last_samples(4))

    aux_params = None
    if "aux_logp" in rec.requires or "teacher_logp" in rec.requires:
        from jaxrl_llm.training.loading import load_aux_params

        aux_params = load_aux_params(cfg.model.aux_params, params)
    if "teacher_logp" in rec.requires:  # AlignDistil: the reverse-DPO model takes the reference's slot
        from jaxrl_llm.training.loading import load_aux_params

        ref_params = load_aux_params(cfg.model.reverse_params, params, "model.reverse_params")
    def encode(raw):  # a (hinted) prompt rendered and tokenised as the data pipeline does
        from jaxrl_llm.data.pipeline import encode_prompt

        return encode_prompt(s.tok, raw, chat=cfg.data.chat, system_prompt=cfg.data.system_prompt)

    trainer = RLTrainer(s.gd, state, train_step, sampler, data, _rewards(cfg, reward_fn), rec, s.tok,
                        seed=cfg.run.seed, frozen=s.frozen, ref_params=ref_params, critic=critic, checkpointer=ckpt,
                        aux_params=aux_params, store=PromptStore(cfg.data.pass_threshold),
                        candidates=cfg.rollout.candidates, staleness=cfg.rollout.staleness,
                        asynchronous=cfg.rollout.asynchronous, prompt_encoder=encode, prompt_value=prompt_value,
                        shared_prefix=prefix, logprob_packing=_logprob_packing(s),
                        checkpoint_every=cfg.run.checkpoint_every, eval_fn=evaluate, eval_every=cfg.run.eval_every,
                        log_fn=log_fn, config=resolved)
    return trainer


def _logprob_packing(s: _Setup):
    """The packed log-prob passes of a packing run (``train.max_tokens_per_microbatch``), else None."""
    t = s.cfg.train
    if not t.max_tokens_per_microbatch:
        return None
    from jaxrl_llm.training.packed_step import PackedLogprobs

    return PackedLogprobs(s.gd, t.logprob_tokens_per_microbatch or 2 * t.max_tokens_per_microbatch,
                          s.cfg.mesh.batch_ways if s.mesh is not None else 1, mesh=s.mesh)


def _finish(s: _Setup, trainer, history: list[dict], evaluate, summary: dict, start_acc: float) -> None:
    """Held-out accuracy after RL, the HF export and the reward-curve plot."""
    from flax import nnx

    from jaxrl_llm.models import save_hf
    from jaxrl_llm.training.plots import have_matplotlib, plot_run

    cfg = s.cfg
    last_eval = history[-1] if history and "eval/accuracy" in history[-1] else None
    summary["eval_after"] = ({k: v for k, v in last_eval.items() if k.startswith("eval/")} if last_eval
                             else evaluate(trainer.state.params, *s.frozen))
    summary["eval_after_samples"] = [{"prompt": r["prompt"], "completion": c}
                                     for r, c in zip(evaluate.rows[:8], evaluate.last_completions[:8])]
    summary["accuracy_change"] = summary["eval_after"]["eval/accuracy"] - start_acc
    summary["reward_first_5"] = float(np.mean([h["rewards/total/mean"] for h in history[:5]]))
    summary["reward_last_5"] = float(np.mean([h["rewards/total/mean"] for h in history[-5:]]))
    if cfg.run.export_hf:
        weights = (trainer.state.params, s.frozen_state)
        if jax.process_count() > 1:  # every process takes part in fetching the shards
            from jaxrl_llm.parallel import gather

            weights = gather(weights)
        if s.host0:
            save_hf(nnx.merge(s.gd, *weights), s.out / "hf",
                    tokenizer=s.tok if hasattr(s.tok, "save_pretrained") else None)
        summary["hf_export"] = str(s.out / "hf")
    if s.host0 and cfg.run.plot:
        if have_matplotlib():
            plot_run(history, s.out / "reward_curve.png", start_acc, summary["eval_after"]["eval/accuracy"])
            summary["plot"] = str(s.out / "reward_curve.png")
        else:
            log.warning("run.plot: matplotlib is not installed, so reward_curve.png is not drawn "
                        "(pip install 'jaxrl_llm[plot]', or set run.plot=false)")
            summary["plot"] = None


def run_rl(cfg: RLRunConfig) -> dict:
    """Run (or resume) the RL experiment ``cfg``; returns the summary (also ``summary.json``)."""
    from jaxrl_llm.shapes import BucketError

    try:
        return _run_rl(cfg)
    except BucketError as e:
        if e.buckets != tuple(sorted(cfg.rollout.prompt_buckets)):
            raise
        bigger = 1 << (e.length - 1).bit_length()
        raise ConfigError(f"a prompt of {e.length} tokens is longer than the largest of rollout.prompt_buckets="
                          f"{list(e.buckets)}: add a larger bucket (rollout.prompt_buckets="
                          f"{list(e.buckets) + [bigger]}) or skip long prompts with data.max_prompt_tokens="
                          f"{max(e.buckets)}") from None


def _run_rl(cfg: RLRunConfig) -> dict:
    from jaxrl_llm.training.checkpoint import Checkpointer
    from jaxrl_llm.training.telemetry import Telemetry

    from jaxrl_llm.training.host_loop import use_compile_cache

    t_start = time.perf_counter()
    _check_fields(cfg, files=True)
    use_compile_cache(cfg.run.compile_cache)
    rec = rl_recipe(cfg)  # every name is resolved (and checked) before anything loads
    cfg, execution = resolve_execution(cfg, rec=rec)  # auto execution settings, from the shapes (training/auto.py)
    if jax.process_index() == 0:
        print(execution.line(), flush=True)
    try:
        mcfg = model_config(cfg.model)
        _check_long(cfg, rec, mcfg)  # lengths against the model, packing, context
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if jax.device_count() - cfg.rollout.sampler_devices == cfg.mesh.devices:  # (else the mesh check says why)
        from jaxrl_llm.training.preflight import preflight

        pre = preflight(cfg, rec, mcfg, force=cfg.run.force)
        log.info("preflight (%s): %.2f GiB per device planned at most, %.1f GiB available", pre["checked"],
                 pre.get("planned_bytes", pre["bound_bytes"]) / 2**30, pre["available_bytes"] / 2**30)
    resolved = {**to_dict(dataclasses.replace(cfg, recipe=rec.spec)), "execution": execution.to_dict()}
    s = _setup(cfg, resolved)
    _check_mesh(cfg, rec, s.base_cfg, jax.device_count() - cfg.rollout.sampler_devices)
    train_src, eval_rows, sft_rows, reward_fn, score_fn = _rows(cfg)
    evaluate = s.evaluator(eval_rows, score_fn)
    tel = Telemetry(s.out, tensorboard=cfg.run.tensorboard, console_every=cfg.run.console_every, step_key="iteration")
    ckpt = Checkpointer(s.out / "ckpt", keep_last=cfg.run.keep_last)
    params, before = _before_rl(s, evaluate, train_src, sft_rows, score_fn, tel, ckpt.latest_step() is not None)
    summary: dict[str, Any] = {"config": resolved, **before}
    start_acc = summary.get("eval_after_sft", summary["eval_before"])["eval/accuracy"]

    trainer = _trainer(s, rec, params, train_src, reward_fn, evaluate, tel, ckpt, resolved)
    if trainer.restore():
        log.info("resumed from %s at step %d", ckpt.directory, trainer.iteration)
    t0 = time.perf_counter()
    # context parallelism: the trainer's programs are traced under the mesh, so that activations (their
    # tokens) are split over the context axis and attention gathers keys and values across it
    with (jax.set_mesh(s.mesh) if s.mesh is not None and cfg.mesh.context > 1 else contextlib.nullcontext()):
        history = trainer.run(cfg.run.steps, progress=cfg.run.progress and s.host0)
    summary["rl_seconds_this_process"] = time.perf_counter() - t0
    summary["steps"] = trainer.iteration
    if trainer.iteration < cfg.run.steps:  # preempted: the checkpoint is saved, stop here
        summary["preempted"] = True
        ckpt.close()
        tel.close()
        return summary
    _finish(s, trainer, history, evaluate, summary, start_acc)
    ckpt.close()
    tel.close()
    summary["seconds_this_process"] = time.perf_counter() - t_start
    if s.host0:
        (s.out / "summary.json").write_text(json.dumps(jsonable(summary), indent=1))
        acc = [("start", summary["eval_before"])] + ([("after SFT", summary["eval_after_sft"])]
                                                     if "eval_after_sft" in summary else [])
        acc.append(("after RL", summary["eval_after"]))
        print(f"held-out accuracy ({int(summary['eval_after']['eval/n'])} problems, greedy): "
              + " -> ".join(f"{k} {v['eval/accuracy']:.3f}" for k, v in acc) + f"  [{s.out}]", flush=True)
    return {k: v for k, v in summary.items() if k not in ("config", "eval_before_samples", "eval_after_samples")}

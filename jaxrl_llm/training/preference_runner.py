"""An offline preference run from one config: SFT warm-up -> pairs -> DPO (or any preference
recipe) -> held-out accuracy, with an optional SFT control.

:func:`run_preference` is what ``jaxrl-llm train`` calls for an experiment whose ``config()``
returns a :class:`~jaxrl_llm.training.configs.PreferenceRunConfig` (``experiments/tiny_dpo.py``).

Pairs (``pairs.source="self"``): for each training prompt of the task, chosen = the task's
reference solution, rejected = the first wrong answer among the SFT policy's own samples (else
a near miss: off by one or ten). The SFT policy is also the frozen reference. The control
continues plain SFT on the chosen answers for as many steps instead, so the summary shows
whether the preference phase beats more SFT. Both phases use the library's trainers
(:class:`~jaxrl_llm.training.SFTTrainer`, :class:`~jaxrl_llm.training.PreferenceTrainer`) with
checkpoints: re-running with the same ``run.out`` resumes (or skips) each phase.

Outputs in ``run.out``: ``config.json``, ``metrics.jsonl`` (the preference steps), ``sft_ckpt/``,
``ckpt/`` and ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.config import ConfigError, to_dict
from jaxrl_llm.training.configs import PreferenceRunConfig
from jaxrl_llm.training.loading import load_policy
from jaxrl_llm.training.optim import make_optimizer
from jaxrl_llm.training.telemetry import jsonable

__all__ = ["run_preference", "check_preference", "preference_run_objective", "self_generated_pairs", "spin_pairs"]


def preference_run_objective(cfg: PreferenceRunConfig):
    """The run's :class:`~jaxrl_llm.training.PreferenceObjective`: the preset, with another loss or
    the preset loss's arguments and the NLL weight overridden."""
    from jaxrl_llm.training.preference import PREFERENCE_RECIPES, preference_objective, preference_recipe

    r = cfg.recipe
    preset = preference_recipe(r.name)  # an unknown preset fails with its own message
    sft_coef = preset.sft_coef if r.sft_coef is None else r.sft_coef  # RPO's NLL term stays with another loss
    if r.loss.name is not None and r.loss.name != PREFERENCE_RECIPES[r.name].loss:
        return preference_objective(r.loss.name, sft_coef=sft_coef, **r.loss.args)
    return preference_recipe(r.name, sft_coef=sft_coef, **r.loss.args)


def resolve_preference_execution(cfg: PreferenceRunConfig):
    """``(cfg with model.remat=auto resolved, the Execution)``: from one update micro-batch of
    pairs (chosen and rejected rows) at the longest prompt bucket plus ``pairs.max_new_tokens``
    (:func:`jaxrl_llm.training.auto.resolve_remat`)."""
    from jaxrl_llm.training.auto import resolve_remat

    rows = 2 * cfg.pairs.batch_size // max(1, cfg.optim.num_microbatches)
    try:
        model, execution = resolve_remat(cfg.model, rows, max(cfg.prompt_buckets) + cfg.pairs.max_new_tokens)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return dataclasses.replace(cfg, model=model), execution


def check_preference(cfg: PreferenceRunConfig) -> dict:
    """Validate ``cfg`` without running anything; raises :class:`~jaxrl_llm.config.ConfigError`."""
    from jaxrl_llm.tasks import get_task

    obj = preference_run_objective(cfg)
    p = cfg.pairs
    for key in ("prompts", "samples_per_prompt", "max_new_tokens", "held_out", "batch_size"):
        if getattr(p, key) < 1:
            raise ConfigError(f"pairs.{key} must be >= 1, got {getattr(p, key)}")
    if p.iterations < 1:
        raise ConfigError(f"pairs.iterations must be >= 1, got {p.iterations}")
    if p.iterations > 1 and p.source != "spin":
        raise ConfigError(f"pairs.iterations={p.iterations} is SPIN's self-play (pairs.source=spin), not "
                          f"pairs.source={p.source!r}")
    if obj.token_weighted and not cfg.model.aux_params:
        raise ConfigError(f"recipe.loss {obj.name!r} weighs tokens by an auxiliary model's token rewards: set "
                          f"model.aux_params=<a parameter directory, e.g. a DPO run's final_params>")
    if p.source == "spin" and not obj.needs_reference:
        raise ConfigError(f"pairs.source=spin trains against the previous iterate as the reference; loss {obj.name!r} "
                          f"has none (use recipe.name=spin or a reference-based loss)")
    if p.source == "spin" and not obj.paired:
        raise ConfigError(f"pairs.source=spin plays the reference answer against the policy's own sample as a "
                          f"pair; loss {obj.name!r} takes unpaired rows (use a paired loss: spin, dpo, ipo, ...)")
    if p.split not in ("", "easy", "hard"):
        raise ConfigError(f"pairs.split must be '', 'easy' or 'hard' (MPO's data selection), got {p.split!r}")
    if p.split and p.source in ("self", "spin"):
        raise ConfigError(f"pairs.split={p.split!r} selects pairs by their reward-model scores: it needs a pairs file "
                          f"whose rows carry them (pairs.source=<file>, pairs.score_fields), not "
                          f"pairs.source={p.source!r}")
    if p.split and (isinstance(p.margin, bool) or not isinstance(p.margin, (int, float))
                    or not math.isfinite(p.margin)):
        raise ConfigError(f"pairs.split={p.split!r} needs pairs.margin, the score gap at and above which a pair is "
                          f"easy (a finite number), got {p.margin!r}")
    if len(p.score_fields) != 2 or not all(isinstance(f, str) and f for f in p.score_fields):
        raise ConfigError(f"pairs.score_fields must be two field names (chosen, rejected), got {p.score_fields!r}")
    if getattr(obj, "slots", 2) == 3:
        if not p.rationale_field or p.source in ("self", "spin"):
            raise ConfigError(f"recipe.loss={obj.name} learns each pair's rationale: it needs a pairs file "
                              f"(pairs.source=<file>) whose rows carry one, named by pairs.rationale_field")
        if cfg.train.max_tokens_per_microbatch:
            raise ConfigError(f"recipe.loss={obj.name} adds a rationale row to each pair; packing "
                              f"(train.max_tokens_per_microbatch) takes pairs of two rows: set it to 0")
    elif p.rationale_field or p.rationale_template:
        raise ConfigError(f"pairs.rationale_field / pairs.rationale_template are read by a rationale loss "
                          f"(recipe.loss=rdpo); recipe.loss={obj.name} would ignore them")
    if p.rationale_template:
        from jaxrl_llm.data.pipeline import rationale_prompt

        try:
            rationale_prompt(p.rationale_template, "q", "a", "b")
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(f"pairs.rationale_template may use {{prompt}}, {{chosen}} and {{rejected}} only: "
                              f"{type(e).__name__}: {e}") from None
    if cfg.model.init_params:
        raise ConfigError("model.init_params starts an RL run from another run's parameters; a preference run "
                          "starts from model.source (and its SFT warm-up)")
    if p.source not in ("self", "spin"):
        for key, path in (("pairs.source", p.source), ("pairs.eval_source", p.eval_source)):
            if not path:
                raise ConfigError(f"{key} is required with a pairs file (pairs.source={p.source!r})")
    try:
        get_task(cfg.data.task, **dict(cfg.data.task_args))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"data.task={cfg.data.task!r} with data.task_args={dict(cfg.data.task_args)}: {e}") from None
    if p.batch_size % cfg.optim.num_microbatches:
        raise ConfigError(f"optim.num_microbatches={cfg.optim.num_microbatches} must divide pairs.batch_size="
                          f"{p.batch_size}")
    return {"loss": obj.name, "needs_reference": obj.needs_reference, "paired": obj.paired}


def _near_miss(answer: int, rng: np.random.Generator) -> str:
    """A plausible wrong answer: off by one or by ten (a dropped or extra carry)."""
    return str(answer + int(rng.choice([-10, -1, 1, 10])))


def _policy_samples(rows, sampler, params, tok, seed: int, frozen: tuple = ()):
    """``(row, [the policy's decoded samples for its prompt])`` for every row, sampled 256
    prompts at a time with keys ``fold_in(key(seed), first row)``."""
    prompt_ids = [tok(r["prompt"])["input_ids"] for r in rows]
    g = sampler.config.num_samples
    for s in range(0, len(rows), 256):
        roll = sampler(params, prompt_ids[s:s + 256], jax.random.fold_in(jax.random.key(seed), s), *frozen)
        toks, mask = np.asarray(roll.tokens), np.asarray(roll.mask).astype(bool)
        for i, row in enumerate(rows[s:s + 256]):
            yield row, [tok.decode(toks[j][mask[j]], skip_special_tokens=True) for j in range(i * g, (i + 1) * g)]


def self_generated_pairs(task, rows, sampler, params, tok, seed: int, frozen: tuple = ()) -> tuple[list[dict], dict]:
    """One pair per prompt: chosen = the reference solution; rejected = a wrong completion
    the policy sampled for this prompt (the first one), else a near miss."""
    rng = np.random.default_rng(seed)
    pairs, own = [], 0
    for row, texts in _policy_samples(rows, sampler, params, tok, seed, frozen):
        wrong = next((t for t in texts if t.strip() and task.score(t, row) < 1.0), None)
        own += wrong is not None
        pairs.append({"prompt": row["prompt"], "chosen": row["solution"],
                      "rejected": wrong if wrong is not None else _near_miss(int(row["answer"]), rng)})
    return pairs, {"pairs": len(pairs), "policy_negatives": own}


def spin_pairs(rows, sampler, params, tok, seed: int, frozen: tuple = ()) -> tuple[list[dict], dict]:
    """SPIN's pairs: chosen = the reference solution, rejected = the policy's own first non-empty
    sample for the prompt, right or wrong (a near miss when every sample is empty)."""
    rng = np.random.default_rng(seed)
    pairs, same = [], 0
    for row, texts in _policy_samples(rows, sampler, params, tok, seed, frozen):
        own = next((t for t in texts if t.strip()), None)
        rejected = own if own is not None else _near_miss(int(row["answer"]), rng)
        same += rejected.strip() == str(row["solution"]).strip()
        pairs.append({"prompt": row["prompt"], "chosen": row["solution"], "rejected": rejected})
    return pairs, {"pairs": len(pairs), "identical_to_chosen": same}


def _sampler(cfg: PreferenceRunConfig, gd, tok):
    from jaxrl_llm.rollout import Sampler, SamplingConfig

    p = cfg.pairs
    return Sampler(gd, SamplingConfig(max_new_tokens=p.max_new_tokens, num_samples=p.samples_per_prompt,
                                      stop_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id),
                   length_buckets=tuple(cfg.prompt_buckets), batch_buckets=(256,))


def _pairs(cfg: PreferenceRunConfig, task, train_rows, eval_rows, gd, params, tok) -> tuple[list, list, dict]:
    """``(train pairs, held-out pairs, info)``."""
    from jaxrl_llm.data import open_source

    p = cfg.pairs
    t0 = time.perf_counter()
    if p.source == "spin":
        sampler = _sampler(cfg, gd, tok)
        pairs, info = spin_pairs(train_rows[:p.prompts], sampler, params, tok, cfg.run.seed)
        held_out, _ = spin_pairs(eval_rows[:p.held_out], sampler, params, tok, cfg.run.seed + 1)
        info["seconds"] = time.perf_counter() - t0
        return pairs, held_out, info
    if p.source != "self":
        train, held = open_source(p.source), open_source(p.eval_source)
        pairs = [train[i] for i in range(len(train))]
        held_out = [held[i] for i in range(min(p.held_out, len(held)))]
        if not pairs or not held_out:
            raise ConfigError(f"pairs.source={p.source!r} / pairs.eval_source={p.eval_source!r}: no rows")
        info = {"pairs": len(pairs)}
        if p.split:
            pairs, counts = _mpo_split(pairs, p)
            info.update(counts)
            if not pairs:
                raise ConfigError(f"pairs.split={p.split!r} with pairs.margin={p.margin}: none of the "
                                  f"{info['pairs']} pairs of {p.source!r} is {p.split}")
        return pairs, held_out, {**info, "seconds": time.perf_counter() - t0}
    sampler = _sampler(cfg, gd, tok)
    pairs, info = self_generated_pairs(task, train_rows[:p.prompts], sampler, params, tok, cfg.run.seed)
    held_out, _ = self_generated_pairs(task, eval_rows[:p.held_out], sampler, params, tok, cfg.run.seed + 1)
    info["seconds"] = time.perf_counter() - t0
    return pairs, held_out, info


def _mpo_split(pairs: list[dict], p) -> tuple[list[dict], dict]:
    """The pairs of MPO's ``pairs.split`` (easy: score gap ``>= pairs.margin``) and the counts
    (the run's report); a row without a numeric score is a
    :class:`~jaxrl_llm.data.DataError` naming it."""
    from jaxrl_llm.core import mpo_easy_pairs
    from jaxrl_llm.data.sources import WHERE, DataError

    scores = np.zeros((len(pairs), 2), np.float64)
    for i, row in enumerate(pairs):
        for j, f in enumerate(p.score_fields):
            v = row.get(f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise DataError(f"{row.get(WHERE, f'pairs row {i}')}: pairs.split={p.split} reads the reward-model score "
                                f"{f!r}, which must be a finite number, got {v!r}")
            scores[i, j] = v
    easy = np.asarray(mpo_easy_pairs(scores[:, 0], scores[:, 1], threshold=float(p.margin)))
    keep = easy if p.split == "easy" else ~easy
    counts = {"mpo_split": p.split, "mpo_easy": int(easy.sum()), "mpo_hard": int((~easy).sum())}
    return [row for row, k in zip(pairs, keep) if k], counts


def _kto_rows(pairs: list[dict]) -> list[dict]:
    """Unpaired rows of pairs: the chosen answer desirable, the rejected one not."""
    return [{"prompt": p["prompt"], "completion": c, "label": lab}
            for p in pairs for c, lab in ((p["chosen"], True), (p["rejected"], False))]


def _preference_phase(cfg: PreferenceRunConfig, objective, gd, tok, pairs: list, held_out: list, start_params,
                      ref, evaluate, ckpt_dir: Path, tel, resolved: dict, seed: int, iteration: int | None,
                      aux: Any = None):
    """One preference phase from ``start_params`` against ``ref``: ``(trainer, history, pair
    evaluator, eval_fn)``; resumes from (or skips with) its checkpoint in ``ckpt_dir``."""
    from jaxrl_llm.data import KTODataConfig, ListSource, PreferenceDataConfig, kto_dataset, preference_dataset
    from jaxrl_llm.training import Checkpointer, PreferenceEvaluator, PreferenceTrainer, init_train_state

    p, o, buckets = cfg.pairs, cfg.optim, tuple(cfg.prompt_buckets)
    if "scope" in getattr(objective, "extra_keys", ()) and not p.scope_field:
        raise ConfigError(f"recipe.loss={objective.name} reads each pair's scope (in / near / out): set "
                          f"pairs.scope_field to the field of the pair rows that gives it")
    if objective.paired:
        dcfg = PreferenceDataConfig(batch_size=p.batch_size, chat=cfg.data.chat, length_buckets=buckets, seed=seed,
                                    scope_field=p.scope_field or None,
                                    rationale_field=p.rationale_field or None if objective.slots == 3 else None,
                                    rationale_template=p.rationale_template)
        make_data = preference_dataset
    else:
        dcfg = KTODataConfig(batch_size=p.batch_size, chat=cfg.data.chat, length_buckets=buckets, seed=seed)
        make_data = kto_dataset
    data = make_data(ListSource(pairs, "pairs"), tok, dcfg, process_index=0, process_count=1)
    held_batch = next(make_data(ListSource(held_out, "held_out"), tok,
                                dataclasses.replace(dcfg, batch_size=len(held_out), shuffle=False),
                                process_index=0, process_count=1))
    pref_eval = PreferenceEvaluator(gd, objective, held_batch, ref_params=ref, prefix="eval_pairs", aux_params=aux)

    def eval_fn(params, *frozen):
        return {**evaluate(params), **pref_eval(params)}
    opt = make_optimizer(o.lr, cfg.run.steps, warmup_steps=o.warmup_steps, schedule=o.schedule,
                         weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, max_grad_norm=o.max_grad_norm)
    start = jax.tree.map(jnp.copy, start_params)  # the step donates its state; start_params stay the reference
    log_fn = tel if iteration is None else (lambda m, _tel=tel, _it=iteration: _tel({**m, "spin/iteration": _it}))
    trainer = PreferenceTrainer(gd, init_train_state(start, opt, seed=seed),
                                _step(cfg, gd, opt, objective, o.num_microbatches), data,
                                objective, ref_params=ref, seed=seed, aux_params=aux,
                                checkpointer=Checkpointer(ckpt_dir, keep_last=cfg.run.keep_last),
                                checkpoint_every=cfg.run.checkpoint_every, eval_fn=eval_fn,
                                eval_every=cfg.run.eval_every, log_fn=log_fn, config=resolved)
    trainer.restore()
    hist = trainer.run(cfg.run.steps, progress=cfg.run.progress)
    return trainer, hist, pref_eval, eval_fn


def _step(cfg, gd, opt, objective, num_microbatches: int = 1):
    """The train step of a phase: packed (``train.max_tokens_per_microbatch``) or padded slices."""
    from jaxrl_llm.training import make_train_step

    budget = cfg.train.max_tokens_per_microbatch
    if not budget:
        return make_train_step(gd, opt, objective, num_microbatches=num_microbatches)
    if num_microbatches > 1:
        raise ConfigError(f"optim.num_microbatches={num_microbatches} and train.max_tokens_per_microbatch (packing) "
                          "both set the micro-batches: keep one")
    from jaxrl_llm.training.packed_step import make_packed_train_step

    return make_packed_train_step(gd, opt, objective, budget=budget)


def _preempted(report: dict, out: Path, phase: str, step: int) -> dict:
    """The summary of a run stopped by SIGTERM in ``phase``: no final parameters, no control;
    re-running the same config resumes from the phase's checkpoint."""
    report.update(preempted=True, preempted_phase=phase, preempted_step=step)
    (out / "summary.json").write_text(json.dumps(jsonable(report), indent=1))
    return report


def run_preference(cfg: PreferenceRunConfig) -> dict:
    """Run (or resume) the preference experiment ``cfg``; returns the summary (also ``summary.json``).
    With ``pairs.source="spin"`` and ``pairs.iterations > 1`` the preference phase is SPIN's
    self-play loop (one checkpoint directory per iteration: ``ckpt``, ``ckpt_spin1``, ...)."""
    from jaxrl_llm.training.host_loop import use_compile_cache

    use_compile_cache(cfg.run.compile_cache)
    from jaxrl_llm.data import ListSource, SFTDataConfig, sft_dataset
    from jaxrl_llm.tasks import get_task
    from jaxrl_llm.training import Checkpointer, SFTObjective, SFTTrainer, init_train_state
    from jaxrl_llm.training.evaluate import Evaluator
    from jaxrl_llm.training.telemetry import Telemetry
    from flax import nnx

    t_start = time.perf_counter()
    check_preference(cfg)
    cfg, execution = resolve_preference_execution(cfg)
    print(execution.line(), flush=True)
    objective = preference_run_objective(cfg)
    out = Path(cfg.run.out)
    out.mkdir(parents=True, exist_ok=True)
    resolved = {**to_dict(cfg), "execution": execution.to_dict()}
    (out / "config.json").write_text(json.dumps(resolved, indent=1))
    seed, buckets = cfg.run.seed, tuple(cfg.prompt_buckets)
    model, tok = load_policy(cfg.model, seed=seed)
    gd, params = nnx.split(model)
    task = get_task(cfg.data.task, **dict(cfg.data.task_args))
    train_rows = task.rows("train", cfg.data.train_rows, seed=seed)
    eval_rows = task.rows("eval", cfg.data.eval_rows, seed=0)  # the same held-out set for every seed
    evaluate = Evaluator(gd, tok, eval_rows, task.score, max_new_tokens=cfg.pairs.max_new_tokens,
                         stop_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id, chat=cfg.data.chat,
                         batch_size=cfg.data.eval_rows)
    report: dict[str, Any] = {"config": resolved, "eval_init": evaluate(params)}

    # --- SFT warm-up on the task's reference solutions
    s, o = cfg.sft, cfg.optim
    sft_opt = make_optimizer(s.lr, s.steps, warmup_steps=s.warmup_steps, schedule=s.schedule,
                             weight_decay=s.weight_decay, max_grad_norm=o.max_grad_norm)
    sft_rows = [{"prompt": r["prompt"], "completion": r["solution"]} for r in train_rows]
    sft_data_cfg = SFTDataConfig(batch_size=s.batch_size, chat=cfg.data.chat, length_buckets=buckets, seed=seed)
    sft = SFTTrainer(gd, init_train_state(params, sft_opt, seed=seed), _step(cfg, gd, sft_opt, SFTObjective()),
                     sft_dataset(ListSource(sft_rows, "sft"), tok, sft_data_cfg, process_index=0, process_count=1),
                     seed=seed, checkpointer=Checkpointer(out / "sft_ckpt", keep_last=1), config=resolved)
    sft.restore()
    t0 = time.perf_counter()
    hist = sft.run(s.steps)
    if sft.iteration < s.steps:  # preempted (SIGTERM): the checkpoint is saved; re-running resumes here
        return _preempted(report, out, "sft", sft.iteration)
    report["sft"] = {"nll": hist[-1]["sft/nll"] if hist else None, "seconds": time.perf_counter() - t0}
    sft_params = sft.state.params
    report["eval_after_sft"] = evaluate(sft_params)

    # --- pairs, then the preference phase from the SFT model (also the frozen reference); SPIN repeats
    # it: each iteration pairs the reference answers with the current policy's samples and trains
    # against the current policy as the reference (the opponent)
    pairs, held_out, report["pairs"] = _pairs(cfg, task, train_rows, eval_rows, gd, sft_params, tok)
    p = cfg.pairs
    if not objective.paired:
        pairs, held_out = _kto_rows(pairs), _kto_rows(held_out)
    o = cfg.optim
    tel = Telemetry(out, tensorboard=cfg.run.tensorboard, console_every=cfg.run.console_every)
    current, previous, hist_all = sft_params, [], []
    aux = None
    if objective.token_weighted:
        from jaxrl_llm.training.loading import load_aux_params

        aux = load_aux_params(cfg.model.aux_params, sft_params)
    t0 = time.perf_counter()
    for it in range(p.iterations):
        if it > 0:  # SPIN: new pairs from the current policy, plus the previous round's
            pairs, info = spin_pairs(train_rows[:p.prompts], _sampler(cfg, gd, tok), current, tok,
                                     cfg.run.seed + 1000 * it)
            report[f"pairs_iteration{it}"] = info
        train_pairs = pairs + (previous if p.keep_previous else [])
        previous = pairs
        ref = current if objective.needs_reference else None
        trainer, hist, pref_eval, eval_fn = _preference_phase(
            cfg, objective, gd, tok, train_pairs, held_out, current, ref, evaluate,
            out / ("ckpt" if it == 0 else f"ckpt_spin{it}"), tel, resolved, seed + 1000 * it,
            None if p.iterations == 1 else it, aux)
        if it == 0:
            report["pairs_before"] = pref_eval(sft_params)
        hist_all += hist
        current = trainer.state.params
        if trainer.iteration < cfg.run.steps:  # preempted: stop before the next iteration's pairs
            tel.close()
            return _preempted(report, out, "preference" if p.iterations == 1 else f"spin iteration {it}",
                              trainer.iteration)
    tel.close()
    first, last = hist_all[0], hist_all[-1]
    report["preference"] = {"seconds": time.perf_counter() - t0, "objective": objective.name,
                            **{f"{k}_first": first[k] for k in ("loss", "rewards/accuracy", "rewards/margin")},
                            **{f"{k}_last": last[k] for k in ("loss", "rewards/accuracy", "rewards/margin")}}
    if p.iterations > 1:
        report["preference"]["iterations"] = p.iterations
    report["eval_after_dpo"] = ({k: v for k, v in last.items() if k.startswith("eval")}
                                if "eval/accuracy" in last else eval_fn(current))
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as c:  # the trained policy alone: another run's model.aux_params (RTO, TGDPO)
        c.save((out / "final_params").absolute(), current, force=True)
    report["final_params"] = str(out / "final_params")

    # --- control: the same number of steps of plain SFT on the chosen answers instead
    if cfg.control:
        t0 = time.perf_counter()
        chosen = [{"prompt": x["prompt"], "completion": x["chosen"]} for x in pairs] if objective.paired else \
            [{"prompt": x["prompt"], "completion": x["completion"]} for x in pairs if x["label"]]
        steps = cfg.run.steps * p.iterations  # as many steps as the preference phase(s) took
        more_opt = make_optimizer(s.lr, steps, weight_decay=s.weight_decay, max_grad_norm=o.max_grad_norm)
        more = SFTTrainer(gd, init_train_state(sft_params, more_opt, seed=seed),
                          _step(cfg, gd, more_opt, SFTObjective()),
                          sft_dataset(ListSource(chosen, "chosen"), tok,
                                      dataclasses.replace(sft_data_cfg, batch_size=p.batch_size),
                                      process_index=0, process_count=1))
        more.run(steps)
        report["control_more_sft"] = {**evaluate(more.state.params), "seconds": time.perf_counter() - t0}
    report["seconds"] = time.perf_counter() - t_start
    (out / "summary.json").write_text(json.dumps(jsonable(report), indent=1))
    acc = [("start", report["eval_init"]), ("after SFT", report["eval_after_sft"]),
           (f"after {objective.name}", report["eval_after_dpo"])]
    if "control_more_sft" in report:
        acc.append(("control: more SFT", report["control_more_sft"]))
    print(f"held-out accuracy ({len(eval_rows)} problems, greedy): "
          + ", ".join(f"{k} {v['eval/accuracy']:.3f}" for k, v in acc) + f"  [{out}]", flush=True)
    return {k: v for k, v in report.items() if k != "config"}

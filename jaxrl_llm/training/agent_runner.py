"""A whole agent RL run from one config: model -> environment -> (optional SFT warm-up on the
scripted solver's transcripts) -> multi-turn RL -> held-out success rate.

:func:`run_agent` is what ``jaxrl-llm train`` calls for an experiment whose ``config()`` returns
an :class:`AgentRunConfig`. Outputs in ``run.out``, as the single-turn runner's:
``config.json``, ``metrics.jsonl`` (with the per-turn telemetry ``episodes/*``), ``samples.jsonl``
(episode transcripts), ``ckpt/``, ``summary.json``, ``reward_curve.png`` (with matplotlib).
Re-running the same command resumes from the newest checkpoint, bit for bit.

Evaluation plays one greedy episode per held-out seed (``env.eval_episodes`` of the
environment's eval split, the same for every run seed) and reports ``eval/success`` (the
environment's ``success`` flag, or a positive return when it gives none), ``eval/return``
and ``eval/turns``; ``eval/accuracy`` is ``eval/success`` (the name the plots and the
single-turn runner use).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_llm.config import Choice, ConfigError, to_dict
from jaxrl_llm.training.configs import ModelSpec, OptimSpec, RecipeSpec, RunSpec, SFTSpec
from jaxrl_llm.training.telemetry import jsonable

__all__ = ["EnvRunSpec", "AgentRolloutSpec", "AgentRunConfig", "run_agent", "check_agent", "EpisodeEvaluator",
           "solver_transcripts"]

log = logging.getLogger("jaxrl_llm")


@dataclasses.dataclass(frozen=True)
class EnvRunSpec:
    """The environment family and how its episodes are formatted.

    ``name``: a family of :data:`jaxrl_llm.agents.ENVIRONMENTS` (``jaxrl-llm methods`` lists
    them), built with ``args``. ``max_turns``: cap on policy turns (``None``: the
    environment's). ``context_len``: KV-cache slots per episode (the context budget: an episode
    that would not fit its next observation plus a full turn is truncated there). ``chat``:
    apply the tokenizer's chat template (``False`` for the tiny character-level models).
    ``observation_role``: ``user`` or ``tool``. ``eval_episodes``: held-out seeds evaluated
    (greedy, one episode each). ``eval_samples``: when > 0, each held-out seed is also played
    ``eval_samples`` times with the policy's own sampling (the rollout temperature, a fixed key):
    ``eval/success`` is then the sampled policy's success rate and ``eval/success_greedy`` the
    greedy one's. ``train_pool``: training seeds cycled through. ``horizon``: a schedule of the
    turn cap over training steps (:data:`jaxrl_llm.algorithms.HORIZONS`; ``scaling_inter``:
    ScalingInter-RL's stages, ``env.horizon.stages=[6,13,20] env.horizon.every=100``); with
    ``max_turns`` too, the smaller cap applies. Evaluation uses ``max_turns``.
    """

    name: str = "grid"
    args: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_turns: int | None = None
    context_len: int = 512
    chat: bool = True
    system_prompt: str | None = None
    observation_role: str = "user"
    max_observation_tokens: int = 256
    step_timeout_s: float = 30.0
    eval_episodes: int = 64
    eval_samples: int = 0
    train_pool: int = 4096
    horizon: Choice = dataclasses.field(default_factory=lambda: Choice("none"))


@dataclasses.dataclass(frozen=True)
class AgentRolloutSpec:
    """Sampling of episodes: ``episodes_per_step`` environment seeds x ``num_samples`` episodes
    each (a group), ``max_new_tokens`` per policy turn; length buckets of the first prompt,
    the observations and the whole episode region (one compilation per bucket used)."""

    episodes_per_step: int = 8
    num_samples: int = 8
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    prompt_buckets: tuple[int, ...] = (32, 64, 128, 256)
    obs_buckets: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    episode_buckets: tuple[int, ...] = (64, 128, 256, 512, 1024)


@dataclasses.dataclass(frozen=True)
class AgentRunConfig:
    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    env: EnvRunSpec = dataclasses.field(default_factory=EnvRunSpec)
    rollout: AgentRolloutSpec = dataclasses.field(default_factory=AgentRolloutSpec)
    recipe: RecipeSpec = dataclasses.field(default_factory=RecipeSpec)
    optim: OptimSpec = dataclasses.field(default_factory=OptimSpec)
    sft: SFTSpec = dataclasses.field(default_factory=SFTSpec)
    run: RunSpec = dataclasses.field(default_factory=lambda: RunSpec(out="runs/agent", export_hf=False))


# ----------------------------------------------------------------------------- pieces


def _env_spec(cfg: AgentRunConfig):
    from jaxrl_llm.agents import make_env

    try:
        return make_env(cfg.env.name, **dict(cfg.env.args))
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"env.name={cfg.env.name!r} with env.args={dict(cfg.env.args)}: {e}") from None


def _recipe(cfg: AgentRunConfig):
    from jaxrl_llm.training.recipes import build_recipe

    return build_recipe(cfg.recipe, num_samples=cfg.rollout.num_samples, temperature=cfg.rollout.temperature)


def _check_fields(cfg: AgentRunConfig) -> None:
    ro, e = cfg.rollout, cfg.env

    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(msg)

    for key in ("episodes_per_step", "num_samples", "max_new_tokens"):
        v = getattr(ro, key)
        need(isinstance(v, int) and v >= 1, f"rollout.{key} must be an int >= 1, got {v!r}")
    need(ro.temperature > 0, f"rollout.temperature must be > 0, got {ro.temperature}")
    need(0 < ro.top_p <= 1, f"rollout.top_p must be in (0, 1], got {ro.top_p}")
    for key in ("prompt_buckets", "obs_buckets", "episode_buckets"):
        b = getattr(ro, key)
        need(bool(b) and all(isinstance(x, int) and x >= 1 for x in b), f"rollout.{key} must be lengths >= 1, got "
                                                                        f"{list(b)}")
    need(e.max_turns is None or e.max_turns >= 1, f"env.max_turns must be >= 1 (or None), got {e.max_turns}")
    need(e.context_len >= min(ro.prompt_buckets) + ro.max_new_tokens,
         f"env.context_len={e.context_len} has no room for a prompt of the smallest bucket "
         f"({min(ro.prompt_buckets)}) plus one turn of rollout.max_new_tokens={ro.max_new_tokens}")
    need(e.observation_role in ("user", "tool"), f"env.observation_role must be 'user' or 'tool', got "
                                                 f"{e.observation_role!r}")
    need(isinstance(e.eval_samples, int) and e.eval_samples >= 0,
         f"env.eval_samples must be an int >= 0 (0: greedy only), got {e.eval_samples!r}")
    need(e.eval_episodes >= 1 and e.train_pool >= ro.episodes_per_step,
         f"env.eval_episodes must be >= 1 and env.train_pool >= rollout.episodes_per_step, got {e.eval_episodes}, "
         f"{e.train_pool}")
    need(e.step_timeout_s > 0, f"env.step_timeout_s must be > 0, got {e.step_timeout_s}")
    rows = ro.episodes_per_step * ro.num_samples
    if rows % max(cfg.recipe.num_minibatches or 1, 1):
        raise ConfigError(f"recipe.num_minibatches={cfg.recipe.num_minibatches} must divide the episodes per step "
                          f"(episodes_per_step*num_samples={rows})")


def _horizon(cfg: AgentRunConfig):
    """The bound turn-cap schedule of ``env.horizon`` (``None``: none), checked on step 0."""
    from jaxrl_llm.algorithms import HORIZONS, RegistryError
    from jaxrl_llm.training.recipes import _optional

    try:
        part = _optional(HORIZONS, cfg.env.horizon, "env.horizon")
        if part is not None:
            v = part(0)
            if not isinstance(v, int) or v < 1:
                raise RegistryError(f"env.horizon={part.name} gives a turn cap of {v!r} at step 0; caps are ints >= 1")
    except (RegistryError, TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None
    return part


def check_agent(cfg: AgentRunConfig, *, n_devices: int | None = None) -> dict:
    """Validate ``cfg`` without weights (fields, environment, recipe); raises ConfigError."""
    from jaxrl_llm.training.loading import model_config

    _check_fields(cfg)
    spec = _env_spec(cfg)
    rec = _recipe(cfg)
    cfg, execution = resolve_agent_execution(cfg)
    try:
        model_config(cfg.model)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    from jaxrl_llm.training.parts.registry import LoopSettings, build_parts

    for key in ("aux_params", "reverse_params"):
        if getattr(cfg.model, key):
            raise ConfigError(f"model.{key} is read by single-turn RL runs (jaxrl-llm train with a prompt task); agent "
                              f"runs do not load an auxiliary policy")
    build_parts(LoopSettings(rec, episodes=True, horizon=_horizon(cfg), processes=jax.process_count(), models=False))
    if "greedy_scores" in rec.requires:
        raise ConfigError(f"recipe.advantage={rec.estimator.name}: a greedy-baseline estimator is not available in "
                          f"agent runs")
    return {"env": spec.name, "episodes_per_step": cfg.rollout.episodes_per_step * cfg.rollout.num_samples,
            "recipe": to_dict(rec.spec), "execution": execution.to_dict()}


def resolve_agent_execution(cfg: AgentRunConfig):
    """``(cfg with model.remat=auto resolved, the Execution)``: from one update micro-batch of
    episodes at the longest episode bucket (:func:`jaxrl_llm.training.auto.resolve_remat`)."""
    from jaxrl_llm.training.auto import resolve_remat

    ro = cfg.rollout
    rows = ro.episodes_per_step * ro.num_samples // max(1, _recipe(cfg).num_minibatches)
    rows //= max(1, cfg.optim.num_microbatches)
    try:
        model, execution = resolve_remat(cfg.model, rows, max(ro.episode_buckets))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return dataclasses.replace(cfg, model=model), execution


class EpisodeEvaluator:
    """Held-out episodes: ``evaluate(params, *frozen) -> {"eval/success", "eval/return",
    "eval/turns", "eval/accuracy", "eval/n"}``: one greedy episode per seed, or with ``samples``
    > 0 that many episodes per seed sampled at the rollout temperature (fixed key: every call and
    every run sees the same random numbers), the greedy success then as ``eval/success_greedy``;
    ``last_transcripts`` keeps the episodes."""

    def __init__(self, graphdef, spec, seeds, fmt, sampling, *, context_len, length_buckets, obs_buckets,
                 max_turns=None, step_timeout_s=30.0, batch_size=64, samples: int = 0):
        from jaxrl_llm.rollout.multiturn import MultiTurnSampler

        kw = dict(context_len=context_len, length_buckets=length_buckets, obs_buckets=obs_buckets)
        self.sampler = MultiTurnSampler(graphdef, dataclasses.replace(sampling, greedy=True, num_samples=1), **kw)
        self.sampled = None if samples <= 0 else MultiTurnSampler(
            graphdef, dataclasses.replace(sampling, greedy=False, num_samples=int(samples)), **kw)
        self.spec, self.seeds, self.fmt = spec, list(seeds), fmt
        self.max_turns, self.step_timeout_s, self.batch_size = max_turns, step_timeout_s, batch_size
        self.last_transcripts: list[dict] = []

    def _play(self, sampler, params, frozen, batch: int) -> tuple[list, list, list]:
        from jaxrl_llm.agents.rollout import rollout_episodes

        succ, rets, turns, self.last_transcripts = [], [], [], []
        for start in range(0, len(self.seeds), batch):
            # a fixed key per batch of seeds (greedy decoding ignores it)
            ep = rollout_episodes(sampler, params, self.spec, self.seeds[start:start + batch], self.fmt,
                                  jax.random.fold_in(jax.random.key(0), start), *frozen, max_turns=self.max_turns,
                                  step_timeout_s=self.step_timeout_s)
            for i in range(len(ep.tokens)):
                ok = ep.success[i] if ep.success[i] is not None else ep.returns[i] > 0
                succ.append(bool(ok))
                if len(self.last_transcripts) < 8:
                    self.last_transcripts.append({"seed": ep.seeds[i], "success": bool(ok),
                                                  "transcript": ep.transcript(i)})
            rets += ep.returns.tolist()
            turns += ep.turns.tolist()
        return succ, rets, turns

    def __call__(self, params, *frozen) -> dict[str, float]:
        succ, rets, turns = self._play(self.sampler, params, frozen, self.batch_size)
        greedy = float(np.mean(succ))
        if self.sampled is not None:
            per = max(1, self.batch_size // self.sampled.config.num_samples)  # seeds per sampled batch
            succ, rets, turns = self._play(self.sampled, params, frozen, per)
        s = float(np.mean(succ))
        out = {"eval/success": s, "eval/accuracy": s, "eval/return": float(np.mean(rets)),
               "eval/turns": float(np.mean(turns)), "eval/n": float(len(succ))}
        if self.sampled is not None:
            out["eval/success_greedy"] = greedy
        return out


def solver_transcripts(spec, seeds, fmt, *, max_turns=None) -> list[tuple[list[int], list[bool]]]:
    """``(tokens, train_mask)`` of the scripted solver's episodes (SFT warm-up): the solver's
    actions are the trained tokens (each with the end-of-turn token), everything else context,
    assembled exactly as a rollout assembles them."""
    if spec.solve is None:
        raise ConfigError(f"sft.steps > 0 needs an environment with a scripted solver; {spec.name!r} has none")
    out = []
    for seed in seeds:
        env = spec.make()
        obs, _ = env.reset(seed=seed)
        actions = spec.solve(env)
        env = spec.make()
        obs, _ = env.reset(seed=seed)
        ids, train = list(fmt.prompt_ids(obs)), []
        train = [False] * len(ids)
        for k, a in enumerate(actions[:max_turns] if max_turns else actions):
            act = fmt.encode(a) + [fmt.end_token_id]
            ids += act
            train += [True] * len(act)
            obs, _, term, trunc, _ = env.step(a)
            if term or trunc:
                break
            o = fmt.observation_ids(obs, stopped=True)
            ids += o
            train += [False] * len(o)
        out.append((ids, train))
    return out


def _sft(cfg: AgentRunConfig, gd, params, frozen, spec, fmt, tel, probe) -> tuple[Any, dict]:
    """SFT on solver transcripts (``sft.batch_size`` per step, seeds cycled), with the early stop
    at ``sft.target_accuracy`` of ``probe`` (success on training seeds)."""
    from jaxrl_llm.shapes import bucket
    from jaxrl_llm.training.objectives import SFTObjective
    from jaxrl_llm.training.optim import make_optimizer
    from jaxrl_llm.training.step import init_train_state, make_train_step

    s = cfg.sft
    seeds = spec.split_seeds("train", max(s.batch_size * 8, 64), cfg.run.seed)
    rows = solver_transcripts(spec, seeds, fmt, max_turns=cfg.env.max_turns)
    length = bucket(max(len(r[0]) for r in rows), tuple(cfg.rollout.episode_buckets))
    opt = make_optimizer(s.lr, s.steps, warmup_steps=s.warmup_steps, schedule=s.schedule,
                         weight_decay=s.weight_decay, max_grad_norm=cfg.optim.max_grad_norm)
    state = init_train_state(params, opt, seed=cfg.run.seed)
    step = make_train_step(gd, opt, SFTObjective())
    rng = np.random.default_rng(cfg.run.seed)
    t0, probes, done, m = time.perf_counter(), [], s.steps, {"sft/nll": float("nan")}
    for i in range(s.steps):
        pick = rng.choice(len(rows), size=s.batch_size, replace=len(rows) < s.batch_size)
        toks = np.full((s.batch_size, length), fmt.tok.pad_token_id or 0, np.int32)
        mask = np.zeros((s.batch_size, length), bool)
        lm = np.zeros((s.batch_size, length), bool)
        for r, j in enumerate(pick):
            ids, train = rows[j]
            toks[r, :len(ids)], mask[r, :len(ids)], lm[r, :len(ids)] = ids, True, train
        state, m = step(state, {"tokens": toks, "mask": mask, "loss_mask": lm[:, 1:]}, *frozen)
        n, reached = i + 1, False
        if probe is not None and s.target_accuracy and n % s.probe_every == 0:
            acc = float(probe(state.params)["eval/success"])
            probes.append((n, acc))
            tel({"sft/probe_success": acc}, step=n)
            reached = acc >= s.target_accuracy
        if n % 50 == 0 or n == s.steps or reached:
            tel({"sft/nll": float(m["sft/nll"])}, step=n)
        if reached:
            done = n
            break
    info = {"steps": done, "nll_last": float(m["sft/nll"]), "seconds": time.perf_counter() - t0,
            "transcripts": len(rows)}
    if s.target_accuracy:
        info["probe_success"] = probes
        info["reached_target"] = bool(probes) and probes[-1][1] >= s.target_accuracy
    return state.params, info


# ----------------------------------------------------------------------------- the run


def run_agent(cfg: AgentRunConfig) -> dict:
    """Run (or resume) the agent experiment ``cfg``; returns the summary (also ``summary.json``)."""
    from jaxrl_llm.training.host_loop import use_compile_cache

    use_compile_cache(cfg.run.compile_cache)
    import optax  # noqa: F401  (the optimiser's library; imported here so a missing install fails early)
    import orbax.checkpoint as ocp
    from flax import nnx

    from jaxrl_llm.agents.rollout import ChatFormat
    from jaxrl_llm.data import end_of_turn_id
    from jaxrl_llm.models import trainable
    from jaxrl_llm.rollout import SamplingConfig
    from jaxrl_llm.rollout.multiturn import MultiTurnSampler
    from jaxrl_llm.training.agent_loop import AgentTrainer, SeedStream
    from jaxrl_llm.training.checkpoint import Checkpointer
    from jaxrl_llm.training.loading import load_policy
    from jaxrl_llm.training.optim import make_optimizer
    from jaxrl_llm.training.plots import have_matplotlib, plot_run
    from jaxrl_llm.training.step import init_train_state, make_train_step
    from jaxrl_llm.training.telemetry import Telemetry

    t_start = time.perf_counter()
    check_agent(cfg)
    cfg, execution = resolve_agent_execution(cfg)
    print(execution.line(), flush=True)
    rec = _recipe(cfg)
    resolved = {**to_dict(dataclasses.replace(cfg, recipe=rec.spec)), "execution": execution.to_dict()}
    spec = _env_spec(cfg)
    out = Path(cfg.run.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(resolved, indent=1))
    model, tok = load_policy(cfg.model, seed=cfg.run.seed)
    gd, params, frozen_state = nnx.split(model, trainable(model.cfg), ...)
    if cfg.model.init_params:  # the policy (and its reference) start from another run's parameters
        from jaxrl_llm.training.loading import load_aux_params

        params = load_aux_params(cfg.model.init_params, params, "model.init_params")
    frozen = (frozen_state,)
    e, ro = cfg.env, cfg.rollout
    stop = end_of_turn_id(tok, e.chat)
    pad = tok.pad_token_id if tok.pad_token_id is not None else stop
    fmt = ChatFormat(tok, chat=e.chat, system_prompt=e.system_prompt if e.system_prompt is not None
                     else spec.system_prompt, observation_role=e.observation_role,
                     max_observation_tokens=e.max_observation_tokens, end_token_id=stop)
    widest = e.max_observation_tokens + fmt.overhead()
    if widest > max(ro.obs_buckets):
        raise ConfigError(f"an observation can take {widest} tokens (env.max_observation_tokens="
                          f"{e.max_observation_tokens} + {fmt.overhead()} of its rendering), more than the largest of "
                          f"rollout.obs_buckets={list(ro.obs_buckets)}: add a bucket of {widest} or lower "
                          f"env.max_observation_tokens")
    sampling = SamplingConfig(max_new_tokens=ro.max_new_tokens, num_samples=ro.num_samples,
                              temperature=ro.temperature, top_p=ro.top_p, stop_token_ids=(stop,), pad_token_id=pad)
    ev_kw = dict(context_len=e.context_len, length_buckets=tuple(ro.prompt_buckets), obs_buckets=tuple(ro.obs_buckets),
                 max_turns=e.max_turns, step_timeout_s=e.step_timeout_s, batch_size=cfg.run.eval_batch_size,
                 samples=e.eval_samples)
    evaluate = EpisodeEvaluator(gd, spec, spec.split_seeds("eval", e.eval_episodes, 0), fmt, sampling, **ev_kw)
    tel = Telemetry(out, tensorboard=cfg.run.tensorboard, console_every=cfg.run.console_every, step_key="iteration")
    ckpt = Checkpointer(out / "ckpt", keep_last=cfg.run.keep_last)
    resuming = ckpt.latest_step() is not None
    before_path, start_path = out / "eval_before.json", (out / "sft_params").absolute()
    if resuming and before_path.exists():
        if cfg.sft.steps:
            with ocp.StandardCheckpointer() as c:
                params = c.restore(start_path, params)
        before = json.loads(before_path.read_text())
    else:
        before = {"eval_before": evaluate(params, *frozen), "eval_before_samples": evaluate.last_transcripts}
        if cfg.sft.steps:
            probe = None
            if cfg.sft.target_accuracy:
                p_eval = EpisodeEvaluator(gd, spec, spec.split_seeds("train", cfg.sft.probe_rows, cfg.run.seed), fmt,
                                          sampling, **ev_kw)
                probe = lambda p: p_eval(p, *frozen)  # noqa: E731
            params, before["sft"] = _sft(cfg, gd, params, frozen, spec, fmt, tel, probe)
            before["eval_after_sft"] = evaluate(params, *frozen)
            with ocp.StandardCheckpointer() as c:
                c.save(start_path, params, force=True)
        before_path.write_text(json.dumps(jsonable(before)))
    summary: dict[str, Any] = {"config": resolved, **before}
    start = summary.get("eval_after_sft", summary["eval_before"])["eval/success"]

    o = cfg.optim
    opt = make_optimizer(o.lr, cfg.run.steps, warmup_steps=o.warmup_steps, schedule=o.schedule,
                         weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, max_grad_norm=o.max_grad_norm)
    state = init_train_state(params, opt, seed=cfg.run.seed)
    ref_params = jax.tree.map(lambda x: x.copy(), params) if rec.needs_reference else None
    critic = None
    if rec.needs_critic:
        from jaxrl_llm.training.rl import Critic

        base = nnx.state(nnx.merge(gd, params, frozen_state), nnx.Param)
        critic = Critic.create(model.cfg.replace(lora=None),
                               make_optimizer(cfg.recipe.critic_lr, cfg.run.steps, warmup_steps=o.warmup_steps,
                                              max_grad_norm=o.max_grad_norm),
                               rec.value_objective, policy_params=base, seed=cfg.run.seed,
                               num_microbatches=o.num_microbatches)
    progress = None
    if rec.needs_progress_model:  # SPA-RL: a score-head copy of the policy, its own optimiser
        from jaxrl_llm.training.objectives import ProgressObjective
        from jaxrl_llm.training.rl import Critic

        base = nnx.state(nnx.merge(gd, params, frozen_state), nnx.Param)
        progress = Critic.create(model.cfg.replace(lora=None),
                                 make_optimizer(cfg.recipe.progress_lr, cfg.run.steps, warmup_steps=o.warmup_steps,
                                                max_grad_norm=o.max_grad_norm),
                                 ProgressObjective(), policy_params=base, seed=cfg.run.seed + 1,
                                 num_microbatches=o.num_microbatches)
    sampler = MultiTurnSampler(gd, sampling, context_len=e.context_len, length_buckets=tuple(ro.prompt_buckets),
                               obs_buckets=tuple(ro.obs_buckets))
    trainer = None

    def log_fn(metrics: dict) -> None:
        tel(metrics)
        it = metrics["iteration"]
        if cfg.run.log_samples_every and (it == 1 or it % cfg.run.log_samples_every == 0):
            tel.log_samples(it, trainer.last_samples(4))

    trainer = AgentTrainer(gd, state, make_train_step(gd, opt, rec.objective, num_microbatches=o.num_microbatches),
                           sampler, SeedStream(spec, ro.episodes_per_step, seed=cfg.run.seed, pool=e.train_pool),
                           spec, fmt, rec, tok, episode_buckets=tuple(ro.episode_buckets), max_turns=e.max_turns,
                           horizon=_horizon(cfg),
                           step_timeout_s=e.step_timeout_s, seed=cfg.run.seed, frozen=frozen, ref_params=ref_params,
                           critic=critic, progress=progress, checkpointer=ckpt, checkpoint_every=cfg.run.checkpoint_every,
                           eval_fn=evaluate, eval_every=cfg.run.eval_every, log_fn=log_fn, config=resolved)
    if trainer.restore():
        log.info("resumed from %s at step %d", ckpt.directory, trainer.iteration)
    history = trainer.run(cfg.run.steps, progress=cfg.run.progress)
    summary["steps"] = trainer.iteration
    if trainer.iteration < cfg.run.steps:
        summary["preempted"] = True
        ckpt.close()
        tel.close()
        return summary
    last_eval = history[-1] if history and "eval/success" in history[-1] else None
    summary["eval_after"] = ({k: v for k, v in last_eval.items() if k.startswith("eval/")} if last_eval
                             else evaluate(trainer.state.params, *frozen))
    summary["eval_after_samples"] = evaluate.last_transcripts
    summary["success_change"] = summary["eval_after"]["eval/success"] - start
    summary["return_first_5"] = float(np.mean([h["rewards/total/mean"] for h in history[:5]]))
    summary["return_last_5"] = float(np.mean([h["rewards/total/mean"] for h in history[-5:]]))
    if cfg.run.plot and have_matplotlib():
        plot_run(history, out / "reward_curve.png", start, summary["eval_after"]["eval/success"])
        summary["plot"] = str(out / "reward_curve.png")
    ckpt.close()
    tel.close()
    summary["seconds_this_process"] = time.perf_counter() - t_start
    (out / "summary.json").write_text(json.dumps(jsonable(summary), indent=1))
    stages = [("start", summary["eval_before"])] + ([("after SFT", summary["eval_after_sft"])]
                                                    if "eval_after_sft" in summary else [])
    stages.append(("after RL", summary["eval_after"]))
    how = "greedy" if not e.eval_samples else f"sampled x {e.eval_samples}"
    print(f"held-out success ({int(summary['eval_after']['eval/n'])} episodes, {how}): "
          + " -> ".join(f"{k} {v['eval/success']:.3f}" for k, v in stages) + f"  [{out}]", flush=True)
    return {k: v for k, v in summary.items() if k not in ("config", "eval_before_samples", "eval_after_samples")}

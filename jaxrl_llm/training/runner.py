"""A whole RL run from one config: model -> data -> (optional SFT warm-up) -> RL -> export.

:func:`run_rl` is what an experiment file calls (``experiments/*.py``; ``jaxrl-llm train``).
It is deliberately a flat, readable function over the library's pieces -- copy it into a
notebook and change any step. Everything a run needs is in :class:`RLRunConfig` (nested
frozen dataclasses, overridable from the command line as ``rollout.num_samples=16``), and
the resolved config is stored in ``out/config.json`` and with every checkpoint.

Re-running the same command resumes from the newest checkpoint in ``out/ckpt`` (train
state, optimiser, RNG, data-iterator position and metric history), bit for bit; the
held-out accuracy before training is kept in ``out/eval_before.json`` so a resumed run still
reports it. SIGTERM saves and exits.

Outputs in ``run.out``: ``config.json``, ``metrics.jsonl`` and ``tb/`` (TensorBoard),
``samples.jsonl`` (completions every ``log_samples_every`` steps), ``ckpt/``, ``hf/`` (an HF
model directory with LoRA merged; transformers loads it), ``reward_curve.png`` and
``summary.json``.

Several processes (one per host): start the same command on every host after
:func:`jaxrl_llm.parallel.initialize` (``jaxrl-llm train --multihost``, or the
``$JAXRL_COORDINATOR`` / ``$JAXRL_NUM_PROCESSES`` / ``$JAXRL_PROCESS_ID`` variables); ``mesh.*``
spans every device of every process. Each process holds the global batch and scores its share
of it (:mod:`jaxrl_llm.training.loop`), process 0 writes the side files, and checkpoints are
written collectively, so the run equals a one-process run on the same mesh.

:func:`check_rl` validates a config without weights or data (model shapes from
``model.preset``, mesh divisibility, recipe, optimiser, sampling): how large TPU/GPU
experiment files are checked here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

__all__ = ["ModelSpec", "DataSpec", "RolloutSpec", "RecipeSpec", "OptimSpec", "SFTSpec", "MeshSpec", "RunSpec",
           "RLRunConfig", "run_rl", "check_rl", "make_optimizer", "load_policy"]

log = logging.getLogger("jaxrl_llm")

ALL_LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The policy.

    ``source``: ``"smollm2"`` (the embedded SmolLM2-135M-Instruct), ``"hf:<dir>"`` (an HF
    model directory: config, safetensors, tokenizer), ``"gguf:<file>"``, or ``"tiny"`` (a
    random Llama-style model of ``hidden_size`` / ``num_layers`` over the 95-character
    tokenizer, for tests and the tiny preset). ``preset``: a
    :data:`jaxrl_llm.models.PRESETS` name giving the shapes when the weights are not on this
    machine (used by :func:`check_rl`). ``lora_rank > 0`` trains LoRA adapters only
    (``lora_alpha = 0`` means ``2 * rank``). ``offload_reference``: keep the frozen reference
    policy of a KL recipe in host memory (same sharding) and move it to the devices only for
    its log-prob pass, saving its size in device memory between passes at the price of one
    host-to-device copy per step (no effect without a reference; with LoRA the reference is
    the adapters only).
    """

    source: str = "smollm2"
    preset: str = ""
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"
    lora_rank: int = 0
    lora_alpha: float = 0.0
    lora_targets: tuple[str, ...] = ALL_LORA_TARGETS
    hidden_size: int = 64
    num_layers: int = 2
    offload_reference: bool = False


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """Prompts and the reward.

    Either a built-in ``task`` (:func:`jaxrl_llm.tasks.get_task` with ``task_args``; train and
    eval rows come from the task's disjoint splits) or a ``dataset`` file/folder (jsonl,
    parquet, saved HF dataset; ``dataset_format="gsm8k"`` reads GSM8K's question/answer
    columns) with an ``eval_dataset``. The reward is the task's verifier (or the math
    verifier on the ``answer`` column for datasets) plus ``format_weight`` times a strict
    tag-format reward when ``format_weight > 0``.
    """

    task: str = "arithmetic"
    task_args: dict[str, Any] = dataclasses.field(default_factory=lambda: {"preset": "mul"})
    dataset: str = ""
    eval_dataset: str = ""
    dataset_format: str = "gsm8k"
    train_rows: int = 4096
    eval_rows: int = 64
    chat: bool = True
    system_prompt: str | None = None
    max_prompt_tokens: int = 256
    format_weight: float = 0.0


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """Sampling. ``sampler_weights``: the layout of the weights the sampler decodes with on a
    mesh -- ``"train"`` (the trainer's: FSDP-split weights are all-gathered layer by layer at
    every decoded token) or ``"tensor"`` (resharded once per rollout into a copy split over
    ``tensor`` only, :data:`jaxrl_llm.parallel.SAMPLER_RULES`; costs that copy's memory while
    sampling)."""

    prompts_per_step: int = 8
    num_samples: int = 8
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    prompt_buckets: tuple[int, ...] = (32, 64, 128, 256)
    sampler_weights: str = "train"


@dataclasses.dataclass(frozen=True)
class RecipeSpec:
    """A preset of :func:`jaxrl_llm.training.recipe` and its overrides (``args``: any
    :class:`~jaxrl_llm.training.RLRecipe` field). ``kl_coef > 0`` adds a KL penalty to the
    frozen initial policy (which then stays in memory). Recipes with a critic (``ppo``) get one
    started from the policy's weights, trained with AdamW at ``critic_lr``."""

    name: str = "grpo"
    epochs: int = 1
    num_minibatches: int = 1
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    critic_lr: float = 1e-5
    args: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class OptimSpec:
    """AdamW with linear warm-up then ``schedule`` (``"constant"`` or ``"cosine"`` to 10%),
    global-norm clipping at ``max_grad_norm`` (0: off)."""

    lr: float = 1e-6
    warmup_steps: int = 0
    schedule: str = "constant"
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    max_grad_norm: float = 1.0
    num_microbatches: int = 1


@dataclasses.dataclass(frozen=True)
class SFTSpec:
    """Optional supervised warm-up on the task's reference solutions before RL (0 steps: off)."""

    steps: int = 0
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 0
    schedule: str = "constant"
    #: Stop the warm-up early once greedy accuracy on ``probe_rows`` *training* prompts (never
    #: the held-out ones) reaches this value, checked every ``probe_every`` steps (0: run all
    #: ``steps``). Small models cross from "mostly wrong" to "mostly right" at seed-dependent
    #: step counts; a target makes RL start from a comparable, partly-right policy on every seed.
    target_accuracy: float = 0.0
    probe_every: int = 50
    probe_rows: int = 128


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """Device mesh ``(data, fsdp, tensor)``; the product must equal the device count
    (``1, 1, 1``: one device, no sharding)."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1


@dataclasses.dataclass(frozen=True)
class RunSpec:
    out: str = "runs/rl"
    steps: int = 50
    seed: int = 0
    eval_every: int = 0
    eval_batch_size: int = 64
    checkpoint_every: int = 10
    keep_last: int = 2
    log_samples_every: int = 10
    export_hf: bool = True
    plot: bool = True
    tensorboard: bool = True
    progress: bool = True
    console_every: int = 10


@dataclasses.dataclass(frozen=True)
class RLRunConfig:
    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    data: DataSpec = dataclasses.field(default_factory=DataSpec)
    rollout: RolloutSpec = dataclasses.field(default_factory=RolloutSpec)
    recipe: RecipeSpec = dataclasses.field(default_factory=RecipeSpec)
    optim: OptimSpec = dataclasses.field(default_factory=OptimSpec)
    sft: SFTSpec = dataclasses.field(default_factory=SFTSpec)
    mesh: MeshSpec = dataclasses.field(default_factory=MeshSpec)
    run: RunSpec = dataclasses.field(default_factory=RunSpec)


# ----------------------------------------------------------------------------- pieces


def make_optimizer(lr: float, total_steps: int, *, warmup_steps: int = 0, schedule: str = "constant",
                   weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999,
                   max_grad_norm: float = 0.0) -> optax.GradientTransformation:
    """AdamW with warm-up and a constant or cosine schedule, after global-norm clipping."""
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"optim.schedule must be 'constant' or 'cosine', got {schedule!r}")
    if lr <= 0:
        raise ValueError(f"optim.lr must be > 0, got {lr}")
    if schedule == "cosine":
        sched = optax.warmup_cosine_decay_schedule(0.0 if warmup_steps else lr, lr, max(warmup_steps, 0),
                                                   max(total_steps, warmup_steps + 1), end_value=0.1 * lr)
    elif warmup_steps:
        sched = optax.join_schedules([optax.linear_schedule(0.0, lr, warmup_steps), optax.constant_schedule(lr)],
                                     [warmup_steps])
    else:
        sched = lr
    parts = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm > 0 else []
    return optax.chain(*parts, optax.adamw(sched, b1=b1, b2=b2, weight_decay=weight_decay))


def _lora(spec: ModelSpec):
    from jaxrl_llm.models import LoRAConfig

    if spec.lora_rank <= 0:
        return None
    return LoRAConfig(rank=spec.lora_rank, alpha=spec.lora_alpha or 2.0 * spec.lora_rank,
                      targets=tuple(spec.lora_targets))


def _tiny_config(spec: ModelSpec, vocab: int):
    from jaxrl_llm.models import ModelConfig

    h = spec.hidden_size
    if h % 16:
        raise ValueError(f"model.hidden_size must be a multiple of 16 for the tiny model, got {h}")
    return ModelConfig(vocab_size=vocab, hidden_size=h, num_layers=spec.num_layers, num_heads=4, num_kv_heads=2,
                       head_dim=h // 4, intermediate_size=4 * h, tie_embeddings=True, max_position_embeddings=512,
                       dtype=spec.dtype, param_dtype=spec.param_dtype, remat=spec.remat, lora=_lora(spec))


def load_policy(spec: ModelSpec, *, seed: int = 0, mesh=None):
    """``(model, tokenizer)`` for ``spec`` (see :class:`ModelSpec`)."""
    from flax import nnx

    from jaxrl_llm.models import Transformer, load_gguf, load_hf, load_smollm2, load_tokenizer

    over = dict(dtype=spec.dtype, param_dtype=spec.param_dtype, remat=spec.remat, lora=_lora(spec))
    src = spec.source
    if src == "smollm2":
        return load_smollm2(mesh=mesh, **over)
    if src.startswith("gguf:"):
        return load_gguf(src[5:], mesh=mesh, **over)
    if src.startswith("hf:"):
        path = Path(src[3:])
        if not path.is_dir():
            raise FileNotFoundError(f"model.source: HF model directory {path} does not exist")
        return load_hf(path, mesh=mesh, seed=seed, **over), load_tokenizer(path)
    if src == "tiny":
        from jaxrl_llm.data.char_tokenizer import char_tokenizer

        tok = char_tokenizer()
        if mesh is not None:  # created in its shards: no whole copy on one device
            from jaxrl_llm.parallel import init_sharded

            return init_sharded(_tiny_config(spec, len(tok)), mesh, seed), tok
        return Transformer(_tiny_config(spec, len(tok)), rngs=nnx.Rngs(seed)), tok
    raise ValueError(f"model.source must be 'smollm2', 'tiny', 'hf:<dir>' or 'gguf:<file>', got {src!r}")


def _rows(cfg: RLRunConfig) -> tuple[Any, list[dict], list[dict], Any]:
    """``(train_source, eval_rows, sft_rows, reward_fn)``."""
    from jaxrl_llm.data import ListSource

    d, seed = cfg.data, cfg.run.seed
    if d.dataset:
        from jaxrl_llm.data import load_gsm8k, open_source
        from jaxrl_llm.rewards import math_reward

        if d.dataset_format not in ("gsm8k", "rows"):
            raise ValueError(f"data.dataset_format must be 'gsm8k' or 'rows', got {d.dataset_format!r}")
        opener = load_gsm8k if d.dataset_format == "gsm8k" else open_source
        train = opener(d.dataset)
        if not d.eval_dataset:
            raise ValueError("data.eval_dataset is required with data.dataset (held-out prompts for evaluation)")
        ev = opener(d.eval_dataset)
        eval_rows = [ev[i] for i in range(min(d.eval_rows, len(ev)))]
        return train, eval_rows, [], math_reward, (lambda c, r: float(math_reward([""], [c], answer=[r["answer"]])[0]))
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


def _recipe(cfg: RLRunConfig):
    from jaxrl_llm.training.rl import recipe

    r, ro = cfg.recipe, cfg.rollout
    rec = recipe(r.name, num_samples=ro.num_samples, epochs=r.epochs, num_minibatches=r.num_minibatches,
                 **dict(r.args))
    # the loss sees the log-probs of the distribution the sampler drew from
    obj = dataclasses.replace(rec.objective, temperature=ro.temperature,
                              kl_coef=r.kl_coef or rec.objective.kl_coef,
                              entropy_coef=r.entropy_coef or rec.objective.entropy_coef)
    return dataclasses.replace(rec, objective=obj)


def _sampling(cfg: RLRunConfig, stop_ids, pad_id):
    from jaxrl_llm.rollout import SamplingConfig

    ro = cfg.rollout
    return SamplingConfig(max_new_tokens=ro.max_new_tokens, num_samples=ro.num_samples, temperature=ro.temperature,
                          top_p=ro.top_p, stop_token_ids=tuple(stop_ids), pad_token_id=pad_id)


def _check_mesh(cfg: RLRunConfig, model_cfg, n_devices: int) -> None:
    m = cfg.mesh
    if cfg.rollout.sampler_weights not in ("train", "tensor"):
        raise ValueError(f"rollout.sampler_weights must be 'train' or 'tensor', got {cfg.rollout.sampler_weights!r}")
    n = m.data * m.fsdp * m.tensor
    if n != n_devices:
        raise ValueError(f"mesh: data*fsdp*tensor = {m.data}*{m.fsdp}*{m.tensor} = {n} must equal the number of "
                         f"devices ({n_devices})")
    rows = cfg.rollout.prompts_per_step * cfg.rollout.num_samples
    batch_ways = m.data * m.fsdp
    per_update = rows // max(cfg.recipe.num_minibatches, 1)
    if rows % cfg.recipe.num_minibatches:
        raise ValueError(f"recipe.num_minibatches={cfg.recipe.num_minibatches} must divide the rollout rows "
                         f"prompts_per_step*num_samples={rows}")
    if per_update % (batch_ways * cfg.optim.num_microbatches):
        raise ValueError(f"each update has {per_update} rows, which must divide into optim.num_microbatches="
                         f"{cfg.optim.num_microbatches} micro-batches across data*fsdp={batch_ways} devices")
    if m.tensor > 1:
        for name in ("num_heads", "num_kv_heads", "intermediate_size"):
            v = getattr(model_cfg, name)
            if v % m.tensor:
                raise ValueError(f"mesh.tensor={m.tensor} must divide model {name}={v}")


def check_rl(cfg: RLRunConfig, *, n_devices: int | None = None) -> dict:
    """Validate ``cfg`` without loading weights or data; returns a summary (parameter count,
    rows per step, mesh). Raises ``ValueError`` naming the field that is wrong."""
    from flax import nnx

    from jaxrl_llm.models import PRESETS, Transformer

    m = cfg.model
    if m.source == "tiny":
        model_cfg = _tiny_config(m, 95)
    elif m.preset:
        if m.preset not in PRESETS:
            raise ValueError(f"model.preset {m.preset!r} is unknown; known: {', '.join(sorted(PRESETS))}")
        model_cfg = PRESETS[m.preset].replace(dtype=m.dtype, param_dtype=m.param_dtype, remat=m.remat,
                                              lora=_lora(m))
    elif m.source == "smollm2":
        from jaxrl_llm.models import gguf_config, smollm2_path
        from gguf import GGUFReader

        model_cfg = gguf_config(GGUFReader(str(smollm2_path())), dtype=m.dtype, param_dtype=m.param_dtype,
                                remat=m.remat, lora=_lora(m))
    elif m.source.startswith("hf:"):  # the config.json only; no weights are read
        from jaxrl_llm.models.config import load_config

        if not Path(m.source[3:]).is_dir():
            raise ValueError(f"model.source: HF model directory {m.source[3:]} does not exist")
        model_cfg = load_config(m.source[3:], dtype=m.dtype, param_dtype=m.param_dtype, remat=m.remat, lora=_lora(m))
    else:
        raise ValueError("model.preset is needed to check a config whose weights are not loaded "
                         f"(model.source={m.source!r})")
    _recipe(cfg)
    _sampling(cfg, (0,), 0)
    make_optimizer(cfg.optim.lr, cfg.run.steps, warmup_steps=cfg.optim.warmup_steps, schedule=cfg.optim.schedule)
    if cfg.sft.steps:
        make_optimizer(cfg.sft.lr, cfg.sft.steps, warmup_steps=cfg.sft.warmup_steps, schedule=cfg.sft.schedule)
    if not 0.0 <= cfg.sft.target_accuracy <= 1.0:
        raise ValueError(f"sft.target_accuracy must be in [0, 1], got {cfg.sft.target_accuracy}")
    if cfg.sft.target_accuracy and (cfg.sft.probe_every < 1 or cfg.sft.probe_rows < 1):
        raise ValueError("sft.probe_every and sft.probe_rows must be >= 1 when sft.target_accuracy is set")
    if cfg.rollout.prompts_per_step < 1 or cfg.rollout.max_new_tokens < 1:
        raise ValueError("rollout.prompts_per_step and rollout.max_new_tokens must be >= 1")
    if cfg.data.dataset and not cfg.data.eval_dataset:
        raise ValueError("data.eval_dataset is required with data.dataset")
    if not cfg.data.dataset:
        from jaxrl_llm.tasks import get_task

        get_task(cfg.data.task, **dict(cfg.data.task_args))
    m_ = cfg.mesh
    _check_mesh(cfg, model_cfg, n_devices or m_.data * m_.fsdp * m_.tensor)
    abstract = nnx.eval_shape(lambda: Transformer(model_cfg, rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    return {"params": n_params, "rows_per_step": cfg.rollout.prompts_per_step * cfg.rollout.num_samples,
            "mesh": dataclasses.asdict(cfg.mesh), "model": model_cfg.to_dict()}


# ----------------------------------------------------------------------------- the run


def _sft_warmup(cfg: RLRunConfig, gd, state_params, frozen, tok, sft_rows, log_fn, probe=None) -> tuple[Any, dict]:
    """SFT on ``sft_rows``; with ``cfg.sft.target_accuracy`` it stops once ``probe(params)``
    (greedy accuracy on training prompts) reaches the target."""
    from jaxrl_llm.data import ListSource, SFTDataConfig, sft_dataset
    from jaxrl_llm.training.objectives import SFTObjective
    from jaxrl_llm.training.preference import sft_arrays
    from jaxrl_llm.training.step import init_train_state, make_train_step

    s = cfg.sft
    if not sft_rows:
        raise ValueError("sft.steps > 0 needs a task with reference solutions (data.task), not a dataset")
    opt = make_optimizer(s.lr, s.steps, warmup_steps=s.warmup_steps, schedule=s.schedule,
                         max_grad_norm=cfg.optim.max_grad_norm)
    state = init_train_state(state_params, opt, seed=cfg.run.seed)
    step = make_train_step(gd, opt, SFTObjective())
    data = sft_dataset(ListSource(sft_rows, "sft"), tok,
                       SFTDataConfig(batch_size=s.batch_size, chat=cfg.data.chat, system_prompt=cfg.data.system_prompt,
                                     length_buckets=tuple(cfg.rollout.prompt_buckets), seed=cfg.run.seed),
                       process_index=0, process_count=1)  # the global batch on every host (loop docstring)
    t0, probes, done = time.perf_counter(), [], s.steps
    for i in range(s.steps):
        state, m = step(state, sft_arrays(next(data)), *frozen)
        n, reached = i + 1, False
        if probe is not None and s.target_accuracy and n % s.probe_every == 0:
            acc = float(probe(state.params)["eval/accuracy"])
            probes.append((n, acc))
            log_fn({"sft/probe_accuracy": acc}, step=n)
            reached = acc >= s.target_accuracy
        if n % 50 == 0 or n == s.steps or reached:
            log_fn({"sft/nll": float(m["sft/nll"])}, step=n)
        if reached:
            done = n
            break
    info = {"steps": done, "nll_last": float(m["sft/nll"]) if s.steps else None,
            "seconds": time.perf_counter() - t0}
    if s.target_accuracy:
        info["probe_accuracy"] = probes
        info["reached_target"] = bool(probes) and probes[-1][1] >= s.target_accuracy
    return state.params, info


def _plot(history: list[dict], path: Path, before: float, after: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["iteration"] for h in history]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    r = np.array([h["rewards/total/mean"] for h in history])
    axes[0].plot(steps, r, alpha=0.35, label="per step")
    k = max(1, len(r) // 10)
    if len(r) >= k:
        axes[0].plot(steps[k - 1:], np.convolve(r, np.ones(k) / k, mode="valid"), label=f"mean of {k}")
    axes[0].set(title="training reward", xlabel="step")
    axes[0].legend()
    ev = [(h["iteration"], h["eval/accuracy"]) for h in history if "eval/accuracy" in h]
    pts = [(0, before)] + ev
    axes[1].plot([p[0] for p in pts], [p[1] for p in pts], "o-")
    axes[1].set(title="held-out accuracy (greedy)", xlabel="step", ylim=(0, 1))
    axes[2].plot(steps, [h["response/length_mean"] for h in history])
    axes[2].set(title="completion length (tokens)", xlabel="step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_rl(cfg: RLRunConfig) -> dict:
    """Run (or resume) the RL experiment ``cfg``; returns the summary (also ``summary.json``)."""
    from flax import nnx

    from jaxrl_llm.data import PromptDataConfig, end_of_turn_id, prompt_dataset
    from jaxrl_llm.models import save_hf, trainable
    from jaxrl_llm.rollout import Sampler
    from jaxrl_llm.training.checkpoint import Checkpointer
    from jaxrl_llm.training.evaluate import Evaluator
    from jaxrl_llm.training.loop import RLTrainer
    from jaxrl_llm.training.step import init_train_state, make_train_step, train_state_shardings
    from jaxrl_llm.training.telemetry import Telemetry

    t_start = time.perf_counter()
    if cfg.run.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ImportError("run.plot=true needs matplotlib: pip install 'jaxrl_llm[plot]' (or set run.plot=false)")
    out = Path(cfg.run.out)
    host0 = jax.process_index() == 0
    out.mkdir(parents=True, exist_ok=True)
    from jaxrl_llm.config import to_dict

    resolved = to_dict(cfg)
    if host0:
        (out / "config.json").write_text(json.dumps(resolved, indent=1))

    mesh = None
    m_ = cfg.mesh
    if m_.data * m_.fsdp * m_.tensor > 1:
        from jaxrl_llm.parallel import make_mesh

        mesh = make_mesh((m_.data, m_.fsdp, m_.tensor))
    model, tok = load_policy(cfg.model, seed=cfg.run.seed, mesh=mesh)
    _check_mesh(cfg, model.cfg, jax.device_count())
    base_cfg = model.cfg
    gd, params, frozen_state = nnx.split(model, trainable(model.cfg), ...)
    frozen = (frozen_state,)
    del model

    stop = end_of_turn_id(tok, cfg.data.chat)
    pad = tok.pad_token_id if tok.pad_token_id is not None else stop
    train_src, eval_rows, sft_rows, reward_fn, score_fn = _rows(cfg)
    evaluate = Evaluator(gd, tok, eval_rows, score_fn, max_new_tokens=cfg.rollout.max_new_tokens,
                         stop_token_ids=(stop,), pad_token_id=pad, chat=cfg.data.chat,
                         system_prompt=cfg.data.system_prompt, batch_size=cfg.run.eval_batch_size,
                         length_buckets=tuple(cfg.rollout.prompt_buckets))

    tel = Telemetry(out, tensorboard=cfg.run.tensorboard, console_every=cfg.run.console_every, step_key="iteration")
    ckpt = Checkpointer(out / "ckpt", keep_last=cfg.run.keep_last)
    resuming = ckpt.latest_step() is not None
    summary: dict[str, Any] = {"config": resolved}

    before_path = out / "eval_before.json"
    if resuming and before_path.exists():
        summary.update(json.loads(before_path.read_text()))
    else:
        summary["eval_before"] = evaluate(params, *frozen)
        summary["eval_before_samples"] = [{"prompt": r["prompt"], "completion": c}
                                          for r, c in zip(eval_rows[:8], evaluate.last_completions[:8])]
        if cfg.sft.steps:
            probe = None
            if cfg.sft.target_accuracy:
                probe_rows = [train_src[i] for i in range(min(cfg.sft.probe_rows, len(train_src)))]
                p_eval = Evaluator(gd, tok, probe_rows, score_fn, max_new_tokens=cfg.rollout.max_new_tokens,
                                   stop_token_ids=(stop,), pad_token_id=pad, chat=cfg.data.chat,
                                   system_prompt=cfg.data.system_prompt, batch_size=cfg.run.eval_batch_size,
                                   length_buckets=tuple(cfg.rollout.prompt_buckets))
                probe = lambda p: p_eval(p, *frozen)  # noqa: E731
            params, summary["sft"] = _sft_warmup(cfg, gd, params, frozen, tok, sft_rows, tel, probe=probe)
            summary["eval_after_sft"] = evaluate(params, *frozen)
        if host0:
            before_path.write_text(json.dumps({k: summary[k] for k in ("eval_before", "eval_after_sft", "sft",
                                                                        "eval_before_samples") if k in summary}))
    start_acc = summary.get("eval_after_sft", summary["eval_before"])["eval/accuracy"]

    rec = _recipe(cfg)
    o = cfg.optim
    opt = make_optimizer(o.lr, cfg.run.steps, warmup_steps=o.warmup_steps, schedule=o.schedule,
                         weight_decay=o.weight_decay, b1=o.b1, b2=o.b2, max_grad_norm=o.max_grad_norm)
    state = init_train_state(params, opt, seed=cfg.run.seed)
    shard_kw = {}
    if mesh is not None:
        from jaxrl_llm.parallel import state_shardings

        st_sh = train_state_shardings(opt, state, mesh)
        state = jax.device_put(state, st_sh)
        shard_kw = dict(state_shardings=st_sh, frozen_shardings=(state_shardings(frozen_state, mesh),))
    ref_params = None
    if rec.objective.kl_coef or rec.kl_in_reward_coef:
        if cfg.model.offload_reference:
            from jaxrl_llm.parallel import to_host_memory

            ref_params = to_host_memory(params)
        else:
            ref_params = jax.tree.map(lambda x: x.copy(), params)
    train_step = make_train_step(gd, opt, rec.objective, num_microbatches=o.num_microbatches, **shard_kw)
    data = prompt_dataset(train_src, tok,
                          PromptDataConfig(batch_size=cfg.rollout.prompts_per_step, chat=cfg.data.chat,
                                           system_prompt=cfg.data.system_prompt, seed=cfg.run.seed + 1,
                                           max_prompt_tokens=cfg.data.max_prompt_tokens),
                          process_index=0, process_count=1)  # the global batch on every host (loop docstring)
    sampler_rules = None
    if mesh is not None and cfg.rollout.sampler_weights == "tensor":
        from jaxrl_llm.parallel import SAMPLER_RULES as sampler_rules
    sampler = Sampler(gd, _sampling(cfg, (stop,), pad), length_buckets=tuple(cfg.rollout.prompt_buckets), mesh=mesh,
                      param_rules=sampler_rules)

    def log_fn(metrics: dict) -> None:
        tel(metrics)
        it = metrics["iteration"]
        if cfg.run.log_samples_every and (it == 1 or it % cfg.run.log_samples_every == 0):
            tel.log_samples(it, trainer.last_samples(4))

    critic = None
    if rec.advantage_type == "critic":
        from jaxrl_llm.training.rl import Critic

        base = nnx.state(nnx.merge(gd, params, frozen_state), nnx.Param)  # backbone (LoRA adapters excluded)
        critic = Critic.create(base_cfg.replace(lora=None),
                               make_optimizer(cfg.recipe.critic_lr, cfg.run.steps, warmup_steps=o.warmup_steps,
                                              max_grad_norm=o.max_grad_norm),
                               rec.value_objective, policy_params=base, seed=cfg.run.seed,
                               num_microbatches=o.num_microbatches, mesh=mesh)
    trainer = RLTrainer(gd, state, train_step, sampler, data, _rewards(cfg, reward_fn), rec, tok, seed=cfg.run.seed,
                        frozen=frozen, ref_params=ref_params, critic=critic, checkpointer=ckpt,
                        checkpoint_every=cfg.run.checkpoint_every,
                        eval_fn=lambda p: evaluate(p, *frozen), eval_every=cfg.run.eval_every, log_fn=log_fn,
                        config=resolved)
    if trainer.restore():
        log.info("resumed from %s at step %d", ckpt.directory, trainer.iteration)
    t0 = time.perf_counter()
    history = trainer.run(cfg.run.steps, progress=cfg.run.progress and host0)
    summary["rl_seconds_this_process"] = time.perf_counter() - t0
    summary["steps"] = trainer.iteration
    if trainer.iteration < cfg.run.steps:  # preempted: the checkpoint is saved, stop here
        summary["preempted"] = True
        ckpt.close()
        tel.close()
        return summary

    last_eval = history[-1] if history and "eval/accuracy" in history[-1] else None
    summary["eval_after"] = ({k: v for k, v in last_eval.items() if k.startswith("eval/")} if last_eval
                             else evaluate(trainer.state.params, *frozen))
    summary["eval_after_samples"] = [{"prompt": r["prompt"], "completion": c}
                                     for r, c in zip(eval_rows[:8], evaluate.last_completions[:8])]
    summary["accuracy_change"] = summary["eval_after"]["eval/accuracy"] - start_acc
    summary["reward_first_5"] = float(np.mean([h["rewards/total/mean"] for h in history[:5]]))
    summary["reward_last_5"] = float(np.mean([h["rewards/total/mean"] for h in history[-5:]]))
    if cfg.run.export_hf:
        weights = (trainer.state.params, frozen_state)
        if jax.process_count() > 1:  # every process takes part in fetching the shards
            from jaxrl_llm.parallel import gather

            weights = gather(weights)
        if host0:
            save_hf(nnx.merge(gd, *weights), out / "hf", tokenizer=tok if hasattr(tok, "save_pretrained") else None)
        summary["hf_export"] = str(out / "hf")
    if host0:
        if cfg.run.plot:
            _plot(history, out / "reward_curve.png", summary["eval_before"]["eval/accuracy"] if not cfg.sft.steps
                  else start_acc, summary["eval_after"]["eval/accuracy"])
            summary["plot"] = str(out / "reward_curve.png")
    ckpt.close()
    tel.close()
    summary["seconds_this_process"] = time.perf_counter() - t_start
    if host0:
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
        acc = [("start", summary["eval_before"])] + ([("after SFT", summary["eval_after_sft"])]
                                                     if "eval_after_sft" in summary else [])
        acc.append(("after RL", summary["eval_after"]))
        print(f"held-out accuracy ({int(summary['eval_after']['eval/n'])} problems, greedy): "
              + " -> ".join(f"{k} {v['eval/accuracy']:.3f}" for k, v in acc) + f"  [{out}]", flush=True)
    return {k: v for k, v in summary.items() if k not in ("config", "eval_before_samples", "eval_after_samples")}

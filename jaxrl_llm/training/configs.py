"""Run configs: nested frozen dataclasses that an experiment returns and the command line
overrides (``rollout.num_samples=16``, ``recipe.loss=gspo``); see :mod:`jaxrl_llm.config`.

:class:`RLRunConfig` is an RL run (:func:`jaxrl_llm.training.runner.run_rl`),
:class:`PreferenceRunConfig` an offline preference run
(:func:`jaxrl_llm.training.preference_runner.run_preference`). The resolved config (presets
filled in) is stored in ``out/config.json`` and with every checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_llm.config import Choice

__all__ = ["ModelSpec", "DataSpec", "RolloutSpec", "KLSpec", "RecipeSpec", "OptimSpec", "TrainSpec", "SFTSpec",
           "MeshSpec", "RunSpec", "RLRunConfig", "PairsSpec", "PreferenceRecipeSpec", "PreferenceTrainSpec",
           "PreferenceRunConfig"]

ALL_LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The policy.

    ``source``: ``"smollm2"`` (the embedded SmolLM2-135M-Instruct), ``"hf:<dir>"`` (an HF
    model directory: config, safetensors, tokenizer), ``"gguf:<file>"``, or ``"tiny"`` (a
    random Llama-style model of ``hidden_size`` / ``num_layers`` over the 95-character
    tokenizer, for tests and the tiny preset), ``"tiny-moe"`` (the same with a mixture of 8
    experts, top-2, in every layer). ``preset``: a
    :data:`jaxrl_llm.models.PRESETS` name giving the shapes when the weights are not on this
    machine (used by :func:`check_rl`). ``lora_rank > 0`` trains LoRA adapters only
    (``lora_alpha = 0`` means ``2 * rank``). ``offload_reference``: keep the frozen reference
    policy of a KL recipe in host memory (same sharding) and move it to the devices only for
    its log-prob pass, saving its size in device memory between passes at the price of one
    host-to-device copy per step (no effect without a reference; with LoRA the reference is
    the adapters only). ``aux_params``: a parameter directory of a model with the same
    architecture and parameter layout (the ``final_params/`` a preference run writes, an RL run's
    ``sft_params/``): the auxiliary policy whose per-token log-probs RTO's dense rewards and
    TGDPO's token weights read (a DPO-trained model in those papers). ``reverse_params``: the
    same for AlignDistil's reverse-DPO model (trained on swapped preferences), its teacher's
    second model beside ``aux_params``. ``init_params``: a parameter directory of the same kind
    the RL policy starts from instead of ``source``'s weights (the frozen reference of a KL term
    starts there too): MPO's second stage, RL from the DPO model with it as the reference.
    """

    source: str = "smollm2"
    preset: str = ""
    dtype: str = "float32"
    param_dtype: str = "float32"
    #: what the update's backward pass recomputes: none, dots, full, or auto (chosen from the run's
    #: shapes: dots when the update keeps >= 1 GiB of activations without it; jaxrl_llm.training.auto)
    remat: str = "auto"
    #: the attention implementation (jaxrl_llm.models.attn): auto (splash on TPU, cudnn on GPU; on
    #: CPU dense up to 2,048 keys, blockwise above), dense, blockwise, splash, cudnn
    attention: str = "auto"
    #: query and key block of blockwise and splash attention
    attention_block: int = 512
    #: a mixture of experts: each expert's capacity per sequence, as a multiple of an even share
    #: (ModelConfig.moe_capacity_factor); null: dropless (the model's own setting)
    moe_capacity_factor: float | None = None
    lora_rank: int = 0
    lora_alpha: float = 0.0
    lora_targets: tuple[str, ...] = ALL_LORA_TARGETS
    hidden_size: int = 64
    num_layers: int = 2
    offload_reference: bool = False
    aux_params: str = ""
    reverse_params: str = ""
    init_params: str = ""


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """Prompts and the reward.

    Either a built-in ``task`` (:func:`jaxrl_llm.tasks.get_task` with ``task_args``; train and
    eval rows come from the task's disjoint splits) or a ``dataset`` file/folder (jsonl,
    parquet, saved HF dataset; ``dataset_format="gsm8k"`` reads GSM8K's question/answer
    columns) with an ``eval_dataset``. The reward is the task's verifier (or the math
    verifier on the ``answer`` column for datasets) plus ``format_weight`` times a strict
    tag-format reward when ``format_weight > 0``. ``budgets``: HBPO's budget variants of every
    training prompt (``budget_template`` with ``{prompt}`` and ``{budget}``), consecutive, so
    prompt group ``g`` asks question ``g // k`` under budget ``g % k`` (``rollout.prompts_per_step``
    counts questions). ``pass_threshold``: a response passes when its reward total is ``>=``
    this (the pass rates of the run's per-prompt statistics, :class:`~jaxrl_llm.training.PromptStore`).
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
    budgets: tuple[int, ...] = ()
    budget_template: str = "{prompt}\n(Answer within {budget} tokens.)"
    pass_threshold: float = 1.0


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """Sampling. ``sampler_weights``: the layout of the weights the sampler decodes with on a
    mesh -- ``"train"`` (the trainer's: FSDP-split weights are all-gathered layer by layer at
    every decoded token) or ``"tensor"`` (resharded once per rollout into a copy split over
    ``tensor`` only, :data:`jaxrl_llm.parallel.SAMPLER_RULES`; costs that copy's memory while
    sampling). ``candidates``: prompts drawn from the data per trained prompt, for
    ``recipe.selector`` to choose from (1: no choice). ``staleness``: sample with the policy of
    that many updates before (off-policy; needs ``recipe.old_logp=recompute``, corrected by
    ``recipe.is_weights`` / ``recipe.rejection``). ``sampler_devices``: the first that many
    devices run the sampler and the rest (``mesh``) the trainer (0: both on the whole mesh);
    ``asynchronous``: with ``sampler_devices`` and ``staleness >= 1``, the next step's rollout is
    sampled on the sampler's devices while this step's update runs (verl's one-step-off-policy
    structure); the same run as without it, only faster. ``tree_segment``: TreePO's segment-tree
    sampling (:class:`jaxrl_llm.rollout.TreeSampler`): a prompt's responses share their first
    segments of that many tokens, the width growing by ``tree_branch`` per segment (``None``:
    independent samples); the tree's paths feed ``recipe.advantage=treepo``. ``sampler_dtype``:
    decode with the weights cast to this dtype (``bfloat16``: half the bytes each decode step
    streams; the training weights stay float32; ``None``: the model's own dtype). The sampler's
    log-probs are then those of the cast model: needs ``recipe.old_logp=recompute`` (the ratio's
    old policy is the float32 one) and logs the mismatch (``sampler_mismatch/*``); correct it
    with ``recipe.is_weights=tis`` or ``icepop``. ``shared_prompt_kv``: the ``num_samples`` rows of a
    prompt read its keys/values once while decoding instead of a copy each (less cache memory and
    fewer bytes per decode step when prompts are long; equal to float rounding, not bit for bit;
    :class:`jaxrl_llm.rollout.SamplingConfig`); unset: chosen by the run (on when the copies it
    saves are >= 16 MiB and >= 10% of a decode step's bytes, :mod:`jaxrl_llm.training.auto`).
    ``unroll_layers``: decode with the
    layers unrolled over per-layer copies of the weights (``true``) or scanned over the stacked
    weights (``false``); unset: chosen by the run as :class:`jaxrl_llm.rollout.Sampler`'s ``"auto"``
    (scanned for models above 128 MiB decoded in float32, i.e. without ``sampler_dtype``). Unrolled is faster for large
    decode batches (SmolLM2, 32 distinct prompts: 7.8 against 10.7 s) and compiles longer; it matches
    the scanned sampler to float rounding, not bit for bit. The held-out evaluation's sampler and
    SPO's continuation sampler follow it too."""

    prompts_per_step: int = 8
    num_samples: int = 8
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    prompt_buckets: tuple[int, ...] = (32, 64, 128, 256)
    sampler_weights: str = "train"
    candidates: int = 1
    staleness: int = 0
    sampler_devices: int = 0
    asynchronous: bool = False
    tree_segment: int | None = None
    tree_branch: int = 2
    sampler_dtype: str | None = None
    shared_prompt_kv: bool | None = None
    unroll_layers: bool | None = None


@dataclasses.dataclass(frozen=True)
class KLSpec:
    """The KL regulariser to the frozen initial policy (``None``: the preset's value).

    ``coef``: its weight (``0``: none; the reference policy is then not kept). ``estimator``:
    ``k1``, ``k2``, ``k3`` (= ``low_var_kl``), ``abs``, each optionally with ``+`` (the
    straight-through variant). ``placement``: ``loss`` (a term of the policy loss, GRPO's) or
    ``reward`` (subtracted from the token rewards before the advantages, InstructGPT's; needs
    an estimator that reads token rewards). ``controller``: ``fixed`` or ``adaptive``
    (``target``, ``horizon``: Ziegler et al.'s controller, updated once per iteration).
    """

    coef: float | None = None
    estimator: str | None = None
    placement: str | None = None
    controller: Choice = dataclasses.field(default_factory=Choice)
    bias_correction: str | None = None


@dataclasses.dataclass(frozen=True)
class RecipeSpec:
    """A policy-optimisation recipe as data: a preset (``name``) and the parts that differ.

    Every field left at ``None`` (or a :class:`~jaxrl_llm.config.Choice` without a name) takes
    the preset's value; ``jaxrl_llm.training.recipes.PRESETS`` lists the presets and
    ``jaxrl-llm methods`` every part. A choice field takes a name and its arguments::

        recipe.advantage=optimal_token_baseline recipe.loss=gspo recipe.loss.clip_low=3e-4
        recipe.agg=seq-mean-token-mean recipe.kl.coef=0 recipe.is_weights=tis

    Attributes:
      name: the preset (``grpo``, ``dr_grpo``, ``dapo``, ``gspo``, ``rloo``, ``ppo``, ...).
      advantage: the advantage estimator and its arguments.
      loss: the policy surrogate and its arguments (clip ranges, ...).
      agg: the aggregation mode (``token-mean``, ``seq-mean-token-mean``, ...); ``horizon``:
        the constant of ``seq-mean-token-sum-norm``.
      kl: the KL regulariser (:class:`KLSpec`); entropy_coef: the entropy bonus.
      is_weights: importance weights against the sampler-trainer mismatch (``tis``,
        ``icepop``); rejection: rollout rejection masks (``mask`` with a ``mode``). Both need
        ``old_logp=recompute``.
      shaping: reward shaping (``overlong``, ``kimi_length``); group_filter: which groups are
        kept (``dynamic_sampling``); batch_filter: a resample of the batch (``pf_ppo``).
      old_logp: ``sampler`` (the sampler's log-probs) or ``recompute`` (a forward pass of the
        policy before the update, as verl).
      epochs, num_minibatches: passes over each rollout batch and optimiser steps per pass.
      value_clip: the critic's value clipping (recipes with a critic).
      critic_lr: the critic's AdamW learning rate; critic_warmup: iterations that train the
        critic only.
      progress_lr: the AdamW learning rate of SPA-RL's progress estimator (estimators that
        require ``progress``; agent runs).
      clusterer: how completions are grouped into answers for methods that read answer
        clusters (``answer``: equal extracted final answers; ``text``: equal completions).
      truncation: a cut of sampled responses before they are trained on, the cut responses
        scored again (``dot``: DOT's outlier truncation in all-correct groups).
      selector: which of ``rollout.candidates`` x ``prompts_per_step`` candidate prompts a
        step samples (``sec``, ``vas``, ...: curricula over the per-prompt statistics).
      allocator: how a step's ``prompts_per_step x num_samples`` rollouts are divided among its
        prompts (``knapsack``: Knapsack RL; ``none``: ``num_samples`` each).
      replay: earlier successes put back into collapsed groups (``arpo``: ARPO's buffer; needs
        ``old_logp=recompute``).
      hints: groups the policy cannot solve sampled again with part of the reference solution in
        the prompt (``ghpo``).
      loop_part: a further loop part by name (:mod:`jaxrl_llm.training.parts`, e.g.
        ``variance_filter``: ReST-GRPO's set-aside of prompts without reward variance), its
        arguments as ``recipe.loop_part.<arg>=...``; ``none``: none.
    """

    name: str = "grpo"
    advantage: Choice = dataclasses.field(default_factory=Choice)
    loss: Choice = dataclasses.field(default_factory=Choice)
    agg: str | None = None
    horizon: float | None = None
    kl: KLSpec = dataclasses.field(default_factory=KLSpec)
    entropy_coef: float | None = None
    is_weights: Choice = dataclasses.field(default_factory=Choice)
    rejection: Choice = dataclasses.field(default_factory=Choice)
    shaping: Choice = dataclasses.field(default_factory=Choice)
    group_filter: Choice = dataclasses.field(default_factory=Choice)
    batch_filter: Choice = dataclasses.field(default_factory=Choice)
    old_logp: str | None = None
    epochs: int | None = None
    num_minibatches: int | None = None
    value_clip: float | None = None
    critic_lr: float = 1e-5
    critic_warmup: int | None = None
    progress_lr: float = 1e-5
    clusterer: Choice = dataclasses.field(default_factory=Choice)
    truncation: Choice = dataclasses.field(default_factory=Choice)
    selector: Choice = dataclasses.field(default_factory=Choice)
    allocator: Choice = dataclasses.field(default_factory=Choice)
    replay: Choice = dataclasses.field(default_factory=Choice)
    hints: Choice = dataclasses.field(default_factory=Choice)
    loop_part: Choice = dataclasses.field(default_factory=Choice)


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
class TrainSpec:
    """How the update computes. ``shared_prefix``: Prefix Grouper (arXiv 2506.05433) -- each
    prompt group's prompt is encoded once in every log-prob pass of the update (old and
    reference log-probs, the loss and its gradient) and the completions attend to its
    keys/values, the same values and gradients up to float rounding
    (:mod:`jaxrl_llm.training.prefix`). ``None`` (default): on wherever the update stays the
    same computation -- every row of a group has its group's prompt (not with
    ``recipe.allocator``, ``recipe.batch_filter`` or ``recipe.hints``), mini-batches already hold
    whole groups (one mini-batch, or a surrogate that compares a group's rows), and the batch
    geometry leaves blocks of >= 2 rows of one prompt per micro-batch and device; ``true``: on
    wherever the prompts are shared, dealing whole prompt groups (instead of rows) into
    mini-batches, an error where it cannot be; ``false``: off (each row encodes its own prompt)."""

    shared_prefix: bool | None = None
    #: mixture of experts: compute every log-prob pass of the update with the experts the sampler
    #: routed each token to (recorded at rollout; Rollout Routing Replay, arXiv 2510.11370); false:
    #: the trainer's routers choose. Either way ``moe/router_mismatch`` logs the fraction of
    #: (token, layer) pairs whose trainer-side router picks another expert set than the sampler's
    routing_replay: bool = False
    #: mixture of experts: weight of the load-balancing loss in the policy loss (HF's
    #: ``router_aux_loss_coef``; logged as ``moe/load_balancing_loss`` whatever the weight)
    router_aux_coef: float = 0.0
    #: sequence packing (jaxrl_llm.data.packing): > 0 packs the rows' real tokens into micro-batches of
    #: one packed row of this many tokens per batch device (verl's remove-padding with dynamic batch
    #: size), instead of optim.num_microbatches padded slices; the same values and gradients up to
    #: float summation order. 0: off (rows padded to the longest)
    max_tokens_per_microbatch: int = 0
    #: with packing: the budget of the forward-only log-prob passes (old, reference, auxiliary
    #: policies); 0: twice max_tokens_per_microbatch (no activations kept for a backward pass)
    logprob_tokens_per_microbatch: int = 0


@dataclasses.dataclass(frozen=True)
class SFTSpec:
    """Optional supervised warm-up on the task's reference solutions before RL (0 steps: off)."""

    steps: int = 0
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 0
    schedule: str = "constant"
    weight_decay: float = 0.0
    #: Stop the warm-up early once greedy accuracy on ``probe_rows`` *training* prompts (never
    #: the held-out ones) reaches this value, checked every ``probe_every`` steps (0: run all
    #: ``steps``). Small models cross from "mostly wrong" to "mostly right" at seed-dependent
    #: step counts; a target makes RL start from a comparable, partly-right policy on every seed.
    target_accuracy: float = 0.0
    probe_every: int = 50
    probe_rows: int = 128


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """Device mesh ``(data, fsdp, tensor)``, plus ``expert`` for a mixture of experts (its
    stacked experts split over that axis; the batch is split over ``data``, ``fsdp`` and
    ``expert``) and ``context`` (each row's tokens split over it); the product must equal the
    device count (all 1: one device, no sharding)."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1
    #: context parallelism: each row's tokens split over this many devices (the train step and the
    #: log-prob passes; keys and values all-gathered in attention); parameters split over it too
    context: int = 1

    @property
    def devices(self) -> int:
        return self.data * self.fsdp * self.tensor * self.expert * self.context

    @property
    def batch_ways(self) -> int:
        """Ways the batch is split: ``data * fsdp * expert``."""
        return self.data * self.fsdp * self.expert

    def shape_axes(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """``(shape, axis names)`` for :func:`jaxrl_llm.parallel.make_mesh` (no ``expert`` axis
        unless it is > 1: the same mesh as before for dense runs)."""
        shape, axes = (self.data, self.fsdp, self.tensor), ("data", "fsdp", "tensor")
        if self.expert > 1:
            shape, axes = shape + (self.expert,), axes + ("expert",)
        if self.context > 1:
            shape, axes = shape + (self.context,), axes + ("context",)
        return shape, axes


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Where and how long a run goes. ``compile_cache``: JAX's persistent compilation cache
    directory (``~`` expands): a second run of the same shapes reads its compiled programs instead
    of compiling them, so its first step starts sooner; ``""``: off. A cache configured
    already (``JAX_COMPILATION_CACHE_DIR``, ``jax.config``) is left as it is."""

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
    compile_cache: str = "~/.cache/jaxrl_llm/xla"
    #: start even when the preflight plans more memory than the devices have (a warning instead of
    #: the one-line error; `jaxrl-llm train --force`)
    force: bool = False


@dataclasses.dataclass(frozen=True)
class RLRunConfig:
    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    data: DataSpec = dataclasses.field(default_factory=DataSpec)
    rollout: RolloutSpec = dataclasses.field(default_factory=RolloutSpec)
    recipe: RecipeSpec = dataclasses.field(default_factory=RecipeSpec)
    optim: OptimSpec = dataclasses.field(default_factory=OptimSpec)
    train: TrainSpec = dataclasses.field(default_factory=TrainSpec)
    sft: SFTSpec = dataclasses.field(default_factory=SFTSpec)
    mesh: MeshSpec = dataclasses.field(default_factory=MeshSpec)
    run: RunSpec = dataclasses.field(default_factory=RunSpec)


@dataclasses.dataclass(frozen=True)
class PairsSpec:
    """Where the preference pairs of a preference run come from.

    ``source="self"``: for each of ``prompts`` training prompts of ``data.task``, chosen = the
    task's reference solution and rejected = the first wrong answer among the (SFT) policy's
    ``samples_per_prompt`` samples (``max_new_tokens`` each, temperature 1), else a near miss
    (off by one or ten, for arithmetic). ``held_out`` eval prompts give held-out pairs the same
    way (their pair metrics are logged). ``source="spin"`` is SPIN's self-play: ``iterations``
    rounds, each pairing the reference solution (chosen) with the current policy's own first
    sample (rejected, right or wrong), training ``run.steps`` steps with the current policy as
    the frozen reference (the opponent), on this round's pairs plus the previous round's
    (``keep_previous``, the authors' data schedule). Otherwise ``source`` is a file or folder of
    rows with ``prompt``, ``chosen``, ``rejected`` (jsonl, parquet, a saved HF dataset) and
    ``eval_source`` the held-out pairs. ``batch_size``: pairs per optimiser step.
    ``scope_field``: the row field giving each pair's scope (``in`` / ``near`` / ``out``), read by
    ``recipe.loss=c3po``. ``split``: MPO's data selection (:func:`jaxrl_llm.core.mpo_easy_pairs`)
    of a pairs file's rows by their reward-model scores (the row fields ``score_fields``, chosen
    then rejected): ``"easy"`` trains on the pairs whose score gap is ``>= margin``, ``"hard"`` on
    the others (``""``: every pair); the held-out pairs are not split. ``rationale_field``: the
    row field with each pair's rationale, read by ``recipe.loss=rdpo`` (a third row per pair: the
    rationale after ``rationale_template``, by default
    :data:`jaxrl_llm.data.pipeline.RATIONALE_TEMPLATE`, showing the prompt and both answers); the
    held-out pairs (``eval_source``) need one too.
    """

    source: str = "self"
    eval_source: str = ""
    prompts: int = 1024
    samples_per_prompt: int = 4
    max_new_tokens: int = 6
    held_out: int = 64
    batch_size: int = 32
    iterations: int = 1
    keep_previous: bool = True
    scope_field: str = ""
    split: str = ""
    score_fields: tuple[str, str] = ("score_chosen", "score_rejected")
    margin: float | None = None
    rationale_field: str = ""
    rationale_template: str = ""


@dataclasses.dataclass(frozen=True)
class PreferenceRecipeSpec:
    """A preference preset (``dpo``, ``rpo``, ``ipo``, ``simpo``, ``cpo``, ``orpo``,
    ``kto_paired``, ``kto``; :data:`jaxrl_llm.training.PREFERENCE_RECIPES`) and what differs:
    ``loss`` another registered loss (:data:`jaxrl_llm.algorithms.PREFERENCE_LOSSES`) or the
    preset's loss arguments (``recipe.loss.beta=0.05``), ``sft_coef`` the chosen-NLL weight."""

    name: str = "dpo"
    loss: Choice = dataclasses.field(default_factory=Choice)
    sft_coef: float | None = None


@dataclasses.dataclass(frozen=True)
class PreferenceTrainSpec:
    """How a preference run's updates compute: ``max_tokens_per_microbatch > 0`` packs the pairs
    (chosen and rejected side by side) and the SFT phases' rows into micro-batches of one packed row
    of that many tokens (the preference loss then runs once on the whole batch's sequence sums:
    exact for every loss), instead of ``optim.num_microbatches`` padded slices; 0: off."""

    max_tokens_per_microbatch: int = 0


@dataclasses.dataclass(frozen=True)
class PreferenceRunConfig:
    """An offline preference run (:func:`jaxrl_llm.training.preference_runner.run_preference`):
    model -> SFT warm-up -> pairs -> preference training from the SFT model (also the frozen
    reference), with held-out accuracy and pair metrics, and optionally a control that continues
    SFT on the chosen answers for as many steps instead."""

    model: ModelSpec = dataclasses.field(default_factory=lambda: ModelSpec(source="tiny", hidden_size=64,
                                                                           num_layers=2))
    data: DataSpec = dataclasses.field(default_factory=lambda: DataSpec(
        task="arithmetic", task_args={"preset": "add2x1", "instruction": ""}, chat=False, eval_rows=128))
    pairs: PairsSpec = dataclasses.field(default_factory=PairsSpec)
    recipe: PreferenceRecipeSpec = dataclasses.field(default_factory=PreferenceRecipeSpec)
    # AdamW without clipping and optax's default weight decay 1e-4, as the tiny DPO experiment always had
    optim: OptimSpec = dataclasses.field(default_factory=lambda: OptimSpec(lr=3e-4, max_grad_norm=0.0, weight_decay=1e-4,
                                                                           num_microbatches=2))
    sft: SFTSpec = dataclasses.field(default_factory=lambda: SFTSpec(steps=400, batch_size=32, lr=3e-3,
                                                                     weight_decay=1e-4))
    run: RunSpec = dataclasses.field(default_factory=lambda: RunSpec(
        out="runs/tiny_dpo", steps=100, eval_every=50, checkpoint_every=50, keep_last=1, export_hf=False,
        plot=False, log_samples_every=0, progress=False))
    prompt_buckets: tuple[int, ...] = (32,)
    control: bool = True
    train: PreferenceTrainSpec = dataclasses.field(default_factory=PreferenceTrainSpec)

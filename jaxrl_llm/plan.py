"""Ahead-of-time planning: will a model, batch and mesh fit, and how long will a step take?

:func:`plan` builds the model, the train state and the batches as *abstract* shapes (no
weights are created), lowers and compiles the real jitted train step
(:func:`jaxrl_llm.training.make_train_step`) and the real sampler
(:func:`jaxrl_llm.rollout.generate`) for a ``(data, fsdp, tensor)`` mesh (plus ``expert`` for
a mixture of experts), and reports per device:

- **params**, **optimiser state**, **batch**: summed from each array's shard shape under
  the same logical sharding rules training uses;
- **temporaries**: the compiler's memory analysis of the step (activations kept for the
  backward pass, gradients, fusion buffers);
- **peak** = arguments + outputs - donated (aliased) bytes + temporaries;
- for the sampler: **KV cache** (from its shard shape) and the compiled program's peak;
- **FLOPs** per device: ``6 x params x tokens`` plus causal attention (a mixture of experts
  counts its *active* parameters, ``k`` of ``E`` experts; sliding-window layers count the
  keys in their window) (the compiler's cost
  analysis is reported too, but it counts one trip of the layer scan), and an estimated time
  on a chip (:data:`CHIPS`, or ``peak_tflops`` / ``hbm_gbs`` given): a roofline, the larger of
  the FLOPs at the chip's peak and the state's memory traffic (parameters read forward and
  backward, gradients written and read, the optimiser's read and write of parameters and
  moments: ``6 x params + 2 x optimiser state`` bytes per device) at its HBM bandwidth.
  Communication is not modelled, so it is a lower bound; the decode estimate streams the
  per-device weights and KV cache once per generated token.

The mesh needs that many devices. On a machine without them, ``jaxrl-llm plan`` re-runs
itself on simulated CPU devices (``--xla_force_host_platform_device_count``), which is how
the 64-device plans in ``docs/scaling.md`` are made on a 2-core CPU. That compile is XLA:CPU's:
TPU and GPU compilers fuse differently, so temporaries there can differ (parameters,
optimiser state, batch and KV cache are exact; they depend only on shapes and shardings). With
a target (``PlanSpec.target``, ``jaxrl-llm plan --target tpu-v5e:8x8``) the chips' own compiler
compiles it on this host instead (:func:`parse_target`, :func:`target_devices`: libtpu's
topologies for TPUs, the XLA GPU compiler with a target description for GPUs), its memory
analysis is the chip's, and the report says whether the program fits; :func:`search` finds the
remat policy, context split and micro-batches that fit.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

__all__ = ["Chip", "CHIPS", "PlanSpec", "Target", "parse_target", "target_devices", "plan", "search", "format_plan",
           "check_spec", "plan_spec_of", "active_params", "attended_pairs"]

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    """Per-chip peak numbers (dense bfloat16 matmul TFLOP/s, HBM GiB and GB/s), from vendor
    data sheets."""

    name: str
    peak_tflops: float
    hbm_gib: float
    hbm_gbs: float


CHIPS = {
    "tpu-v4": Chip("tpu-v4", 275.0, 32.0, 1200.0),
    "tpu-v5e": Chip("tpu-v5e", 197.0, 16.0, 819.0),
    "tpu-v5p": Chip("tpu-v5p", 459.0, 95.0, 2765.0),
    "tpu-v6e": Chip("tpu-v6e", 918.0, 32.0, 1640.0),
    "a100-80gb": Chip("a100-80gb", 312.0, 80.0, 2039.0),
    "h100-sxm": Chip("h100-sxm", 989.0, 80.0, 3350.0),
}


@dataclasses.dataclass(frozen=True)
class PlanSpec:
    """What to plan.

    Attributes:
      model: a :data:`jaxrl_llm.models.PRESETS` name, or a ``ModelConfig``.
      mesh: ``(data, fsdp, tensor)``, or ``(data, fsdp, tensor, expert)`` for a mixture of
        experts (its stacked experts split over ``expert``, the batch over data x fsdp x expert).
      context: context parallelism: each row's tokens split over a ``context`` mesh axis of this
        size (``1``: none); the mesh then has ``prod(mesh) * context`` devices.
      rows: global rows of one train step (prompts x samples), split over data x fsdp (x expert).
      seq_len: tokens per training row (prompt + completion).
      num_microbatches: gradient-accumulation slices of the step.
      prompts, num_samples, prompt_len, new_tokens: the sampler's batch (``prompts`` global
        prompts, each sampled ``num_samples`` times) and lengths. ``prompts=0``: skip it.
      param_dtype, dtype, remat, moe_capacity_factor, attention: override the model's execution
        settings (``None``: keep; the capacity factor of a mixture of experts' expert buffers; the
        attention implementation, ``"auto"`` resolved for the target's platform).
      optimizer: ``"adamw"`` (two moments like the parameters) or ``"sgd"`` (none).
      reference: the frozen reference policy of a KL recipe: ``"none"``, ``"device"`` (a
        second copy of the parameters, sharded like them, resident in device memory through
        the train step and the sampler) or ``"host"`` (``model.offload_reference``: in host
        memory, moved in only for its log-prob pass).
      chip: a :data:`CHIPS` name for the time estimate (``None``: no estimate) unless
        ``peak_tflops`` and ``hbm_gbs`` are given.
      objective: the train step's objective (``None``: GRPO's); its ``batch_keys`` shape the
        planned batch (a KL term adds the reference log-probs).
      critic: also plan PPO's critic: a copy of the model with a one-output score head, its own
        optimiser state and its own train step (``critic_objective``, default PPO's clipped value
        loss) on the same rows. Each model's state stays resident while the other one's step runs.
      target: compile for these chips instead of this host's devices (:func:`parse_target`:
        ``"tpu-v5e:8x8"``, ``"v5p-16"``, ... with libtpu installed, which compiles for a TPU
        topology on a CPU host; ``"h100:8"``); the report then says whether the program fits the
        chip's memory as the chip's own compiler counts it.
      max_tokens_per_microbatch: sequence packing (``train.max_tokens_per_microbatch``): plan one
        packed micro-batch, a row of this many tokens per batch device (the update of one such
        micro-batch: its gradient and the optimiser step), instead of ``rows / num_microbatches``
        padded rows of ``seq_len``.
      model_name: the name reports show (default: the preset name, or ``"custom"``).
      whole_loop_cost: also compile 1- and 2-layer copies of the step, so that FLOPs, bytes and
        the compiler's time estimate count every trip of the layer scan (XLA's cost analysis
        counts a loop body once): ``cost = c1 + (L - 1) (c2 - c1)``. ``None``: on with a target.
    """

    model: Any = "smollm2-135m"
    mesh: tuple[int, ...] = (1, 1, 1)
    context: int = 1
    rows: int = 8
    seq_len: int = 256
    num_microbatches: int = 1
    prompts: int = 1
    num_samples: int = 8
    prompt_len: int = 64
    new_tokens: int = 192
    param_dtype: str | None = None
    dtype: str | None = None
    remat: str | None = None
    moe_capacity_factor: float | None = None
    attention: str | None = None
    optimizer: str = "adamw"
    reference: str = "none"
    chip: str | None = None
    peak_tflops: float | None = None
    hbm_gbs: float | None = None
    hbm_gib: float | None = None
    objective: Any = None
    critic: bool = False
    critic_objective: Any = None
    target: str | None = None
    whole_loop_cost: bool | None = None
    max_tokens_per_microbatch: int = 0
    model_name: str | None = None

    def model_config(self):
        from jaxrl_llm.models import ModelConfig, preset

        cfg = self.model if isinstance(self.model, ModelConfig) else preset(str(self.model))
        over = {k: getattr(self, k) for k in ("param_dtype", "dtype", "remat", "moe_capacity_factor", "attention")
                if getattr(self, k) is not None}
        return cfg.replace(**over) if over else cfg

    @property
    def mesh_axes(self) -> tuple[str, ...]:
        return ("data", "fsdp", "tensor", "expert")[:len(self.mesh)] + (("context",) if self.context > 1 else ())

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The mesh's shape: ``mesh`` plus the ``context`` axis when it is larger than 1."""
        return tuple(self.mesh) + ((self.context,) if self.context > 1 else ())

    @property
    def devices(self) -> int:
        return math.prod(self.mesh_shape)

    @property
    def batch_ways(self) -> int:
        """Ways the batch is split: data x fsdp (x expert); the context axis splits each row."""
        return math.prod(self.mesh) // self.mesh[2]

    def chip_numbers(self) -> Chip | None:
        if self.chip is not None and self.chip not in CHIPS:
            raise ValueError(f"PlanSpec.chip: unknown chip {self.chip!r}; known: {', '.join(CHIPS)}")
        base = CHIPS.get(self.chip) if self.chip else None
        if base is None and (self.peak_tflops is None or self.hbm_gbs is None):
            return None
        return Chip(base.name if base else "custom", self.peak_tflops or base.peak_tflops,
                    self.hbm_gib or (base.hbm_gib if base else float("nan")), self.hbm_gbs or base.hbm_gbs)


@dataclasses.dataclass(frozen=True)
class Target:
    """Chips to compile for (:func:`parse_target`).

    Attributes:
      name: as given. platform: ``"tpu"`` or ``"gpu"``. topology: the topology name
        ``jax.experimental.topologies.get_topology_desc`` takes (``"v5e:8x8"``, ``"1x1x8"``).
      chip: the :data:`CHIPS` entry of one device. devices: how many devices it has.
      usable_hbm_gib: the memory the chip's compiler lets one program use (what it reports as
        "available HBM" when it refuses one), ``None`` where not measured.
    """

    name: str
    platform: str
    topology: str
    chip: str
    devices: int
    usable_hbm_gib: float | None = None


# TPU generations: (CHIPS key, devices per chip as libtpu counts them, usable HBM per device in GiB
# as the TPU compiler reports it when it refuses a program (measured with libtpu 0.0.52),
# TensorCores per chip for Cloud TPU names such as "v5p-16")
_TPU = {"v4": ("tpu-v4", 2, 15.25, 2), "v5e": ("tpu-v5e", 1, 15.75, 1), "v5litepod": ("tpu-v5e", 1, 15.75, 1),
        "v5p": ("tpu-v5p", 1, 95.74, 2), "v6e": ("tpu-v6e", 1, 31.25, 1)}
# chips -> the slice shape of Cloud TPU's accelerator types (2-D for v5e/v6e, 3-D for v4/v5p)
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
              512: "8x8x8"}
_GPUS = {"h100": "h100-sxm", "a100": "a100-80gb"}


def parse_target(name: str) -> Target:
    """A :class:`Target` from ``tpu-<gen>:<topology>`` (``tpu-v5e:8x8``, ``tpu-v5p:2x2x2``; the
    ``tpu-`` prefix is optional), a Cloud TPU accelerator type (``v5e-64``: 64 chips; ``v5p-16`` and
    ``v4-16``: 16 TensorCores, i.e. 8 chips), or ``<gpu>:<count>`` (``h100:8``)."""
    import re

    raw = str(name).strip().lower()
    n = raw[4:] if raw.startswith("tpu-") else raw
    m = re.fullmatch(r"(v4|v5e|v5litepod|v5p|v6e):(\d+(?:x\d+){1,2})", n)
    if m:
        gen, topo = m.group(1), m.group(2)
        chip, per_chip, hbm, _ = _TPU[gen]
        chips = math.prod(int(x) for x in topo.split("x"))
        return Target(str(name), "tpu", f"{'v5e' if gen == 'v5litepod' else gen}:{topo}", chip, chips * per_chip, hbm)
    m = re.fullmatch(r"(v4|v5e|v5litepod|v5p|v6e)-(\d+)", n)
    if m:
        gen, cores = m.group(1), int(m.group(2))
        chip, per_chip, hbm, tc = _TPU[gen]
        if cores % tc:
            raise ValueError(f"target {name!r}: a {gen} slice counts {tc} TensorCores per chip")
        chips = cores // tc
        shapes = _SHAPES_3D if gen in ("v4", "v5p") else _SHAPES_2D
        if chips not in shapes:
            raise ValueError(f"target {name!r}: no standard {gen} slice of {chips} chips (known: "
                             f"{', '.join(f'{gen}-{c * tc}' for c in shapes)}); give the topology, e.g. "
                             f"tpu-{gen}:{next(iter(shapes.values()))}")
        return Target(str(name), "tpu", f"{'v5e' if gen == 'v5litepod' else gen}:{shapes[chips]}", chip,
                      chips * per_chip, hbm)
    m = re.fullmatch(r"(h100|a100):(\d+)", n)
    if m:
        count = int(m.group(2))
        return Target(str(name), "gpu", f"1x1x{count}", _GPUS[m.group(1)], count, None)
    raise ValueError(f"unknown target {name!r}: use tpu-<v4|v5e|v5p|v6e>:<topology> (e.g. tpu-v5e:8x8), a Cloud "
                     "TPU type (v5e-64, v5p-16) or h100:<gpus>")


def target_devices(target: Target | str) -> list:
    """The devices of ``target``'s topology, to compile for on this host (nothing runs on them).
    TPU: needs libtpu (``pip install "jax[tpu]"``; ``bash scripts/setup_tpu_compiler.sh`` makes
    ``.venv-tpu``). GPU: ``jax-cuda12-plugin`` with an XLA target description (see docs/scaling.md)."""
    from jaxrl_llm.models.attn import target_platform  # noqa: F401  (imports jax)
    from jax.experimental import topologies

    t = parse_target(target) if isinstance(target, str) else target
    if t.platform == "tpu":
        try:
            import libtpu  # noqa: F401
        except ImportError:
            raise ValueError(f"target {t.name}: compiling for TPUs needs libtpu in this Python environment "
                             "(pip install 'jax[tpu]', or bash scripts/setup_tpu_compiler.sh and run "
                             ".venv-tpu/bin/jaxrl-llm)") from None
        return list(topologies.get_topology_desc(platform="tpu", topology_name=t.topology).devices)
    return _gpu_devices(t)


#: GPU targets: XLA target description file (jaxrl_llm/specs) per CHIPS entry
_GPU_SPECS = {"h100-sxm": "h100_sxm.txtpb"}
#: the share of a GPU's memory JAX lets programs use by default (XLA_PYTHON_CLIENT_MEM_FRACTION)
GPU_MEM_FRACTION = 0.75


def _gpu_devices(t: Target) -> list:
    """Devices of a GPU topology without a GPU: ``jax-cuda12-plugin`` compiles for the XLA target
    description of the chip (``jaxrl_llm/specs``), with autotuning off (``--xla_gpu_autotune_level=0``
    in ``XLA_FLAGS`` before JAX starts; ``jaxrl-llm plan --target`` sets it) and ``ptxas`` from the
    ``nvidia-cuda-nvcc-cu12`` wheel (``bash scripts/setup_gpu_compiler.sh`` installs both)."""
    from importlib import resources

    from jax.experimental import topologies

    try:
        import jax_cuda12_plugin  # noqa: F401
    except ImportError:
        raise ValueError(f"target {t.name}: compiling for GPUs on this host needs jax-cuda12-plugin, "
                         "jax-cuda12-pjrt and nvidia-cuda-nvcc-cu12 (bash scripts/setup_gpu_compiler.sh, then run "
                         ".venv-gpu/bin/jaxrl-llm)") from None
    if t.chip not in _GPU_SPECS:
        raise ValueError(f"target {t.name}: no XLA target description for {t.chip} (known: {', '.join(_GPU_SPECS)})")
    spec = resources.files("jaxrl_llm.specs").joinpath(_GPU_SPECS[t.chip]).read_text()
    return list(topologies.get_topology_desc(platform="cuda", target_config=spec, topology=t.topology).devices)


def _gpu_usable_gib(t: Target) -> float:
    """JAX's default share of the chip's memory (its XLA description's ``device_memory_size``)."""
    import re
    from importlib import resources

    spec = resources.files("jaxrl_llm.specs").joinpath(_GPU_SPECS[t.chip]).read_text()
    m = re.search(r"device_memory_size:\s*(\d+)", spec)
    return GPU_MEM_FRACTION * int(m.group(1)) / GiB


def _shard_bytes(tree: Any, shardings: Any) -> int:
    """Bytes of one device's shards of the arrays of ``tree`` under ``shardings`` (the
    largest shard, i.e. what the busiest device holds)."""
    import jax
    import numpy as np

    total = 0
    for x, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
        shape = sh.shard_shape(tuple(x.shape))
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
    return total


def check_spec(spec: PlanSpec) -> None:
    """Raise ``ValueError`` naming the field if ``spec`` cannot be planned (before any compile)."""
    cfg = spec.model_config()
    spec.chip_numbers()
    if spec.reference not in ("none", "device", "host"):
        raise ValueError(f"PlanSpec.reference must be 'none', 'device' or 'host', got {spec.reference!r}")
    if len(spec.mesh) not in (3, 4):
        raise ValueError(f"PlanSpec.mesh must be (data, fsdp, tensor) or (data, fsdp, tensor, expert), got {spec.mesh}")
    if min(spec.mesh) < 1:
        raise ValueError(f"PlanSpec.mesh: every axis must be >= 1, got {spec.mesh}")
    ways, what = spec.batch_ways, "data*fsdp" + ("*expert" if len(spec.mesh) == 4 else "")
    if len(spec.mesh) == 4 and spec.mesh[3] > 1:
        if not cfg.is_moe:
            raise ValueError(f"PlanSpec.mesh: an expert axis of {spec.mesh[3]} needs a mixture of experts; "
                             f"{cfg.family} has none")
        if cfg.num_experts % spec.mesh[3]:
            raise ValueError(f"PlanSpec.mesh: the expert axis ({spec.mesh[3]}) must divide the model's "
                             f"{cfg.num_experts} experts")
    if spec.rows % ways:
        raise ValueError(f"PlanSpec.rows={spec.rows} must be divisible by {what}={ways}")
    if spec.rows % spec.num_microbatches or (spec.rows // spec.num_microbatches) % ways:
        raise ValueError(f"PlanSpec.num_microbatches={spec.num_microbatches}: each micro-batch "
                         f"({spec.rows}/{spec.num_microbatches} rows) must split over {what}={ways}")
    if spec.optimizer not in ("adamw", "sgd"):
        raise ValueError(f"PlanSpec.optimizer must be 'adamw' or 'sgd', got {spec.optimizer!r}")
    if spec.seq_len < 2:
        raise ValueError(f"PlanSpec.seq_len must be >= 2, got {spec.seq_len}")
    if not (isinstance(spec.context, int) and spec.context >= 1):
        raise ValueError(f"PlanSpec.context must be an int >= 1, got {spec.context!r}")
    if spec.max_tokens_per_microbatch:
        if spec.max_tokens_per_microbatch < spec.seq_len:
            raise ValueError(f"PlanSpec.max_tokens_per_microbatch={spec.max_tokens_per_microbatch} is smaller than "
                             f"one row (seq_len={spec.seq_len})")
        if spec.max_tokens_per_microbatch % spec.context:
            raise ValueError(f"PlanSpec.context={spec.context} must divide max_tokens_per_microbatch="
                             f"{spec.max_tokens_per_microbatch}")
    elif spec.seq_len % spec.context:
        raise ValueError(f"PlanSpec.context={spec.context} must divide the sequence length seq_len={spec.seq_len}")
    if spec.target is not None:
        parse_target(spec.target)
    if spec.seq_len > cfg.max_position_embeddings or spec.prompt_len + spec.new_tokens > cfg.max_position_embeddings:
        raise ValueError(f"PlanSpec: sequence lengths exceed the model's max_position_embeddings="
                         f"{cfg.max_position_embeddings}")


def active_params(cfg: Any, n_params: int) -> int:
    """Parameters one token computes with: all of them for a dense model; for a mixture of
    experts, every non-expert parameter plus ``k`` of the ``E`` experts of each layer."""
    if not cfg.is_moe:
        return int(n_params)
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size * cfg.num_layers
    return int(n_params - (cfg.num_experts - cfg.num_experts_per_tok) * per_expert)


def attended_pairs(cfg: Any, length: int) -> float:
    """(query, key) pairs of causal attention over ``length`` tokens, summed over layers: ``L^2 / 2``
    for a global layer, about ``W L - W^2 / 2`` for a sliding window of ``W < L`` keys."""
    total = 0.0
    for w in cfg.layer_windows():
        w = int(w)
        total += length * length / 2 if (w == 0 or w >= length) else w * length - w * w / 2
    return total


def _cost(compiled) -> dict:
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else {}
    if not ca:  # a compile-only GPU client gives none: XLA's cost analysis of the optimised module
        ca = _module_cost(compiled)
    ca = ca or {}
    out = {"flops": float(ca.get("flops", 0.0)), "bytes_accessed": float(ca.get("bytes accessed", 0.0))}
    return out


def _module_cost(compiled) -> dict:
    """XLA's HLO cost analysis of ``compiled``'s optimised per-device module, run by the CPU client
    (jaxlib's ``hlo_module_cost_analysis``, not a public API: an empty dict where it is missing)."""
    import jax

    try:
        from jax._src.lib import _jax
    except ImportError:
        return {}
    analyse = getattr(_jax, "hlo_module_cost_analysis", None)
    modules = compiled.runtime_executable().hlo_modules()
    if analyse is None or not modules:
        return {}
    return dict(analyse(jax.devices("cpu")[0].client, modules[0]))


def _memory(compiled) -> dict:
    ma = compiled.memory_analysis()
    out = {k: int(getattr(ma, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp",
                                                                  "generated_code")}
    out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    return out


def _plan_step(gd: Any, params: Any, opt: Any, objective: Any, spec: PlanSpec, mesh: Any):
    """Lower and compile one train step of ``objective`` on abstract ``params`` (``spec.rows`` x
    ``spec.seq_len``, the objective's batch keys); returns ``(compiled, state shardings, batch
    shardings, report)`` with per-device bytes."""
    import jax
    import jax.numpy as jnp

    from jaxrl_llm.parallel import logical_sharding
    from jaxrl_llm.training import TrainState, make_train_step, train_state_shardings

    t0 = time.perf_counter()
    sds = jax.ShapeDtypeStruct
    state = TrainState(params, jax.eval_shape(opt.init, params), sds((), jnp.int32), sds((2,), jnp.uint32),
                       sds((), jnp.int32))
    st_sh = train_state_shardings(opt, state, mesh)
    B, L = spec.rows, spec.seq_len
    batch = {}
    packed = spec.max_tokens_per_microbatch
    if packed:  # one packed micro-batch: a row of `packed` tokens per batch device, its rows' slots
        ways = spec.batch_ways
        slots = 1 << max(0, -(-packed // L) - 1).bit_length()
        B = ways * slots
        for k in ("packed_tokens", "packed_segments", "packed_positions"):
            batch[k] = sds((ways, packed), jnp.int32)
        batch["packed_index"] = sds((B, L - 1), jnp.int32)
    for k in objective.batch_keys():
        if packed and k in ("tokens", "mask"):
            continue
        if k in ("tokens", "mask"):
            batch[k] = sds((B, L), jnp.int32 if k == "tokens" else jnp.bool_)
        elif k == "kl_coef":
            batch[k] = sds((B,), jnp.float32)
        elif k == "prefix_mask":  # a shared-prefix objective (train.shared_prefix): the prompt's width
            batch[k] = sds((B, spec.prompt_len), jnp.bool_)
        elif k == "routes":  # a mixture of experts' sampler routes (replayed or compared)
            cfg = spec.model_config()
            batch[k] = sds((B, L, cfg.num_layers, cfg.num_experts_per_tok), jnp.int32)
        else:
            batch[k] = sds((B, L - 1), jnp.bool_ if k == "loss_mask" else jnp.float32)
    b_sh = {k: logical_sharding(("batch",) + (None,) * (len(v.shape) - 1), mesh, shape=v.shape)
            for k, v in batch.items()}
    step = make_train_step(gd, opt, objective, num_microbatches=1 if packed else spec.num_microbatches,
                           state_shardings=st_sh, batch_shardings=b_sh)
    with jax.set_mesh(mesh):
        lowered = step.lower(jax.tree.map(lambda x, s: sds(x.shape, x.dtype, sharding=s), state, st_sh),
                             {k: sds(v.shape, v.dtype, sharding=b_sh[k]) for k, v in batch.items()})
    t_lower = time.perf_counter() - t0
    compiled = lowered.compile()
    report = {"params": _shard_bytes(params, st_sh.params), "opt_state": _shard_bytes(state.opt_state, st_sh.opt_state),
              "batch": _shard_bytes(batch, b_sh), **{f"compiled_{k}": v for k, v in _memory(compiled).items()},
              **_cost(compiled), "_lower_s": t_lower, "_compile_s": time.perf_counter() - t0 - t_lower}
    return compiled, st_sh, b_sh, report


def _is_oom(e: Exception) -> bool:
    """Whether a compile error is the compiler refusing a program for its memory (MaxText's test)."""
    msg = str(e)
    return "RESOURCE_EXHAUSTED" in msg or "exceeds available HBM" in msg or "Ran out of memory" in msg


def _refused(spec: PlanSpec, cfg: Any, mesh: Any, pool: list, target: Target | None, err: Exception) -> dict:
    """The report of a train step the chip's compiler refused (it does not fit)."""
    import re

    msg = str(err).strip().splitlines()[0][:400]
    m = re.search(r"temporaries \(([0-9.]+)([GM])\)", msg)
    temp = None if m is None else float(m.group(1)) * (GiB if m.group(2) == "G" else 2**20)
    return {"model": spec.model_name or (spec.model if isinstance(spec.model, str) else "custom"), "family": cfg.family,
            "param_dtype": cfg.param_dtype, "dtype": cfg.dtype, "remat": cfg.remat, "attention": cfg.attention,
            "mesh": dict(zip(spec.mesh_axes, spec.mesh_shape)), "devices": spec.devices,
            "target": None if target is None else dataclasses.asdict(target),
            "device_kind": getattr(pool[0], "device_kind", pool[0].platform), "platform": pool[0].platform,
            "spec": {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
                     if f.name not in ("model", "objective", "critic_objective")},
            "train_step": {"refused": msg, "compiled_temp": temp},
            "fit": {"train_fits": False, "refused_by_compiler": True}}


def _whole_loop_cost(spec: PlanSpec, cfg: Any, opt: Any, objective: Any, mesh: Any, train: dict) -> dict:
    """FLOPs, bytes and the compiler's time estimate of the whole layer scan: the step compiled
    with 1 and 2 layers, unrolled, gives one layer's cost, ``total = c1 + (L - 1) (c2 - c1)`` (the
    full model's own cost analysis counts the scan's body once). Loops inside a layer (blockwise
    attention's key blocks) still count once, and a Pallas kernel as the kernel declares."""
    from flax import nnx

    from jaxrl_llm.models import Transformer
    from jaxrl_llm.models.transformer import unrolled_layer_scan

    costs = []
    for n in (1, 2):
        c = cfg.replace(num_layers=n, sliding_layers=None if cfg.sliding_layers is None else cfg.sliding_layers[:n])
        gd, params = nnx.split(nnx.eval_shape(lambda c=c: Transformer(c, rngs=nnx.Rngs(0))))
        with unrolled_layer_scan():
            compiled = _plan_step(gd, params, opt, objective, dataclasses.replace(spec, model=c), mesh)[0]
        costs.append(_cost(compiled))
    out = {}
    for k in ("flops", "bytes_accessed"):
        one, two = costs[0].get(k), costs[1].get(k)
        if one is not None and two is not None:
            out[f"{k}_whole_loop"] = one + (cfg.num_layers - 1) * (two - one)
    return out


def plan(spec: PlanSpec, *, devices: Any = None, return_compiled: bool = False) -> dict:
    """Lower and compile the train step (and the sampler) for ``spec``; return the report
    (a JSON-able dict, byte counts per device). ``devices``: the devices to build the mesh
    on (default: the first ``prod(mesh)`` of ``jax.devices()``). With ``return_compiled``,
    the compiled step and its abstract arguments are added under ``"_compiled"``."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from jaxrl_llm.models import Transformer
    from jaxrl_llm.models.transformer import init_cache
    from jaxrl_llm.parallel import logical_sharding, make_mesh, state_shardings
    from jaxrl_llm.parallel.sharding import decode_rules, logical_rules
    from jaxrl_llm.rollout import SamplingConfig, generate
    from jaxrl_llm.training import recipe

    from jaxrl_llm.models.attn import compile_for, resolve_implementation

    check_spec(spec)
    target = parse_target(spec.target) if spec.target is not None else None
    n_dev = spec.devices
    if devices is None and target is not None:
        devices = target_devices(target)
    pool = list(jax.devices() if devices is None else devices)
    if len(pool) < n_dev:
        raise ValueError(f"mesh {spec.mesh_shape} needs {n_dev} devices; {len(pool)} available "
                         "(on CPU, run `jaxrl-llm plan`, which simulates them, or set "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count={n_dev} before importing jax)")
    mesh = make_mesh(spec.mesh_shape, spec.mesh_axes, devices=pool[:n_dev])
    platform = "gpu" if pool[0].platform in ("cuda", "rocm", "gpu") else pool[0].platform
    cfg = spec.model_config()
    if cfg.attention == "auto" and platform != "cpu":  # decided for the chips compiled for, not this host
        cfg = cfg.replace(attention=resolve_implementation("auto", platform))
    model_name = spec.model_name or (spec.model if isinstance(spec.model, str) else "custom")
    spec = dataclasses.replace(spec, model=cfg) if spec.model is not cfg else spec

    gd, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    opt = optax.adamw(1e-6) if spec.optimizer == "adamw" else optax.sgd(1e-6)
    sds = jax.ShapeDtypeStruct
    B, L = spec.rows, spec.seq_len
    objective = spec.objective or recipe("grpo", num_samples=max(spec.num_samples, 2)).objective
    with compile_for(platform):
        try:
            compiled, st_sh, b_sh, train = _plan_step(gd, params, opt, objective, spec, mesh)
        except Exception as e:  # the chip's compiler refusing the program is an answer, not a crash
            if not _is_oom(e):
                raise
            return _refused(spec, cfg, mesh, pool, target, e)
        whole = spec.whole_loop_cost if spec.whole_loop_cost is not None else target is not None
        if whole:
            train.update(_whole_loop_cost(spec, cfg, opt, objective, mesh, train))
    t_lower, t_compile = train.pop("_lower_s"), train.pop("_compile_s")

    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    n_active = active_params(cfg, n_params)
    if spec.max_tokens_per_microbatch:  # one packed micro-batch: rows of seq_len filling each packed row
        B = spec.batch_ways * max(1, spec.max_tokens_per_microbatch // L)
    train = {
        **train,
        "flops_6nd_per_device": 6.0 * n_active * B * L / n_dev,
        # + causal attention (QK^T and AV over the keys each query sees), forward and backward
        "flops_model_per_device": (6.0 * n_active * B * L + 3 * 2 * 2 * B * attended_pairs(cfg, L)
                                   * cfg.num_heads * cfg.head_dim) / n_dev,
        "lower_s": round(t_lower, 2), "compile_s": round(t_compile, 2),
    }
    ref = _shard_bytes(params, st_sh.params) if spec.reference != "none" else 0
    train["reference"] = ref if spec.reference == "device" else 0  # device memory, beside the step's own
    train["reference_host"] = ref if spec.reference == "host" else 0
    train["peak_with_reference"] = train["compiled_peak"] + train["reference"]
    critic = None
    if spec.critic:
        from jaxrl_llm.training.objectives import ValueObjective

        cgd, cparams = nnx.split(nnx.eval_shape(
            lambda: Transformer(cfg.replace(num_labels=1), rngs=nnx.Rngs(0), head="score")))
        _, _, _, critic = _plan_step(cgd, cparams, opt, spec.critic_objective or ValueObjective(), spec, mesh)
        critic = {k: v for k, v in critic.items() if not k.startswith("_")}
        resident = {"policy": train["params"] + train["opt_state"], "critic": critic["params"] + critic["opt_state"]}
        # the critic's state is resident through the policy's step and the policy's through the critic's
        critic["peak_policy_step"] = train["compiled_peak"] + resident["critic"] + train["reference"]
        critic["peak_critic_step"] = critic["compiled_peak"] + resident["policy"] + train["reference"]
        critic["peak_with_critic"] = max(critic["peak_policy_step"], critic["peak_critic_step"])
    report: dict[str, Any] = {
        "model": model_name, "n_params": int(n_params),
        "n_active_params": int(n_active), "family": cfg.family,
        "param_dtype": cfg.param_dtype, "dtype": cfg.dtype, "remat": cfg.remat, "attention": cfg.attention,
        "mesh": dict(zip(spec.mesh_axes, spec.mesh_shape)), "devices": n_dev,
        "target": None if target is None else dataclasses.asdict(target),
        "device_kind": getattr(pool[0], "device_kind", pool[0].platform),
        "platform": pool[0].platform, "spec": {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
                                               if f.name not in ("model", "objective", "critic_objective")},
        "objective": None if spec.objective is None else _describe_objective(spec.objective),
        "lora": cfg.lora is not None,
        "train_step": train,
    }
    if critic is not None:
        report["critic_step"] = critic
    if return_compiled:
        report["_compiled"] = (compiled, st_sh, b_sh, mesh, gd, opt, objective)

    if spec.prompts:
        p_sh = state_shardings(params, mesh)
        scfg = SamplingConfig(max_new_tokens=spec.new_tokens, num_samples=spec.num_samples, temperature=1.0,
                              pad_token_id=0)
        P = spec.prompt_len
        rules = decode_rules()  # as the Sampler: the rows split over the context axis too
        tok_sh = logical_sharding(("batch", None), mesh, rules, shape=(spec.prompts, P))
        gen = jax.jit(generate, static_argnums=(0, 5), static_argnames=("unroll_layers",))
        t1 = time.perf_counter()
        with jax.set_mesh(mesh), compile_for(platform), logical_rules(rules):
            low = gen.lower(gd, jax.tree.map(lambda x, s: sds(x.shape, x.dtype, sharding=s), params, p_sh),
                            sds((spec.prompts, P), jnp.int32, sharding=tok_sh),
                            sds((spec.prompts, P), jnp.bool_, sharding=tok_sh),
                            jax.eval_shape(lambda: jax.random.key(0)), scfg)
            gcomp = low.compile()
        if return_compiled:
            report["_compiled_sampler"] = (gcomp, p_sh, tok_sh)
        n = spec.prompts * spec.num_samples
        cache = jax.eval_shape(lambda: init_cache(cfg, n, P + spec.new_tokens))
        names_k = ("layers", "batch", "kv_heads", "head_dim", "cache_seq")
        names_v = ("layers", "batch", "kv_heads", "cache_seq", "head_dim")
        kv = sum(_shard_bytes([c], [logical_sharding(nm, mesh, rules, shape=c.shape)])
                 for c, nm in ((cache.k, names_k), (cache.v, names_v)))
        if cache.routes is not None:  # a mixture of experts records every token's experts
            kv += _shard_bytes([cache.routes], [logical_sharding(("batch", None, None, None), mesh, rules,
                                                                  shape=cache.routes.shape)])
        report["sampler"] = {
            "params": _shard_bytes(params, p_sh), "kv_cache": kv, "rows": n,
            **{f"compiled_{k}": v for k, v in _memory(gcomp).items()},
            "compile_s": round(time.perf_counter() - t1, 2),
        }
        report["sampler"]["peak_with_reference"] = report["sampler"]["compiled_peak"] + train["reference"]

    if target is not None and spec.chip is None:
        spec = dataclasses.replace(spec, chip=target.chip)
    chip = spec.chip_numbers()
    if target is not None:
        usable = target.usable_hbm_gib if target.usable_hbm_gib is not None else (
            _gpu_usable_gib(target) if target.platform == "gpu" else CHIPS[target.chip].hbm_gib)
        fit = {"usable_hbm_gib": usable, "train_fits": bool(train["peak_with_reference"] <= usable * GiB)}
        if "critic_step" in report:
            fit["train_fits"] = fit["train_fits"] and report["critic_step"]["peak_with_critic"] <= usable * GiB
        if "sampler" in report:
            fit["sampler_fits"] = bool(report["sampler"]["peak_with_reference"] <= usable * GiB)
        report["fit"] = fit
    if chip is not None:
        peak, bw = chip.peak_tflops * 1e12, chip.hbm_gbs * 1e9
        est = {"chip": chip.name, "peak_tflops": chip.peak_tflops, "hbm_gbs": chip.hbm_gbs, "hbm_gib": chip.hbm_gib}
        est["train_compute_s"] = train["flops_model_per_device"] / peak
        est["train_memory_s"] = (6 * train["params"] + 2 * train["opt_state"]) / bw
        est["train_step_s"] = max(est["train_compute_s"], est["train_memory_s"])
        est["train_fits"] = bool(train["peak_with_reference"] <= chip.hbm_gib * GiB)
        if "sampler" in report:
            s = report["sampler"]
            rows_dev = s["rows"] / (spec.batch_ways * spec.context)  # decoding splits rows over context too
            per_token = max((s["params"] + s["kv_cache"]) / bw,
                            2.0 * n_active / max(spec.mesh[1] * spec.mesh[2], 1) * rows_dev / peak)
            prefill = 2.0 * n_active * spec.prompts * spec.prompt_len / n_dev / peak
            est["rollout_s"] = prefill + spec.new_tokens * per_token
            est["sampler_fits"] = bool(s["peak_with_reference"] <= chip.hbm_gib * GiB)
        report["estimate"] = est
    return report


#: compute of a step relative to no rematerialisation (``full`` runs every layer's forward twice:
#: 8 instead of 6 x params x tokens; ``dots`` recomputes only elementwise work), for ranking
REMAT_COMPUTE = {"none": 1.0, "dots": 1.05, "full": 4.0 / 3.0}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def search(spec: PlanSpec, *, devices: Any = None, max_compiles: int = 18, log: Any = None) -> dict:
    """The least-compute execution settings of ``spec``'s train step that fit (MaxText's estimator
    idea, for the RL step). For each remat policy (``full``, ``dots``, ``none``) the candidates
    (context split x micro-batches, the rest of the mesh FSDP: ``(data, devices / (data * tensor *
    context), tensor)``) are ordered by how much they divide a device's activations (``context *
    micro-batches``; at a tie, fewer micro-batches first: larger matmuls, and a smaller context
    axis: fewer keys moved), and searched for the first that fits: doubling through that order,
    then bisecting back, a few compiles per policy. Among the fits, the one with the least
    compute (:data:`REMAT_COMPUTE`), then the least division. Needs the devices' memory:
    ``spec.target``'s, or ``spec.hbm_gib`` / ``spec.chip``. Returns ``{"tried": [...], "best":
    report or None, "best_settings": ...}``; ``log(row)`` is called after each compile."""
    check_spec(spec)
    target = parse_target(spec.target) if spec.target is not None else None
    if target is not None:
        usable = target.usable_hbm_gib if target.usable_hbm_gib is not None else (
            _gpu_usable_gib(target) if target.platform == "gpu" else CHIPS[target.chip].hbm_gib)
        n = target.devices
        if devices is None:
            devices = target_devices(target)
    else:
        chip = spec.chip_numbers()
        usable = spec.hbm_gib or (chip.hbm_gib if chip is not None else None)
        if usable is None:
            raise ValueError("plan --search needs the devices' memory: --target, --chip or --hbm-gib")
        n = len(devices) if devices is not None else spec.devices
    data, tensor = spec.mesh[0], spec.mesh[2]
    expert = spec.mesh[3] if len(spec.mesh) == 4 else None
    fixed = data * tensor * (expert or 1)
    if n % fixed:
        raise ValueError(f"plan --search: data*tensor{'*expert' if expert else ''}={fixed} must divide the {n} devices")
    options = []
    for ctx in _divisors(n // fixed):
        length = spec.max_tokens_per_microbatch or spec.seq_len
        if length % ctx:
            continue
        fsdp = n // fixed // ctx
        ways = data * fsdp * (expert or 1)
        if spec.rows % ways:
            continue
        mbs = [1] if spec.max_tokens_per_microbatch else _divisors(spec.rows // ways)
        for mb in mbs:
            options.append((ctx * mb, mb, ctx, fsdp))
    options.sort()
    tried, fits, cache = [], [], {}
    per_policy = max(1, max_compiles // 3)

    def attempt(remat, i):
        if (remat, i) in cache:
            return cache[(remat, i)]
        _, mb, ctx, fsdp = options[i]
        mesh = (data, fsdp, tensor) + ((expert,) if expert else ())
        cand = dataclasses.replace(spec, remat=remat, context=ctx, mesh=mesh, num_microbatches=mb, prompts=0,
                                   whole_loop_cost=False)
        r = plan(cand, devices=devices)
        t = r["train_step"]
        peak = t.get("peak_with_reference")
        ok = bool(peak is not None and peak <= usable * GiB)
        row = {"remat": remat, "context": ctx, "fsdp": fsdp, "num_microbatches": mb, "fits": ok,
               "peak_gib": None if peak is None else peak / GiB,
               "temp_gib": None if t.get("compiled_temp") is None else t["compiled_temp"] / GiB,
               "refused": t.get("refused")}
        if ok:
            fits.append((t["flops_model_per_device"] * REMAT_COMPUTE[remat], options[i][0], mb, ctx, row, r))
        tried.append(row)
        if log is not None:
            log(row)
        cache[(remat, i)] = ok
        return ok

    for remat in ("full", "dots", "none"):
        budget = per_policy
        lo, hi, i = -1, None, 0  # lo: last index known not to fit; hi: first index known to fit
        while i < len(options) and budget > 0:  # doubling
            budget -= 1
            if attempt(remat, i):
                hi = i
                break
            lo, i = i, 2 * i + 1
        if hi is None and budget > 0 and lo < len(options) - 1 and i >= len(options):
            budget -= 1
            if attempt(remat, len(options) - 1):
                hi = len(options) - 1
        while hi is not None and hi - lo > 1 and budget > 0:  # bisect between the last fail and the first fit
            budget -= 1
            mid = (lo + hi) // 2
            if attempt(remat, mid):
                hi = mid
            else:
                lo = mid
    best = min(fits, key=lambda f: f[:4]) if fits else None
    return {"usable_hbm_gib": usable, "tried": tried, "best": None if best is None else best[5],
            "best_settings": None if best is None else {k: best[4][k] for k in
                                                        ("remat", "context", "fsdp", "num_microbatches")}}


def _gib(x: float) -> str:
    return f"{x / GiB:.2f}"


def format_plan(r: dict) -> str:
    """A short Markdown report of :func:`plan`'s dict."""
    t = r["train_step"]
    m = r["mesh"]
    where = (f"{r['devices']} {r.get('device_kind', r['platform'])} devices ({r['target']['name']}, compiled by "
             f"the chip's own compiler)" if r.get("target") else f"{r['devices']} devices")
    if "refused" in t:
        sp = r["spec"]
        return "\n".join([f"### {r['model']} ({r['param_dtype']} params, {r['dtype']} compute, remat={r['remat']}, "
                          f"attention={r.get('attention')}) on {where}, mesh "
                          + " ".join(f"{k}={v}" for k, v in m.items()), "",
                          f"Train step: {sp['rows']} rows x {sp['seq_len']} tokens, {sp['num_microbatches']} "
                          f"micro-batch(es): **DOES NOT FIT**, the compiler refused it: {t['refused']}", ""])
    active = (f", {r['n_active_params'] / 1e9:.2f}B active per token"
              if r.get("n_active_params", r["n_params"]) != r["n_params"] else "")
    lines = [f"### {r['model']} ({r['n_params'] / 1e9:.2f}B params{active}, {r['param_dtype']} params, {r['dtype']} "
             f"compute, remat={r['remat']}, attention={r.get('attention', 'auto')}) on {where}, mesh "
             + " ".join(f"{k}={v}" for k, v in m.items()), ""]
    sp = r["spec"]
    obj = r.get("objective")
    what = (f"{sp['rows']} rows x {sp['seq_len']} tokens, {sp['num_microbatches']} micro-batch(es)"
            if not sp.get("max_tokens_per_microbatch") else
            f"one packed micro-batch, a row of {sp['max_tokens_per_microbatch']} tokens per batch device (the update's "
            f"{sp['rows']} rows of up to {sp['seq_len']} tokens, packed)")
    lines += [f"Train step: {what}, "
              f"{sp['optimizer']}{', ' + obj['policy_loss'] + ' / ' + obj['agg_mode'] if obj else ''}; compiled for "
              f"{r['platform']} in {t['compile_s']:.0f} s."
              + (" LoRA: the plan counts every parameter as trained (an upper bound)." if r.get("lora") else ""),
              "",
              "| per device | GiB |", "|---|---|",
              f"| params | {_gib(t['params'])} |", f"| optimiser state | {_gib(t['opt_state'])} |",
              f"| batch | {_gib(t['batch'])} |", f"| temporaries (compiler) | {_gib(t['compiled_temp'])} |",
              f"| **peak** (arguments + outputs - donated + temporaries) | **{_gib(t['compiled_peak'])}** |"]
    if t.get("reference"):
        lines += [f"| reference policy (device memory) | {_gib(t['reference'])} |",
                  f"| **peak with the reference** | **{_gib(t['peak_with_reference'])}** |"]
    elif t.get("reference_host"):
        lines += [f"| reference policy in host memory (not in the peak) | {_gib(t['reference_host'])} |"]
    if "critic_step" in r:
        c = r["critic_step"]
        lines += [f"| critic: params + optimiser state | {_gib(c['params'] + c['opt_state'])} |",
                  f"| critic step: temporaries (compiler) | {_gib(c['compiled_temp'])} |",
                  f"| **peak with the critic** (the larger of the policy's and the critic's step, the other "
                  f"model resident) | **{_gib(c['peak_with_critic'])}** |"]
    if "flops_whole_loop" in t:
        count = (f"the compiler's count over the whole layer scan, {t['flops_whole_loop'] / 1e12:.2f} T, without "
                 "what attention kernels and their loops do")
    else:
        count = f"the compiler's count, {t['flops'] / 1e12:.2f} T, covers one trip of the layer scan"
    lines += ["",
              f"FLOPs per device per step: {t['flops_model_per_device'] / 1e12:.2f} T (6 x "
              f"{'active ' if active else ''}params x tokens + attention; {count}).",
              ""]
    if "sampler" in r:
        s = r["sampler"]
        lines += [f"Sampler: {sp['prompts']} prompts x {sp['num_samples']} samples, {sp['prompt_len']} + "
                  f"{sp['new_tokens']} tokens.", "", "| per device | GiB |", "|---|---|",
                  f"| params | {_gib(s['params'])} |", f"| KV cache | {_gib(s['kv_cache'])} |",
                  f"| **peak** (compiler) | **{_gib(s['compiled_peak'])}** |"]
        if s.get("peak_with_reference", 0) > s["compiled_peak"]:
            lines += [f"| **peak with the reference** | **{_gib(s['peak_with_reference'])}** |"]
        lines += [""]
    if "fit" in r:
        f = r["fit"]
        fit = lambda ok: "fits" if ok else "DOES NOT FIT"  # noqa: E731
        lines += [f"On the chip's {f['usable_hbm_gib']:.2f} GiB of usable HBM per device: train step "
                  f"{fit(f['train_fits'])}" + (f", sampler {fit(f['sampler_fits'])}" if "sampler_fits" in f else "")
                  + ".", ""]
    if "estimate" in r:
        e = r["estimate"]
        fit = lambda ok: "fits" if ok else "DOES NOT FIT"  # noqa: E731
        lines += [f"On {e['chip']} ({e['peak_tflops']:.0f} TFLOP/s, {e['hbm_gbs']:.0f} GB/s, {e['hbm_gib']:.0f} GiB "
                  f"HBM), a roofline without communication: train step >= {e['train_step_s']:.3g} s "
                  f"(compute {e['train_compute_s']:.3g} s, memory {e['train_memory_s']:.3g} s), "
                  f"{fit(e['train_fits'])}"
                  + (f"; rollout >= {e['rollout_s']:.3g} s, sampler {fit(e['sampler_fits'])}" if "rollout_s" in e
                     else "") + ".", ""]
    return "\n".join(lines)


def _describe_objective(obj: Any) -> dict:
    return {"policy_loss": getattr(obj.policy_loss, "__name__", repr(obj.policy_loss)),
            "agg_mode": obj.agg_mode, "batch_keys": list(obj.batch_keys()),
            "rows_per_prompt": getattr(obj, "rows_per_prompt", 0)}


def plan_spec_of(cfg: Any, **overrides: Any) -> PlanSpec:
    """The :class:`PlanSpec` of an RL run config (what ``jaxrl-llm plan <experiment>`` plans):
    the model's shapes (``model.preset`` or the model's own config), the mesh, one update's rows
    (``prompts_per_step * num_samples / recipe.num_minibatches``) of the largest prompt bucket
    plus ``max_new_tokens``, the micro-batches, the sampler's batch, the recipe's objective and
    its reference policy (resident, or in host memory with ``model.offload_reference``), with
    each prompt encoded once where the run does (``train.shared_prefix``).
    A PPO recipe's critic is planned with it (``critic``, the recipe's value objective).
    ``overrides``: PlanSpec fields (``chip``, ``hbm_gib``, ...). Not planned: LoRA's smaller
    optimiser state (the plan counts every parameter as trained)."""
    from jaxrl_llm.training.loading import model_config
    from jaxrl_llm.training.runner import resolve_execution, rl_recipe, update_objective

    cfg, _ = resolve_execution(cfg)  # model.remat=auto and the sampler's settings, as the run resolves them
    rec = rl_recipe(cfg)
    mcfg = model_config(cfg.model)
    rec, _, _ = update_objective(cfg, rec, mcfg, cfg.mesh.batch_ways)  # the update the run compiles
    ro = cfg.rollout
    # the longest prompt the run can see, padded to its bucket as the sampler pads it
    longest = min(max(ro.prompt_buckets), cfg.data.max_prompt_tokens)
    prompt_len = min(b for b in ro.prompt_buckets if b >= longest)
    rows = ro.prompts_per_step * ro.num_samples
    reference = "none" if not rec.needs_reference else ("host" if cfg.model.offload_reference else "device")
    m = cfg.mesh
    fields = dict(model=mcfg, model_name=cfg.model.preset or cfg.model.source,
                  mesh=(m.data, m.fsdp, m.tensor) + ((m.expert,) if m.expert > 1 else ()),
                  context=m.context, max_tokens_per_microbatch=cfg.train.max_tokens_per_microbatch,
                  rows=rows // rec.num_minibatches, seq_len=prompt_len + ro.max_new_tokens,
                  num_microbatches=cfg.optim.num_microbatches, prompts=ro.prompts_per_step,
                  num_samples=ro.num_samples, prompt_len=prompt_len, new_tokens=ro.max_new_tokens,
                  reference=reference, objective=rec.objective, critic=rec.needs_critic,
                  critic_objective=rec.value_objective if rec.needs_critic else None)
    return PlanSpec(**{**fields, **overrides})

"""Execution settings chosen per run (issue 38): what a plain command runs with.

A run leaves ``model.remat`` at ``"auto"`` and ``rollout.shared_prompt_kv`` /
``rollout.unroll_layers`` unset; :func:`choose` resolves them from the model's shapes and the
run's (rows, prompt and response lengths, micro-batches) and the backend, before anything
loads. The runner logs the result in ``config.json`` (``"execution"``: each value with the
reason) and prints it in one line at start. A value given in the config is kept as it is (and
logged as ``given``).

The rules are written from ``benchmarks/auto_sweep.py`` (docs/benchmarks.md, sections
"auto_sweep" and "The auto rule"), our GRPO step over the options at the realistic shapes:

- ``model.remat``: ``"dots"`` when the update would keep at least :data:`REMAT_DOTS_MIN_BYTES`
  of activations without rematerialisation, else ``"none"``. Measured on XLA:CPU: shape (a)
  (8.7M model, 64 rows x 384 tokens; 2.81 GiB by this estimate) 1.06-1.17x faster and half the
  peak RSS (5.8 -> 3.1 GB); shape (b) (SmolLM2, 32 x 384; 12.45 GiB) 1.44-1.55x and 19 -> 8 GB;
  the main job (SmolLM2 with LoRA, 32 x 76; 2.41 GiB) the same accuracy and rewards, update time
  equal, wall time 145 against 151 s. Below the threshold (every test-sized run) the recomputation
  has nothing to win back and only lengthens compiles.
  The same memory rule holds on accelerators, where it is what the chips' memory needs (the
  planner, ``jaxrl-llm plan``, checks the compiled step against it); no timing there was measured.
- ``rollout.shared_prompt_kv``: on when the prompt keys/values it stops copying are at least
  :data:`SHARED_KV_MIN_BYTES` and at least :data:`SHARED_KV_MIN_SHARE` of what a decode step reads
  (the weights plus the unshared cache). Shape (b) (0.31 GiB, 30% of a step's bytes): 1.08-1.13x
  alone, 1.04-1.09x on top of ``dots``; the main job (79 MiB, 13%): rollouts 33.0 against 37.6 s. Off where it does not apply: one sample per prompt,
  TreePO's segment tree, and a mixture of experts (the sampler's expert routes of the prompt are
  then not recorded, which routing replay and ``moe/router_mismatch`` read).
- ``rollout.unroll_layers``: the sampler's own rule (:func:`jaxrl_llm.rollout.sampler.resolve_unroll`),
  resolved here so that it is logged: unrolled unless the decoded weights are float32 and above
  128 MiB.
- ``rollout.sampler_dtype`` is never chosen: bfloat16 sampler weights change the sampled policy
  (they need ``recipe.old_logp=recompute`` and a correction) and XLA:CPU has no faster bf16 path
  (shape (b), docs/benchmarks.md "bf16 sampler weights against TRL in bf16").
- ``model.attention=auto`` is logged as what it resolves to at the run's longest row (the model
  resolves it per call: :func:`jaxrl_llm.models.attn.resolve_implementation`).
- The allocator (``JAXRL_LLM_HUGEPAGES``) is not chosen per run: it must be set before the process
  starts, and it was measured both ways (shape (b) with ``dots`` 1.16x faster, the main job 10-13%
  slower); it stays opt-in (:mod:`jaxrl_llm.launch`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["REMAT_DOTS_MIN_BYTES", "SHARED_KV_MIN_BYTES", "SHARED_KV_MIN_SHARE", "RunShape", "Choice", "Execution",
           "n_params", "activation_bytes", "choose", "rl_shape", "resolve_rl", "resolve_remat"]

GiB, MiB = 2**30, 2**20
#: the update's activations without remat (:func:`activation_bytes`) from which ``auto`` picks ``dots``
REMAT_DOTS_MIN_BYTES = 1 * GiB
#: prompt keys/values no longer copied per sample, from which ``auto`` shares them
SHARED_KV_MIN_BYTES = 16 * MiB
#: ... and their share of the bytes a decode step reads (weights + cache without sharing)
SHARED_KV_MIN_SHARE = 0.10


@dataclasses.dataclass(frozen=True)
class RunShape:
    """The shapes the choices depend on. ``prompts``: prompts sampled together per step;
    ``num_samples``: rows per prompt; ``prompt_len``: the longest prompt bucket; ``new_tokens``:
    the response length; ``update_rows``: rows of one update micro-batch; ``update_len``: its
    longest row (prompt + response)."""

    prompts: int
    num_samples: int
    prompt_len: int
    new_tokens: int
    update_rows: int
    update_len: int


@dataclasses.dataclass(frozen=True)
class Choice:
    """One resolved setting: its config key, value, and why (``given`` when the config set it)."""

    key: str
    value: Any
    why: str
    given: bool = False
    shown: str = ""  # what the one-line summary shows instead of the value


@dataclasses.dataclass(frozen=True)
class Execution:
    """The resolved execution settings of a run (see the module docstring)."""

    choices: tuple[Choice, ...]

    def __getitem__(self, key: str) -> Any:
        for c in self.choices:
            if c.key == key:
                return c.value
        raise KeyError(key)

    def line(self) -> str:
        """The one line printed at start."""
        return "execution: " + ", ".join(f"{c.key}={c.shown or _show(c.value)}" + (" (given)" if c.given else "")
                                         for c in self.choices)

    def to_dict(self) -> dict:
        """For ``config.json``: ``{key: {"value", "why", "given"}}``."""
        return {c.key: {"value": c.value, "why": c.why, "given": c.given} for c in self.choices}


def _show(v: Any) -> str:
    return "unset" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _gib(x: float) -> str:
    return f"{x / GiB:.2f} GiB" if x >= GiB / 4 else f"{x / MiB:.1f} MiB"


def n_params(model_cfg: Any) -> int:
    """Parameters of the model (embeddings once when tied), from its shapes."""
    c = model_cfg
    d, layers = c.hidden_size, c.num_layers
    mlp = 3 * d * max(c.intermediate_size, c.moe_intermediate_size * max(1, c.num_experts))
    attn = d * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * d
    return c.vocab_size * d * (1 if c.tie_embeddings else 2) + layers * (attn + mlp)


def activation_bytes(model_cfg: Any, rows: int, length: int, remat: str = "none",
                     tokens: float | None = None) -> float:
    """The activations one update micro-batch of ``rows`` rows of up to ``length`` tokens
    (``tokens`` in all, default ``rows * length``; fewer when packed) keeps for its backward pass
    under ``remat`` (every layer's whole without remat, its matmul outputs under ``dots``, its
    input plus one layer under ``full``), float32 bound, plus a dense implementation's attention
    scores of one layer. The preflight's bound (:func:`jaxrl_llm.training.preflight.rough_peak`)
    is built on it."""
    from jaxrl_llm.models.attn import AUTO_DENSE_MAX_KEYS

    c = model_cfg
    d, f, h, kh, dh, layers = (c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim,
                               c.num_layers)
    width = 2.0 if c.dtype in ("bfloat16", "float16") else 4.0
    layer = (4 * d + 3 * f + 2 * (h + 2 * kh) * dh) * 4.0
    kept = {"none": layers * layer, "dots": layers * (2 * d + 2 * f + (h + 2 * kh) * dh) * width,
            "full": layers * d * width + layer}[remat]
    act = (rows * length if tokens is None else tokens) * kept
    if c.attention == "dense" or (c.attention == "auto" and length <= AUTO_DENSE_MAX_KEYS):
        act += 2 * rows * h * length * length * 4.0
    return act


def _remat(model_cfg, shape: RunShape, given: str) -> Choice:
    if given != "auto":
        return Choice("model.remat", given, "set in the config", True)
    act = activation_bytes(model_cfg, shape.update_rows, shape.update_len, "none")
    if act >= REMAT_DOTS_MIN_BYTES:
        dots = activation_bytes(model_cfg, shape.update_rows, shape.update_len, "dots")
        return Choice("model.remat", "dots", f"the update keeps {_gib(act)} of activations without remat, {_gib(dots)} "
                      f"with dots (>= {_gib(REMAT_DOTS_MIN_BYTES)})")
    return Choice("model.remat", "none", f"the update keeps {_gib(act)} of activations without remat "
                  f"(< {_gib(REMAT_DOTS_MIN_BYTES)})")


def _kv_bytes_per_token(model_cfg) -> float:
    c = model_cfg
    width = 2.0 if c.dtype in ("bfloat16", "float16") else 4.0
    return c.num_layers * 2 * c.num_kv_heads * c.head_dim * width


def _shared_kv(model_cfg, shape: RunShape, given: bool | None, why_not: str, weight_bytes: float) -> Choice:
    key = "rollout.shared_prompt_kv"
    if given is not None:
        return Choice(key, bool(given), "set in the config", True)
    if why_not:
        return Choice(key, False, why_not)
    if shape.num_samples < 2:
        return Choice(key, False, "one sample per prompt")
    per = _kv_bytes_per_token(model_cfg)
    saved = shape.prompts * (shape.num_samples - 1) * shape.prompt_len * per
    cache = shape.prompts * shape.num_samples * (shape.prompt_len + shape.new_tokens) * per
    share = saved / (weight_bytes + cache)
    what = f"{_gib(saved)} of prompt keys/values not copied, {share:.0%} of a decode step's bytes"
    if saved >= SHARED_KV_MIN_BYTES and share >= SHARED_KV_MIN_SHARE:
        return Choice(key, True, what)
    return Choice(key, False, what + f" (< {_gib(SHARED_KV_MIN_BYTES)} or < {SHARED_KV_MIN_SHARE:.0%})")


def _unroll(model_cfg, given: bool | None, sampler_dtype: str | None, weight_bytes: float, all_f32: bool) -> Choice:
    from jaxrl_llm.rollout.sampler import UNROLL_MAX_BYTES

    key = "rollout.unroll_layers"
    if given is not None:
        return Choice(key, bool(given), "set in the config", True)
    if sampler_dtype is not None and sampler_dtype != "float32":
        return Choice(key, True, f"decoded in {sampler_dtype}")
    if all_f32 and weight_bytes > UNROLL_MAX_BYTES:
        return Choice(key, False, f"float32 weights of {_gib(weight_bytes)} (> {_gib(UNROLL_MAX_BYTES)}): scanned")
    return Choice(key, True, f"weights of {_gib(weight_bytes)}" + ("" if all_f32 else " not all float32"))


def _attention(model_cfg, shape: RunShape, platform: str) -> Choice:
    from jaxrl_llm.models.attn import resolve_implementation

    name = model_cfg.attention
    if name != "auto":
        return Choice("model.attention", name, "set in the config", True)
    got = resolve_implementation("auto", platform, shape.update_len)
    return Choice("model.attention", "auto", f"{got} in the update ({shape.update_len} keys, {platform}); the model "
                  f"resolves it per call", shown=f"auto ({got})")


def choose(model_cfg: Any, shape: RunShape, *, remat: str = "auto", shared_prompt_kv: bool | None = None,
           unroll_layers: bool | None = None, sampler_dtype: str | None = None, platform: str = "cpu",
           shared_kv_why_not: str = "") -> Execution:
    """Resolve the execution settings of a run of ``model_cfg`` at ``shape`` on ``platform``.
    ``remat="auto"`` and ``None`` for the others mean "choose"; any other value is kept.
    ``shared_kv_why_not``: a reason the run cannot share prompt keys (then off). LoRA adapters are
    left out of the sampler's weight bytes (a small float32 addition to the base weights)."""
    weight_bytes = n_params(model_cfg) * (2.0 if model_cfg.param_dtype in ("bfloat16", "float16") else 4.0)
    all_f32 = model_cfg.param_dtype == "float32"
    choices = (_remat(model_cfg, shape, remat),
               _shared_kv(model_cfg, shape, shared_prompt_kv, shared_kv_why_not, weight_bytes),
               _unroll(model_cfg, unroll_layers, sampler_dtype, weight_bytes, all_f32),
               Choice("rollout.sampler_dtype", sampler_dtype,
                      "set in the config" if sampler_dtype is not None else
                      "the model's own (bfloat16 sampler weights change the sampled policy and are not faster on "
                      "XLA:CPU; set it to choose)", sampler_dtype is not None),
               _attention(model_cfg, shape, platform))
    return Execution(choices)


# ----------------------------------------------------------------------------- the RL runner


def rl_shape(cfg: Any, rec: Any) -> RunShape:
    """The :class:`RunShape` of an RL run's config (:class:`~jaxrl_llm.training.configs.RLRunConfig`)."""
    from jaxrl_llm.training.runner import longest_row

    ro, t = cfg.rollout, cfg.train
    length = longest_row(cfg)
    prompts = ro.prompts_per_step * max(1, len(cfg.data.budgets))
    rows = prompts * ro.num_samples
    per_update = max(1, rows // max(1, rec.num_minibatches))
    if t.max_tokens_per_microbatch:
        mb_rows = max(1, t.max_tokens_per_microbatch // length)
    else:
        mb_rows = max(1, per_update // max(1, cfg.optim.num_microbatches))
    prompt_len = length - ro.max_new_tokens
    return RunShape(prompts=prompts, num_samples=ro.num_samples, prompt_len=prompt_len, new_tokens=ro.max_new_tokens,
                    update_rows=mb_rows, update_len=length)


def resolve_rl(cfg: Any, rec: Any, model_cfg: Any, platform: str | None = None) -> tuple[Any, Execution]:
    """``(cfg with every auto setting replaced by its value, the Execution)`` of an RL run.
    ``model_cfg``: the model's shapes (its ``remat`` is not read)."""
    import jax

    platform = platform or jax.default_backend()
    ro = cfg.rollout
    why_not = ("rollout.tree_segment (TreePO) copies the prompt's cache into its branches"
               if ro.tree_segment is not None else
               "a mixture of experts: the sampler records the prompts' expert routes" if model_cfg.is_moe else "")
    ex = choose(model_cfg, rl_shape(cfg, rec), remat=cfg.model.remat, shared_prompt_kv=ro.shared_prompt_kv,
                unroll_layers=ro.unroll_layers, sampler_dtype=ro.sampler_dtype, platform=platform,
                shared_kv_why_not=why_not)
    new = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat=ex["model.remat"]),
                              rollout=dataclasses.replace(ro, shared_prompt_kv=ex["rollout.shared_prompt_kv"],
                                                          unroll_layers=ex["rollout.unroll_layers"]))
    return new, ex


def resolve_remat(spec: Any, rows: int, length: int) -> tuple[Any, Execution]:
    """``(spec with model.remat resolved, the Execution)`` for a run that only trains (preference,
    agent runs): ``spec`` a :class:`~jaxrl_llm.training.configs.ModelSpec`, ``rows`` x ``length``
    one update micro-batch."""
    from jaxrl_llm.training.loading import shapes_of

    shape = RunShape(prompts=1, num_samples=1, prompt_len=length, new_tokens=0, update_rows=max(1, rows),
                     update_len=length)
    c = _remat(shapes_of(spec), shape, spec.remat)
    return dataclasses.replace(spec, remat=c.value), Execution((c,))

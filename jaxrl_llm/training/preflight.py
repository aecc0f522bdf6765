"""A run's memory checked before its first step: a plan that cannot fit is a one-line error
naming what to change, not a process the kernel's OOM killer ends at 18 GB.

:func:`preflight` first bounds the update's and the sampler's per-device memory from the shapes
alone (:func:`rough_peak`: parameters, gradients and optimiser moments, every layer's
activations kept for the backward pass as if nothing were rematerialised, the attention scores
of a dense implementation, the KV cache); where that bound is below half of what the devices
have, nothing more is done (every small run: no extra compile). Otherwise the planner compiles
the run's real train step and sampler on abstract shapes (:func:`jaxrl_llm.plan.plan_spec_of`,
:func:`jaxrl_llm.plan.plan`) and compares the compiler's peak with the devices' memory: above
it, the run stops with a :class:`~jaxrl_llm.config.ConfigError` listing the settings that lower
it, or, with ``run.force=true`` (``jaxrl-llm train --force``), logs that as a warning and goes on.

The devices' memory: each accelerator's ``bytes_limit`` (``Device.memory_stats()``), or on a CPU
the host's available memory (``MemAvailable``) shared by its (simulated) devices.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import jax

__all__ = ["device_memory", "rough_peak", "preflight"]

log = logging.getLogger("jaxrl_llm")
GiB = 2**30


def device_memory(devices: list | None = None) -> tuple[int, str]:
    """``(bytes per device, description)`` a program may use on ``devices`` (default: this
    process's)."""
    devs = list(devices or jax.local_devices())
    if devs[0].platform == "cpu":
        avail = None
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        avail = int(line.split()[1]) * 1024
        except OSError:
            avail = None
        if avail is None:
            import os

            avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        return avail // len(devs), f"the host's available memory ({avail / GiB:.1f} GiB) over {len(devs)} CPU device(s)"
    limits = []
    for d in devs:
        stats = d.memory_stats() or {}
        if "bytes_limit" in stats:
            limits.append(int(stats["bytes_limit"]))
    if not limits:
        raise RuntimeError(f"preflight: {devs[0].platform} devices report no memory limit (memory_stats)")
    return min(limits), f"{min(limits) / GiB:.1f} GiB per {devs[0].device_kind}"


def rough_peak(cfg: Any, rec: Any, model_cfg: Any, n_devices: int = 1) -> float:
    """An upper bound (bytes per device) of the update's and the sampler's memory from shapes
    alone: parameters, a gradient and two optimiser moments in float32, the activations the
    backward pass keeps (every layer's whole, its matmul outputs under ``remat=dots``, its input
    under ``remat=full`` plus one layer's whole), dense attention scores, the logits of one chunk,
    and the sampler's KV cache beside the parameters. Loose on purpose: it decides whether the
    compiled plan is needed."""
    from jaxrl_llm.training.auto import activation_bytes, n_params as count_params
    from jaxrl_llm.training.runner import longest_row

    ro, t = cfg.rollout, cfg.train
    kh, dh, layers = model_cfg.num_kv_heads, model_cfg.head_dim, model_cfg.num_layers
    n_params = count_params(model_cfg)
    state = n_params * 16.0  # params, gradient and two moments, 4 bytes each
    length = longest_row(cfg)
    rows = ro.prompts_per_step * max(1, len(cfg.data.budgets)) * ro.num_samples
    per_update = rows // max(1, rec.num_minibatches)
    if t.max_tokens_per_microbatch:
        tokens = max(t.max_tokens_per_microbatch, 2 * t.max_tokens_per_microbatch if t.logprob_tokens_per_microbatch
                     == 0 else t.logprob_tokens_per_microbatch)
        mb_rows = max(1, tokens // length)
    else:
        mb_rows = max(1, per_update // max(1, cfg.optim.num_microbatches))
        tokens = mb_rows * length
    act = activation_bytes(model_cfg, mb_rows, length, model_cfg.remat, tokens=tokens)
    act += mb_rows * min(128, length) * model_cfg.vocab_size * 4.0 * 3  # a logits chunk, forward and backward
    cache = layers * 2 * kh * dh * rows * length * 4.0
    sampler = n_params * 4.0 + cache + rows * model_cfg.vocab_size * 4.0
    return max(state + act, sampler + state * 0.25) / max(1, n_devices)


def preflight(cfg: Any, rec: Any, model_cfg: Any, *, force: bool = False, devices: list | None = None) -> dict:
    """Check ``cfg``'s memory before its first step (see the module docstring). Returns what was
    checked (``{"checked": "bound" | "plan", ...}``); raises ``ConfigError`` when the plan does not
    fit, unless ``force``."""
    from jaxrl_llm.config import ConfigError

    devs = list(devices or jax.devices())
    budget, what = device_memory([d for d in devs if d.process_index == jax.process_index()] or devs)
    n = cfg.mesh.devices
    bound = rough_peak(cfg, rec, model_cfg, n)
    out = {"available_bytes": budget, "bound_bytes": bound}
    if bound <= 0.5 * budget:
        return {**out, "checked": "bound"}
    from jaxrl_llm.plan import plan, plan_spec_of

    spec = plan_spec_of(cfg, whole_loop_cost=False)
    log.info("preflight: the shapes allow up to %.1f GiB per device, %s; planning the step", bound / GiB, what)
    r = plan(spec, devices=devs[:math.prod(spec.mesh_shape)])
    t = r["train_step"]
    peaks = {"the update": t.get("peak_with_reference") or 0}
    if "critic_step" in r:
        peaks["the update with the critic"] = r["critic_step"]["peak_with_critic"]
    if "sampler" in r:
        peaks["the sampler"] = r["sampler"]["peak_with_reference"]
    worst = max(peaks, key=peaks.get)
    out.update(checked="plan", planned_bytes=peaks[worst])
    if peaks[worst] <= budget:
        return out
    m, ro = cfg.mesh, cfg.rollout
    fixes = []
    if model_cfg.remat != "full":
        fixes.append("model.remat=full")
    if worst != "the sampler" and (model_cfg.attention == "dense" or (model_cfg.attention == "auto"
                                                                       and devs[0].platform == "cpu")):
        fixes.append("model.attention=blockwise")
    if worst != "the sampler":
        if cfg.train.max_tokens_per_microbatch:
            fixes.append(f"a smaller train.max_tokens_per_microbatch (now {cfg.train.max_tokens_per_microbatch})")
        else:
            fixes.append("train.max_tokens_per_microbatch=<tokens> (packing) or more optim.num_microbatches "
                         f"(now {cfg.optim.num_microbatches})")
        fixes.append(f"mesh.context > 1 (now {m.context}) with more devices")
    fixes.append(f"a smaller rollout.max_new_tokens (now {ro.max_new_tokens}) or fewer rollout.num_samples")
    msg = (f"preflight: {worst} needs {peaks[worst] / GiB:.1f} GiB per device as planned, more than {what} "
           f"({budget / GiB:.1f} GiB); set " + ", ".join(fixes) + " (or run with --force)")
    if force:
        log.warning("%s; going on (--force)", msg)
        return {**out, "forced": True}
    raise ConfigError(msg)

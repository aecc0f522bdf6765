"""Hugging Face checkpoints in and out: config, tokenizer and safetensors weights.

Loading streams: every parameter is created with ``jax.make_array_from_callback`` on its
target sharding, and the callback reads only the HF tensors that parameter needs (one
parameter's tensors are held on the host at a time, never the whole model). On several
hosts each host reads only what its own devices hold. Weights are cast to
``cfg.param_dtype`` (float32 or bfloat16) as they are read.

Export writes ``model.safetensors`` (or shards plus ``model.safetensors.index.json``), the
``config.json`` of the matching ``transformers`` class and, if given, the tokenizer files;
``transformers`` reloads the directory with the same logits (tested per architecture).
LoRA adapters are folded into the base kernels on export.

The same code reads GGUF files (:mod:`jaxrl_llm.models.gguf`): anything with
:class:`TensorSource`'s two methods can feed :func:`load_weights`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models.config import ModelConfig, load_config, to_hf_config
from jaxrl_llm.models.transformer import LoRAParam, Transformer
from jaxrl_llm.parallel.sharding import DEFAULT_RULES, state_shardings

__all__ = [
    "TensorSource",
    "SafetensorsSource",
    "weight_entries",
    "load_weights",
    "load_hf",
    "load_tokenizer",
    "save_hf",
    "hf_state_dict",
]


class TensorSource(Protocol):
    def names(self) -> set[str]: ...

    def get(self, name: str) -> np.ndarray: ...


class SafetensorsSource:
    """Tensors of a local HF directory: ``model.safetensors`` or sharded files with an index."""

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        self._open = safe_open
        p = Path(path)
        index = p / "model.safetensors.index.json"
        if index.exists():
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            self._file = {k: p / v for k, v in weight_map.items()}
        else:
            files = sorted(p.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors file in {p} (PyTorch .bin checkpoints are not read)")
            self._file = {}
            for fp in files:
                with safe_open(str(fp), framework="numpy") as f:
                    for k in f.keys():
                        self._file[k] = fp
        self._handles: dict[Path, Any] = {}

    def names(self) -> set[str]:
        return set(self._file)

    def get(self, name: str) -> np.ndarray:
        if name not in self._file:
            raise KeyError(f"tensor {name!r} not found in the checkpoint")
        fp = self._file[name]
        if fp not in self._handles:
            self._handles[fp] = self._open(str(fp), framework="numpy")
        return self._handles[fp].get_tensor(name)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One parameter of ours <-> one HF tensor (or one part of a fused HF tensor)."""

    path: tuple[str, ...]
    name: str  # HF name; "{i}" is the layer index for stacked parameters
    to_ours: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    prefixed: bool = True  # under the base-model prefix ("model." / "transformer.")
    part: tuple[int, int] | None = None  # (index, count) of a tensor fused along its last axis
    experts: int = 0  # > 0: one HF tensor per expert ("{j}" in name), stacked on our leading expert axis

    @property
    def stacked(self) -> bool:
        return self.path[0] == "blocks"


def _same(x):
    return x


def weight_entries(cfg: ModelConfig, head: str = "lm") -> list[Entry]:
    """The parameter <-> HF tensor table for ``cfg.family`` (LoRA adapters excluded)."""
    d, h, kh, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    e: list[Entry] = []

    def add(path, name, to_ours=_same, to_hf=_same, **kw):
        e.append(Entry(tuple(path.split(".")), name, to_ours, to_hf, **kw))

    if cfg.family == "gpt2":
        add("embed", "wte.weight")
        add("pos_embed", "wpe.weight")
        for ours, hf in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
            add(f"blocks.{ours}.scale", f"h.{{i}}.{hf}.weight")
            add(f"blocks.{ours}.bias", f"h.{{i}}.{hf}.bias")
        for j, n in enumerate("qkv"):
            add(f"blocks.{n}.kernel", "h.{i}.attn.c_attn.weight", lambda w, j=j: w[:, j * d:(j + 1) * d].reshape(d, h, dh),
                lambda x: x.reshape(d, h * dh), part=(j, 3))
            add(f"blocks.{n}.bias", "h.{i}.attn.c_attn.bias", lambda w, j=j: w[j * d:(j + 1) * d].reshape(h, dh),
                lambda x: x.reshape(h * dh), part=(j, 3))
        add("blocks.o.kernel", "h.{i}.attn.c_proj.weight", lambda w: w.reshape(h, dh, d), lambda x: x.reshape(h * dh, d))
        add("blocks.o.bias", "h.{i}.attn.c_proj.bias")
        add("blocks.up.kernel", "h.{i}.mlp.c_fc.weight")
        add("blocks.up.bias", "h.{i}.mlp.c_fc.bias")
        add("blocks.down.kernel", "h.{i}.mlp.c_proj.weight")
        add("blocks.down.bias", "h.{i}.mlp.c_proj.bias")
        add("final_norm.scale", "ln_f.weight")
        add("final_norm.bias", "ln_f.bias")
    else:
        add("embed", "embed_tokens.weight")
        add("blocks.attn_norm.scale", "layers.{i}.input_layernorm.weight")
        if cfg.post_norms:  # Gemma: post_attention_layernorm normalises the attention output
            add("blocks.post_attn_norm.scale", "layers.{i}.post_attention_layernorm.weight")
            add("blocks.mlp_norm.scale", "layers.{i}.pre_feedforward_layernorm.weight")
            add("blocks.post_mlp_norm.scale", "layers.{i}.post_feedforward_layernorm.weight")
        else:
            add("blocks.mlp_norm.scale", "layers.{i}.post_attention_layernorm.weight")
        for n, heads in (("q", h), ("k", kh), ("v", kh)):
            add(f"blocks.{n}.kernel", f"layers.{{i}}.self_attn.{n}_proj.weight",
                lambda w, n_=heads: w.T.reshape(d, n_, dh), lambda x, n_=heads: x.reshape(d, n_ * dh).T)
            if cfg.qkv_bias:
                add(f"blocks.{n}.bias", f"layers.{{i}}.self_attn.{n}_proj.bias",
                    lambda w, n_=heads: w.reshape(n_, dh), lambda x, n_=heads: x.reshape(n_ * dh))
        add("blocks.o.kernel", "layers.{i}.self_attn.o_proj.weight", lambda w: w.T.reshape(h, dh, d),
            lambda x: x.reshape(h * dh, d).T)
        if cfg.o_bias:
            add("blocks.o.bias", "layers.{i}.self_attn.o_proj.bias")
        if cfg.qk_norm:
            add("blocks.q_norm.scale", "layers.{i}.self_attn.q_norm.weight")
            add("blocks.k_norm.scale", "layers.{i}.self_attn.k_norm.weight")
        if cfg.is_moe:  # the hub layout: a router and one gate/up/down triple per expert
            add("blocks.moe.router.kernel", "layers.{i}.mlp.gate.weight", lambda w: w.T, lambda x: x.T)
            for n in ("gate", "up", "down"):
                add(f"blocks.moe.{n}", f"layers.{{i}}.mlp.experts.{{j}}.{n}_proj.weight", lambda w: w.T,
                    lambda x: x.T, experts=cfg.num_experts)
        else:
            for n in ("gate", "up", "down"):
                add(f"blocks.{n}.kernel", f"layers.{{i}}.mlp.{n}_proj.weight", lambda w: w.T, lambda x: x.T)
                if cfg.mlp_bias:
                    add(f"blocks.{n}.bias", f"layers.{{i}}.mlp.{n}_proj.bias")
        add("final_norm.scale", "norm.weight")
    if head == "lm" and not cfg.tie_embeddings:
        add("lm_head.kernel", "lm_head.weight", lambda w: w.T, lambda x: x.T, prefixed=False)
    if head == "score":
        add("score.kernel", "score.weight", lambda w: w.T, lambda x: x.T, prefixed=False)
    return e


def _prefix(cfg: ModelConfig, names: set[str]) -> str:
    embed = "wte.weight" if cfg.family == "gpt2" else "embed_tokens.weight"
    for p in ("model.", "transformer.", ""):
        if p + embed in names:
            return p
    raise KeyError(f"no embedding tensor ('*{embed}') in the checkpoint; is it a {cfg.family} model?")


def _hf_name(entry: Entry, prefix: str, layer: int | None, expert: int | None = None) -> str:
    name = entry.name.format(i=layer, j=expert) if layer is not None else entry.name
    return prefix + name if entry.prefixed else name


def _hf_names(entry: Entry, prefix: str, layer: int | None) -> list[str]:
    """The HF tensors of one layer of ``entry``: one, or one per expert."""
    if entry.experts:
        return [_hf_name(entry, prefix, layer, j) for j in range(entry.experts)]
    return [_hf_name(entry, prefix, layer)]


def _flat(state) -> dict[tuple[str, ...], Any]:
    return {tuple(str(k) for k in path): v for path, v in nnx.to_flat_state(state)}


def _lora_value(path, shape, dtype, key) -> jax.Array:
    """Initial adapter value: A ~ N(0, 1/fan_in), B = 0 (``shape`` includes the layer axis)."""
    if path[-1] == "lora_b":
        return jnp.zeros(shape, dtype)
    fan_in = int(np.prod(shape[1:-1] if path[0] == "blocks" else shape[:-1]))
    return (jax.random.normal(key, shape, jnp.float32) / math.sqrt(fan_in)).astype(dtype)


def load_weights(model_abstract: Transformer, source: TensorSource, *, mesh=None, rules=None,
                 seed: int = 0) -> Transformer:
    """Fill an abstract model (``nnx.eval_shape``) with the tensors of ``source``.

    Each parameter goes straight to its sharding (from its logical axes and ``rules`` on
    ``mesh``; the first local device without a mesh). LoRA adapters, absent from HF
    checkpoints, get their initial values from ``seed``.
    """
    cfg: ModelConfig = model_abstract.cfg
    graphdef, state = nnx.split(model_abstract)
    if mesh is not None:
        shardings = _flat(state_shardings(state, mesh, rules or DEFAULT_RULES))
    names = source.names()
    prefix = _prefix(cfg, names)
    entries = {en.path: en for en in weight_entries(cfg, model_abstract.head)}
    key = jax.random.key(seed)
    flat = _flat(state)
    missing = [p for p in entries if p not in flat]
    if missing:
        raise ValueError(f"weight table and model disagree: no model parameter at {missing}")
    values = {}
    for i, (path, var) in enumerate(sorted(flat.items())):
        shape, dtype = var.get_value().shape, var.get_value().dtype
        sharding = shardings[path].get_value() if mesh is not None else jax.sharding.SingleDeviceSharding(
            jax.local_devices()[0])
        if isinstance(var, LoRAParam):
            values[path] = jax.device_put(_lora_value(path, shape, dtype, jax.random.fold_in(key, i)), sharding)
            continue
        if path not in entries:
            raise ValueError(f"no checkpoint tensor is mapped to parameter {'.'.join(path)}")
        en = entries[path]
        needed = ([_hf_names(en, prefix, l) for l in range(cfg.num_layers)] if en.stacked
                  else [_hf_names(en, prefix, None)])
        absent = [n for group in needed for n in group if n not in names]
        if absent:
            raise KeyError(f"checkpoint lacks tensor {absent[0]!r} (for parameter {'.'.join(path)})")
        cache: dict[str, np.ndarray] = {}

        def read(group, en=en, cache=cache, path=path):
            key = group[0]
            if key not in cache:
                parts = [en.to_ours(source.get(name)) for name in group]
                w = np.stack(parts) if en.experts else parts[0]
                expect = shape[1:] if en.stacked else shape
                if w.shape != tuple(expect):
                    raise ValueError(f"tensor {key!r} gives shape {w.shape} for parameter {'.'.join(path)}, "
                                     f"expected {tuple(expect)}")
                cache[key] = w
            return cache[key]

        def callback(index, en=en, read=read, needed=needed, dtype=dtype):
            if en.stacked:
                layers = range(cfg.num_layers)[index[0]]
                arr = np.stack([read(needed[l])[index[1:]] for l in layers])
            else:
                arr = read(needed[0])[index]
            return np.asarray(arr).astype(dtype)

        values[path] = jax.make_array_from_callback(shape, sharding, callback)
    for path, var in flat.items():
        var.set_value(values[path])
    return nnx.merge(graphdef, state)


def _abstract(cfg: ModelConfig, head: str) -> Transformer:
    return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0), head=head))


def load_hf(path: str | Path, *, head: str = "lm", mesh=None, rules=None, seed: int = 0,
            **config_overrides) -> Transformer:
    """Load a local HF model directory (``config.json`` + safetensors) as a :class:`Transformer`.

    ``config_overrides`` set execution fields (``param_dtype="bfloat16"``, ``dtype``,
    ``remat``, ``lora=LoRAConfig(...)``). ``head="score"`` loads a
    ``*ForSequenceClassification`` checkpoint (reward model / critic).
    """
    cfg = load_config(path, **config_overrides)
    return load_weights(_abstract(cfg, head), SafetensorsSource(path), mesh=mesh, rules=rules, seed=seed)


def load_tokenizer(path: str | Path):
    """``transformers.AutoTokenizer`` from local files (chat template included; no network)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def hf_state_dict(model: Transformer, dtype: str = "float32", merge_lora: bool = True) -> dict[str, np.ndarray]:
    """The model's weights under HF names and layouts, as host numpy arrays."""
    cfg = model.cfg
    _, state = nnx.split(model)
    flat = _flat(state)
    npdt = jnp.dtype(dtype)
    prefix = {"gpt2": "transformer."}.get(cfg.family, "model.")
    out: dict[str, np.ndarray] = {}
    fused: dict[str, list] = {}
    for en in weight_entries(cfg, model.head):
        value = flat[en.path].get_value()
        kernel_owner = en.path[:-1]
        if merge_lora and en.path[-1] == "kernel" and kernel_owner + ("lora_a",) in flat:
            a = flat[kernel_owner + ("lora_a",)].get_value().astype(jnp.float32)
            b = flat[kernel_owner + ("lora_b",)].get_value().astype(jnp.float32)
            proj = _find(model, kernel_owner)
            if en.stacked:
                value = value.astype(jnp.float32) + proj.lora_scale * jax.vmap(
                    lambda x, y: jnp.tensordot(x, y, axes=1))(a, b)
            else:
                value = value.astype(jnp.float32) + proj.lora_scale * jnp.tensordot(a, b, axes=1)
        host = np.asarray(jax.device_get(value)).astype(np.float32)
        layers = range(cfg.num_layers) if en.stacked else [None]
        for l in layers:
            if en.experts:
                for j, name in enumerate(_hf_names(en, prefix, l)):
                    out[name] = np.ascontiguousarray(en.to_hf(host[l][j])).astype(npdt)
                continue
            arr = en.to_hf(host[l] if l is not None else host)
            name = _hf_name(en, prefix, l)
            if en.part is None:
                out[name] = np.ascontiguousarray(arr).astype(npdt)
            else:
                fused.setdefault(name, [None] * en.part[1])[en.part[0]] = arr
    for name, parts in fused.items():
        out[name] = np.ascontiguousarray(np.concatenate(parts, axis=-1)).astype(npdt)
    return out


def _find(model, path):
    obj = model
    for p in path:
        obj = getattr(obj, p)
    return obj


def save_hf(model: Transformer, out_dir: str | Path, *, tokenizer: Any = None, dtype: str = "float32",
            max_shard_bytes: int = 5 * 2**30, merge_lora: bool = True) -> Path:
    """Write an HF model directory that ``transformers`` loads (``from_pretrained``).

    ``dtype``: storage dtype of the tensors (``"float32"`` or ``"bfloat16"``). Files larger
    than ``max_shard_bytes`` are split into shards with an index, as ``transformers`` does.
    """
    from safetensors.numpy import save_file

    cfg = model.cfg
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = hf_state_dict(model, dtype=dtype, merge_lora=merge_lora)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        nb = tensors[name].nbytes
        if shards[-1] and size + nb > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += nb
    for old in list(out.glob("model*.safetensors")) + list(out.glob("model.safetensors.index.json")):
        old.unlink()
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata=meta)
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out / fname), metadata=meta)
            weight_map.update({k: fname for k in shard})
        total = sum(t.nbytes for t in tensors.values())
        with open(out / "model.safetensors.index.json", "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    hf_cfg = to_hf_config(cfg, "causal_lm" if model.head == "lm" else "sequence_classification")
    hf_cfg.dtype = dtype
    hf_cfg.save_pretrained(str(out))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return out


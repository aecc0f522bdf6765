"""Model configuration: one frozen dataclass describes every decoder of the family.

Llama (2, 3, 3.1/3.2 rope scaling), Mistral (sliding window), Qwen2/2.5 (qkv bias), Qwen3
(q/k RMSNorm), GPT-2 (learned positions, LayerNorm, GELU), Gemma 2/3 ((1 + w) norms, post-norms,
soft-capping, embedding scale, local rope base) and Qwen3-MoE (experts) differ only in a
handful of switches, so one implementation with per-family options serves them all.
:func:`from_hf_config` reads a ``transformers`` config (a local ``config.json`` through
``AutoConfig``), :func:`to_hf_config` writes one back for export, and :data:`PRESETS` names
common sizes (used by tests, the memory planner and experiment files).

The config is hashable (it is a static argument of jitted functions); RoPE scaling
parameters are kept as a sorted tuple of ``(key, value)`` pairs for that reason.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FAMILIES",
    "LORA_TARGETS",
    "LoRAConfig",
    "ModelConfig",
    "from_hf_config",
    "to_hf_config",
    "load_config",
    "PRESETS",
    "preset",
]

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "gemma2", "gemma3", "qwen3_moe")
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
ACTIVATIONS = ("silu", "gelu_tanh", "gelu", "relu")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
REMAT = ("none", "full", "dots")
ATTENTION = ("auto", "dense", "blockwise", "splash", "cudnn")  # jaxrl_llm.models.attn.IMPLEMENTATIONS
DTYPES = ("float32", "bfloat16", "float16")

# transformers' activation names -> ours
_HF_ACT = {"silu": "silu", "swish": "silu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
           "gelu_fast": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
_ACT_HF = {"silu": "silu", "gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters ``W + (alpha / rank) A B`` on the named projections.

    ``targets`` is a subset of :data:`LORA_TARGETS` (``q k v o`` attention, ``gate up down``
    MLP). Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685:
    ``A`` random (here N(0, 1/in_features)), ``B`` zero, so training starts at the base model.
    """

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q", "k", "v", "o")

    def __post_init__(self):
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoRAConfig.rank must be a positive int, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"LoRAConfig.alpha must be > 0, got {self.alpha!r}")
        object.__setattr__(self, "targets", tuple(self.targets))
        bad = [t for t in self.targets if t not in LORA_TARGETS]
        if bad or not self.targets:
            raise ValueError(f"LoRAConfig.targets must be a non-empty subset of {LORA_TARGETS}, got {self.targets}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture and execution settings of a decoder-only transformer.

    Architecture fields follow the HF names where one exists (``hidden_size``,
    ``num_kv_heads`` = ``num_key_value_heads``, ...). Execution fields: ``param_dtype``
    (storage), ``dtype`` (activations and matmul inputs; norms, softmax and logits are
    computed in float32), ``remat`` (``"none"``, ``"full"`` recompute of each layer in the
    backward pass, ``"dots"``: keep matmul outputs only), ``attention`` (the implementation of
    the attention call, :mod:`jaxrl_llm.models.attn`: ``"auto"``, ``"dense"``, ``"blockwise"``,
    ``"splash"``, ``"cudnn"``) with ``attention_block`` (query and key block of ``blockwise`` and
    ``splash``), ``lora``.
    """

    family: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 32
    head_dim: int = 128
    intermediate_size: int = 11008
    norm: str = "rms"  # "rms" | "layer"
    norm_eps: float = 1e-6
    activation: str = "silu"
    gated_mlp: bool = True
    position: str = "rope"  # "rope" | "learned"
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] = ()  # HF rope_parameters minus rope_theta; () = default
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] | None = None  # None: every layer when sliding_window is set
    # Gemma 2 / 3
    norm_offset: float = 0.0  # RMSNorm scales by (norm_offset + w): 1.0 for Gemma (weights stored around 0)
    post_norms: bool = False  # also normalise the attention and MLP outputs before their residual adds
    embed_scale: bool = False  # multiply the token embeddings by sqrt(hidden_size)
    query_pre_attn_scalar: float | None = None  # attention scale query_pre_attn_scalar**-0.5 (None: head_dim)
    attn_softcap: float | None = None  # attention scores c * tanh(s / c), before the mask
    final_softcap: float | None = None  # output logits c * tanh(z / c)
    local_rope_theta: float | None = None  # rope base of the sliding-window layers (Gemma 3), default rope
    # mixture of experts (Qwen3-MoE): every layer's MLP is num_experts experts, top-k routed
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalise the k routing weights to sum to 1
    # None: dropless (every token reaches its k experts; jax.lax.ragged_dot); a float c: each
    # expert takes at most ceil(c * tokens * k / E) tokens of a forward pass (batched matmuls
    # over [E, capacity, D] buffers), later tokens over capacity skip that expert
    moe_capacity_factor: float | None = None
    num_labels: int = 1  # outputs of the score head (reward / value models)
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    param_dtype: str = "float32"
    dtype: str = "float32"
    remat: str = "none"
    attention: str = "auto"
    attention_block: int = 512
    lora: LoRAConfig | None = None

    def __post_init__(self):
        def need(ok, field, msg):
            if not ok:
                raise ValueError(f"ModelConfig.{field} {msg}, got {getattr(self, field)!r}")

        need(self.family in FAMILIES, "family", f"must be one of {FAMILIES}")
        for f in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "max_position_embeddings", "num_labels"):
            v = getattr(self, f)
            need(isinstance(v, (int, np.integer)) and v >= 1, f, "must be a positive int")
        need(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", f"must divide num_heads={self.num_heads}")
        need(self.norm in ("rms", "layer"), "norm", "must be 'rms' or 'layer'")
        need(self.activation in ACTIVATIONS, "activation", f"must be one of {ACTIVATIONS}")
        need(self.position in ("rope", "learned"), "position", "must be 'rope' or 'learned'")
        need(self.norm_eps > 0, "norm_eps", "must be > 0")
        need(self.rope_theta > 0, "rope_theta", "must be > 0")
        need(self.param_dtype in DTYPES, "param_dtype", f"must be one of {DTYPES}")
        need(self.dtype in DTYPES, "dtype", f"must be one of {DTYPES}")
        need(self.remat in REMAT, "remat", f"must be one of {REMAT}")
        need(self.attention in ATTENTION, "attention", f"must be one of {ATTENTION}")
        need(isinstance(self.attention_block, (int, np.integer)) and self.attention_block >= 1, "attention_block",
             "must be a positive int")
        object.__setattr__(self, "rope_scaling", tuple(sorted(tuple(p) for p in self.rope_scaling)))
        rtype = dict(self.rope_scaling).get("rope_type", "default")
        need(rtype in ROPE_TYPES, "rope_scaling", f"has rope_type {rtype!r}; supported: {ROPE_TYPES}")
        if self.position == "rope":
            need(self.head_dim % 2 == 0, "head_dim", "must be even for rotary embeddings")
        if self.sliding_window is not None:
            need(self.sliding_window >= 1, "sliding_window", "must be >= 1 or None")
        if self.sliding_layers is not None:
            object.__setattr__(self, "sliding_layers", tuple(bool(x) for x in self.sliding_layers))
            need(len(self.sliding_layers) == self.num_layers, "sliding_layers",
                 f"must have one entry per layer ({self.num_layers})")
        for f in ("query_pre_attn_scalar", "attn_softcap", "final_softcap", "local_rope_theta"):
            v = getattr(self, f)
            need(v is None or v > 0, f, "must be > 0 or None")
        if self.num_experts:
            need(isinstance(self.num_experts, (int, np.integer)) and self.num_experts >= 2, "num_experts",
                 "must be 0 (dense MLP) or an int >= 2")
            need(isinstance(self.num_experts_per_tok, (int, np.integer))
                 and 1 <= self.num_experts_per_tok <= self.num_experts, "num_experts_per_tok",
                 f"must be an int in [1, num_experts={self.num_experts}]")
            need(isinstance(self.moe_intermediate_size, (int, np.integer)) and self.moe_intermediate_size >= 1,
                 "moe_intermediate_size", "must be a positive int when num_experts > 0")
            need(self.gated_mlp, "gated_mlp", "must be True for a mixture of experts (gated experts)")
        need(self.moe_capacity_factor is None or self.moe_capacity_factor > 0, "moe_capacity_factor",
             "must be > 0 or None (dropless)")
        need(self.family != "qwen3_moe" or self.num_experts > 0, "num_experts", "must be > 0 for family qwen3_moe")
        need(self.norm_offset == 0 or self.norm == "rms", "norm_offset", "applies to RMSNorm only (norm='rms')")
        if not self.num_experts:
            for f, off in (("num_experts_per_tok", 0), ("moe_intermediate_size", 0), ("moe_capacity_factor", None),
                           ("norm_topk_prob", False)):
                need(getattr(self, f) == off, f, f"is a mixture-of-experts setting: must be {off!r} with num_experts=0")
        else:
            need(not self.mlp_bias, "mlp_bias", "must be False for a mixture of experts (its experts have no biases)")
        need(self.local_rope_theta is None or (self.sliding_window is not None and any(self.layer_windows() > 0)),
             "local_rope_theta", "needs sliding-window layers (it is their rope base)")
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if self.lora is not None and not isinstance(self.lora, LoRAConfig):
            raise ValueError(f"ModelConfig.lora must be a LoRAConfig or None, got {self.lora!r}")
        if self.lora is not None and self.num_experts:
            mlp = [t for t in self.lora.targets if t in ("gate", "up", "down")]
            need(not mlp, "lora", f"targets {mlp} are MLP projections, which a mixture of experts replaces by "
                 "stacked experts without adapters: target the attention (q k v o)")

    # ------------------------------------------------------------------ derived
    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attn_scale(self) -> float:
        """Multiplier of the attention scores: ``query_pre_attn_scalar ** -0.5`` (Gemma) or
        ``head_dim ** -0.5``."""
        return float((self.query_pre_attn_scalar or self.head_dim) ** -0.5)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def layer_windows(self) -> np.ndarray:
        """``[L]`` int32 attention window per layer (0 = full causal attention)."""
        if self.sliding_window is None:
            return np.zeros(self.num_layers, np.int32)
        on = self.sliding_layers if self.sliding_layers is not None else (True,) * self.num_layers
        return np.array([self.sliding_window if s else 0 for s in on], np.int32)

    def local_rope(self) -> np.ndarray | None:
        """Inverse frequencies of the sliding-window layers when they have their own base
        (``local_rope_theta``, default rope: Gemma 3), else None (every layer uses :meth:`rope`)."""
        if self.local_rope_theta is None:
            return None
        exps = np.arange(0, self.head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(self.head_dim)
        return (np.float32(1.0) / (np.float32(self.local_rope_theta) ** exps)).astype(np.float32)

    def rope(self) -> tuple[np.ndarray, float]:
        """Inverse frequencies ``[head_dim / 2]`` (float32) and the cos/sin scale (YaRN).

        Same formulas as ``transformers.modeling_rope_utils`` for ``default``, ``linear``,
        ``llama3`` (Llama 3.1/3.2) and ``yarn``, computed in float32 as there.
        """
        dim = self.head_dim
        base = np.float32(self.rope_theta)
        exps = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
        inv = (np.float32(1.0) / (base ** exps)).astype(np.float32)
        p = dict(self.rope_scaling)
        kind = p.get("rope_type", "default")
        if kind == "default":
            return inv, 1.0
        if kind == "linear":
            return (inv / np.float32(p["factor"])).astype(np.float32), 1.0
        if kind == "llama3":
            factor, lo, hi = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
            old = p["original_max_position_embeddings"]
            lo_wl, hi_wl = old / lo, old / hi
            wl = (2 * math.pi / inv).astype(np.float32)
            out = np.where(wl > lo_wl, inv / np.float32(factor), inv).astype(np.float32)
            smooth = ((old / wl - lo) / (hi - lo)).astype(np.float32)
            smoothed = ((1 - smooth) * out / np.float32(factor) + smooth * out).astype(np.float32)
            medium = ~(wl < hi_wl) & ~(wl > lo_wl)
            return np.where(medium, smoothed, out).astype(np.float32), 1.0
        # yarn (Peng et al., "YaRN", arXiv:2309.00071)
        orig = p["original_max_position_embeddings"]
        factor = p.get("factor") or self.max_position_embeddings / orig

        def mscale(s, m=1.0):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

        att = p.get("attention_factor")
        if att is None:
            m, m_all = p.get("mscale"), p.get("mscale_all_dim")
            att = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)
        beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

        def corr_dim(rot):
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(self.rope_theta))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if p.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
        extra = (1 - ramp).astype(np.float32)
        pos_freqs = base ** exps
        inv_inter = (np.float32(1.0) / (np.float32(factor) * pos_freqs)).astype(np.float32)
        return (inv_inter * (1 - extra) + inv * extra).astype(np.float32), float(att)

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["rope_scaling"] = [list(p) for p in self.rope_scaling]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        d = dict(d)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}")
        if d.get("lora") is not None:
            d["lora"] = LoRAConfig(**{**d["lora"], "targets": tuple(d["lora"]["targets"])})
        d["rope_scaling"] = tuple(tuple(p) for p in d.get("rope_scaling", ()))
        if d.get("sliding_layers") is not None:
            d["sliding_layers"] = tuple(d["sliding_layers"])
        return cls(**d)


# ---------------------------------------------------------------------------- HF configs
def _rope_from_hf(hf) -> tuple[float, tuple]:
    params = dict(getattr(hf, "rope_parameters", None) or {})
    legacy = getattr(hf, "rope_scaling", None)
    if not params and legacy:
        params = dict(legacy)
    params["rope_theta"] = params.get("rope_theta") or getattr(hf, "rope_theta", None)
    return _rope_params(params)


def from_hf_config(hf: Any, **overrides) -> ModelConfig:
    """:class:`ModelConfig` of a ``transformers`` config (Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE,
    GPT-2, Gemma 2, Gemma 3 text).

    ``overrides`` set execution fields (``param_dtype``, ``dtype``, ``remat``, ``lora``...).
    A ``*ForSequenceClassification`` config's ``num_labels`` is kept for the score head.
    """
    mt = getattr(hf, "model_type", None)
    common = dict(vocab_size=hf.vocab_size, bos_token_id=getattr(hf, "bos_token_id", None),
                  eos_token_id=getattr(hf, "eos_token_id", None), pad_token_id=getattr(hf, "pad_token_id", None),
                  tie_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
                  num_labels=int(getattr(hf, "num_labels", 1) or 1))
    if mt == "gpt2":
        if getattr(hf, "scale_attn_by_inverse_layer_idx", False):
            raise NotImplementedError("GPT-2 with scale_attn_by_inverse_layer_idx=True is not supported")
        if not getattr(hf, "scale_attn_weights", True):
            raise NotImplementedError("GPT-2 with scale_attn_weights=False is not supported")
        d = hf.n_embd
        act = _HF_ACT.get(hf.activation_function)
        if act is None:
            raise NotImplementedError(f"GPT-2 activation_function {hf.activation_function!r} is not supported")
        cfg = ModelConfig(family="gpt2", hidden_size=d, num_layers=hf.n_layer, num_heads=hf.n_head,
                          num_kv_heads=hf.n_head, head_dim=d // hf.n_head,
                          intermediate_size=hf.n_inner or 4 * d, norm="layer", norm_eps=hf.layer_norm_epsilon,
                          activation=act, gated_mlp=False, position="learned",
                          max_position_embeddings=hf.n_positions, qkv_bias=True, o_bias=True, mlp_bias=True,
                          **{**common, "tie_embeddings": bool(getattr(hf, "tie_word_embeddings", True))})
        return cfg.replace(**overrides)
    if mt in ("gemma2", "gemma3_text", "gemma3"):
        return _gemma_from_hf(hf, common).replace(**overrides)
    if mt not in ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe"):
        raise NotImplementedError(f"model_type {mt!r} is not supported (supported: {', '.join(HF_MODEL_TYPES)})")
    act = _HF_ACT.get(hf.hidden_act)
    if act is None:
        raise NotImplementedError(f"hidden_act {hf.hidden_act!r} is not supported")
    theta, scaling = _rope_from_hf(hf)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    attn_bias = bool(getattr(hf, "attention_bias", False))
    qkv_bias = {"qwen2": True, "mistral": False}.get(mt, attn_bias)
    o_bias = {"qwen2": False, "mistral": False}.get(mt, attn_bias)
    window, layers = getattr(hf, "sliding_window", None), None
    moe = {}
    if mt == "qwen3_moe":
        if getattr(hf, "mlp_only_layers", None) or getattr(hf, "decoder_sparse_step", 1) != 1:
            raise NotImplementedError("qwen3_moe with dense layers (mlp_only_layers, decoder_sparse_step != 1) is not "
                                      "supported: every layer must be a mixture of experts")
        moe = dict(num_experts=hf.num_experts, num_experts_per_tok=hf.num_experts_per_tok,
                   moe_intermediate_size=hf.moe_intermediate_size, norm_topk_prob=bool(hf.norm_topk_prob))
    if mt in ("qwen2", "qwen3"):
        types = getattr(hf, "layer_types", None)
        if window is None or not types or "sliding_attention" not in types:
            window = None
        else:
            layers = tuple(t == "sliding_attention" for t in types)
    cfg = ModelConfig(family=mt, hidden_size=hf.hidden_size, num_layers=hf.num_hidden_layers,
                      num_heads=hf.num_attention_heads, num_kv_heads=hf.num_key_value_heads or hf.num_attention_heads,
                      head_dim=head_dim, intermediate_size=hf.intermediate_size, norm="rms", norm_eps=hf.rms_norm_eps,
                      activation=act, gated_mlp=True, position="rope",
                      max_position_embeddings=hf.max_position_embeddings, rope_theta=theta, rope_scaling=scaling,
                      qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=bool(getattr(hf, "mlp_bias", False)),
                      qk_norm=mt in ("qwen3", "qwen3_moe"), sliding_window=window, sliding_layers=layers, **moe,
                      **common)
    return cfg.replace(**overrides)


HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gpt2", "gemma2", "gemma3_text")


def _rope_params(params: dict, where: str = "") -> tuple[float, tuple]:
    """``(rope_theta, rope_scaling)`` of an HF ``rope_parameters`` dict (``rope_type`` or the
    legacy ``type``; theta 10000 when absent)."""
    params = dict(params)
    theta = params.pop("rope_theta", None) or 10000.0
    kind = params.get("rope_type", params.get("type", "default"))
    params.pop("type", None)
    params["rope_type"] = kind
    if kind == "default":
        return float(theta), ()
    if kind not in ROPE_TYPES:
        raise NotImplementedError(f"{where + ': ' if where else ''}rope_type {kind!r} is not supported "
                                  f"(supported: {ROPE_TYPES})")
    return float(theta), tuple(sorted((k, v) for k, v in params.items() if v is not None))


def _gemma_from_hf(hf: Any, common: dict) -> ModelConfig:
    """Gemma 2 and Gemma 3 (text): (1 + w) RMSNorms before and after attention and MLP,
    sqrt(hidden) embedding scale, query_pre_attn_scalar, soft-capping, sliding-window layers
    from ``layer_types``, and (Gemma 3) QK-norm and a separate rope base for local layers."""
    mt = hf.model_type
    if mt == "gemma3":
        raise NotImplementedError("model_type 'gemma3' is the multimodal Gemma 3; load its text model "
                                  "(Gemma3ForCausalLM, model_type 'gemma3_text')")
    if getattr(hf, "use_bidirectional_attention", False):
        raise NotImplementedError(f"{mt} with use_bidirectional_attention=True (an encoder) is not supported")
    act = _HF_ACT.get(hf.hidden_activation)
    if act is None:
        raise NotImplementedError(f"hidden_activation {hf.hidden_activation!r} is not supported")
    rp = dict(getattr(hf, "rope_parameters", None) or {})
    local_theta = None
    if "full_attention" in rp or "sliding_attention" in rp:  # Gemma 3: per layer type
        theta, scaling = _rope_params(rp.get("full_attention") or {}, f"{mt} full_attention")
        loc_theta, loc_scaling = _rope_params(rp.get("sliding_attention") or {}, f"{mt} sliding_attention")
        if loc_scaling:
            raise NotImplementedError(f"{mt}: scaled rope on sliding-window layers is not supported")
        local_theta = loc_theta if loc_theta != theta or scaling else None
    else:
        theta, scaling = _rope_params(rp or {"rope_theta": getattr(hf, "rope_theta", 10000.0)}, mt)
    types = list(getattr(hf, "layer_types", None) or [])
    window = getattr(hf, "sliding_window", None)
    layers = tuple(t == "sliding_attention" for t in types) if types else None
    if window is None or (layers is not None and not any(layers)):
        window, layers, local_theta = None, None, None
    if getattr(hf, "attention_bias", False):
        raise NotImplementedError(f"{mt} with attention_bias=True is not supported")
    return ModelConfig(family="gemma2" if mt == "gemma2" else "gemma3", hidden_size=hf.hidden_size,
                       num_layers=hf.num_hidden_layers, num_heads=hf.num_attention_heads,
                       num_kv_heads=hf.num_key_value_heads or hf.num_attention_heads, head_dim=hf.head_dim,
                       intermediate_size=hf.intermediate_size, norm="rms", norm_eps=hf.rms_norm_eps,
                       activation=act, gated_mlp=True, position="rope",
                       max_position_embeddings=hf.max_position_embeddings, rope_theta=theta, rope_scaling=scaling,
                       qk_norm=mt == "gemma3_text", sliding_window=window, sliding_layers=layers,
                       norm_offset=1.0, post_norms=True, embed_scale=True,
                       query_pre_attn_scalar=getattr(hf, "query_pre_attn_scalar", None),
                       attn_softcap=getattr(hf, "attn_logit_softcapping", None),
                       final_softcap=getattr(hf, "final_logit_softcapping", None), local_rope_theta=local_theta,
                       **{**common, "tie_embeddings": bool(getattr(hf, "tie_word_embeddings", True))})


def to_hf_config(cfg: ModelConfig, architecture: str = "causal_lm"):
    """A ``transformers`` config for ``cfg`` (export). ``architecture``: ``"causal_lm"`` or
    ``"sequence_classification"`` (score head)."""
    from transformers import AutoConfig

    _check_exportable(cfg)
    suffix = {"causal_lm": "ForCausalLM", "sequence_classification": "ForSequenceClassification"}[architecture]
    common = dict(vocab_size=cfg.vocab_size, tie_word_embeddings=cfg.tie_embeddings, bos_token_id=cfg.bos_token_id,
                  eos_token_id=list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id,
                  pad_token_id=cfg.pad_token_id, num_labels=cfg.num_labels)
    if cfg.family == "gpt2":
        hf = AutoConfig.for_model("gpt2", n_embd=cfg.hidden_size, n_layer=cfg.num_layers, n_head=cfg.num_heads,
                                  n_inner=cfg.intermediate_size, n_positions=cfg.max_position_embeddings,
                                  layer_norm_epsilon=cfg.norm_eps, activation_function=_ACT_HF[cfg.activation],
                                  **common)
        hf.architectures = ["GPT2LMHeadModel" if architecture == "causal_lm" else "GPT2ForSequenceClassification"]
        return hf
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        rope = {**dict(cfg.rope_scaling), "rope_theta": cfg.rope_theta}
    if cfg.family in ("gemma2", "gemma3"):
        return _gemma_to_hf(cfg, suffix, rope, common)
    kw = dict(hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
              num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, intermediate_size=cfg.intermediate_size,
              rms_norm_eps=cfg.norm_eps, hidden_act=_ACT_HF[cfg.activation],
              max_position_embeddings=cfg.max_position_embeddings, rope_parameters=rope, **common)
    if cfg.family in ("llama", "qwen3", "qwen3_moe"):
        if cfg.qkv_bias != cfg.o_bias:
            raise ValueError(f"{cfg.family} export needs qkv_bias == o_bias (HF's attention_bias)")
        kw["attention_bias"] = cfg.qkv_bias
    if cfg.family == "llama":
        kw["mlp_bias"] = cfg.mlp_bias
    if cfg.family == "mistral":
        kw["sliding_window"] = cfg.sliding_window
    if cfg.family == "qwen3_moe":
        kw.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                  moe_intermediate_size=cfg.moe_intermediate_size, norm_topk_prob=cfg.norm_topk_prob,
                  decoder_sparse_step=1, mlp_only_layers=[])
        if cfg.sliding_window is not None:
            if cfg.sliding_layers is not None and not all(cfg.sliding_layers):
                raise ValueError("qwen3_moe export: HF applies the sliding window to every layer")
            kw.update(use_sliding_window=True, sliding_window=cfg.sliding_window)
    if cfg.family in ("qwen2", "qwen3") and cfg.sliding_window is not None:
        layers = cfg.sliding_layers or (True,) * cfg.num_layers
        kw.update(use_sliding_window=True, sliding_window=cfg.sliding_window,
                  layer_types=["sliding_attention" if s else "full_attention" for s in layers])
    hf = AutoConfig.for_model(cfg.family, **kw)
    hf.architectures = [{"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3",
                         "qwen3_moe": "Qwen3Moe"}[cfg.family] + suffix]
    return hf


def _gemma_to_hf(cfg: ModelConfig, suffix: str, rope: dict, common: dict):
    from transformers import AutoConfig

    if cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias:
        raise ValueError(f"{cfg.family} export: HF Gemma has no biases")
    layers = cfg.sliding_layers or (True,) * cfg.num_layers
    if cfg.sliding_window is None:
        layers = (False,) * cfg.num_layers
    kw = dict(hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
              num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, intermediate_size=cfg.intermediate_size,
              rms_norm_eps=cfg.norm_eps, hidden_activation={"gelu_tanh": "gelu_pytorch_tanh"}.get(
                  cfg.activation, _ACT_HF[cfg.activation]),
              max_position_embeddings=cfg.max_position_embeddings, sliding_window=cfg.sliding_window or 4096,
              layer_types=["sliding_attention" if s else "full_attention" for s in layers],
              query_pre_attn_scalar=cfg.query_pre_attn_scalar or cfg.head_dim,
              attn_logit_softcapping=cfg.attn_softcap, final_logit_softcapping=cfg.final_softcap, **common)
    if cfg.family == "gemma2":
        if cfg.local_rope_theta is not None:
            raise ValueError("gemma2 export: HF Gemma 2 has one rope base (local_rope_theta must be None)")
        hf = AutoConfig.for_model("gemma2", rope_parameters=rope, **kw)
        name = "Gemma2"
    else:
        local = {"rope_type": "default", "rope_theta": cfg.local_rope_theta or cfg.rope_theta}
        if cfg.local_rope_theta is None and cfg.rope_scaling:
            raise ValueError("gemma3 export: scaled rope on every layer needs local_rope_theta (HF scales the "
                             "global layers only)")
        hf = AutoConfig.for_model("gemma3_text", rope_parameters={"full_attention": rope, "sliding_attention": local},
                                  **kw)
        name = "Gemma3"
    hf.architectures = [name + suffix]
    return hf


def _check_exportable(cfg: ModelConfig) -> None:
    """The HF class of ``cfg.family`` can express ``cfg``: a switch it lacks is an error naming
    the field (an export that transformers would load with different logits is worse)."""
    gemma = cfg.family in ("gemma2", "gemma3")
    want = dict(norm_offset=1.0 if gemma else 0.0, post_norms=gemma, embed_scale=gemma)
    if gemma:
        want["qk_norm"] = cfg.family == "gemma3"
    else:
        want.update(query_pre_attn_scalar=None, attn_softcap=None, final_softcap=None, local_rope_theta=None)
    if cfg.family == "gemma3":
        want["attn_softcap"] = cfg.attn_softcap  # Gemma 3's HF class has both caps (null by default)
    bad = [f"{k}={getattr(cfg, k)!r} (HF's {cfg.family} needs {v!r})" for k, v in want.items() if getattr(cfg, k) != v]
    if cfg.is_moe != (cfg.family == "qwen3_moe"):
        bad.append(f"num_experts={cfg.num_experts} (only qwen3_moe has experts)")
    if bad:
        raise ValueError(f"cannot export this ModelConfig as HF {cfg.family}: " + "; ".join(bad))


#: keys ``config.json`` must hold for :func:`load_config` to read it without ``transformers``
#: (its classes fill absent keys with per-model defaults, which only they know)
_PLAIN_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "rms_norm_eps", "hidden_act", "max_position_embeddings", "tie_word_embeddings",
               "bos_token_id", "eos_token_id")


class _PlainConfig:
    """The attributes :func:`from_hf_config` reads, from a ``config.json`` that states them all
    (``transformers``' own defaults where a key is absent and the default is the same for every
    class read this way: no biases, no pad token)."""

    def __init__(self, d: dict):
        self.__dict__.update(d)
        # PretrainedConfig: num_labels is len(id2label), two labels unless the file says otherwise
        self.num_labels = len(d["id2label"]) if d.get("id2label") else int(d.get("num_labels", 2))

    def __getattr__(self, name: str):  # only reached for keys the file does not hold
        if name in ("attention_bias", "mlp_bias"):
            return False
        if name in ("pad_token_id", "head_dim", "rope_parameters", "rope_scaling", "layer_types", "sliding_window"):
            return None
        raise AttributeError(name)


def _plain_config(d: dict) -> _PlainConfig | None:
    """``d`` (a ``config.json``) as attributes when it can be read without ``transformers`` (the
    launch then imports neither it nor torch), else None. Covered: Llama, Qwen2 and Qwen3 files
    that state every key read, with the default rope and no sliding window; everything else
    (Mistral, GPT-2, Gemma, Qwen3-MoE, whose class renames keys, scaled rope, sliding windows,
    absent keys) goes through ``AutoConfig``, whose classes know their defaults and aliases."""
    mt = d.get("model_type")
    if mt not in ("llama", "qwen2", "qwen3") or any(k not in d for k in _PLAIN_KEYS):
        return None
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default" or not (d.get("rope_theta")
                                                                            or rope.get("rope_theta")):
        return None
    if d.get("use_sliding_window") or "sliding_attention" in (d.get("layer_types") or ()) or (
            mt == "llama" and d.get("sliding_window")):
        return None
    if mt == "qwen3" and "head_dim" not in d:  # Qwen3's class default is 128, not hidden / heads
        return None
    return _PlainConfig(d)


def load_config(path: str | Path, **overrides) -> ModelConfig:
    """Read ``config.json`` of a local HF model directory (no network). A complete Llama / Qwen2 /
    Qwen3 file is read directly (no ``transformers`` or torch import, :func:`_plain_config`); any other
    goes through ``transformers.AutoConfig``. Both give the same :class:`ModelConfig` (tested)."""
    import json

    p = Path(path)
    if not (p / "config.json").exists():
        raise FileNotFoundError(f"{p}/config.json not found: expected a local Hugging Face model directory")
    try:
        plain = _plain_config(json.loads((p / "config.json").read_text()))
    except (ValueError, AttributeError):  # not a JSON object: transformers reports it
        plain = None
    if plain is not None:
        return from_hf_config(plain, **overrides)
    from transformers import AutoConfig

    return from_hf_config(AutoConfig.from_pretrained(str(p), local_files_only=True), **overrides)


# ---------------------------------------------------------------------------- presets
def _llama3(**kw):
    return ModelConfig(family="llama", vocab_size=128256, norm_eps=1e-5, rope_theta=500000.0, bos_token_id=128000,
                       eos_token_id=128001, **kw)


def _qwen(family="qwen2", **kw):
    kw.setdefault("vocab_size", 151936)
    kw.setdefault("max_position_embeddings", 32768)
    return ModelConfig(family=family, norm_eps=1e-6, rope_theta=1e6, qkv_bias=family == "qwen2",
                       qk_norm=family in ("qwen3", "qwen3_moe"), eos_token_id=151643, **kw)


_L31 = (("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
        ("original_max_position_embeddings", 8192), ("rope_type", "llama3"))
_L32 = (("factor", 32.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
        ("original_max_position_embeddings", 8192), ("rope_type", "llama3"))

PRESETS: dict[str, ModelConfig] = {
    "llama3-8b": _llama3(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                         intermediate_size=14336, max_position_embeddings=8192),
    "llama3.1-8b": _llama3(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                           intermediate_size=14336, max_position_embeddings=131072, rope_scaling=_L31),
    "llama3.2-1b": _llama3(hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64,
                           intermediate_size=8192, max_position_embeddings=131072, rope_scaling=_L32,
                           tie_embeddings=True),
    "llama3.2-3b": _llama3(hidden_size=3072, num_layers=28, num_heads=24, num_kv_heads=8, head_dim=128,
                           intermediate_size=8192, max_position_embeddings=131072, rope_scaling=_L32,
                           tie_embeddings=True),
    "mistral-7b": ModelConfig(family="mistral", vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32,
                              num_kv_heads=8, head_dim=128, intermediate_size=14336, norm_eps=1e-5,
                              max_position_embeddings=32768, sliding_window=4096, bos_token_id=1, eos_token_id=2),
    "qwen2.5-0.5b": _qwen(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
                          intermediate_size=4864, tie_embeddings=True),
    "qwen2.5-1.5b": _qwen(hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2, head_dim=128,
                          intermediate_size=8960, tie_embeddings=True),
    "qwen2.5-7b": _qwen(hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
                        intermediate_size=18944, vocab_size=152064),
    "qwen2.5-32b": _qwen(hidden_size=5120, num_layers=64, num_heads=40, num_kv_heads=8, head_dim=128,
                         intermediate_size=27648, vocab_size=152064),
    "qwen3-0.6b": _qwen("qwen3", hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
                        intermediate_size=3072, tie_embeddings=True),
    "qwen3-8b": _qwen("qwen3", hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
                      intermediate_size=12288, vocab_size=151936),
    "gpt2": ModelConfig(family="gpt2", vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=12,
                        head_dim=64, intermediate_size=3072, norm="layer", norm_eps=1e-5, activation="gelu_tanh",
                        gated_mlp=False, position="learned", max_position_embeddings=1024, qkv_bias=True,
                        o_bias=True, mlp_bias=True, tie_embeddings=True, bos_token_id=50256, eos_token_id=50256),
    "smollm2-135m": ModelConfig(family="llama", vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9,
                                num_kv_heads=3, head_dim=64, intermediate_size=1536, norm_eps=1e-5,
                                rope_theta=100000.0, max_position_embeddings=8192, tie_embeddings=True,
                                bos_token_id=1, eos_token_id=2, pad_token_id=2),
    "gemma2-2b": ModelConfig(family="gemma2", vocab_size=256000, hidden_size=2304, num_layers=26, num_heads=8,
                             num_kv_heads=4, head_dim=256, intermediate_size=9216, norm_eps=1e-6,
                             activation="gelu_tanh", max_position_embeddings=8192, tie_embeddings=True,
                             sliding_window=4096, sliding_layers=tuple(i % 2 == 0 for i in range(26)),
                             norm_offset=1.0, post_norms=True, embed_scale=True, query_pre_attn_scalar=256,
                             attn_softcap=50.0, final_softcap=30.0, bos_token_id=2, eos_token_id=1, pad_token_id=0),
    "gemma3-1b": ModelConfig(family="gemma3", vocab_size=262144, hidden_size=1152, num_layers=26, num_heads=4,
                             num_kv_heads=1, head_dim=256, intermediate_size=6912, norm_eps=1e-6,
                             activation="gelu_tanh", max_position_embeddings=32768, rope_theta=1e6,
                             tie_embeddings=True, sliding_window=512,
                             sliding_layers=tuple((i + 1) % 6 != 0 for i in range(26)), qk_norm=True,
                             norm_offset=1.0, post_norms=True, embed_scale=True, query_pre_attn_scalar=256,
                             local_rope_theta=1e4, bos_token_id=2, eos_token_id=1, pad_token_id=0),
    "gemma3-27b": ModelConfig(family="gemma3", vocab_size=262208, hidden_size=5376, num_layers=62, num_heads=32,
                              num_kv_heads=16, head_dim=128, intermediate_size=21504, norm_eps=1e-6,
                              activation="gelu_tanh", max_position_embeddings=131072, rope_theta=1e6,
                              rope_scaling=(("factor", 8.0), ("rope_type", "linear")), tie_embeddings=True,
                              sliding_window=1024, sliding_layers=tuple((i + 1) % 6 != 0 for i in range(62)),
                              qk_norm=True, norm_offset=1.0, post_norms=True, embed_scale=True,
                              query_pre_attn_scalar=168, local_rope_theta=1e4, bos_token_id=2, eos_token_id=1,
                              pad_token_id=0),
    "qwen3-30b-a3b": _qwen("qwen3_moe", hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128,
                           intermediate_size=6144, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                           norm_topk_prob=True, max_position_embeddings=40960),
    # tiny prime-sized configs for tests and CPU experiments
    "tiny": ModelConfig(family="llama", vocab_size=263, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                        head_dim=16, intermediate_size=112, norm_eps=1e-5, max_position_embeddings=512),
    "tiny-moe": ModelConfig(family="qwen3_moe", vocab_size=263, hidden_size=64, num_layers=2, num_heads=4,
                            num_kv_heads=2, head_dim=16, intermediate_size=112, norm_eps=1e-6, qk_norm=True,
                            max_position_embeddings=512, num_experts=8, num_experts_per_tok=2,
                            moe_intermediate_size=32, norm_topk_prob=True),
    "tiny-gemma": ModelConfig(family="gemma3", vocab_size=263, hidden_size=64, num_layers=3, num_heads=4,
                              num_kv_heads=2, head_dim=16, intermediate_size=112, norm_eps=1e-6,
                              activation="gelu_tanh", max_position_embeddings=512, tie_embeddings=True,
                              sliding_window=16, sliding_layers=(True, True, False), qk_norm=True, norm_offset=1.0,
                              post_norms=True, embed_scale=True, query_pre_attn_scalar=16, final_softcap=30.0,
                              local_rope_theta=1e4, rope_theta=1e6),
}


def preset(name: str, **overrides) -> ModelConfig:
    """A named :data:`PRESETS` entry, with field overrides."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)


def config_json(cfg: ModelConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True)

"""Loading the policy of a run (:class:`~jaxrl_llm.training.configs.ModelSpec`): the embedded
SmolLM2, an HF directory, a GGUF file, or the tiny random model of tests and the tiny presets."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from jaxrl_llm.training.configs import ModelSpec

__all__ = ["load_policy", "lora_config", "tiny_config", "model_config", "shapes_of", "load_aux_params"]


def lora_config(spec: ModelSpec):
    from jaxrl_llm.models import LoRAConfig

    if spec.lora_rank <= 0:
        return None
    return LoRAConfig(rank=spec.lora_rank, alpha=spec.lora_alpha or 2.0 * spec.lora_rank,
                      targets=tuple(spec.lora_targets))


TINY_SOURCES = ("tiny", "tiny-moe")


def tiny_config(spec: ModelSpec, vocab: int):
    """The tiny random model of ``spec``: Llama-style (``"tiny"``), or (``"tiny-moe"``) a
    Qwen3-MoE-style mixture of 8 experts of width ``hidden_size``, top-2 with renormalised
    weights, in every layer."""
    from jaxrl_llm.models import ModelConfig

    h = spec.hidden_size
    if h % 16:
        raise ValueError(f"model.hidden_size must be a multiple of 16 for the tiny model, got {h}")
    moe = {}
    if spec.source == "tiny-moe":
        moe = dict(family="qwen3_moe", qk_norm=True, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=h,
                   norm_topk_prob=True)
    return ModelConfig(vocab_size=vocab, hidden_size=h, num_layers=spec.num_layers, num_heads=4, num_kv_heads=2,
                       head_dim=h // 4, intermediate_size=4 * h, tie_embeddings=True, max_position_embeddings=512,
                       dtype=spec.dtype, param_dtype=spec.param_dtype, remat=_remat(spec), attention=spec.attention,
                       attention_block=spec.attention_block, lora=lora_config(spec), **_moe_over(spec), **moe)


def _remat(spec: ModelSpec) -> str:
    """``model.remat`` as the model takes it; ``"auto"`` must have been resolved by the runner
    (:mod:`jaxrl_llm.training.auto`), except for a shapes-only config (:func:`shapes_of`)."""
    if spec.remat == "auto":
        raise ValueError("model.remat=auto is chosen by the runner from the run's shapes (jaxrl_llm.training.auto); "
                         "resolve the config first or pass none, dots or full")
    return spec.remat


def shapes_of(spec: ModelSpec, *, vocab_size: int = 95):
    """:func:`model_config` for reading shapes only: ``model.remat=auto`` taken as ``"none"``."""
    if spec.remat == "auto":
        spec = dataclasses.replace(spec, remat="none")
    return model_config(spec, vocab_size=vocab_size)


def _moe_over(spec: ModelSpec) -> dict:
    """``model.moe_capacity_factor`` when set (else the model's own)."""
    return {} if spec.moe_capacity_factor is None else {"moe_capacity_factor": float(spec.moe_capacity_factor)}


def load_policy(spec: ModelSpec, *, seed: int = 0, mesh=None):
    """``(model, tokenizer)`` for ``spec`` (see :class:`ModelSpec`)."""
    from flax import nnx

    from jaxrl_llm.models import Transformer, load_gguf, load_hf, load_smollm2, load_tokenizer

    over = dict(dtype=spec.dtype, param_dtype=spec.param_dtype, remat=_remat(spec), attention=spec.attention,
                attention_block=spec.attention_block, lora=lora_config(spec), **_moe_over(spec))
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
    if src in TINY_SOURCES:
        from jaxrl_llm.data.char_tokenizer import char_tokenizer

        tok = char_tokenizer()
        if mesh is not None:  # created in its shards: no whole copy on one device
            from jaxrl_llm.parallel import init_sharded

            return init_sharded(tiny_config(spec, len(tok)), mesh, seed), tok
        return Transformer(tiny_config(spec, len(tok)), rngs=nnx.Rngs(seed)), tok
    raise ValueError(_bad_source(src))


def model_config(spec: ModelSpec, *, vocab_size: int = 95):
    """The :class:`~jaxrl_llm.models.ModelConfig` of ``spec`` without loading weights: the tiny
    model's, the embedded SmolLM2's (from its GGUF metadata), an HF directory's ``config.json``,
    or ``spec.preset``'s shapes (for checking configs whose weights are elsewhere)."""
    from jaxrl_llm.models import PRESETS

    over = dict(dtype=spec.dtype, param_dtype=spec.param_dtype, remat=_remat(spec), attention=spec.attention,
                attention_block=spec.attention_block, lora=lora_config(spec), **_moe_over(spec))
    if spec.source in TINY_SOURCES:
        return tiny_config(spec, vocab_size)
    if spec.preset:
        if spec.preset not in PRESETS:
            raise ValueError(f"model.preset {spec.preset!r} is unknown; known: {', '.join(sorted(PRESETS))}")
        return PRESETS[spec.preset].replace(**over)
    if spec.source == "smollm2":
        from gguf import GGUFReader

        from jaxrl_llm.models import gguf_config, smollm2_path

        return gguf_config(GGUFReader(str(smollm2_path())), **over)
    if spec.source.startswith("hf:"):  # the config.json only; no weights are read
        from jaxrl_llm.models.config import load_config

        if not Path(spec.source[3:]).is_dir():
            raise ValueError(f"model.source: HF model directory {spec.source[3:]} does not exist")
        return load_config(spec.source[3:], **over)
    if spec.source.startswith("gguf:"):
        from gguf import GGUFReader

        from jaxrl_llm.models import gguf_config

        path = Path(spec.source[5:])
        if not path.is_file():
            raise ValueError(f"model.source: GGUF file {path} does not exist")
        return gguf_config(GGUFReader(str(path)), **over)
    raise ValueError(_bad_source(spec.source))


def _bad_source(src: str) -> str:
    kinds = "'smollm2', 'tiny', 'tiny-moe', 'hf:<dir>' or 'gguf:<file>'"
    if "/" in src or src.endswith(".gguf") or src.startswith("."):
        p = Path(src)
        if not p.exists():
            return f"model.source={src!r}: no such file or directory (model.source is {kinds})"
        return f"model.source={src!r}: write {'gguf:' if p.is_file() else 'hf:'}{src} (model.source is {kinds})"
    return f"model.source must be {kinds}, got {src!r}"


def load_aux_params(path: str, template: Any, key: str = "model.aux_params") -> Any:
    """The auxiliary policy's parameters (``model.aux_params``; ``key`` names the setting in the
    errors): an Orbax parameter directory restored onto ``template`` (the policy's trained
    parameters: same tree, shapes and shardings). A missing directory or a different layout is a
    one-line config error."""
    import orbax.checkpoint as ocp

    from jaxrl_llm.config import ConfigError

    p = Path(path).absolute()
    if not p.is_dir():
        raise ConfigError(f"{key}={path!r}: no such parameter directory (a preference run writes "
                          f"final_params/, an RL run with an SFT warm-up sft_params/)")
    try:
        with ocp.StandardCheckpointer() as c:
            return c.restore(p, template)
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{key}={path!r} does not match the policy's parameters (same model.source, "
                          f"sizes and LoRA setting needed): {str(e).splitlines()[0][:300]}") from None

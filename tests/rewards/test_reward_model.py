"""Reward-model scoring equals HF's *ForSequenceClassification on each pair."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from hf_factory import require_torch  # noqa: E402

from jaxrl_llm.models import load_hf  # noqa: E402
from jaxrl_llm.rewards import Rewards, RewardModel  # noqa: E402


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory, smollm2_tokenizer):
    require_torch()
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    tok = smollm2_tokenizer
    cfg = AutoConfig.for_model("llama", vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
                               max_position_embeddings=512, num_labels=2, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    hf = AutoModelForSequenceClassification.from_config(cfg, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.2)
    path = tmp_path_factory.mktemp("rm")
    hf.save_pretrained(str(path))
    return hf, load_hf(path, head="score"), tok


def test_scores_equal_hf_per_pair(tiny_rm):
    hf, model, tok = tiny_rm
    import torch

    prompts = ["What is 2+3?", "Name a colour.", "Say hi", "Count to three, slowly and carefully please."]
    completions = ["5", "Blue, or maybe green if you like.", "hi", "one... two... three."]
    rm = RewardModel(model, tok, label=1, batch_size=3, length_buckets=(16, 32, 64))
    got = rm(prompts, completions)
    for p, c, g in zip(prompts, completions, got):
        ids = torch.tensor([rm.encode(p, c)])
        with torch.no_grad():
            ref = hf(input_ids=ids).logits[0, 1].item()
        assert abs(g - ref) < 1e-4, (p, g, ref)
    assert rm.compiled_shapes <= {(3, 16), (3, 32), (3, 64)}
    # as a reward function in a combination
    out = Rewards([rm])(prompts, completions)
    np.testing.assert_allclose(out.per_fn["reward_model"], got, rtol=1e-6)


def test_truncation_keeps_the_end_and_is_counted(tiny_rm):
    hf, model, tok = tiny_rm
    import torch

    rm = RewardModel(model, tok, chat=False, max_length=16, length_buckets=(8,))
    long = "word " * 40
    got = rm(["q", "q"], [long, "ok"])
    assert rm.truncated == 1
    full = rm.encode("q", long)
    assert len(full) > 16
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([full[-16:]])).logits[0, 0].item()
    assert abs(got[0] - ref) < 1e-4


def test_needs_a_score_head(tmp_path, smollm2_tokenizer):
    from jaxrl_llm.models import ModelConfig, Transformer
    from flax import nnx

    cfg = ModelConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                      intermediate_size=32)
    with pytest.raises(ValueError, match="score head"):
        RewardModel(Transformer(cfg, rngs=nnx.Rngs(0)), smollm2_tokenizer)

"""Every architecture: our logits equal transformers' on a padded batch, and an export
reloads in transformers with the same logits."""

from __future__ import annotations

import numpy as np
import pytest

from hf_factory import ARCHS, hf_logits, make_hf_model, padded_batch, save_hf_model
from jaxrl_llm.models import LoRAConfig, load_hf, save_hf

TOL = 1e-4


def ours_logits(model, tokens, mask):
    h, _ = model(tokens, mask)
    return np.asarray(model.logits(h))


@pytest.fixture(scope="module", params=sorted(ARCHS))
def arch_dir(request, tmp_path_factory):
    hf = make_hf_model(request.param)
    return request.param, hf, save_hf_model(hf, tmp_path_factory.mktemp(request.param))


def test_logits_match_transformers_with_padding(arch_dir):
    arch, hf, path = arch_dir
    tokens, mask = padded_batch(1)
    ref = hf_logits(hf, tokens, mask)
    ours = ours_logits(load_hf(path), tokens, mask)
    err = np.abs(ours - ref)[mask].max()
    assert err <= TOL, f"{arch}: max |logit diff| {err:.2e}"
    assert np.abs(ref[mask]).max() > 1.0  # the comparison is not of near-zero logits


def test_export_reloads_in_transformers_with_same_logits(arch_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    arch, hf, path = arch_dir
    model = load_hf(path)
    out = save_hf(model, tmp_path / "export")
    again = AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager").float().eval()
    tokens, mask = padded_batch(2)
    err = np.abs(hf_logits(again, tokens, mask) - hf_logits(hf, tokens, mask))[mask].max()
    assert err <= TOL, f"{arch}: export changed logits by {err:.2e}"


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2", "qwen3_moe"])
def test_lora_export_folds_adapters(arch, tmp_path):
    """Non-zero adapters: the merged export computes what our LoRA model computes."""
    import jax
    from flax import nnx
    from transformers import AutoModelForCausalLM

    from jaxrl_llm.models.transformer import LoRAParam

    path = save_hf_model(make_hf_model(arch), tmp_path / "base")
    targets = ("q", "k", "v", "o") if arch == "qwen3_moe" else ("q", "v", "o", "up", "down")  # experts: no LoRA
    lora = LoRAConfig(rank=3, alpha=6.0, targets=targets)
    model = load_hf(path, lora=lora)
    gd, adapters, rest = nnx.split(model, LoRAParam, ...)
    keys = iter(jax.random.split(jax.random.key(0), 64))
    adapters = jax.tree.map(lambda x: 0.2 * jax.random.normal(next(keys), x.shape, x.dtype), adapters)
    model = nnx.merge(gd, adapters, rest)
    tokens, mask = padded_batch(3)
    ours = ours_logits(model, tokens, mask)
    base = ours_logits(load_hf(path), tokens, mask)
    assert np.abs(ours - base)[mask].max() > 1e-2  # the adapters matter
    out = save_hf(model, tmp_path / "merged")
    again = AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager").float().eval()
    err = np.abs(hf_logits(again, tokens, mask) - ours)[mask].max()
    assert err <= TOL, f"merged export differs by {err:.2e}"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_score_head_matches_sequence_classification(arch, tmp_path):
    """Reward-model head: pooled at the last real token, as HF's *ForSequenceClassification."""
    from transformers import AutoModelForSequenceClassification

    hf = make_hf_model(arch, head="score", num_labels=2)
    path = save_hf_model(hf, tmp_path / "rm")
    model = load_hf(path, head="score")
    tokens, mask = padded_batch(4)
    mask[2, -2:] = True  # HF pools at the rightmost non-pad token: use left padding only
    tokens[2] = np.where(tokens[2] == 0, 5, tokens[2])
    h, _ = model(tokens, mask)
    scores = np.asarray(model.scores(h))[:, -1]
    ref = hf_logits(hf, tokens, mask)
    np.testing.assert_allclose(scores, ref, atol=TOL)
    out = save_hf(model, tmp_path / "rm-export")
    again = AutoModelForSequenceClassification.from_pretrained(str(out), attn_implementation="eager").float().eval()
    np.testing.assert_allclose(hf_logits(again, tokens, mask), ref, atol=TOL)


def test_sharded_checkpoint_with_index_and_bf16(tmp_path):
    """Sharded safetensors + index load; bfloat16 storage loads into bfloat16 params."""
    import jax.numpy as jnp

    hf = make_hf_model("qwen3")
    hf.save_pretrained(str(tmp_path / "sharded"), max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    tokens, mask = padded_batch(5)
    ref = hf_logits(hf, tokens, mask)
    np.testing.assert_allclose(ours_logits(load_hf(tmp_path / "sharded"), tokens, mask)[mask], ref[mask], atol=TOL)
    m16 = load_hf(tmp_path / "sharded", param_dtype="bfloat16")
    assert m16.embed[...].dtype == jnp.bfloat16
    err = np.abs(ours_logits(m16, tokens, mask) - ref)[mask].max()
    assert err < 0.1 * np.abs(ref).max()  # bf16 weights: close, not equal


def test_export_writes_shards_with_index(tmp_path):
    path = save_hf_model(make_hf_model("llama"), tmp_path / "base")
    out = save_hf(load_hf(path), tmp_path / "export", max_shard_bytes=40_000)
    assert (out / "model.safetensors.index.json").exists() and len(list(out.glob("model-*.safetensors"))) > 1
    tokens, mask = padded_batch(6)
    np.testing.assert_allclose(ours_logits(load_hf(out), tokens, mask)[mask],
                               ours_logits(load_hf(path), tokens, mask)[mask], atol=1e-6)


def test_lora_on_experts_is_refused():
    from jaxrl_llm.models import preset

    with pytest.raises(ValueError, match="experts"):
        preset("tiny-moe", lora=LoRAConfig(targets=("q", "up")))


def test_export_refuses_what_the_hf_class_cannot_express():
    from jaxrl_llm.models import preset
    from jaxrl_llm.models.config import to_hf_config

    with pytest.raises(ValueError, match="final_softcap"):
        to_hf_config(preset("tiny", final_softcap=30.0))
    with pytest.raises(ValueError, match="post_norms"):
        to_hf_config(preset("tiny-gemma", post_norms=False))
    with pytest.raises(ValueError, match="num_experts"):
        preset("tiny-moe", num_experts=0)
    assert to_hf_config(preset("tiny-gemma")).model_type == "gemma3_text"
    assert to_hf_config(preset("tiny-moe")).num_experts == 8

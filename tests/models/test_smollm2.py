"""The embedded SmolLM2-135M-Instruct: loads from the installed package with no torch and no
network, matches transformers' own GGUF loading, and answers a sum."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hf_factory import require_torch
from jaxrl_llm.models import init_cache, load_hf, load_smollm2, load_tokenizer, save_hf, smollm2_path

TEXTS = ["What is 2+3?", "  leading spaces and 12345 digits, 3.14 and -7", "Tabs\tand\nnewlines\n\n",
         "unicode: café naïve 日本語 🙂", "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture(scope="module")
def ours():
    return load_smollm2()


@pytest.fixture(scope="module")
def theirs():
    require_torch()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = smollm2_path()
    model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32).eval()
    assert next(model.parameters()).dtype == torch.float32
    return model, AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


def test_loading_needs_no_torch():
    """The package path runs in a fresh interpreter where importing torch is impossible."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "from jaxrl_llm.models import load_smollm2\n"
            "m, tok = load_smollm2()\n"
            "print(m.cfg.num_layers, len(tok))")
    import os

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # no network either
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["30", "49152"]


def test_config_is_smollm2(ours):
    cfg = ours[0].cfg
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (30, 576, 9, 3, 49152)
    assert cfg.tie_embeddings and cfg.head_dim == 64


def test_tokenizer_matches_transformers_gguf_tokenizer(ours, theirs):
    tok, ref = ours[1], theirs[1]
    for text in TEXTS:
        assert tok(text)["input_ids"] == ref(text)["input_ids"], text
        assert tok.decode(tok(text)["input_ids"]) == text
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_logits_match_transformers_gguf_loading(ours, theirs):
    import torch

    model, tok = ours
    texts = ["What is 2+3?", "The capital of France is", "def add(a, b):\n    return"]
    enc = [tok(t)["input_ids"] for t in texts]
    t = max(map(len, enc))
    tokens = np.full((len(enc), t), tok.pad_token_id, np.int32)
    mask = np.zeros((len(enc), t), bool)
    for i, ids in enumerate(enc):  # left padding, as in generation
        tokens[i, t - len(ids):], mask[i, t - len(ids):] = ids, True
    h, _ = model(tokens, mask)
    logits = np.asarray(model.logits(h))
    m = torch.tensor(mask.astype(np.int64))
    with torch.no_grad():
        ref = theirs[0](input_ids=torch.tensor(tokens.astype(np.int64)), attention_mask=m,
                        position_ids=(m.cumsum(-1) - 1).clamp(min=0)).logits.numpy()
    err = np.abs(logits - ref)[mask].max()
    assert err <= 1e-3, f"max |logit diff| {err:.2e}"
    assert np.abs(ref[mask]).max() > 5.0


def test_greedy_chat_answer_is_5(ours):
    model, tok = ours
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    gd, params = nnx.split(model)

    @jax.jit
    def step(params, tokens, cache):
        m = nnx.merge(gd, params)
        h, cache = m(tokens, jnp.ones(tokens.shape, bool), cache=cache)
        return jnp.argmax(m.logits(h[:, -1]), -1), cache

    cache = init_cache(model.cfg, 1, len(ids) + 24)
    nxt, cache = step(params, jnp.array([ids], jnp.int32), cache)
    out = []
    for _ in range(24):
        out.append(int(nxt[0]))
        if out[-1] == tok.eos_token_id:
            break
        nxt, cache = step(params, nxt[:, None], cache)
    answer = tok.decode(out, skip_special_tokens=True)
    assert "5" in answer.split("=")[-1], answer


def test_export_to_hf_with_tokenizer(ours, tmp_path):
    """The embedded model exported as an HF directory: transformers serves it with the same
    logits, and AutoTokenizer reads the tokenizer (chat template included)."""
    import torch
    from transformers import AutoModelForCausalLM

    model, tok = ours
    out = save_hf(model, tmp_path / "smollm2", tokenizer=tok)
    tok2 = load_tokenizer(out)
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert tok2.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == text
    ids = tok2(text)["input_ids"]
    assert ids == tok(text)["input_ids"]
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids])).logits.numpy()[0]
    h, _ = model(np.array([ids], np.int32))
    np.testing.assert_allclose(np.asarray(model.logits(h))[0], ref, atol=1e-3)
    again = load_hf(out)  # and our own loader reads it back exactly
    h2, _ = again(np.array([ids], np.int32))
    np.testing.assert_allclose(np.asarray(again.logits(h2)), np.asarray(model.logits(h)), atol=1e-5)


def test_sampler_greedy_equals_transformers_generate(ours, theirs):
    """Chat prompts of different lengths in one left-padded batch, greedy, stop at <|im_end|>."""
    import torch
    from jaxrl_llm.rollout import Sampler, encode_prompts, sampling_config

    model, tok = ours
    prompts = encode_prompts(tok, ["What is 2+3?", "Name a colour.", "Write one short sentence about the sea."])
    cfg = sampling_config(tok, max_new_tokens=20, greedy=True)
    gd, params = nnx.split(model)
    out = Sampler(gd, cfg, length_buckets=(64,))(params, prompts, jax.random.key(0))
    t = max(map(len, prompts))
    ids = torch.full((len(prompts), t), tok.pad_token_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, t - len(p):], att[i, t - len(p):] = torch.tensor(p), 1
    with torch.no_grad():
        ref = theirs[0].generate(ids, attention_mask=att, do_sample=False, max_new_tokens=20,
                                 eos_token_id=list(cfg.stop_token_ids), pad_token_id=tok.pad_token_id,
                                 top_k=None, top_p=None, temperature=None)[:, t:].tolist()
    for i, row in enumerate(ref):
        n = next((j + 1 for j, x in enumerate(row) if x in cfg.stop_token_ids), len(row))
        assert list(out.tokens[i][out.mask[i]]) == row[:n], (i, tok.decode(row[:n]))
    assert out.stopped.any()


def test_text_helpers_and_evaluation(ours):
    import re
    from jaxrl_llm.rollout import evaluate, generate_text, sampling_config

    model, tok = ours
    texts = generate_text(model, tok, ["What is 2+3?"], sampling_config(tok, max_new_tokens=24, greedy=True),
                          key=jax.random.key(0))
    assert len(texts) == 1 and len(texts[0]) == 1 and "5" in texts[0][0]

    def last_number_is(completion, answer):
        nums = re.findall(r"-?\d+", completion)
        return bool(nums) and int(nums[-1]) == answer

    res = evaluate(model, tok, ["What is 2+3?", "What is 4+4?", "What is 7+1?"], [5, 8, 8], last_number_is,
                   key=jax.random.key(1), k=2, num_samples=4, max_new_tokens=24)
    assert res["greedy_pass@1"] == pytest.approx(np.mean(res["correct"]))
    assert res["correct"][0]  # the greedy answer to 2+3 is right
    assert 0.0 <= res["pass@1"] <= res["pass@2"] <= 1.0 and res["n"] == 4

"""Model internals: positions, packing, LoRA, remat, dtype policy, chunked log-probs, configs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models import (PRESETS, LoRAConfig, ModelConfig, Transformer, from_hf_config, load_config, preset,
                              to_hf_config, token_logprobs, trainable)
from jaxrl_llm.models.logprobs import sequence_logprobs
from jaxrl_llm.models.transformer import LoRAParam, positions_from_mask, positions_from_segments

CFG = preset("tiny")


def test_positions_by_hand():
    m = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    np.testing.assert_array_equal(positions_from_mask(m), [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]])
    seg = np.array([[1, 1, 1, 2, 2, 3], [5, 5, 5, 5, 5, 5]])
    np.testing.assert_array_equal(positions_from_segments(seg), [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_packed_sequences_equal_separate_sequences(family):
    cfg = CFG if family == "llama" else preset("gpt2", vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
                                               num_kv_heads=4, head_dim=8, intermediate_size=53,
                                               max_position_embeddings=64)
    model = Transformer(cfg, rngs=nnx.Rngs(1))
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, cfg.vocab_size, 5), rng.integers(0, cfg.vocab_size, 4)
    packed = np.concatenate([a, b])[None].astype(np.int32)
    seg = np.array([[1] * 5 + [2] * 4])
    h, _ = model(packed, segment_ids=seg)
    got = np.asarray(model.logits(h))[0]
    for start, x in ((0, a), (5, b)):
        hs, _ = model(x[None].astype(np.int32))
        np.testing.assert_allclose(got[start:start + len(x)], np.asarray(model.logits(hs))[0], atol=2e-5)


def test_lora_starts_at_base_and_trains_only_adapters():
    lora = LoRAConfig(rank=4, alpha=8.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
    model = Transformer(CFG.replace(lora=lora), rngs=nnx.Rngs(0))
    base = Transformer(CFG, rngs=nnx.Rngs(5))
    nnx.update(base, nnx.split(model, LoRAParam, ...)[2])  # the LoRA model's base weights
    tokens = jnp.array(np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 6)), jnp.int32)
    hb, _ = base(tokens)
    hl, _ = model(tokens)
    np.testing.assert_allclose(np.asarray(hl), np.asarray(hb), atol=1e-6)  # B = 0: same function
    gd, train, frozen = nnx.split(model, trainable(model.cfg), ...)
    assert all(isinstance(v, LoRAParam) for _, v in nnx.to_flat_state(train))
    n_train = sum(x.size for x in jax.tree.leaves(train))
    n_all = n_train + sum(x.size for x in jax.tree.leaves(frozen))
    assert 0 < n_train < 0.3 * n_all

    def loss(train):
        lp, _ = sequence_logprobs(nnx.merge(gd, train, frozen), tokens, jnp.ones(tokens.shape, bool))
        return -jnp.mean(lp)

    g = jax.grad(loss)(train)
    assert any(float(jnp.abs(x).max()) > 0 for x in jax.tree.leaves(g))  # adapters get gradient
    assert trainable(CFG) is nnx.Param


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_changes_nothing_numerically(remat):
    tokens = jnp.array(np.random.default_rng(2).integers(0, CFG.vocab_size, (2, 7)), jnp.int32)

    def loss_and_grad(cfg):
        model = Transformer(cfg, rngs=nnx.Rngs(0))
        gd, params = nnx.split(model)
        f = lambda p: -jnp.mean(sequence_logprobs(nnx.merge(gd, p), tokens, jnp.ones((2, 7), bool))[0])  # noqa: E731
        return jax.value_and_grad(f)(params)

    v0, g0 = loss_and_grad(CFG)
    v1, g1 = loss_and_grad(CFG.replace(remat=remat))
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6)


def test_bf16_compute_and_params_stay_close_to_f32():
    tokens = jnp.array(np.random.default_rng(3).integers(0, CFG.vocab_size, (2, 6)), jnp.int32)
    f32 = Transformer(CFG, rngs=nnx.Rngs(0))
    h32, _ = f32(tokens)
    l32 = f32.logits(h32)
    for pdt, dt in (("float32", "bfloat16"), ("bfloat16", "bfloat16")):
        m = Transformer(CFG.replace(param_dtype=pdt, dtype=dt), rngs=nnx.Rngs(0))
        h, _ = m(tokens)
        assert h.dtype == jnp.bfloat16 and m.embed[...].dtype == jnp.dtype(pdt)
        lg = m.logits(h)
        assert lg.dtype == jnp.float32
        assert float(jnp.abs(lg - l32).max()) < 0.05 * float(jnp.abs(l32).max()) + 0.05


@pytest.mark.parametrize("chunk,temp,cap", [(3, 1.0, None), (8, 0.7, None), (64, 1.3, None), (3, 0.7, 2.5),
                                            (8, 1.0, 30.0)])
def test_chunked_logprobs_equal_dense(chunk, temp, cap):
    """Values and gradients (the hand-written backward pass) against autodiff through dense
    logits; ``cap``: Gemma 2's final-logit soft-cap c tanh(z / c) (2.5: most logits capped)."""
    rng = np.random.default_rng(4)
    h = jnp.asarray(rng.normal(size=(2, 7, 16)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(16, 29)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 29, (2, 7)), jnp.int32)

    def dense(h, w):
        z = h @ w
        if cap is not None:
            z = cap * jnp.tanh(z / cap)
        z = jax.nn.log_softmax(z / temp, -1)
        p = jnp.exp(z)
        return jnp.take_along_axis(z, y[..., None], -1)[..., 0], -jnp.sum(p * z, -1)

    def chunked(h, w):
        return token_logprobs(h, w, y, chunk_size=chunk, temperature=temp, softcap=cap)

    for a, b in zip(dense(h, w), chunked(h, w)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5)
    obj = lambda f: lambda h, w: jnp.sum(f(h, w)[0] * 0.3 + f(h, w)[1] * 0.1)  # noqa: E731
    gd, gc = jax.grad(obj(dense), (0, 1))(h, w), jax.grad(obj(chunked), (0, 1))(h, w)
    for a, b in zip(gd, gc):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5)


def test_logprobs_gradient_under_jit_with_masked_positions():
    """The hand-written backward pass of token_logprobs, jitted, with chunks that do not divide
    the length: the gradients of autodiff through dense logits, and exactly zero for positions
    whose cotangent is zero (masked tokens)."""
    rng = np.random.default_rng(5)
    h = jnp.asarray(rng.normal(size=(3, 10, 16)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(16, 37)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 37, (3, 10)), jnp.int32)
    m = jnp.asarray(rng.random((3, 10)) < 0.6)

    def loss(h, w, temp):
        lp, ent = token_logprobs(h, w, y, chunk_size=4, temperature=temp)
        return jnp.sum(jnp.where(m, lp - 0.2 * ent, 0.0))

    def dense(h, w, temp):
        z = jax.nn.log_softmax((h @ w) / temp, -1)
        lp = jnp.take_along_axis(z, y[..., None], -1)[..., 0]
        return jnp.sum(jnp.where(m, lp + 0.2 * jnp.sum(jnp.exp(z) * z, -1), 0.0))

    g = jax.jit(jax.grad(loss, (0, 1)), static_argnums=2)(h, w, 0.8)
    g_dense = jax.grad(dense, (0, 1))(h, w, 0.8)
    for a, c in zip(g, g_dense):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), atol=2e-5)
    assert float(jnp.abs(g[0][~m]).max()) == 0.0


def test_scan_makes_the_program_independent_of_depth():
    """The lowered program has the same number of ops for 2 and 12 layers (compile time does
    not grow with depth; measured in benchmarks/model_compile_time.py)."""
    def n_ops(layers):
        cfg = CFG.replace(num_layers=layers)
        gd, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
        f = jax.jit(lambda p, t: nnx.merge(gd, p)(t)[0])
        text = f.lower(params, jax.ShapeDtypeStruct((2, 8), jnp.int32)).as_text()
        return sum(1 for line in text.splitlines() if "=" in line)

    assert n_ops(2) == n_ops(12)


def test_config_round_trips():
    for name, cfg in PRESETS.items():
        assert ModelConfig.from_dict(cfg.to_dict()) == cfg, name
        back = from_hf_config(to_hf_config(cfg))
        assert back == cfg.replace(num_labels=back.num_labels), name
    c = preset("tiny", lora=LoRAConfig(rank=2, targets=("q", "up")))
    assert ModelConfig.from_dict(c.to_dict()) == c


def test_rope_scaling_matches_transformers():
    """inv_freq (and YaRN's attention factor) equal transformers' own rope init functions."""
    import torch  # noqa: F401  (transformers' rope utils need it)
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cases = {"llama3": dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64),
             "linear": dict(factor=3.0),
             "yarn": dict(factor=4.0, original_max_position_embeddings=128, beta_fast=16, beta_slow=2)}
    for kind, params in cases.items():
        hf = AutoConfig.for_model("llama", hidden_size=64, num_attention_heads=2, head_dim=32,
                                  max_position_embeddings=1024,
                                  rope_parameters={"rope_type": kind, "rope_theta": 50000.0, **params})
        inv, att = from_hf_config(hf).rope()
        ref_inv, ref_att = ROPE_INIT_FUNCTIONS[kind](hf, "cpu")
        np.testing.assert_allclose(inv, ref_inv.numpy(), rtol=1e-6)
        assert att == pytest.approx(ref_att)


def test_bad_configs_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelConfig(num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match="family"):
        ModelConfig(family="bert")
    with pytest.raises(ValueError, match="rope_scaling"):
        ModelConfig(rope_scaling=(("rope_type", "longrope"),))
    with pytest.raises(ValueError, match="targets"):
        LoRAConfig(targets=("qkv",))
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_config(tmp_path)
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="'tokens'"):
        model(jnp.zeros((3,), jnp.int32))
    with pytest.raises(ValueError, match="'mask'"):
        model(jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 4), bool))

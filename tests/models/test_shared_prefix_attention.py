"""Prefix Grouper (shared-prefix attention): encoding each prompt once gives the log-probs,
entropies and gradients of the row-by-row computation on every completion target, for every
attention variant the model family has (GQA, sliding windows, QK-norm and biases, learned
positions, LoRA, remat), with left-padded prompts of different lengths and right-padded
completions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models.config import LoRAConfig, ModelConfig, preset
from jaxrl_llm.models.logprobs import sequence_logprobs, shared_prefix_logprobs
from jaxrl_llm.models.transformer import Transformer, trainable

U, R, P, T = 3, 4, 7, 6  # prompts, rows per prompt, prompt columns, completion columns

CONFIGS = {
    # default suite: every variant at once (GQA, sliding windows, QK-norm, q/k/v biases, remat, LoRA)
    # and GPT-2 (learned positions, LayerNorm, tied embeddings); each variant alone with -m slow
    "all_variants_lora": dict(sliding_window=4, qk_norm=True, qkv_bias=True, remat="full",
                              lora=LoRAConfig(rank=4, alpha=8.0)),
    "gpt2": "gpt2",
    "llama_gqa": dict(),
    "sliding_window": dict(sliding_window=4),
    "qk_norm_bias": dict(qk_norm=True, qkv_bias=True),
    "remat": dict(remat="full"),
    "lora": dict(lora=LoRAConfig(rank=4, alpha=8.0)),
}
DEFAULT = ("all_variants_lora", "gpt2")


def _config(name):
    spec = CONFIGS[name]
    if spec == "gpt2":
        return ModelConfig(family="gpt2", vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=4,
                           head_dim=8, intermediate_size=64, norm="layer", activation="gelu_tanh", gated_mlp=False,
                           position="learned", max_position_embeddings=64, qkv_bias=True, o_bias=True, mlp_bias=True,
                           tie_embeddings=True)
    return preset("tiny", **spec)


def _batch(vocab, seed=0):
    """Blocks of R rows with one left-padded prompt (lengths 2..P) and right-padded completions."""
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, vocab, (U * R, P + T)).astype(np.int32)
    mask = np.ones((U * R, P + T), bool)
    for u in range(U):
        plen = int(rng.integers(2, P + 1))
        prompt = rng.integers(0, vocab, P)
        for j in range(R):
            i = u * R + j
            toks[i, :P] = prompt
            toks[i, :P - plen] = 0
            mask[i, :P - plen] = False
            mask[i, P + int(rng.integers(1, T + 1)):] = False
    target = np.zeros((U * R, P + T - 1), bool)
    target[:, P - 1:] = mask[:, P:]  # the completion tokens (what an RL loss trains on)
    return jnp.asarray(toks), jnp.asarray(mask), jnp.asarray(target)


@pytest.mark.parametrize("name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in CONFIGS])
def test_values_and_gradients_equal_the_row_by_row_pass(name):
    cfg = _config(name)
    model = Transformer(cfg, rngs=nnx.Rngs(1))
    if cfg.lora is not None:  # non-zero adapters, so their gradients are not trivially the same
        gd, lora, rest = nnx.split(model, trainable(cfg), ...)
        lora = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(3), x.shape), lora)
    else:
        gd, lora = nnx.split(model)
        rest = None
    toks, mask, target = _batch(cfg.vocab_size)
    others = () if rest is None else (rest,)

    def loss(params, grouped):
        m = nnx.merge(gd, params, *others)
        if grouped:
            lp, ent = shared_prefix_logprobs(m, toks, mask, P, R, chunk_size=4, temperature=0.8)
        else:
            lp, ent = sequence_logprobs(m, toks, mask, chunk_size=4, temperature=0.8)
        # an arbitrary loss of both, weighted per token, so every gradient path is exercised
        w = jnp.linspace(0.5, 1.5, lp.size).reshape(lp.shape)
        return jnp.sum(jnp.where(target, w * lp + 0.3 * ent, 0.0)), (lp, ent)

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (v0, (lp0, e0)), g0 = grad(lora, False)
    (v1, (lp1, e1)), g1 = grad(lora, True)
    np.testing.assert_allclose(np.where(target, lp1, 0), np.where(target, lp0, 0), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.where(target, e1, 0), np.where(target, e0, 0), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(v1, v0, rtol=1e-5)
    assert np.all(np.asarray(lp1)[:, :P - 1] == 0) and np.all(np.asarray(e1)[:, :P - 1] == 0)
    leaves0, leaves1 = jax.tree.leaves(g0), jax.tree.leaves(g1)
    assert len(leaves0) == len(leaves1) > 0
    top = max(float(jnp.max(jnp.abs(a))) for a in leaves0)
    assert top > 1e-3  # gradients are not all zero
    for a, b in zip(leaves0, leaves1):  # each leaf to its own scale, or the largest's for (near-)zero leaves
        scale = max(float(jnp.max(jnp.abs(a))), 1e-3 * top)  # (a key bias's gradient is 0 up to rounding)
        np.testing.assert_allclose(np.asarray(b) / scale, np.asarray(a) / scale, atol=2e-5)


def test_a_block_with_a_different_prompt_gives_different_values():
    """The check that the test above can fail: break one block's shared prompt and the grouped
    pass (which reads the block's first row only) no longer matches row by row."""
    cfg = _config("llama_gqa")
    model = Transformer(cfg, rngs=nnx.Rngs(1))
    toks, mask, target = _batch(cfg.vocab_size)
    toks = toks.at[R + 1, P - 1].set((toks[R + 1, P - 1] + 1) % cfg.vocab_size)  # row 1 of block 1
    lp0, _ = sequence_logprobs(model, toks, mask)
    lp1, _ = shared_prefix_logprobs(model, toks, mask, P, R)
    diff = np.abs(np.where(target, np.asarray(lp1) - np.asarray(lp0), 0))
    assert diff[R + 1].max() > 1e-3 and diff[np.arange(U * R) != R + 1].max() < 2e-5


def test_bad_arguments_are_named():
    cfg = _config("llama_gqa")
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    toks, mask, _ = _batch(cfg.vocab_size)
    with pytest.raises(ValueError, match="rows_per_prompt=5"):
        shared_prefix_logprobs(model, toks, mask, P, 5)
    with pytest.raises(ValueError, match="prompt_len=13"):
        shared_prefix_logprobs(model, toks, mask, P + T, R)
    _, prefix = model.encode_prefix(toks[::R, :P], mask[::R, :P])
    with pytest.raises(ValueError, match="must divide the 5 rows"):
        model(toks[:5, P:], mask[:5, P:], prefix=prefix)

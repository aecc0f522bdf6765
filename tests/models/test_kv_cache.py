"""Decoding with the KV cache gives the full forward's logits at every position."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hf_factory import ARCHS
from jaxrl_llm.models import Transformer, from_hf_config, init_cache


def tiny_cfg(arch):
    from transformers import AutoConfig

    kw = dict(ARCHS[arch])
    return from_hf_config(AutoConfig.for_model(kw.pop("model_type"), **kw))


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2-sliding-yarn", "qwen3", "gpt2", "gemma2", "gemma3",
                                  "qwen3_moe"])
@pytest.mark.parametrize("prefill", [1, 4])
def test_incremental_decoding_equals_full_forward(arch, prefill):
    cfg = tiny_cfg(arch)
    model = Transformer(cfg, rngs=nnx.Rngs(3))
    rng = np.random.default_rng(0)
    b, t = 3, 10
    tokens = rng.integers(0, cfg.vocab_size, (b, t)).astype(np.int32)
    mask = np.ones((b, t), bool)
    mask[0, :3] = False  # left-padded prompt
    mask[1, :1] = False
    h, _ = model(tokens, mask)
    full = np.asarray(model.logits(h))
    gd, params = nnx.split(model)

    @jax.jit
    def step(params, tok, m, cache):
        mod = nnx.merge(gd, params)
        hh, cache = mod(tok, m, cache=cache)
        return mod.logits(hh), cache

    cache = init_cache(cfg, b, t + 2)
    got, cache = step(params, tokens[:, :prefill], mask[:, :prefill], cache)
    outs = [np.asarray(got)]
    for i in range(prefill, t):
        got, cache = step(params, tokens[:, i:i + 1], mask[:, i:i + 1], cache)
        outs.append(np.asarray(got))
    inc = np.concatenate(outs, 1)
    err = np.abs(inc - full)[mask].max()
    assert err < 2e-5, f"{arch}: incremental vs full differ by {err:.2e}"
    assert int(cache.index) == t and np.array_equal(np.asarray(cache.next_position), mask.sum(1))


def test_decode_step_updates_the_donated_cache_in_place():
    cfg = tiny_cfg("llama")
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    gd, params = nnx.split(model)

    def step(params, tok, cache):
        hh, cache = nnx.merge(gd, params)(tok, cache=cache)
        return hh, cache

    f = jax.jit(step, donate_argnums=2)
    cache = init_cache(cfg, 2, 8)
    _, c1 = f(params, jnp.ones((2, 3), jnp.int32), cache)
    assert cache.k.is_deleted() and cache.v.is_deleted()  # the buffers were donated, not copied
    _, c2 = f(params, jnp.ones((2, 1), jnp.int32), c1)
    assert c1.k.is_deleted() and int(c2.index) == 4
    compiled = jax.jit(step, donate_argnums=2).lower(params, jnp.ones((2, 1), jnp.int32), c2).compile()
    # XLA aliases the cache buffers input -> output (no second [L, B, S, K, Dh] allocation)
    assert compiled.memory_analysis().alias_size_in_bytes >= 2 * c2.k.nbytes


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "mistral"])
@pytest.mark.parametrize("chunks", [(1,) * 10, (4,) + (1,) * 6, (5, 3, 2)])
def test_ring_cache_of_sliding_layers_equals_full_forward(arch, chunks):
    """Per-layer cache with the sliding-window layers as rings of W slots (Gemma's default,
    Mistral's opt-in): decoding one token at a time, and several tokens per call (a prefill, a
    multi-turn observation) longer than the window, give the full forward's logits; the local
    layers' buffers never grow beyond W."""
    from jaxrl_llm.models import unstack_layers

    cfg = tiny_cfg(arch)
    model = Transformer(cfg, rngs=nnx.Rngs(5))
    rng = np.random.default_rng(1)
    b, t = 3, sum(chunks)
    tokens = rng.integers(0, cfg.vocab_size, (b, t)).astype(np.int32)
    mask = np.ones((b, t), bool)
    mask[0, :3] = False
    mask[1, :1] = False
    h, _ = model(tokens, mask)
    full = np.asarray(model.logits(h))
    gd, params = nnx.split(model)
    layers = unstack_layers(params)

    @jax.jit
    def step(params, layers, tok, m, cache):
        mod = nnx.merge(gd, params)
        hh, cache = mod(tok, m, cache=cache, layers=layers)
        return mod.logits(hh), cache

    cache = init_cache(cfg, b, t + 2, per_layer=True, ring=True)
    w = cfg.sliding_window
    assert w < t
    sizes = [c.shape[2] for c in cache.v]
    assert sizes == [w if x > 0 else t + 2 for x in cfg.layer_windows()] and w in sizes
    outs, i = [], 0
    for n in chunks:
        got, cache = step(params, layers, tokens[:, i:i + n], mask[:, i:i + n], cache)
        outs.append(np.asarray(got))
        i += n
    err = np.abs(np.concatenate(outs, 1) - full)[mask].max()
    assert err < 2e-5, f"{arch}: ring cache vs full forward differ by {err:.2e}"
    assert [c.shape[2] for c in cache.v] == sizes  # no growth

"""The attention implementations (``models/attn.py``) against ``dense``: values and gradients of
the kernels on packed rows (segment ids) with grouped-query heads, sliding windows, soft-capped
scores, shared-prefix parts and KV-cache parts (run-time slots), then the model with each
implementation (log-probs and gradients of packed rows, the shared-prefix pass, KV-cache
decoding), ``auto``'s choice, and the refusals. ``splash`` runs in Pallas interpret mode."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models import attn as A
from jaxrl_llm.models.config import ModelConfig, preset
from jaxrl_llm.models.logprobs import sequence_logprobs, shared_prefix_logprobs
from jaxrl_llm.models.transformer import Transformer, init_cache

RNG = np.random.default_rng(0)


def _rnd(*shape, dtype=jnp.float32):
    return jnp.asarray(RNG.normal(size=shape), dtype)


def _packed_rows(b, t):
    """Validity and segment ids of ``b`` rows of ``t`` tokens: left padding, right padding, and
    rows packed with 2-3 segments (segment 0 = padding)."""
    mask = np.ones((b, t), bool)
    seg = np.ones((b, t), np.int32)
    mask[0, :5] = False
    seg[0, :5] = 0
    mask[1, t - 7:] = False
    seg[1, t - 7:] = 0
    seg[2, 10:] = 2
    seg[2, 25:] = 3
    seg[3, :t - 4] = np.repeat([1, 2], [(t - 4) // 2, t - 4 - (t - 4) // 2])
    seg[3, t - 4:] = 0
    mask[3, t - 4:] = False
    return jnp.asarray(mask), jnp.asarray(seg)


def _run(impl, q, parts_fn, mask, **kw):
    """``(loss, out), grads`` of a weighted sum of the real queries' outputs."""
    def f(q, *kv):
        out = A.attention(q, parts_fn(*kv), impl=impl, q_valid=mask, **kw)
        w = jnp.where(mask[:, :, None, None], 1.0, 0.0) * jnp.cos(jnp.arange(q.shape[-1], dtype=jnp.float32))
        return jnp.sum(out.astype(jnp.float32) * w), out
    return f


def _compare(impl, f_args, parts_fn, mask, tol, **kw):
    q, *kv = f_args
    argnums = tuple(range(len(f_args)))
    (_, od), gd = jax.jit(jax.value_and_grad(_run("dense", q, parts_fn, mask, **kw), argnums, has_aux=True))(*f_args)
    (_, oi), gi = jax.jit(jax.value_and_grad(_run(impl, q, parts_fn, mask, **kw), argnums, has_aux=True))(*f_args)
    m = np.asarray(mask)[:, :, None, None]
    np.testing.assert_allclose(np.where(m, np.asarray(oi, np.float32), 0), np.where(m, np.asarray(od, np.float32), 0),
                               atol=tol, rtol=tol)
    for a, b in zip(gi, gd):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=tol, rtol=tol)


IMPLS = ["blockwise", "splash"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("window,softcap", [(None, None), (6, 3.0)])
def test_packed_rows_with_gqa_window_softcap_equal_dense(impl, window, softcap):
    b, t, h, kh, dh = 4, 37, 6, 2, 8
    mask, seg = _packed_rows(b, t)
    args = (_rnd(b, t, h, dh), _rnd(b, kh, dh, t), _rnd(b, kh, t, dh))
    with A.splash_interpret():
        _compare(impl, args, lambda k, v: [(k, v, 0, mask, seg)], mask, 2e-5, q_slot=0, window=window, q_seg=seg,
                 softcap=softcap, block_q=8, block_k=16)


@pytest.mark.parametrize("impl", IMPLS)
def test_traced_window_equals_dense(impl):
    """A window that is a traced value (the scanned layers of Gemma: local and global layers)."""
    b, t, h, kh, dh = 2, 40, 4, 2, 8
    mask = jnp.asarray(np.arange(t)[None] >= np.array([[0], [9]]))
    args = (_rnd(b, t, h, dh), _rnd(b, kh, dh, t), _rnd(b, kh, t, dh))
    for win in (0, 7):
        def f(q, k, v, w):
            out = A.attention(q, [(k, v, 0, mask, None)], q_slot=0, window=w, impl=impl_, q_valid=mask,
                              static_window=7, block_q=16, block_k=16)
            return jnp.where(mask[:, :, None, None], out, 0.0)
        impl_ = "dense"
        ref = f(*args, jnp.asarray(win))
        impl_ = impl
        with A.splash_interpret():
            got = jax.jit(f)(*args, jnp.asarray(win))
        np.testing.assert_allclose(got, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_shared_prefix_parts_equal_dense(impl):
    """Keys of U prompts each read by R rows (Prefix Grouper), then each row's own keys."""
    u, r, p, t, h, kh, dh = 2, 3, 11, 9, 4, 2, 8
    pv = np.ones((u, p), bool)
    pv[0, :4] = False
    mask = np.ones((u * r, t), bool)
    mask[1, 6:] = False
    pv, mask = jnp.asarray(pv), jnp.asarray(mask)
    args = (_rnd(u * r, t, h, dh), _rnd(u, kh, dh, p), _rnd(u, kh, p, dh), _rnd(u * r, kh, dh, t),
            _rnd(u * r, kh, t, dh))
    with A.splash_interpret():
        _compare(impl, args, lambda kp, vp, k, v: [(kp, vp, 0, pv, None, r), (k, v, p, mask, None)], mask, 2e-5,
                 q_slot=p, window=6, softcap=5.0, block_q=4, block_k=8)


@pytest.mark.parametrize("impl", ["blockwise", "splash"])
def test_kv_cache_parts_with_runtime_slots_equal_dense(impl):
    """Decoding: the cache's slots and the new tokens' slots are run-time values (splash hands
    the call to blockwise)."""
    b, s, h, kh, dh = 3, 20, 4, 2, 8
    idx = jnp.asarray(12)
    cvalid = jnp.asarray((np.arange(s)[None] < 12) & (np.arange(s)[None] >= np.array([[0], [3], [5]])))
    kc, vc = _rnd(b, kh, dh, s), _rnd(b, kh, s, dh)
    for tn in (1, 3):
        q, k1, v1 = _rnd(b, tn, h, dh), _rnd(b, kh, dh, tn), _rnd(b, kh, tn, dh)
        mask = jnp.ones((b, tn), bool)
        parts = lambda kc, vc, k1, v1: [(kc, vc, jnp.arange(s), cvalid, None),  # noqa: E731
                                        (k1, v1, idx + jnp.arange(tn), mask, None)]
        _compare(impl, (q, kc, vc, k1, v1), parts, mask, 2e-5, q_slot=idx + jnp.arange(tn), window=jnp.asarray(5),
                 block_q=2, block_k=8)


def test_bfloat16_inputs_stay_close_to_dense():
    b, t, h, kh, dh = 4, 37, 6, 2, 8
    mask, seg = _packed_rows(b, t)
    args = (_rnd(b, t, h, dh, dtype=jnp.bfloat16), _rnd(b, kh, dh, t, dtype=jnp.bfloat16),
            _rnd(b, kh, t, dh, dtype=jnp.bfloat16))
    _compare("blockwise", args, lambda k, v: [(k, v, 0, mask, seg)], mask, 5e-2, q_slot=0, q_seg=seg, block_q=8,
             block_k=8)


def test_cudnn_mapping_equals_dense_through_xla():
    """The cuDNN path's argument mapping (rows' real tokens moved to the front, padding as sequence
    lengths, the window as cuDNN's) computed by ``jax.nn.dot_product_attention``'s XLA
    implementation; a row whose real tokens are not contiguous comes out NaN."""
    b, t, h, kh, dh = 3, 24, 4, 2, 8
    valid = np.ones((b, t), bool)
    valid[0, :5] = False  # left padding
    valid[1, 20:] = False  # right padding
    valid[2, :3] = False
    valid[2, 22:] = False  # both
    mask = jnp.asarray(valid)
    q, k, v = _rnd(b, t, h, dh), _rnd(b, kh, dh, t), _rnd(b, kh, t, dh)
    for window in (None, 5):
        ref = A.dense_attention(q, [(k, v, 0, mask, None)], q_slot=0, window=window)
        got = A.cudnn_attention(q, [(k, v, 0, mask, None)], q_slot=0, window=window, implementation="xla")
        m = valid[:, :, None, None]
        np.testing.assert_allclose(np.where(m, got, 0), np.where(m, ref, 0), atol=2e-5, rtol=2e-5)
    holes = valid.copy()
    holes[0, 10] = False
    got = A.cudnn_attention(q, [(k, v, 0, jnp.asarray(holes), None)], q_slot=0, implementation="xla")
    assert np.isnan(np.asarray(got[0])).all() and np.isfinite(np.asarray(got[1:])).all()
    assert A.cudnn_supports(q, [(k, v, 0, mask, mask.astype(jnp.int32))], q_slot=0, q_seg=mask.astype(jnp.int32))
    # the kernel's own limits: 16-bit inputs, and a window known when tracing (not a scanned layer's)
    assert "bfloat16 or float16" in A.cudnn_supports(q, [(k, v, 0, mask, None)], q_slot=0)
    qb = q.astype(jnp.bfloat16)
    assert A.cudnn_supports(qb, [(k, v, 0, mask, None)], q_slot=0, window=5) is None
    assert "traced" in A.cudnn_supports(qb, [(k, v, 0, mask, None)], q_slot=0, window=jnp.asarray(5))


# ------------------------------------------------------------------------------------------ model
def _gemma_like():
    """Grouped-query heads, local and global layers (a traced window in the layer scan), soft-capped
    attention scores and final logits."""
    return preset("tiny-gemma", attn_softcap=20.0, sliding_window=6)


def _packed_batch(vocab, b=3, t=40, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (b, t)).astype(np.int32)
    seg = np.ones((b, t), np.int32)
    seg[0, 17:] = 2
    seg[0, 33:] = 0  # padding at the end of a packed row
    seg[1, 9:] = 2
    seg[1, 21:] = 3
    mask = seg > 0
    return jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(seg)


@pytest.mark.parametrize("impl", ["blockwise", "splash"])
def test_model_logprobs_and_gradients_of_packed_rows_equal_dense(impl):
    cfg = _gemma_like()
    tokens, mask, seg = _packed_batch(cfg.vocab_size)
    gd, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    gd_i, _ = nnx.split(Transformer(cfg.replace(attention=impl, attention_block=8), rngs=nnx.Rngs(0)))

    def loss(p, g):
        lp, ent = sequence_logprobs(nnx.merge(g, p), tokens, mask, segment_ids=seg, chunk_size=16)
        w = (mask[:, 1:] & (seg[:, 1:] == seg[:, :-1])).astype(jnp.float32)
        return jnp.sum((lp + 0.1 * ent) * w), lp

    (_, lp_d), g_d = jax.value_and_grad(loss, has_aux=True)(params, gd)
    with A.splash_interpret():
        (_, lp_i), g_i = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)(params, gd_i)
    w = np.asarray(mask[:, 1:] & (seg[:, 1:] == seg[:, :-1]))
    np.testing.assert_allclose(np.where(w, lp_i, 0), np.where(w, lp_d, 0), atol=1e-4, rtol=1e-4)
    for a, b in zip(jax.tree.leaves(g_i), jax.tree.leaves(g_d)):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("impl", ["blockwise", "splash"])
def test_model_shared_prefix_pass_equals_dense(impl):
    cfg = preset("tiny", sliding_window=5)
    u, r, p, t = 2, 3, 7, 6
    rng = np.random.default_rng(1)
    toks = rng.integers(0, cfg.vocab_size, (u * r, p + t)).astype(np.int32)
    mask = np.ones((u * r, p + t), bool)
    for i in range(u):
        toks[i * r:(i + 1) * r, :p] = toks[i * r, :p]
        mask[i * r:(i + 1) * r, :2 + i] = False
    mask[1, p + 3:] = False
    toks, mask = jnp.asarray(toks), jnp.asarray(mask)
    outs = {}
    for name in ("dense", impl):
        model = Transformer(cfg.replace(attention=name, attention_block=4), rngs=nnx.Rngs(0))
        with A.splash_interpret():
            outs[name] = jax.jit(lambda m: shared_prefix_logprobs(m, toks, mask, p, r, chunk_size=4)[0])(model)
    w = np.zeros(mask.shape, bool)[:, 1:]
    w[:, p - 1:] = np.asarray(mask[:, p:])
    np.testing.assert_allclose(np.where(w, outs[impl], 0), np.where(w, outs["dense"], 0), atol=2e-5, rtol=2e-5)


def test_model_kv_cache_decoding_blockwise_equals_dense():
    """Prefill then token-by-token decoding through the cache: the same logits with blockwise as
    with dense (left-padded prompts, a sliding-window model)."""
    cfg = preset("tiny", sliding_window=4)
    rng = np.random.default_rng(2)
    b, p, n = 3, 9, 5
    toks = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, p + n)).astype(np.int32))
    pmask = jnp.asarray(np.arange(p)[None] >= np.array([[0], [2], [5]]))
    logits = {}
    for name in ("dense", "blockwise"):
        model = Transformer(cfg.replace(attention=name, attention_block=4), rngs=nnx.Rngs(0))

        @jax.jit
        def run(model):
            cache = init_cache(cfg, b, p + n)
            h, cache = model(toks[:, :p], pmask, cache=cache)
            outs = [model.logits(h[:, -1])]
            for i in range(n - 1):
                h, cache = model(toks[:, p + i:p + i + 1], jnp.ones((b, 1), bool), cache=cache)
                outs.append(model.logits(h[:, -1]))
            return jnp.stack(outs, 1)

        logits[name] = run(model)
    np.testing.assert_allclose(logits["blockwise"], logits["dense"], atol=5e-5, rtol=5e-5)


def test_blockwise_compiles_without_the_score_matrix():
    """The compiler's own temporaries: the blockwise gradient at 2,048 tokens needs a small
    fraction of dense's, whose [B, H, T, S] float32 scores alone are 64 MiB here."""
    b, t, h, kh, dh = 1, 2048, 4, 2, 16
    args = (jax.ShapeDtypeStruct((b, t, h, dh), jnp.float32), jax.ShapeDtypeStruct((b, kh, dh, t), jnp.float32),
            jax.ShapeDtypeStruct((b, kh, t, dh), jnp.float32))
    mask = jnp.ones((b, t), bool)

    def temp(impl):
        def loss(q, k, v):
            return jnp.sum(A.attention(q, [(k, v, 0, mask, None)], q_slot=0, impl=impl, block_q=256, block_k=256))
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    dense, blockwise = temp("dense"), temp("blockwise")
    assert dense >= b * h * t * t * 4, dense
    assert blockwise * 8 < dense, (blockwise, dense)


def test_auto_resolves_by_backend_and_length():
    assert A.resolve_implementation("auto", "tpu") == "splash"
    assert A.resolve_implementation("auto", "gpu") == "cudnn"
    assert A.resolve_implementation("auto", "cpu", A.AUTO_DENSE_MAX_KEYS) == "dense"
    assert A.resolve_implementation("auto", "cpu", A.AUTO_DENSE_MAX_KEYS + 1) == "blockwise"
    # a decode step of a few rows over a long cache: few scores, dense (faster on CPU); many: blockwise
    assert A.resolve_implementation("auto", "cpu", 8192, score_elems=9 * 8192) == "dense"
    assert A.resolve_implementation("auto", "cpu", 8192, score_elems=64 * 28 * 8192 * 2) == "blockwise"
    assert A.resolve_implementation("blockwise", "tpu") == "blockwise"
    with A.compile_for("tpu"):
        assert A.resolve_implementation("auto") == "splash"
        assert A.target_platform() == "tpu"
    # on CPU, auto is dense at today's lengths: the same numbers bit for bit
    q, k, v = _rnd(2, 16, 4, 8), _rnd(2, 2, 8, 16), _rnd(2, 2, 16, 8)
    parts = [(k, v, 0, jnp.ones((2, 16), bool), None)]
    np.testing.assert_array_equal(A.attention(q, parts, q_slot=0, impl="auto"),
                                  A.attention(q, parts, q_slot=0, impl="dense"))


def test_refusals_name_what_is_wrong():
    with pytest.raises(ValueError, match="ModelConfig.attention must be one of"):
        ModelConfig(attention="flash")
    with pytest.raises(ValueError, match="attention_block"):
        ModelConfig(attention_block=0)
    q, k, v = _rnd(1, 8, 2, 8), _rnd(1, 1, 8, 8), _rnd(1, 1, 8, 8)
    parts = [(k, v, 0, jnp.ones((1, 8), bool), None)]
    with pytest.raises(ValueError, match="splash is a TPU kernel"):
        A.attention(q, parts, q_slot=0, impl="splash")
    with pytest.raises(ValueError, match="cudnn needs a GPU"):
        A.attention(q, parts, q_slot=0, impl="cudnn")


@pytest.mark.parametrize("impl", ["dense", "blockwise"])
def test_chunked_prefill_equals_one_call(impl):
    """A long prompt prefilled in chunks (each attending to the cache so far) leaves the same last
    hidden state and the same next-token logits after a decode step as one call."""
    from jaxrl_llm.rollout.sampler import prefill, prefill_slots

    cfg = preset("tiny", sliding_window=5, attention=impl, attention_block=4)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(3)
    b, p, chunk = 2, 13, 4
    toks = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, p)).astype(np.int32))
    mask = jnp.asarray(np.arange(p)[None] >= np.array([[0], [4]]))
    nxt = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, 1)).astype(np.int32))

    @functools.partial(jax.jit, static_argnums=1)
    def run(model, c):
        cache = init_cache(cfg, b, prefill_slots(p, c) + 2)
        h, cache = prefill(model, None, toks, mask, cache, chunk=c)
        h2, _ = model(nxt, jnp.ones((b, 1), bool), cache=cache)
        return model.logits(h[:, -1]), model.logits(h2[:, -1])

    one = run(model, p)
    chunked = run(model, chunk)
    assert prefill_slots(p, chunk) == 16
    for a, b_ in zip(chunked, one):
        np.testing.assert_allclose(a, b_, atol=2e-5, rtol=2e-5)

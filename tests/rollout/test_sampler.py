"""The sampler: HF parity (greedy), distribution tests, logprobs, stops, buckets."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hf_factory import make_hf_model, save_hf_model
from jaxrl_llm.models import Transformer, load_hf, preset, token_logprobs
from jaxrl_llm.rollout import Sampler, SamplingConfig, generate, pad_prompts, pass_at_k, process_logits

PROMPTS = [[5, 17, 3, 44, 9, 12, 30], [7, 2], [60, 61, 62, 63]]  # different lengths, one batch


def hf_greedy(hf, prompts, new, eos):
    import torch

    t = max(map(len, prompts))
    ids = torch.zeros((len(prompts), t), dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, t - len(p):], att[i, t - len(p):] = torch.tensor(p), 1
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=att, do_sample=False, max_new_tokens=new, min_new_tokens=0,
                          eos_token_id=eos, pad_token_id=0, top_k=None, top_p=None, temperature=None)
    res = []
    for row in out[:, t:].tolist():
        seq = []
        for x in row:
            seq.append(x)
            if eos is not None and x == eos:
                break
        res.append(seq)
    return res


@pytest.mark.parametrize("arch,unroll", [("llama", False), ("llama", True), ("qwen2", False), ("qwen2", True),
                                         ("gemma2", False), ("gemma2", True), ("gemma3", True), ("qwen3_moe", False),
                                         ("qwen3_moe", True)])
def test_greedy_equals_transformers_generate(arch, unroll, tmp_path):
    hf = make_hf_model(arch, seed=3)
    model = load_hf(save_hf_model(hf, tmp_path / arch))
    free = hf_greedy(hf, PROMPTS, 12, None)
    eos = free[1][4]  # a token the model emits: row 1 stops early, so stopping is exercised
    ref = hf_greedy(hf, PROMPTS, 12, eos)
    assert len(ref[1]) <= 5 and ref[1][-1] == eos
    gd, params = nnx.split(model)
    cfg = SamplingConfig(max_new_tokens=12, greedy=True, stop_token_ids=(eos,), pad_token_id=0)
    out = Sampler(gd, cfg, length_buckets=(8,), unroll_layers=unroll)(params, PROMPTS, jax.random.key(0))
    got = [list(np.asarray(out.tokens[i])[np.asarray(out.mask[i])]) for i in range(len(PROMPTS))]
    assert got == ref
    assert [int(x) for x in out.lengths] == [len(r) for r in ref]
    assert [bool(x) for x in out.stopped] == [r[-1] == eos for r in ref]
    # eos disabled: all 12 tokens of every row, as transformers' generate without an eos
    cfg = SamplingConfig(max_new_tokens=12, greedy=True, stop_token_ids=(), pad_token_id=0)
    out = Sampler(gd, cfg, length_buckets=(8,), unroll_layers=unroll)(params, PROMPTS, jax.random.key(0))
    assert [list(np.asarray(r)) for r in out.tokens] == free and all(len(r) == 12 for r in free)


def test_warpers_equal_transformers():
    import torch
    from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    z = np.random.default_rng(0).normal(0, 2, (6, 97)).astype(np.float32)
    z[0, :5] = z[0, 5]  # ties with the k-th value
    for cfg in [SamplingConfig(temperature=0.7), SamplingConfig(top_k=5), SamplingConfig(top_p=0.8),
                SamplingConfig(temperature=1.3, top_k=20, top_p=0.9, min_p=0.05), SamplingConfig(min_p=0.2)]:
        ref = torch.tensor(z)
        ref = TemperatureLogitsWarper(cfg.temperature)(None, ref)
        if cfg.top_k:
            ref = TopKLogitsWarper(cfg.top_k)(None, ref)
        if cfg.top_p < 1:
            ref = TopPLogitsWarper(cfg.top_p)(None, ref)
        if cfg.min_p:
            ref = MinPLogitsWarper(cfg.min_p)(None, ref)
        ours = np.asarray(process_logits(jnp.asarray(z), cfg))
        ref = ref.numpy()
        np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(ref), err_msg=str(cfg))
        np.testing.assert_allclose(ours[np.isfinite(ours)], ref[np.isfinite(ref)], rtol=1e-6)


def tiny_model(vocab=11, seed=0):
    cfg = preset("tiny", vocab_size=vocab)
    return Transformer(cfg, rngs=nnx.Rngs(seed))


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=0.7), SamplingConfig(top_k=3),
                                 SamplingConfig(top_p=0.7), SamplingConfig(temperature=1.5, min_p=0.1),
                                 SamplingConfig(forbidden_token_ids=(0, 4))],
                         ids=["temperature", "top_k", "top_p", "min_p", "forbidden"])
def test_sampled_tokens_follow_the_processed_distribution(cfg):
    """Chi-square goodness of fit of 6000 first tokens against softmax(process_logits)."""
    from jax.scipy.stats import chi2

    model = tiny_model()
    gd, params = nnx.split(model)
    prompt = jnp.array([[3, 1, 4, 1, 5]], jnp.int32)
    h, _ = model(prompt)
    logits = model.logits(h[:, -1])
    expected = np.asarray(jax.nn.softmax(process_logits(logits, cfg), -1))[0]
    n = 6000
    run = dict(max_new_tokens=1, num_samples=n)
    out = generate(gd, params, prompt, jnp.ones((1, 5), bool), jax.random.key(7),
                   SamplingConfig(**{**cfg.__dict__, **run}))
    counts = np.bincount(np.asarray(out.tokens[:, 0]), minlength=11)
    assert counts[expected == 0].sum() == 0  # truncated / forbidden tokens never appear
    keep = expected > 0
    stat = float(((counts[keep] - n * expected[keep]) ** 2 / (n * expected[keep])).sum())
    p_value = float(chi2.sf(stat, keep.sum() - 1))
    assert p_value > 1e-3, (stat, p_value, counts, n * expected)
    assert keep.sum() >= 2  # a real distribution, not a point mass


@pytest.mark.parametrize("unroll", [False, True])
def test_returned_logprobs_equal_teacher_forced(unroll):
    model = tiny_model(vocab=263, seed=1)
    gd, params = nnx.split(model)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    cfg = SamplingConfig(max_new_tokens=10, num_samples=3, temperature=0.8, top_k=50, stop_token_ids=(17,))
    out = Sampler(gd, cfg, length_buckets=(8,), unroll_layers=unroll)(params, prompts, jax.random.key(3))
    tokens, mask = pad_prompts(prompts, 8, 2, 0)
    full = np.concatenate([np.repeat(tokens, 3, 0), np.asarray(out.tokens)], 1)
    fmask = np.concatenate([np.repeat(mask, 3, 0), np.asarray(out.mask)], 1)
    h, _ = model(full, fmask)
    lp, _ = token_logprobs(h[:, :-1], model.unembedding(), jnp.asarray(full[:, 1:]), temperature=0.8)
    ref = np.asarray(lp)[:, 7:]  # positions predicting the completion
    m = np.asarray(out.mask)
    np.testing.assert_allclose(np.asarray(out.logprobs)[m], ref[m], atol=1e-4)
    assert np.all(np.asarray(out.logprobs)[~m] == 0)


def test_reproducible_stops_and_forbidden_tokens():
    model = tiny_model(vocab=263, seed=2)
    gd, params = nnx.split(model)
    cfg = SamplingConfig(max_new_tokens=16, num_samples=4, stop_token_ids=(1, 2, 3), forbidden_token_ids=(7, 8),
                         pad_token_id=0)
    s = Sampler(gd, cfg, length_buckets=(8,))
    a, b = s(params, [[4, 5, 6]], jax.random.key(0)), s(params, [[4, 5, 6]], jax.random.key(0))
    c = s(params, [[4, 5, 6]], jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))
    toks, mask = np.asarray(a.tokens), np.asarray(a.mask)
    assert not np.isin(toks[mask], [7, 8]).any()
    for row, m, stopped, n in zip(toks, mask, np.asarray(a.stopped), np.asarray(a.lengths)):
        assert m.sum() == n and np.all(m[:n]) and not m[n:].any()  # a prefix mask
        assert np.all(row[n:] == 0)  # padded after the end
        assert stopped == (row[n - 1] in (1, 2, 3))
        assert stopped or n == 16
        assert not np.isin(row[:n - 1], [1, 2, 3]).any()  # nothing generated after a stop


def test_a_call_at_another_temperature_equals_a_sampler_configured_with_it():
    import dataclasses

    model = tiny_model(vocab=263, seed=4)
    gd, params = nnx.split(model)
    cfg = SamplingConfig(max_new_tokens=8, num_samples=2)
    hot = Sampler(gd, dataclasses.replace(cfg, temperature=1.7))(params, PROMPTS, jax.random.key(5))
    over = Sampler(gd, cfg)(params, PROMPTS, jax.random.key(5), temperature=1.7)
    np.testing.assert_array_equal(np.asarray(hot.tokens), np.asarray(over.tokens))
    np.testing.assert_allclose(np.asarray(hot.logprobs), np.asarray(over.logprobs), atol=1e-6)
    plain = Sampler(gd, cfg)(params, PROMPTS, jax.random.key(5))
    assert not np.allclose(np.asarray(plain.logprobs), np.asarray(over.logprobs))
    with pytest.raises(ValueError, match="temperature"):
        Sampler(gd, cfg)(params, PROMPTS, jax.random.key(5), temperature=0.0)


def test_the_geometric_mixture_sampler():
    """Nash-MD's mixture: coefficient 0 is the policy, 1 the other policy (same tokens for the same
    key), 0.5 samples from softmax((z_a + z_b) / 2), checked by teacher forcing."""
    a, b = tiny_model(vocab=263, seed=4), tiny_model(vocab=263, seed=9)
    gd, pa = nnx.split(a)
    _, pb = nnx.split(b)
    cfg = SamplingConfig(max_new_tokens=6, num_samples=2)
    s = Sampler(gd, cfg, length_buckets=(8,), unroll_layers=False)
    key = jax.random.key(7)
    for coef, ref in ((0.0, pa), (1.0, pb)):
        mix = s(pa, PROMPTS, key, mixture=(pb, coef))
        plain = s(ref, PROMPTS, key)
        np.testing.assert_array_equal(np.asarray(mix.tokens), np.asarray(plain.tokens))
        np.testing.assert_allclose(np.asarray(mix.logprobs), np.asarray(plain.logprobs), atol=2e-5)
    half = s(pa, PROMPTS, key, mixture=(pb, 0.5))
    toks = np.asarray(half.tokens)
    for i, prompt in enumerate(PROMPTS):
        for j in range(2):
            row = i * 2 + j
            n = int(half.lengths[row])
            seq = jnp.asarray([list(prompt) + toks[row, :n].tolist()])
            m = jnp.ones_like(seq, bool)
            za = a.logits(a(seq, m)[0])[0]
            zb = b.logits(b(seq, m)[0])[0]
            lp = jax.nn.log_softmax((za + zb) / 2, axis=-1)
            want = [float(lp[len(prompt) - 1 + k, toks[row, k]]) for k in range(n)]
            np.testing.assert_allclose(np.asarray(half.logprobs)[row, :n], want, atol=2e-4)
    with pytest.raises(ValueError, match="mixture coefficient"):
        s(pa, PROMPTS, key, mixture=(pb, 1.5))


def test_unrolled_and_scanned_layers_sample_the_same_tokens():
    model = tiny_model(vocab=263, seed=4)
    gd, params = nnx.split(model)
    cfg = SamplingConfig(max_new_tokens=12, num_samples=3)
    a = Sampler(gd, cfg, unroll_layers=True)(params, PROMPTS, jax.random.key(5))
    b = Sampler(gd, cfg, unroll_layers=False)(params, PROMPTS, jax.random.key(5))
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5)


def test_auto_unroll_follows_the_weight_size():
    model = tiny_model(vocab=263, seed=4)
    gd, params = nnx.split(model)
    cfg = SamplingConfig(max_new_tokens=4, num_samples=2)
    s = Sampler(gd, cfg)
    assert s.unroll_layers == "auto" and s._unroll(params) is True  # a few KB of weights
    s.UNROLL_MAX_BYTES = 1000
    assert s._unroll(params) is False
    a = s(params, PROMPTS, jax.random.key(5))
    b = Sampler(gd, cfg, unroll_layers=True)(params, PROMPTS, jax.random.key(5))
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    assert s._unroll(bf16) is True  # 16-bit weights stay unrolled whatever their size
    with pytest.raises(ValueError, match="unroll_layers must be True, False or 'auto'"):
        Sampler(gd, cfg, unroll_layers="yes")


def test_buckets_bound_the_number_of_compilations():
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, d, **kw: compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None)
    model = tiny_model(vocab=263, seed=5)
    gd, params = nnx.split(model)
    s = Sampler(gd, SamplingConfig(max_new_tokens=4, num_samples=2), length_buckets=(8, 16), batch_buckets=(2, 4))
    rng = np.random.default_rng(0)
    batches = [[list(rng.integers(1, 263, n)) for n in rng.integers(1, 17, b)] for b in (1, 2, 3, 4, 2, 1, 3, 4)]
    keys = [jax.random.key(i) for i in range(16)]
    n0 = len(compiles)
    for i, prompts in enumerate(batches * 2):
        out = s(params, prompts, keys[i])
        assert out.tokens.shape == (2 * len(prompts), 4)
    assert len(s.compiled_shapes) <= 4  # (batch bucket, length bucket) pairs
    assert len(compiles) - n0 == len(s.compiled_shapes), (len(compiles) - n0, s.compiled_shapes)


def test_first_argmax_is_argmax_with_ties_infinities_and_nans():
    from jaxrl_llm.rollout.sampling import first_argmax

    rng = np.random.default_rng(0)
    z = rng.normal(size=(64, 300)).astype(np.float32)
    z[1, [7, 40, 299]] = 9.0  # ties: the first index wins
    z[2] = -np.inf  # all -inf: index 0
    z[3, [5, 9]] = np.inf
    z[4, [12, 30]] = np.nan  # the first NaN, as argmax
    z[5, 0] = np.nan
    z[6] = np.round(z[6])  # many ties
    z[7, -1] = 50.0
    for x in (z, z.astype(jnp.bfloat16)):
        got = np.asarray(jax.jit(first_argmax)(jnp.asarray(x)))
        np.testing.assert_array_equal(got, np.asarray(jnp.argmax(jnp.asarray(x), axis=-1)))
    assert got[1] == 7 and got[2] == 0 and got[3] == 5 and got[4] == 12 and got[5] == 0 and got[7] == 299


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - (3 * 2) / (4 * 3))  # 1 - C(3,2)/C(4,2) = 0.5
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)
    with pytest.raises(ValueError, match="k"):
        pass_at_k(3, 1, 4)


def test_bad_sampling_configs_name_the_field():
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError, match="forbidden_token_ids"):
        SamplingConfig(stop_token_ids=(2,), forbidden_token_ids=(2,))
    with pytest.raises(ValueError, match="largest bucket"):
        Sampler(None, SamplingConfig(), length_buckets=(4,))(None, [[1] * 5], jax.random.key(0))


@pytest.mark.parametrize("unroll", [False, True])
def test_counts_divide_the_rows_unevenly(unroll):
    """Variable samples per prompt (a budget allocator): the rows of each prompt continue that
    prompt (log-probs equal the teacher-forced ones on the prompt they name), a prompt with 0
    gets no row, the count equal to num_samples for all reproduces the uniform rollout, and bad
    counts name what is wrong."""
    model = tiny_model(vocab=263, seed=1)
    gd, params = nnx.split(model)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [20, 21]]
    cfg = SamplingConfig(max_new_tokens=6, num_samples=3, temperature=0.8)
    s = Sampler(gd, cfg, length_buckets=(8,), unroll_layers=unroll)
    counts = [5, 0, 4]
    out = s(params, prompts, jax.random.key(3), counts=counts)
    np.testing.assert_array_equal(np.asarray(out.prompt_index), [0] * 5 + [2] * 4)
    tokens, mask = pad_prompts(prompts, 8, 3, 0)
    rows = np.asarray(out.prompt_index)
    full = np.concatenate([tokens[rows], np.asarray(out.tokens)], 1)
    fmask = np.concatenate([mask[rows], np.asarray(out.mask)], 1)
    h, _ = model(full, fmask)
    lp, _ = token_logprobs(h[:, :-1], model.unembedding(), jnp.asarray(full[:, 1:]), temperature=0.8)
    m = np.asarray(out.mask)
    np.testing.assert_allclose(np.asarray(out.logprobs)[m], np.asarray(lp)[:, 7:][m], atol=1e-4)
    assert len({tuple(r) for r in np.asarray(out.tokens)[:5]}) > 1  # the rows of a prompt differ
    uniform = s(params, prompts, jax.random.key(3))
    same = s(params, prompts, jax.random.key(3), counts=[3, 3, 3])
    for a, b in zip(uniform, same):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="summing to 9"):
        s(params, prompts, jax.random.key(3), counts=[3, 3, 2])
    with pytest.raises(ValueError, match="ints >= 0"):
        s(params, prompts, jax.random.key(3), counts=[10, -1, 0])


@pytest.mark.parametrize("unroll", [False, True])
@pytest.mark.parametrize("window", [None, 4], ids=["full", "sliding4"])
def test_shared_prompt_kv_samples_what_the_copied_cache_samples(unroll, window):
    """``shared_prompt_kv``: the G rows of a prompt read its keys once instead of a copy each.
    Same key, same tokens, log-probs equal to float rounding and to the teacher-forced ones
    (left-padded prompts of different lengths, stops, a sliding window shorter than the
    prompts), and the compiled sampler needs less temporary memory when the prompt is long."""
    cfg_m = preset("tiny", vocab_size=263)
    if window is not None:
        cfg_m = cfg_m.replace(sliding_window=window)
    model = Transformer(cfg_m, rngs=nnx.Rngs(6))
    gd, params = nnx.split(model)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24]]
    base = dict(max_new_tokens=9, num_samples=3, temperature=0.8, stop_token_ids=(17,))
    copied = Sampler(gd, SamplingConfig(**base), length_buckets=(8,), unroll_layers=unroll)
    shared = Sampler(gd, SamplingConfig(**base, shared_prompt_kv=True), length_buckets=(8,), unroll_layers=unroll)
    a, b = copied(params, prompts, jax.random.key(4)), shared(params, prompts, jax.random.key(4))
    for name in ("tokens", "mask", "lengths", "stopped", "prompt_index"):
        np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), err_msg=name)
    np.testing.assert_allclose(np.asarray(b.logprobs), np.asarray(a.logprobs), atol=2e-5)
    assert len({tuple(r) for r in np.asarray(b.tokens)[:3]}) > 1  # the rows of a prompt differ
    tokens, mask = pad_prompts(prompts, 8, 3, 0)
    full = np.concatenate([np.repeat(tokens, 3, 0), np.asarray(b.tokens)], 1)
    fmask = np.concatenate([np.repeat(mask, 3, 0), np.asarray(b.mask)], 1)
    h, _ = model(full, fmask)
    lp, _ = token_logprobs(h[:, :-1], model.unembedding(), jnp.asarray(full[:, 1:]), temperature=0.8)
    m = np.asarray(b.mask)
    np.testing.assert_allclose(np.asarray(b.logprobs)[m], np.asarray(lp)[:, 7:][m], atol=1e-4)

    long_tokens, long_mask = pad_prompts([list(range(1, 129))] * 2, 128, 2, 0)  # P = 128 >> T = 9, G = 3
    temp = {}
    for label, s in (("copied", copied), ("shared", shared)):
        compiled = s._fn.lower(gd, params, long_tokens, long_mask, jax.random.key(0), s.config,
                               unroll_layers=unroll).compile()
        temp[label] = compiled.memory_analysis().temp_size_in_bytes
    assert temp["shared"] < temp["copied"], temp


def test_shared_prompt_kv_falls_back_to_the_copy_for_uneven_counts():
    model = tiny_model(vocab=263, seed=1)
    gd, params = nnx.split(model)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    base = dict(max_new_tokens=5, num_samples=2, temperature=0.8)
    a = Sampler(gd, SamplingConfig(**base), length_buckets=(8,))(params, prompts, jax.random.key(2), counts=[3, 1])
    b = Sampler(gd, SamplingConfig(**base, shared_prompt_kv=True), length_buckets=(8,))(
        params, prompts, jax.random.key(2), counts=[3, 1])
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    with pytest.raises(ValueError, match="shared_prompt_kv"):
        SamplingConfig(shared_prompt_kv=1)

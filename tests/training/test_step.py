"""The functional train step: micro-batching is exact for every aggregation mode; non-finite
updates are skipped; the RNG and counters advance."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxrl_llm as jl
from jaxrl_llm.core.aggregation import AGG_MODES
from jaxrl_llm.models import ModelConfig, Transformer
from jaxrl_llm.training import PolicyObjective, SFTObjective, init_train_state, make_train_step

CFG = ModelConfig(vocab_size=61, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=48)
B, L = 8, 13


def rl_batch(seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, CFG.vocab_size, (B, L)).astype(np.int32)
    mask = np.ones((B, L), bool)
    mask[1, :3] = False  # left padding
    mask[5, :5] = False
    loss_mask = np.zeros((B, L - 1), bool)
    for i, n in enumerate([6, 1, 9, 0, 4, 7, 12, 3]):  # ragged responses, one empty row
        loss_mask[i, L - 1 - n:] = True
    loss_mask &= mask[:, 1:]
    return {"tokens": jnp.asarray(tokens), "mask": jnp.asarray(mask), "loss_mask": jnp.asarray(loss_mask),
            "old_logp": jnp.asarray(rng.normal(-4.0, 0.3, (B, L - 1)), jnp.float32),
            "advantages": jnp.asarray(rng.normal(0, 1, (B, L - 1)), jnp.float32),
            "ref_logp": jnp.asarray(rng.normal(-4.0, 0.3, (B, L - 1)), jnp.float32)}


def setup(optimizer):
    gd, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
    return gd, init_train_state(params, optimizer, seed=0)


def max_diff(a, b):
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# one mode by default (suite time; aggregation exactness of every mode is also in tests/core); all with -m slow
@pytest.mark.parametrize("mode", [m if m == "token-mean" else
                                  pytest.param(m, marks=pytest.mark.slow) for m in AGG_MODES])
def test_one_vs_four_microbatches_same_update(mode):
    obj = PolicyObjective(jl.ppo_clip_loss, (("clip_low", 0.2), ("clip_high", 0.28)), agg_mode=mode, kl_coef=0.05,
                          entropy_coef=0.01)
    batch = rl_batch()
    # a step of realistic size: token-sum's loss is not normalised, so its learning rate is
    opt = optax.sgd(0.5 / float(batch["loss_mask"].sum()) if mode == "token-sum" else 0.5)
    gd, state = setup(opt)
    s1, m1 = make_train_step(gd, opt, obj, num_microbatches=1, donate=False)(state, batch)
    s4, m4 = make_train_step(gd, opt, obj, num_microbatches=4, donate=False)(state, batch)
    moved = max_diff(s1.params, state.params)
    assert moved > 1e-3  # the update is not trivially zero
    assert max_diff(s1.params, s4.params) <= 1e-6
    assert abs(float(m1["loss"]) - float(m4["loss"])) <= 1e-6 * max(1.0, abs(float(m1["loss"])))
    for k in ("policy/clip_frac", "policy/entropy", "policy/kl_ref"):
        if k in m1:
            assert abs(float(m1[k]) - float(m4[k])) <= 1e-5, k


def test_microbatching_sft_and_adam_moments():
    """SFT likewise; with Adam the accumulated gradient (its first moment) matches. (Adam's
    first update ``g / (|g| + eps)`` amplifies float rounding of near-zero gradients, so its
    parameters are compared through the moments, not the update.)"""
    batch = rl_batch(1)
    for obj in (SFTObjective("seq-mean-token-mean"),):
        opt = optax.sgd(0.5)
        gd, state = setup(opt)
        a, _ = make_train_step(gd, opt, obj, num_microbatches=1, donate=False)(state, batch)
        b, _ = make_train_step(gd, opt, obj, num_microbatches=8, donate=False)(state, batch)
        assert max_diff(a.params, b.params) <= 1e-6
        opt = optax.adam(1e-2)
        gd, state = setup(opt)
        a, _ = make_train_step(gd, opt, obj, num_microbatches=1, donate=False)(state, batch)
        b, _ = make_train_step(gd, opt, obj, num_microbatches=8, donate=False)(state, batch)
        assert max_diff(a.opt_state[0].mu, b.opt_state[0].mu) <= 1e-7


def test_loss_is_the_globally_normalised_aggregate():
    obj = PolicyObjective(jl.ppo_clip_loss, agg_mode="seq-mean-token-mean")
    opt = optax.sgd(0.0)
    gd, state = setup(opt)
    batch = rl_batch(2)
    _, m = make_train_step(gd, opt, obj, num_microbatches=2, donate=False)(state, batch)
    model = nnx.merge(gd, state.params)
    logp, _ = jl.models.logprobs.token_logprobs(model(batch["tokens"], batch["mask"])[0][:, :-1],
                                                model.unembedding(), batch["tokens"][:, 1:])
    per_tok, _ = jl.ppo_clip_loss(logp, batch["old_logp"], batch["advantages"], batch["loss_mask"])
    want = jl.aggregate(per_tok, batch["loss_mask"], "seq-mean-token-mean")
    assert abs(float(m["loss"]) - float(want)) < 1e-6


def test_non_finite_loss_or_gradient_skips_the_update():
    obj = PolicyObjective(jl.ppo_clip_loss)
    opt = optax.adam(1e-2)
    gd, state = setup(opt)
    step = make_train_step(gd, opt, obj, num_microbatches=2, donate=False)
    good = rl_batch(3)
    bad = dict(good, advantages=good["advantages"].at[2, -1].set(jnp.nan))  # under the mask: a real token
    s_bad, m_bad = step(state, bad)
    assert float(m_bad["skipped"]) == 1.0 and int(s_bad.skipped) == 1 and int(s_bad.step) == 0
    assert max_diff(s_bad.params, state.params) == 0.0
    assert max_diff(s_bad.opt_state, state.opt_state) == 0.0
    assert not np.array_equal(s_bad.key, state.key)  # the RNG still advances: the next step differs
    s_good, m_good = step(s_bad, good)
    assert float(m_good["skipped"]) == 0.0 and int(s_good.step) == 1 and int(s_good.skipped) == 1
    assert max_diff(s_good.params, state.params) > 0


def test_donated_step_runs_twice_without_recompiling(compiles):
    obj = PolicyObjective(jl.ppo_clip_loss)
    opt = optax.adam(1e-3)
    gd, state = setup(opt)
    step = make_train_step(gd, opt, obj, num_microbatches=2)
    state, _ = step(state, rl_batch(4))
    n = compiles()
    state, _ = step(state, rl_batch(5))
    assert int(state.step) == 2
    assert compiles() == n


def test_committed_params_do_not_compile_twice(compiles):
    # params on a device (as loaders return them) + fresh scalar leaves (step, Adam's count):
    # init_train_state commits the scalars so the step's outputs match its inputs' placement
    obj = PolicyObjective(jl.ppo_clip_loss)
    opt = optax.adam(1e-3)
    gd, state = setup(opt)
    state = init_train_state(jax.device_put(state.params, jax.devices()[0]), opt, seed=0)
    step = make_train_step(gd, opt, obj)
    state, _ = step(state, rl_batch(4))
    n = compiles()
    state, _ = step(state, rl_batch(5))
    assert compiles() == n


def test_bad_microbatch_count():
    obj = PolicyObjective(jl.ppo_clip_loss)
    opt = optax.sgd(0.1)
    gd, state = setup(opt)
    with pytest.raises(ValueError, match="not divisible by num_microbatches=3"):
        make_train_step(gd, opt, obj, num_microbatches=3, donate=False)(state, rl_batch())
    with pytest.raises(ValueError, match="agg_mode"):
        PolicyObjective(jl.ppo_clip_loss, agg_mode="mean")


def test_bfloat16_params_step_keeps_dtypes_and_skips():
    """The optimiser under lax.cond: both branches agree on dtypes with bfloat16 parameters
    (and Adam moments), for a normal step and a skipped one."""
    cfg = CFG.replace(param_dtype="bfloat16", dtype="bfloat16")
    gd, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    opt = optax.adamw(1e-3)
    state = init_train_state(params, opt, seed=0)
    step = make_train_step(gd, opt, PolicyObjective(jl.ppo_clip_loss), donate=False)
    good = rl_batch(6)
    s1, m1 = step(state, good)
    assert int(s1.step) == 1 and float(m1["skipped"]) == 0.0 and float(m1["update_norm"]) > 0
    assert all(a.dtype == b.dtype for a, b in zip(jax.tree.leaves(s1), jax.tree.leaves(state)))
    bad = dict(good, advantages=good["advantages"].at[0, -1].set(jnp.inf))
    s2, m2 = step(s1, bad)
    assert int(s2.skipped) == 1 and float(m2["update_norm"]) == 0.0
    assert max_diff(s2.params, s1.params) == 0.0

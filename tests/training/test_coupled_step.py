"""Coupled surrogates (a loss over the whole batch, not a sum of per-token terms) in the train
step: the two-pass step (log-probs of every row, then the gradient-equivalent linear term per
micro-batch) gives the gradient of the full-batch loss, for any micro-batch split, and its
loss value; KL and entropy terms keep their aggregation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl_llm.core import aggregation, kl as kl_mod
from jaxrl_llm.models.logprobs import token_logprobs
from jaxrl_llm.training import PolicyObjective, make_train_step
from test_step import max_diff, rl_batch, setup


def batch_coupled_loss(logp, old_logp, advantages, mask, *, scores, group_ids, tau=2.0):
    """A test loss coupling rows of a group and the whole batch: a per-group log-sum-exp of the
    rows' mean log-probs, weighted by the scores, plus the batch variance of the token ratio."""
    m = mask.astype(jnp.float32)
    s = jnp.sum(logp * m, 1) / jnp.maximum(jnp.sum(m, 1), 1.0)
    n = logp.shape[0]
    seg_max = jax.ops.segment_max(jnp.where(jnp.any(mask, 1), s / tau, -1e9), group_ids, n)
    lse = tau * (jnp.log(jax.ops.segment_sum(jnp.exp(s / tau - seg_max[group_ids]), group_ids, n) + 1e-30) + seg_max)
    ratio = jnp.exp(logp - old_logp)
    mean_r = jnp.sum(ratio * m) / jnp.sum(m)
    var_r = jnp.sum((ratio - mean_r) ** 2 * m) / jnp.sum(m)
    loss = -jnp.sum(scores * s) / n + jnp.mean(lse[group_ids]) + 0.5 * var_r + 0.01 * jnp.sum(advantages * m * logp) / jnp.sum(m)
    return loss, {"var_ratio": var_r}


def coupled_batch(seed=0):
    b = rl_batch(seed)
    rng = np.random.default_rng(seed + 10)
    return {**b, "scores": jnp.asarray(rng.integers(0, 2, b["tokens"].shape[0]), jnp.float32),
            "group_ids": jnp.asarray([0, 0, 1, 1, 2, 2, 3, 3], jnp.int32)}


def test_coupled_step_equals_the_full_batch_gradient_for_any_microbatch_split():
    obj = PolicyObjective(batch_coupled_loss, (("tau", 2.0),), agg_mode="seq-mean-token-mean", kl_coef=0.05,
                          entropy_coef=0.01, loss_inputs=("group_ids", "scores"), coupled=True)
    assert set(obj.batch_keys()) >= {"scores", "group_ids"}
    batch = coupled_batch()
    opt = optax.sgd(0.3)
    gd, state = setup(opt)

    def full_loss(params):
        model = nnx.merge(gd, params)
        logp, ent = token_logprobs(model(batch["tokens"], batch["mask"])[0][:, :-1], model.unembedding(),
                                   batch["tokens"][:, 1:], with_entropy=True)
        m = batch["loss_mask"]
        cl, _ = batch_coupled_loss(logp, batch["old_logp"], batch["advantages"], m, scores=batch["scores"],
                                   group_ids=batch["group_ids"])
        rest = 0.05 * kl_mod.kl_penalty(logp, batch["ref_logp"], "low_var_kl") - 0.01 * ent
        return cl + aggregation.aggregate(rest, m, "seq-mean-token-mean")

    want_loss, g = jax.value_and_grad(full_loss)(state.params)
    want = jax.tree.map(lambda p, d: p - 0.3 * d, state.params, g)
    for n_mb in (1, 4):  # unsplit, and a split into mini-batches of 2 rows
        new, met = make_train_step(gd, opt, obj, num_microbatches=n_mb, donate=False)(state, batch)
        assert max_diff(new.params, state.params) > 1e-3
        assert max_diff(new.params, want) <= 2e-6, n_mb
        assert abs(float(met["loss"]) - float(want_loss)) <= 1e-5 * max(1.0, abs(float(want_loss))), n_mb
        assert "policy/var_ratio" in met and "policy/kl_ref" in met and np.isfinite(float(met["policy/var_ratio"]))


def test_minibatches_of_whole_groups():
    from jaxrl_llm.training.rl import minibatches

    gid = np.repeat(np.array([3, 0, 2, 1, 5, 4], np.int32), 2)
    batch = {"group_ids": gid, "row": np.arange(12)}
    mbs = minibatches(batch, 3, jax.random.key(1), whole_groups=True)
    assert [len(m["row"]) for m in mbs] == [4, 4, 4]
    seen = np.concatenate([m["row"] for m in mbs])
    assert sorted(seen) == list(range(12))  # every row once
    for m in mbs:  # whole groups, densely renumbered
        orig = gid[m["row"]]
        assert sorted(m["group_ids"]) == [0, 0, 1, 1]
        for k in (0, 1):
            assert len(set(orig[m["group_ids"] == k])) == 1
    plain = minibatches(batch, 3, None, whole_groups=True)
    assert [list(m["row"]) for m in plain] == [[2, 3, 6, 7], [4, 5, 0, 1], [10, 11, 8, 9]]  # group order 0..5
    import pytest
    with pytest.raises(ValueError, match="6 prompt groups are not divisible into 4"):
        minibatches(batch, 4, None, whole_groups=True)

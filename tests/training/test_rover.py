"""ROVER in the loop (recipe.loss=rover, METHODS.md #204): the sampling policy's vocabulary-mean
log-probs reach the batch (computed here by hand from the logits), the train step's loss is the
one-step Bellman regression with the current policy's next-position value (checked against a
by-hand evaluation of the same batch), and a run config turns shared prompts off for it and refuses
packing at config time."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from test_rl_recipes_extra import make, target_frac


def _by_hand(tr, params, batch):
    """(logp of the targets, vocabulary-mean log-prob) of every position, from full logits."""
    model = nnx.merge(tr.graphdef, params, *tr.frozen)
    h, _ = model(jnp.asarray(batch["tokens"]), jnp.asarray(batch["mask"]))
    z = np.asarray(h, np.float64)[:, :-1] @ np.asarray(model.unembedding(), np.float64)
    z /= tr.recipe.objective.temperature
    logz = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    tgt = np.asarray(batch["tokens"])[:, 1:]
    return np.take_along_axis(z, tgt[..., None], -1)[..., 0] - logz, z.mean(-1) - logz


def test_old_values_and_the_loss_with_the_current_policy():
    tr = make("rover", g=4, reward=[target_frac], num_minibatches=2)
    assert tr.recipe.objective.agg_mode == "token-mean"
    p0 = jax.device_get(tr.state.params)
    m1 = tr.step()
    b = tr.last_batch
    lm = np.asarray(b["loss_mask"], bool)
    _, mean0 = _by_hand(tr, p0, b)
    np.testing.assert_allclose(np.asarray(b["old_mean_logp"])[lm], mean0[lm], rtol=1e-4, atol=1e-4)
    assert np.isfinite(m1["policy/rover_target"]) and "policy/rover_next_value" in m1
    # the objective on this batch with the updated policy: the next value is no longer 0
    p1 = jax.device_get(tr.state.params)
    obj = tr.recipe.objective
    keys = obj.batch_keys()
    s, met = obj.loss_sum(nnx.merge(tr.graphdef, p1, *tr.frozen), {k: jnp.asarray(b[k]) for k in keys},
                          jax.random.key(0))
    lp1, mean1 = _by_hand(tr, p1, b)
    old, adv = np.asarray(b["old_logp"], np.float64), np.asarray(b["advantages"], np.float64)
    nxt = np.zeros_like(mean1)
    nxt[:, :-1] = (mean1[:, 1:] - np.asarray(b["old_mean_logp"], np.float64)[:, 1:]) * lm[:, 1:]
    want = np.sum(np.where(lm, ((lp1 - old) - (adv + nxt)) ** 2, 0.0))  # token-mean: the sum over tokens
    assert abs(float(s) - want) <= 1e-4 * max(1.0, abs(want))
    assert abs(float(met["policy/rover_next_value"]) - nxt[lm].mean()) < 1e-4
    assert np.abs(nxt[lm]).max() > 1e-4  # the step moved the policy: a real next-position term

"""BuPO in the loop (recipe.loop_part=bupo, METHODS.md #28): while it is on, the old log-probs are
the internal policy's (the residual stream after the first `layer` layers through the
unembedding, computed here by hand) and the update reaches only the embeddings and those layers;
afterwards the ordinary policy trains; settings that would mix policies are refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from test_rl_recipes_extra import make, target_frac

from jaxrl_llm.config import ConfigError


def _internal_logp_by_hand(tr, params, batch, layer):
    model = nnx.merge(tr.graphdef, params, *tr.frozen)
    h, _ = model(jnp.asarray(batch["tokens"]), jnp.asarray(batch["mask"]), exit_layer=layer)
    logits = np.asarray(h, np.float64)[:, :-1] @ np.asarray(model.unembedding(), np.float64)
    logits /= tr.recipe.objective.temperature
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    tgt = np.asarray(batch["tokens"])[:, 1:]
    return np.take_along_axis(logits, tgt[..., None], -1)[..., 0] - logz


def _blocks(params):
    return np.stack([np.asarray(x).reshape(x.shape[0], -1).sum(1) for x in jax.tree.leaves(params["blocks"])])


def test_internal_policy_trains_first_then_the_whole_model():
    tr = make("grpo", g=4, reward=[target_frac], loop_part={"name": "bupo", "layer": 1, "steps": 1})
    p0 = jax.device_get(tr.state.params)
    m1 = tr.step()
    assert m1["bupo/internal"] == 1.0
    b = tr.last_batch
    lm = np.asarray(b["loss_mask"], bool)
    want = _internal_logp_by_hand(tr, p0, b, 1)
    np.testing.assert_allclose(np.asarray(b["old_logp"])[lm], want[lm], rtol=1e-4, atol=1e-4)
    p1 = jax.device_get(tr.state.params)
    b0, b1 = _blocks(p0), _blocks(p1)
    # layer 1 (index 0) moved, the later layers and the final norm did not: no gradient reached them
    assert np.any(b0[:, 0] != b1[:, 0])
    np.testing.assert_array_equal(b0[:, 1:], b1[:, 1:])
    for x, y in zip(jax.tree.leaves(p0["final_norm"]), jax.tree.leaves(p1["final_norm"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not np.allclose(np.asarray(p0["embed"]), np.asarray(p1["embed"]))
    # the switch: from iteration `steps` on, the whole model's policy trains every layer
    m2 = tr.step()
    assert m2["bupo/internal"] == 0.0
    b2 = _blocks(jax.device_get(tr.state.params))
    assert np.all(np.any(b2 != b1, axis=0))


def test_settings_that_mix_policies_are_refused():
    with pytest.raises(ConfigError, match="layer must be an int >= 1"):
        make("grpo", g=4, loop_part={"name": "bupo", "layer": 0})
    with pytest.raises(ConfigError, match="decoder layers"):
        make("grpo", g=4, loop_part={"name": "bupo", "layer": 99})
    with pytest.raises(ConfigError, match="KL"):
        make("grpo", g=4, ref=True, kl={"coef": 0.1}, loop_part={"name": "bupo", "layer": 1})

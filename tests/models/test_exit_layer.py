"""``Transformer(..., exit_layer=k)``: the residual stream after the first ``k`` decoder layers,
without the final norm (BuPO's internal policy), equals Hugging Face's ``hidden_states[k]`` (a
tiny random Llama) on the valid positions, runs the later layers as the identity (no gradient
reaches them), and is refused with a cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hf_factory import L, make_hf_model, padded_batch, save_hf_model
from jaxrl_llm.models import init_cache, load_hf


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hf = make_hf_model("llama")
    ours = load_hf(save_hf_model(hf, tmp_path_factory.mktemp("llama")))
    return hf, ours


def test_exit_layer_equals_hf_hidden_states(pair):
    import torch

    hf, ours = pair
    tokens, mask = padded_batch(seed=1)
    m = torch.tensor(mask.astype(np.int64))
    pos = (m.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        res = hf(input_ids=torch.tensor(tokens.astype(np.int64)), attention_mask=m, position_ids=pos,
                 output_hidden_states=True)
    for k in range(1, L):  # hidden_states[k]: the raw output of decoder layer k (the last entry is normed)
        got, _ = ours(jnp.asarray(tokens), jnp.asarray(mask), exit_layer=k)
        np.testing.assert_allclose(np.asarray(got)[mask], res.hidden_states[k].numpy()[mask], rtol=2e-4, atol=2e-4)
    # a traced exit layer gives the same numbers
    f = jax.jit(lambda k: ours(jnp.asarray(tokens), jnp.asarray(mask), exit_layer=k)[0])
    np.testing.assert_allclose(np.asarray(f(2))[mask], res.hidden_states[2].numpy()[mask], rtol=2e-4, atol=2e-4)
    # every layer: the ordinary normed output, as HF's last entry
    full, _ = ours(jnp.asarray(tokens), jnp.asarray(mask))
    last, _ = ours(jnp.asarray(tokens), jnp.asarray(mask), exit_layer=L)
    np.testing.assert_allclose(np.asarray(last)[mask], np.asarray(full)[mask], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(last)[mask], res.hidden_states[L].numpy()[mask], rtol=2e-4, atol=2e-4)


def test_later_layers_get_no_gradient_and_a_cache_is_refused(pair):
    _, ours = pair
    tokens, mask = padded_batch(seed=2)
    gd, params = nnx.split(ours)

    def loss(p):
        h, _ = nnx.merge(gd, p)(jnp.asarray(tokens), jnp.asarray(mask), exit_layer=1)
        return jnp.sum(h ** 2)

    g = jax.grad(loss)(params)
    flat = {"/".join(map(str, k)): v for k, v in nnx.to_flat_state(g)}
    blocks = [v for k, v in flat.items() if k.startswith("blocks/")]
    assert blocks and all(np.all(np.asarray(v.get_value() if hasattr(v, "get_value") else v)[1:] == 0) for v in blocks)
    assert any(np.any(np.asarray(v.get_value() if hasattr(v, "get_value") else v)[0] != 0) for v in blocks)
    norm = [v for k, v in flat.items() if k.startswith("final_norm")]
    assert all(np.all(np.asarray(v.get_value() if hasattr(v, "get_value") else v) == 0) for v in norm)
    with pytest.raises(ValueError, match="exit_layer"):
        ours(jnp.asarray(tokens), jnp.asarray(mask), cache=init_cache(ours.cfg, 3, 16), exit_layer=1)

"""AlignDistil in the loop (recipe.loss=aligndistil, METHODS.md #230): the teacher pass reads the
DPO model (aux_params) and the reverse-DPO model (the reference slot), gives each response token
its teacher log-prob and weight w (checked against the core function on the same logits), and a
run without the two models is refused. The loss: tests/core/test_policy_losses.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from test_rl_recipes_extra import make

from jaxrl_llm.core import aligndistil_teacher
from jaxrl_llm.training.providers import aligndistil_teacher_pass


def test_the_teacher_pass_and_a_run():
    tr = make("grpo", g=4, loss={"name": "aligndistil", "beta2": 10.0}, ref=True, aux=True)
    m = [tr.step() for _ in range(2)]
    assert all(x["aligndistil/w_mean"] > 1e-3 for x in m)  # the two models differ: w above its floor
    b = tr.last_batch
    lm = b["loss_mask"]
    assert np.all(b["teacher_logp"][lm] < 0) and (b["teacher_logp"][~lm] == 0).all()
    # the pass equals the core function on the two models' logits
    lt, w = aligndistil_teacher_pass(tr.graphdef, tr.aux_params, tr.ref_params, tr.frozen, b["tokens"], b["mask"], 10.0)
    da = nnx.merge(tr.graphdef, tr.aux_params, *tr.frozen)
    rv = nnx.merge(tr.graphdef, tr.ref_params, *tr.frozen)
    t, msk = jnp.asarray(b["tokens"][:2]), jnp.asarray(b["mask"][:2])
    want, ww = aligndistil_teacher(da.logits(da(t, msk)[0])[:, :-1], rv.logits(rv(t, msk)[0])[:, :-1], t[:, 1:], beta2=10.0)
    np.testing.assert_allclose(np.asarray(lt)[:2], np.asarray(want), atol=1e-4)
    np.testing.assert_allclose(np.asarray(w)[:2], np.asarray(ww), atol=1e-4)


def test_the_two_models_are_required():
    with pytest.raises(ValueError, match="aux_params .the DPO model. and ref_params"):
        make("grpo", g=4, loss={"name": "aligndistil"}, ref=True)


def test_no_kl_term_beside_the_reverse_model():
    from jaxrl_llm.algorithms import RegistryError
    from jaxrl_llm.training.recipes import recipe

    with pytest.raises(RegistryError, match="recipe.kl.coef=0"):
        recipe("grpo", loss={"name": "aligndistil"}, kl={"coef": 0.05})

"""C3PO (RLVF, preference recipe.loss=c3po, METHODS.md #51): each pair's scope comes from a data
field through the pipeline (a bad value names the row), the objective reads it, and its loss on a
model batch is DPO on in-scope pairs and the chosen (original) response's per-token NLL on the
others. The loss's formula: tests/core/test_preference.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.data import DataError, ListSource, PreferenceDataConfig, preference_dataset
from jaxrl_llm.data.char_tokenizer import char_tokenizer
from jaxrl_llm.models import Transformer
from jaxrl_llm.models.logprobs import token_logprobs
from jaxrl_llm.training import preference_objective
from jaxrl_llm.training.preference import preference_arrays
from test_aux_policy import CFG, pair_batch

ONE_HOST = dict(process_index=0, process_count=1)
ROWS = [{"prompt": "Say hi.", "chosen": "Hi!", "rejected": "Hello.", "scope": "in"},
        {"prompt": "Say bye.", "chosen": "Bye.", "rejected": "x", "scope": "near"},
        {"prompt": "2+2?", "chosen": "4", "rejected": "x", "scope": 2}]


def test_the_pipeline_carries_each_pairs_scope():
    tok = char_tokenizer()
    cfg = PreferenceDataConfig(batch_size=3, shuffle=False, scope_field="scope", length_buckets=(32,), chat=False)
    b = next(preference_dataset(ListSource(ROWS), tok, cfg, **ONE_HOST))
    assert b.scope.tolist() == [0, 1, 2]
    assert preference_arrays(b)["scope"].tolist() == [0, 1, 2]
    assert next(preference_dataset(ListSource(ROWS), tok, PreferenceDataConfig(batch_size=3, shuffle=False, chat=False,
                                                                               length_buckets=(32,)),
                                   **ONE_HOST)).scope is None
    bad = [dict(ROWS[0], scope="inside")]
    with pytest.raises(DataError, match=r"rows:0: field 'scope' must be one of in, near, out"):
        next(preference_dataset(ListSource(bad, "rows"), tok, cfg, **ONE_HOST))


def test_the_objective_reads_the_scope_and_its_loss_is_per_scope():
    obj = preference_objective("c3po", beta=0.3, near_coef=0.5, out_coef=2.0)
    assert "scope" in obj.batch_keys()
    gd, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
    model = nnx.merge(gd, params)
    arrays = pair_batch()
    ref = np.array([[-20.0, -21.0], [-19.0, -22.0], [-18.0, -17.0]], np.float32)
    batch = {**{k: jnp.asarray(v) for k, v in arrays.items()}, "ref_logps": jnp.asarray(ref),
             "scope": jnp.asarray([0, 1, 2], jnp.int32)}
    loss = obj.loss_sum(model, batch, jax.random.key(0))[0] / obj.weight(batch)
    t = arrays["tokens"].reshape(-1, 9)
    h, _ = model(jnp.asarray(t), jnp.asarray(arrays["mask"].reshape(-1, 9)))
    lp = np.asarray(token_logprobs(h[:, :-1], model.unembedding(), jnp.asarray(t[:, 1:]))[0]).reshape(3, 2, 8)
    s = (lp * arrays["loss_mask"]).sum(-1)
    n = arrays["loss_mask"].sum(-1)
    dpo = np.log1p(np.exp(-0.3 * ((s[0, 0] - ref[0, 0]) - (s[0, 1] - ref[0, 1]))))
    want = (dpo + 0.5 * -s[1, 0] / n[1, 0] + 2.0 * -s[2, 0] / n[2, 0]) / 3
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    with pytest.raises(KeyError, match="scope"):
        obj.loss_sum(model, {k: v for k, v in batch.items() if k != "scope"}, jax.random.key(0))

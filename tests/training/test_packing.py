"""Sequence packing (``data/packing.py``, ``training/packed_step.py``): the layout (first-fit
decreasing, segments, the row-layout gather), packed log-probs equal to the padded rows' (values
and gradients), and the packed train step equal to the unpacked one for every aggregation mode,
a sequence-level surrogate, a coupled surrogate (two passes) and SFT, with KL and entropy terms;
the refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxrl_llm as jl
from jaxrl_llm.core.aggregation import AGG_MODES
from jaxrl_llm.data.packing import first_fit_decreasing, pack_microbatches, plan_packing, row_runs, unpack_rows
from jaxrl_llm.models import ModelConfig, Transformer
from jaxrl_llm.training import PolicyObjective, SFTObjective, make_train_step
from jaxrl_llm.training.objectives import packed_logprobs, policy_logprobs
from jaxrl_llm.training.packed_step import make_packed_train_step
from test_coupled_step import batch_coupled_loss, coupled_batch
from test_step import CFG, max_diff, rl_batch, setup


def test_first_fit_decreasing_fills_bins_longest_first():
    assert first_fit_decreasing(np.array([3, 7, 2, 5, 0, 4]), 9) == [[1, 2], [3, 5], [0]]
    with pytest.raises(ValueError, match="row 1 has 12 tokens, more than the budget of 9"):
        first_fit_decreasing(np.array([3, 12]), 9)


def test_rows_must_be_one_run_of_real_tokens():
    mask = np.array([[0, 1, 1, 0], [1, 0, 1, 1]], bool)
    with pytest.raises(ValueError, match="row 1 of the batch has real tokens that are not one contiguous run"):
        row_runs(mask)
    first, n = row_runs(mask[:1])
    assert first.tolist() == [1] and n.tolist() == [2]


def test_layout_segments_positions_and_index():
    tokens = np.array([[0, 0, 5, 6, 7], [8, 9, 1, 0, 0], [0, 2, 3, 4, 0]], np.int32)
    mask = tokens > 0
    lay = plan_packing(mask, budget=6, ways=1)
    assert lay.bins == ((0, 1), (2,)) and lay.slots == 2 and lay.num_microbatches == 2
    mbs = pack_microbatches({"tokens": tokens, "mask": mask, "x": np.arange(3.0)}, lay)
    assert mbs[0]["packed_tokens"].tolist() == [[5, 6, 7, 8, 9, 1]]
    assert mbs[0]["packed_segments"].tolist() == [[1, 1, 1, 2, 2, 2]]
    assert mbs[0]["packed_positions"].tolist() == [[0, 1, 2, 0, 1, 2]]
    # row 0's targets 2, 3 (tokens 6, 7) sit at packed targets 0, 1; row 1's targets 0, 1 at 3, 4
    assert mbs[0]["packed_index"][0, 2:4].tolist() == [0, 1] and mbs[0]["packed_index"][1, 0:2].tolist() == [3, 4]
    assert mbs[0]["x"].tolist() == [0.0, 1.0] and mbs[1]["x"].tolist() == [2.0, 0.0]  # empty slot: zero
    assert lay.padding_fraction == pytest.approx(1 - 9 / 12)
    back = unpack_rows([mb["x"] * 10 for mb in mbs], mbs, 3)
    assert back.tolist() == [0.0, 10.0, 20.0]


def test_packed_logprobs_and_gradients_equal_the_padded_rows():
    cfg = CFG.replace(sliding_window=4)
    batch = rl_batch(3)
    gd, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    lay = plan_packing(np.asarray(batch["mask"]), budget=20, ways=2)
    mbs = pack_microbatches({k: np.asarray(v) for k, v in batch.items()}, lay)
    assert lay.num_microbatches >= 2  # the rows really are spread over several micro-batches
    m = np.asarray(batch["loss_mask"])
    w = jnp.asarray(np.random.default_rng(0).normal(size=m.shape).astype(np.float32)) * m

    def padded(p):
        lp, ent = policy_logprobs(nnx.merge(gd, p), batch, chunk_size=4, with_entropy=True)
        return jnp.sum((lp + 0.3 * ent) * w), (lp, ent)

    def packed(p):
        total, outs = 0.0, []
        for mb in mbs:
            rows = mb["_rows"]
            lp, ent = packed_logprobs(nnx.merge(gd, p), {k: jnp.asarray(v) for k, v in mb.items() if k != "_rows"},
                                      chunk_size=4, with_entropy=True)
            wm = jnp.asarray(np.where((rows >= 0)[:, None], np.asarray(w)[np.maximum(rows, 0)], 0.0))
            total = total + jnp.sum((lp + 0.3 * ent) * wm)
            outs.append(lp)
        return total, outs

    (vp, (lp_pad, _)), gp = jax.value_and_grad(padded, has_aux=True)(params)
    (vk, outs), gk = jax.value_and_grad(packed, has_aux=True)(params)
    lp_packed = unpack_rows([np.asarray(o) for o in outs], mbs, lay.num_rows)
    np.testing.assert_allclose(np.where(m, lp_packed, 0), np.where(m, lp_pad, 0), atol=2e-5)
    assert abs(float(vp) - float(vk)) < 1e-4 * max(1.0, abs(float(vp)))
    assert max_diff(gp, gk) < 2e-5


def _compare_steps(obj, batch, budget, opt, tol=2e-6):
    gd, state = setup(opt)
    s_ref, m_ref = make_train_step(gd, opt, obj, num_microbatches=1, donate=False)(state, batch)
    step = make_packed_train_step(gd, opt, obj, budget=budget, ways=2, donate=False)
    s_pk, m_pk = step(state, batch)
    assert step.last_layout.num_microbatches >= 2
    assert max_diff(s_ref.params, state.params) > 1e-3  # the update is not trivially zero
    assert max_diff(s_ref.params, s_pk.params) <= tol, max_diff(s_ref.params, s_pk.params)
    assert abs(float(m_ref["loss"]) - float(m_pk["loss"])) <= 1e-5 * max(1.0, abs(float(m_ref["loss"])))
    # the token means are exact across micro-batches (a max, or a mean per sequence, is averaged over them by
    # their token counts, in the unpacked step's own split as here)
    for k in ("policy/clip_frac", "policy/entropy", "policy/kl_ref", "policy/logp_mean", "sft/nll"):
        if k in m_ref:
            assert abs(float(m_ref[k]) - float(m_pk[k])) <= 1e-4 * max(1.0, abs(float(m_ref[k]))), k
    assert int(s_pk.step) == int(s_ref.step) == 1
    np.testing.assert_array_equal(s_pk.key, s_ref.key)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_packed_step_equals_the_unpacked_step_in_every_aggregation_mode(mode):
    obj = PolicyObjective(jl.ppo_clip_loss, (("clip_low", 0.2), ("clip_high", 0.28)), agg_mode=mode, kl_coef=0.05,
                          entropy_coef=0.01)
    batch = rl_batch()
    opt = optax.sgd(0.5 / float(batch["loss_mask"].sum()) if mode == "token-sum" else 0.5)
    _compare_steps(obj, batch, budget=16, opt=opt)


def test_packed_step_with_a_sequence_level_and_a_coupled_surrogate():
    gspo = jl.training.recipe("gspo", num_samples=2).objective
    _compare_steps(gspo, rl_batch(2), budget=24, opt=optax.sgd(0.5))
    coupled = PolicyObjective(batch_coupled_loss, (("tau", 2.0),), agg_mode="seq-mean-token-mean", kl_coef=0.05,
                              entropy_coef=0.01, loss_inputs=("group_ids", "scores"), coupled=True)
    _compare_steps(coupled, coupled_batch(), budget=16, opt=optax.sgd(0.3))


def test_packed_sft_step_equals_the_unpacked_step():
    _compare_steps(SFTObjective("seq-mean-token-mean"), rl_batch(1), budget=16, opt=optax.sgd(0.5))


def test_a_row_longer_than_the_budget_is_refused():
    obj = PolicyObjective(jl.ppo_clip_loss)
    opt = optax.sgd(0.1)
    gd, state = setup(opt)
    with pytest.raises(ValueError, match="more than the budget of 8 tokens"):
        make_packed_train_step(gd, opt, obj, budget=8)(state, rl_batch())
    assert isinstance(CFG, ModelConfig)

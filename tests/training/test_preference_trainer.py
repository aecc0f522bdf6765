"""Offline preference objectives and trainers on a tiny model over the character tokenizer:
the objective equals the core loss on independently computed log-likelihoods, micro-batching
is exact, short runs of DPO / SimPO / ORPO move held-out pairs the right way, unpaired KTO
gets its reference point from mismatched completions, SFT learns and resumes bit for bit,
bad configurations fail with errors naming the field."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxrl_llm.core as core
from jaxrl_llm.data import (KTODataConfig, ListSource, PreferenceDataConfig, SFTDataConfig, kto_dataset,
                            preference_dataset, sft_dataset)
from jaxrl_llm.data.char_tokenizer import char_tokenizer
from jaxrl_llm.models import ModelConfig, Transformer
from jaxrl_llm.models.logprobs import token_logprobs
from jaxrl_llm.training import (Checkpointer, PreferenceEvaluator, PreferenceTrainer,
                                SFTObjective, SFTTrainer, init_train_state, kto_mismatched_rows, make_train_step,
                                preference_arrays, preference_objective, preference_recipe)

TOK = char_tokenizer()
CFG = ModelConfig(vocab_size=len(TOK), hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=64, tie_embeddings=True)
L = 32


@functools.cache
def model_parts(seed=0):
    """(graphdef, params), built once per seed: tests never donate these params."""
    return nnx.split(Transformer(CFG, rngs=nnx.Rngs(seed)))


GD = model_parts(0)[0]
B = 16  # pairs per batch everywhere (one shape: compilations are shared between tests)


def sgd(lr):
    # the learning rate lives in the optimiser state, so one compiled step serves every lr
    return optax.chain(optax.clip_by_global_norm(1.0), optax.inject_hyperparams(optax.sgd)(learning_rate=lr,
                                                                                          momentum=0.9))


@functools.cache
def train_step(name, microbatches):
    return make_train_step(GD, sgd(1.0), preference_recipe(name), num_microbatches=microbatches, donate=False)


def toy_pairs(n, seed):
    """One-digit sums; chosen = the right answer, rejected = off by a multiple of ten (a
    preference a small model can pick up without learning arithmetic)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        a, b = (int(x) for x in rng.integers(0, 10, 2))
        rows.append({"prompt": f"{a}+{b}=", "chosen": str(a + b),
                     "rejected": str(a + b + 10 * int(rng.integers(1, 5)))})
    return rows


def pair_data(rows, batch_size, seed=0):
    cfg = PreferenceDataConfig(batch_size=batch_size, chat=False, length_buckets=(L,), max_length=L, seed=seed)
    return preference_dataset(ListSource(rows, "pairs"), TOK, cfg, process_index=0, process_count=1)


def kto_rows(pairs):
    out = []
    for i, r in enumerate(pairs):  # unpaired: alternate desirable and undesirable examples
        out.append({"prompt": r["prompt"], "completion": r["chosen"] if i % 2 == 0 else r["rejected"],
                    "label": i % 2 == 0})
    return out


def kto_data(rows, batch_size):
    cfg = KTODataConfig(batch_size=batch_size, chat=False, length_buckets=(L,), max_length=L, shuffle=False)
    return kto_dataset(ListSource(rows, "kto"), TOK, cfg, process_index=0, process_count=1)


@jax.jit
def _sums(params, tokens, mask, targets_mask):
    model = nnx.merge(GD, params)
    hidden, _ = model(tokens, mask)
    logp, _ = token_logprobs(hidden[:, :-1], model.unembedding(), tokens[:, 1:], with_entropy=False)
    return jnp.sum(jnp.where(targets_mask, logp, 0.0), -1)


def reference_sums(params, tokens, mask, loss_mask_tokens):
    """Sequence log-likelihood sums written independently of the library's objective code
    (the model's hidden states, token_logprobs, a sum over the completion tokens) and the
    completion lengths; ``loss_mask_tokens`` is aligned with the tokens, as in the data."""
    sel = np.asarray(loss_mask_tokens)[:, 1:]
    return np.asarray(_sums(params, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(sel))), \
        sel.sum(-1).astype(np.float32)


def max_diff(a, b):
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# ----------------------------------------------------------------------------- the objective

PAIRED = [  # (loss, loss_kwargs, sft_coef, expected per-pair loss from sums (pc, pr, lc, lr, rc, rr))
    ("dpo", {"beta": 0.1}, 0.0, lambda c, r, lc, lr, rc, rr: core.dpo_loss(c, r, rc, rr, beta=0.1).losses),
    ("robust", {"beta": 0.3, "label_smoothing": 0.1}, 0.5,
     lambda c, r, lc, lr, rc, rr: core.dpo_loss(c, r, rc, rr, beta=0.3, loss_type="robust",
                                               label_smoothing=0.1).losses - 0.5 * c / lc),
    ("ipo", {"beta": 0.1}, 0.0,
     lambda c, r, lc, lr, rc, rr: jnp.square((c - rc) / lc - (r - rr) / lr - 1 / (2 * 0.1))),
    ("sigmoid_norm", {"beta": 0.2}, 0.0, lambda c, r, lc, lr, rc, rr: core.dpo_loss(
        c, r, rc, rr, lc, lr, beta=0.2, loss_type="sigmoid_norm").losses),
    ("hinge", {"beta": 0.5}, 0.0, lambda c, r, lc, lr, rc, rr: core.dpo_loss(
        c, r, rc, rr, beta=0.5, loss_type="hinge").losses),
    ("discopop", {"beta": 0.1}, 0.0, lambda c, r, lc, lr, rc, rr: core.dpo_loss(
        c, r, rc, rr, beta=0.1, loss_type="discopop").losses),
    ("simpo", {"beta": 2.0, "gamma": 1.0}, 0.0,
     lambda c, r, lc, lr, rc, rr: core.simpo_loss(c, r, lc, lr, beta=2.0, gamma=1.0).losses),
    ("cpo", {"beta": 0.1}, 1.0, lambda c, r, lc, lr, rc, rr: core.cpo_loss(c, r, beta=0.1).losses - c / lc),
    ("cpo", {"beta": 0.1, "loss_type": "ipo"}, 0.0,
     lambda c, r, lc, lr, rc, rr: core.cpo_loss(c, r, lc, lr, beta=0.1, loss_type="ipo").losses),
    ("orpo", {"beta": 0.1}, 1.0,
     lambda c, r, lc, lr, rc, rr: core.orpo_loss(c / lc, r / lr, beta=0.1).losses - c / lc),
    ("kto_paired", {"beta": 0.1}, 0.0,
     lambda c, r, lc, lr, rc, rr: core.kto_paired_loss(c, r, rc, rr, beta=0.1).losses),
]


def test_objective_equals_core_loss_on_independent_logps():
    params = model_parts(0)[1]
    _, ref_params = model_parts(1)  # a different "reference" so that the log-ratios are not zero
    batch = next(pair_data(toy_pairs(B, 0), B))
    pc_pr, lens = reference_sums(params, batch.tokens, batch.mask, batch.loss_mask)
    ref, _ = reference_sums(ref_params, batch.tokens, batch.mask, batch.loss_mask)
    b = batch.num_pairs
    c, r, lc, lr, rc, rr = (jnp.asarray(x) for x in (pc_pr[:b], pc_pr[b:], lens[:b], lens[b:], ref[:b], ref[b:]))
    assert float(jnp.min(lc)) >= 1 and len(set(lens.tolist())) > 1  # ragged completions
    arrays = preference_arrays(batch)
    arrays["ref_logps"] = np.stack([ref[:b], ref[b:]], 1).astype(np.float32)
    # the library's forward: pair-major sums and counts equal the independent ones ...
    dpo = preference_recipe("dpo")

    @jax.jit
    def library(p, a):
        model = nnx.merge(GD, p)
        return dpo.loss_sum(model, a, jax.random.key(0)), dpo.sequence_logps(model, a)
    (s, m), (logps, counts) = library(params, arrays)
    want = core.dpo_loss(c, r, rc, rr, beta=0.1)
    assert abs(float(s) / b - float(jnp.mean(want.losses))) <= 1e-6
    assert abs(float(m["rewards/margin"]) - float(want.metrics["reward_margin"])) <= 1e-6
    np.testing.assert_allclose(np.asarray(logps), np.stack([c, r], 1), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(counts), np.stack([lc, lr], 1))
    # ... and each loss is its core function of those sums (the step's loss is sum / weight)
    got = []
    for name, kw, sft, want_fn in PAIRED:
        obj = preference_objective(name, sft_coef=sft, **kw)
        losses, metrics = obj.losses(logps, counts, arrays)
        want = float(jnp.mean(want_fn(c, r, lc, lr, rc, rr)))
        got.append(float(jnp.sum(losses) / obj.weight(arrays)))
        assert abs(got[-1] - want) <= 1e-5 * max(1.0, abs(want)), (name, kw, got[-1], want)
        assert set(metrics) >= {"rewards/chosen", "rewards/rejected", "rewards/accuracy", "rewards/margin"}
    assert len({round(g, 6) for g in got}) == len(got)  # the losses really differ

    # unpaired KTO on rows with a desirable flag and a given reference point
    krows = kto_rows(toy_pairs(2 * B, 1))
    kb = next(kto_data(krows, 2 * B))
    p, _ = reference_sums(params, kb.tokens, kb.mask, kb.loss_mask)
    q, _ = reference_sums(ref_params, kb.tokens, kb.mask, kb.loss_mask)
    ka = preference_arrays(kb)
    ka.update(ref_logps=q.astype(np.float32), kl_ref_point=np.full(2 * B, 0.7, np.float32))
    assert ka["desirable"].tolist() == [True, False] * B
    obj = preference_recipe("kto", desirable_weight=1.3)
    s, m = jax.jit(lambda pp, a: obj.loss_sum(nnx.merge(GD, pp), a, jax.random.key(0)))(params, ka)
    want = core.kto_loss(jnp.asarray(p), jnp.asarray(q), jnp.asarray(ka["desirable"]), jnp.float32(0.7), beta=0.1,
                         desirable_weight=1.3)
    assert abs(float(s) / (2 * B) - float(jnp.mean(want.losses))) <= 1e-6
    assert abs(float(m["rewards/chosen"]) - float(want.metrics["chosen_rewards"])) <= 1e-6


# DPO by default (suite time); SimPO's reference-free path with -m slow
@pytest.mark.parametrize("name", ["dpo", pytest.param("simpo", marks=pytest.mark.slow)])
def test_one_vs_four_microbatches_same_update(name):
    params = model_parts(0)[1]
    batch = next(pair_data(toy_pairs(B, 2), B))
    arrays = preference_arrays(batch)
    if preference_recipe(name).needs_reference:
        ref, _ = reference_sums(model_parts(1)[1], batch.tokens, batch.mask, batch.loss_mask)
        arrays["ref_logps"] = np.stack([ref[:B], ref[B:]], 1).astype(np.float32)
    state = init_train_state(params, sgd(1.0), seed=0)
    s1, m1 = train_step(name, 1)(state, arrays)
    s4, m4 = train_step(name, 4)(state, arrays)
    assert max_diff(s1.params, state.params) > 1e-3  # a real update
    assert max_diff(s1.params, s4.params) <= 1e-6
    for k in ("loss", "rewards/accuracy", "rewards/margin", "rewards/chosen", "logps/rejected"):
        assert abs(float(m1[k]) - float(m4[k])) <= 1e-5 * max(1.0, abs(float(m1[k]))), k


@pytest.mark.parametrize("name", ["dpo", "simpo", "kto"])
def test_packed_preference_step_equals_the_unpacked_one(name):
    """Pairs packed side by side (chosen and rejected: two segments of one packed row) into
    micro-batches of a 40-token budget: the update, the loss and every metric equal the unpacked
    step's (the loss runs once on the whole batch's sequence sums: exact for every loss)."""
    from jaxrl_llm.training.packed_step import make_packed_train_step

    params = model_parts(0)[1]
    obj = preference_recipe(name)
    if obj.paired:
        batch = next(pair_data(toy_pairs(B, 2), B))
        arrays = preference_arrays(batch)
        if obj.needs_reference:
            ref, _ = reference_sums(model_parts(1)[1], batch.tokens, batch.mask, batch.loss_mask)
            arrays["ref_logps"] = np.stack([ref[:B], ref[B:]], 1).astype(np.float32)
    else:
        kb = next(kto_data(kto_rows(toy_pairs(2 * B, 2)), 2 * B))
        arrays = preference_arrays(kb)
        q, _ = reference_sums(model_parts(1)[1], kb.tokens, kb.mask, kb.loss_mask)
        arrays.update(ref_logps=q.astype(np.float32), kl_ref_point=np.full(2 * B, 0.7, np.float32))
    state = init_train_state(params, sgd(1.0), seed=0)
    s1, m1 = train_step(name, 1)(state, arrays)
    step = make_packed_train_step(GD, sgd(1.0), obj, budget=40, ways=2, donate=False)
    sp, mp = step(state, arrays)
    assert step.last_layout.num_microbatches >= 2 and step.last_layout.padding_fraction < 0.5
    assert max_diff(s1.params, state.params) > 1e-3  # a real update
    assert max_diff(s1.params, sp.params) <= 2e-6, max_diff(s1.params, sp.params)
    for k in ("loss", "rewards/accuracy", "rewards/margin", "rewards/chosen", "logps/rejected"):
        if k in m1:
            assert abs(float(m1[k]) - float(mp[k])) <= 1e-5 * max(1.0, abs(float(m1[k]))), k


# ----------------------------------------------------------------------------- training runs


@pytest.mark.parametrize("name", ["dpo", "simpo", "orpo"])
def test_short_training_prefers_chosen_on_held_out_pairs(name):
    """15 steps on 240 pairs; held-out pairs are new problems. The preference accuracy (of the
    loss's own implicit reward: DPO's log-ratio to the reference, SimPO's / ORPO's mean
    log-prob) reaches >= 0.9 and the reward margin grows by >= 0.3 nats (times beta)."""
    params = model_parts(0)[1]
    obj = preference_recipe(name)
    ref = params if obj.needs_reference else None
    evaluate = PreferenceEvaluator(GD, obj, next(pair_data(toy_pairs(B, 99), B)), ref_params=ref)
    before = evaluate(params)
    trainer = PreferenceTrainer(GD, init_train_state(params, sgd(0.1)), train_step(name, 4),
                                pair_data(toy_pairs(240, 3), B), obj, ref_params=ref, eval_fn=evaluate, eval_every=15)
    hist = trainer.run(15)
    after = hist[-1]
    assert after["eval/rewards/accuracy"] >= 0.9, (before, after)
    assert after["eval/rewards/accuracy"] >= before["eval/rewards/accuracy"] + 0.15, (before, after)
    beta = dict(obj.loss.kwargs)["beta"]  # rewards are beta * log-prob (ratios)
    assert after["eval/rewards/margin"] > before["eval/rewards/margin"] + 0.3 * beta, (before, after)
    assert after["eval/loss"] < before["eval/loss"]
    assert hist[-1]["loss"] < hist[0]["loss"] and all(h["skipped"] == 0 for h in hist)
    for k in ("time/data", "time/reference", "time/update", "tokens_per_s", "rewards/accuracy", "grad_norm"):
        assert k in hist[0], k
    assert hist[0]["tokens"] == int(np.sum(next(pair_data(toy_pairs(240, 3), B)).mask))


def test_kto_mismatched_rows_and_reference_point():
    rows = kto_rows(toy_pairs(2 * B, 5))
    kb = next(kto_data(rows, 2 * B))
    a = preference_arrays(kb)
    t, m, lm = kto_mismatched_rows(a["tokens"], a["mask"], a["loss_mask"])
    for i in range(2 * B):  # prompt i + the completion of row i - 1 (cyclic); the completion is the loss span
        want = TOK(rows[i]["prompt"])["input_ids"] + TOK(rows[i - 1]["completion"])["input_ids"] + [TOK.eos_token_id]
        assert t[i][m[i]].tolist() == want
        assert t[i][1:][lm[i]].tolist() == want[len(TOK(rows[i]["prompt"])["input_ids"]):]
    # the trainer's z0 = max(0, mean(policy - reference)) over the mismatched rows of the whole batch
    p0 = model_parts(0)[1]
    _, p1 = model_parts(1)
    tok_lm = np.concatenate([np.zeros((2 * B, 1), bool), lm], 1)
    d = reference_sums(p0, t, m, tok_lm)[0] - reference_sums(p1, t, m, tok_lm)[0]
    policy, ref = (p0, p1) if d.mean() > 0 else (p1, p0)  # so that the clamp at 0 is not what we compare
    obj = preference_recipe("kto")
    opt = optax.sgd(0.1)
    trainer = PreferenceTrainer(GD, init_train_state(policy, opt), lambda *a: None, kto_data(rows, 2 * B), obj,
                                ref_params=ref)
    arrays = trainer.prepare(next(kto_data(rows, 2 * B)))
    np.testing.assert_allclose(arrays["ref_logps"], reference_sums(ref, kb.tokens, kb.mask, kb.loss_mask)[0],
                               rtol=1e-6, atol=1e-5)
    assert abs(float(arrays["kl_ref_point"][0]) - abs(float(d.mean()))) <= 1e-4 * max(1.0, abs(float(d.mean())))
    assert np.all(arrays["kl_ref_point"] == arrays["kl_ref_point"][0]) and arrays["kl_ref_point"][0] > 0


def sft_parts(tmp_path, name):
    rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in toy_pairs(512, 7)]
    data = sft_dataset(ListSource(rows, "sft"), TOK, SFTDataConfig(batch_size=B, chat=False, length_buckets=(L,),
                                                                   max_length=L, seed=3),
                       process_index=0, process_count=1)
    return data, Checkpointer(tmp_path / name)


def test_sft_trainer_learns_and_resumes_bitwise(tmp_path):
    params = model_parts(0)[1]
    opt = optax.adam(1e-2)
    step = make_train_step(GD, opt, SFTObjective(), donate=False)
    data, _ = sft_parts(tmp_path, "a")
    a = SFTTrainer(GD, init_train_state(params, opt, seed=0), step, data)  # 12 steps straight
    hist_a = a.run(12)
    assert np.mean([h["sft/nll"] for h in hist_a[-3:]]) < 0.6 * np.mean([h["sft/nll"] for h in hist_a[:3]])
    assert hist_a[-1]["iteration"] == 12 and hist_a[-1]["step"] == 12 and hist_a[-1]["tokens_per_s"] > 0

    data, ckpt = sft_parts(tmp_path, "b")  # 6 steps and a checkpoint ...
    SFTTrainer(GD, init_train_state(params, opt, seed=0), step, data, checkpointer=ckpt, config={"lr": 1e-2}).run(6)
    data, ckpt = sft_parts(tmp_path, "b")  # ... then a fresh trainer (new state and iterator) resumes
    c = SFTTrainer(GD, init_train_state(params, opt, seed=0), step, data, checkpointer=ckpt)
    assert c.restore() and c.iteration == 6 and len(c.history) == 6
    hist_c = c.run(12)
    assert max_diff(c.state.params, a.state.params) == 0.0
    assert max_diff(c.state.opt_state, a.state.opt_state) == 0.0
    assert [h["sft/nll"] for h in hist_c] == [h["sft/nll"] for h in hist_a]
    assert c.data.get_state() == a.data.get_state()
    assert ckpt.all_steps() == [6, 12]


# ----------------------------------------------------------------------------- errors


def test_bad_configurations_name_the_field():
    with pytest.raises(ValueError, match=r"unknown preference loss 'dpoo'.*did you mean 'dpo'"):
        preference_objective("dpoo")
    with pytest.raises(ValueError, match=r"PreferenceObjective\.loss 'dpo' .*'beta' must be finite and > 0"):
        preference_objective("dpo", beta=0.0)
    with pytest.raises(ValueError, match=r"PreferenceObjective\.loss_kwargs: .*unknown argument 'gama'.*'gamma'"):
        preference_recipe("simpo", gama=1.0)
    with pytest.raises(ValueError, match=r"PreferenceObjective\.sft_coef"):
        preference_objective("kto", sft_coef=1.0)
    with pytest.raises(ValueError, match=r"unknown preference recipe 'dppo'"):
        preference_recipe("dppo")
    params = model_parts(0)[1]
    opt = optax.sgd(0.1)
    state = init_train_state(params, opt)
    for name in ("dpo", "ipo", "kto_paired", "kto"):
        obj = preference_recipe(name)
        with pytest.raises(ValueError, match=rf"PreferenceTrainer\.ref_params is required: loss '{name}'"):
            PreferenceTrainer(GD, state, make_train_step(GD, opt, obj), iter(()), obj)
    obj = preference_recipe("simpo")  # reference-free: no ref_params needed, but pairs are
    trainer = PreferenceTrainer(GD, state, make_train_step(GD, opt, obj), kto_data(kto_rows(toy_pairs(4, 0)), 4), obj)
    with pytest.raises(TypeError, match="loss 'simpo' trains on pairs.*got KTOBatch"):
        trainer.step()
    pb = next(pair_data(toy_pairs(2, 0), 2))  # the data's [2B, L] rows passed as they are
    with pytest.raises(ValueError, match=r"needs pair-major tokens \[B, 2, L\] \(see preference_arrays\); got "
                                         r"tokens of shape \(4, 32\)"):
        obj.loss_sum(nnx.merge(GD, params), {"tokens": pb.tokens, "mask": pb.mask, "loss_mask": pb.loss_mask[:, 1:]},
                     jax.random.key(0))
    with pytest.raises(KeyError, match=r"loss 'dpo' needs batch\['ref_logps'\]"):
        arrays = preference_arrays(next(pair_data(toy_pairs(2, 0), 2)))
        preference_recipe("dpo").loss_sum(nnx.merge(GD, params), arrays, jax.random.key(0))

"""The auxiliary policy (model.aux_params) and the methods that read it: RTO's dense token
rewards in the RL loop, TGDPO's token weights in the preference trainer; loading and errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxrl_llm.core as core
from jaxrl_llm.config import Choice, ConfigError
from jaxrl_llm.models import ModelConfig, Transformer
from jaxrl_llm.models.logprobs import token_logprobs
from jaxrl_llm.training import preference_recipe
from jaxrl_llm.training.preference import _add_token_weights
from test_rl_recipes_extra import PPO_KW, make

CFG = ModelConfig(vocab_size=23, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=48)


def pair_batch(seed=0, b=3, length=9):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, CFG.vocab_size, (b, 2, length)).astype(np.int32)
    mask = np.ones((b, 2, length), bool)
    lm = np.zeros((b, 2, length - 1), bool)
    for i in range(b):
        for j in range(2):
            lm[i, j, 3:3 + 2 + (i + j) % 4] = True  # prompt of 4 tokens, ragged completions
    return {"tokens": tokens, "mask": mask, "loss_mask": lm}


def test_tgdpo_weighted_sums_equal_the_per_token_formula_and_alpha_zero_is_dpo():
    gd, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
    _, ref = nnx.split(Transformer(CFG, rngs=nnx.Rngs(1)))
    _, aux = nnx.split(Transformer(CFG, rngs=nnx.Rngs(2)))
    arrays = pair_batch()
    obj = preference_recipe("tgdpo", alpha=2.0)  # a large alpha: the weights matter
    full = _add_token_weights(obj, arrays, gd, ref, aux, ())
    model = nnx.merge(gd, params)
    loss = obj.loss_sum(model, {k: jnp.asarray(v) for k, v in full.items()}, jax.random.key(0))[0] / obj.weight(full)

    def tok_logp(p):
        m = nnx.merge(gd, p)
        t = arrays["tokens"].reshape(-1, 9)
        h, _ = m(jnp.asarray(t), jnp.asarray(arrays["mask"].reshape(-1, 9)))
        return token_logprobs(h[:, :-1], m.unembedding(), jnp.asarray(t[:, 1:]))[0].reshape(3, 2, 8)

    lp, lr, la = tok_logp(params), tok_logp(ref), tok_logp(aux)
    want = core.tgdpo_loss(lp[:, 0], lp[:, 1], lr[:, 0], lr[:, 1], la[:, 0], la[:, 1], arrays["loss_mask"][:, 0],
                           arrays["loss_mask"][:, 1], alpha=2.0, beta=0.1)
    np.testing.assert_allclose(float(loss), float(jnp.mean(want.losses)), rtol=1e-5)
    # in micro-batches (3 pairs = 6 rows, 3 passes of 2): the same arrays
    split = _add_token_weights(obj, arrays, gd, ref, aux, (), 3)
    for k in ("token_weights", "ref_logps"):
        np.testing.assert_allclose(split[k], full[k], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="6 rows are not divisible into 4 reference micro-batches"):
        _add_token_weights(obj, arrays, gd, ref, aux, (), 4)
    # alpha = 0: every weight is 1 and the loss is DPO's
    zero = _add_token_weights(preference_recipe("tgdpo", alpha=0.0), arrays, gd, ref, aux, ())
    assert np.all(zero["token_weights"][arrays["loss_mask"]] == 1.0)
    dpo = preference_recipe("dpo")
    dpo_arrays = {**arrays, "ref_logps": zero["ref_logps"]}
    l0 = preference_recipe("tgdpo", alpha=0.0).loss_sum(model, {k: jnp.asarray(v) for k, v in zero.items()},
                                                         jax.random.key(0))[0]
    ld = dpo.loss_sum(model, {k: jnp.asarray(v) for k, v in dpo_arrays.items()}, jax.random.key(0))[0]
    np.testing.assert_allclose(float(l0), float(ld), rtol=1e-6)


def test_rto_reads_the_auxiliary_policy_in_the_loop():
    kw = dict(PPO_KW)
    kw.update(advantage={"name": "rto", "scale": 0.5, "clip": 0.2}, aux=True)
    tr = make("ppo", **kw)
    m = [tr.step() for _ in range(2)][-1]
    b = tr.last_batch
    assert "aux_logp" in b and np.isfinite(m["critic/vf_loss"])
    lm = b["loss_mask"]
    assert np.any(b["aux_logp"][lm] != b["ref_logp"][lm])  # a different policy
    # the advantages: GAE on the token rewards (the score on the last token minus the KL in the
    # reward) plus RTO's dense DPO rewards, with the critic's values at rollout time
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    cm = b["completion_mask"]
    last = cm.shape[1] - 1 - np.argmax(cm[:, ::-1], axis=1)
    rewards = np.zeros(cm.shape, np.float32)
    rewards[np.arange(len(last)), last] = b["scores"]
    rewards -= 0.05 * (b["old_logp"] - b["ref_logp"])[:, p - 1:]  # k1 in the reward, PPO_KW's coefficient
    dense = core.rto_token_rewards(b["aux_logp"][:, p - 1:], b["ref_logp"][:, p - 1:], cm, scale=0.5, clip=0.2)
    want, _ = core.gae_advantages(np.where(cm, rewards + np.asarray(dense), 0.0), b["old_values"][:, p - 1:], cm,
                                  gamma=1.0, lam=0.95, whiten=True)
    assert np.abs(np.asarray(dense)[cm]).max() > 0
    np.testing.assert_allclose(b["advantages"][:, p - 1:], np.asarray(want), atol=1e-5)
    with pytest.raises(ValueError, match="pass aux_params"):
        make("ppo", **{**kw, "aux": False})


def test_kepo_adds_the_teachers_token_reward_to_the_good_responses_in_the_loop():
    from test_rl_recipes_extra import target_frac

    tr = make("grpo", g=4, reward=[target_frac], advantage={"name": "kepo", "coef": 0.5, "threshold": 0.15}, aux=True)
    tr.step()
    b = tr.last_batch
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    cm = b["completion_mask"]
    grpo = core.grpo_advantages(b["scores"], cm, b["group_ids"], int(b["group_ids"].max()) + 1)
    good = b["scores"] >= 0.15
    assert good.any() and (~good).any()
    want = np.asarray(grpo) + 0.5 * good[:, None] * (b["aux_logp"] - b["old_logp"])[:, p - 1:] * cm
    np.testing.assert_allclose(b["advantages"][:, p - 1:], want, atol=1e-5)
    with pytest.raises(ValueError, match="pass aux_params"):
        make("grpo", g=4, advantage={"name": "kepo", "coef": 0.5}, aux=False)


def test_config_errors_name_aux_params(tmp_path):
    from jaxrl_llm.training.configs import PreferenceRecipeSpec, PreferenceRunConfig
    from jaxrl_llm.training.loading import load_aux_params
    from jaxrl_llm.training.preference_runner import check_preference
    from jaxrl_llm.training.runner import RecipeSpec, check_rl
    from test_runner import tiny

    with pytest.raises(ConfigError, match="model.aux_params=<a parameter directory"):
        check_rl(dataclasses.replace(tiny("unused"), recipe=RecipeSpec(name="ppo", advantage=Choice("rto"))))
    with pytest.raises(ConfigError, match="weighs tokens by an auxiliary model"):
        check_preference(dataclasses.replace(PreferenceRunConfig(), recipe=PreferenceRecipeSpec(name="tgdpo")))
    _, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
    with pytest.raises(ConfigError, match="no such parameter directory"):
        load_aux_params(str(tmp_path / "nope"), params)
    import orbax.checkpoint as ocp

    other = nnx.split(Transformer(dataclasses.replace(CFG, hidden_size=16, head_dim=4), rngs=nnx.Rngs(0)))[1]
    with ocp.StandardCheckpointer() as c:
        c.save((tmp_path / "small").absolute(), other)
    with pytest.raises(ConfigError, match="does not match the policy's parameters"):
        load_aux_params(str(tmp_path / "small"), params)
    with ocp.StandardCheckpointer() as c:
        c.save((tmp_path / "same").absolute(), params)
    back = load_aux_params(str(tmp_path / "same"), params)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)))


@pytest.mark.slow
def test_rto_run_end_to_end_with_another_runs_parameters(tmp_path):
    """A run with an SFT warm-up writes sft_params/; a PPO run with RTO reads them as its DPO model."""
    from jaxrl_llm.training.runner import RecipeSpec, run_rl
    from test_runner import tiny

    first = tiny(tmp_path / "sft", steps=1, eval_every=0, export_hf=False, plot=False, log_samples_every=0)
    run_rl(first)
    cfg = dataclasses.replace(first, run=dataclasses.replace(first.run, out=str(tmp_path / "rto")),
                              model=dataclasses.replace(first.model, aux_params=str(tmp_path / "sft" / "sft_params")),
                              recipe=RecipeSpec(name="ppo", advantage=Choice("rto")))
    s = run_rl(cfg)
    assert s["steps"] == 1


def test_ares_shapes_the_score_by_the_high_window_entropy_counts_in_the_loop():
    """ARES in the loop: GRPO on score + the entropy reward of each response's HWE count against its
    bucket's target, recomputed from the batch's sampling entropies."""
    from test_rl_recipes_extra import target_frac

    tr = make("grpo", g=4, reward=[target_frac], advantage={"name": "ares", "correct_threshold": 0.15,
                                                            "window": 2, "alpha": 1.0})
    tr.step()
    b = tr.last_batch
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    cm = b["completion_mask"]
    ent = b["old_entropy"][:, p - 1:]
    counts, _ = core.window_entropy_counts(ent, cm, window=2)
    counts = np.asarray(counts)
    correct = b["scores"] >= 0.15
    gid = b["group_ids"]
    ng = int(gid.max()) + 1
    rate = np.array([correct[gid == g].mean() for g in range(ng)])
    lv_g = np.where(rate >= 2 / 3, 0, np.where(rate >= 1 / 3, 1, 2))
    pm = np.array([counts[gid == g].mean() for g in range(ng)])
    tgt_b = [np.round(pm[lv_g == lv].mean()) if (lv_g == lv).any() else 0.0 for lv in range(3)]
    r = np.asarray(core.ares_entropy_reward(counts, np.array(tgt_b)[lv_g[gid]], correct, lv_g[gid], alpha=1.0))
    assert np.abs(r).max() > 0
    want = core.grpo_advantages((b["scores"] + r).astype(np.float32), cm, gid, ng)
    np.testing.assert_allclose(b["advantages"][:, p - 1:], np.asarray(want), atol=1e-5)

"""Sampler weights in 16 bits (``SamplingConfig.weight_dtype``, ``rollout.sampler_dtype``): the
sampler decodes with the float32 training weights cast once per rollout, which is the same
program as a model built in bfloat16; the trainer recomputes the old log-probs with the float32
weights and logs the mismatch."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models import Transformer
from jaxrl_llm.models.transformer import cast_floating, with_compute_dtype
from jaxrl_llm.rollout import Sampler, SamplingConfig
from test_rl_recipes_extra import CFG, init, make


def test_cast_model_is_the_bfloat16_model():
    gd, params = init()
    x = jnp.asarray(np.random.default_rng(0).integers(1, CFG.vocab_size, (2, 9)), jnp.int32)
    m = jnp.ones(x.shape, bool)
    cast = with_compute_dtype(nnx.merge(gd, cast_floating(params, "bfloat16")), "bfloat16")
    bf_cfg = dataclasses.replace(CFG, dtype="bfloat16", param_dtype="bfloat16")
    bgd, _ = nnx.split(nnx.eval_shape(lambda: Transformer(bf_cfg, rngs=nnx.Rngs(0))))
    built = nnx.merge(bgd, cast_floating(params, "bfloat16"))
    h1, _ = cast(x, m)
    h2, _ = built(x, m)
    assert h1.dtype == jnp.bfloat16 and cast.cfg.dtype == "bfloat16"
    np.testing.assert_array_equal(np.asarray(h1, np.float32), np.asarray(h2, np.float32))
    # and it is not the float32 model (the cast did something)
    h32, _ = nnx.merge(gd, params)(x, m)
    assert h32.dtype == jnp.float32 and float(jnp.abs(h32 - h1.astype(jnp.float32)).max()) > 0


def test_sampler_in_bfloat16_decodes_as_the_bfloat16_model():
    gd, params = init()
    prompts = [[5, 6, 7], [9, 10, 11, 12]]
    cfg = SamplingConfig(max_new_tokens=6, num_samples=2, temperature=1.0, weight_dtype="bfloat16")
    ours = Sampler(gd, cfg, length_buckets=(8,))(params, prompts, jax.random.key(0))
    bf_cfg = dataclasses.replace(CFG, dtype="bfloat16", param_dtype="bfloat16")
    bgd, _ = nnx.split(nnx.eval_shape(lambda: Transformer(bf_cfg, rngs=nnx.Rngs(0))))
    ref = Sampler(bgd, dataclasses.replace(cfg, weight_dtype=None), length_buckets=(8,), unroll_layers=True)(
        cast_floating(params, "bfloat16"), prompts, jax.random.key(0))
    np.testing.assert_array_equal(ours.tokens, ref.tokens)
    np.testing.assert_array_equal(ours.logprobs, ref.logprobs)
    f32 = Sampler(gd, dataclasses.replace(cfg, weight_dtype=None), length_buckets=(8,))(params, prompts,
                                                                                         jax.random.key(0))
    assert ours.logprobs.dtype == f32.logprobs.dtype == np.float32


def test_bad_weight_dtype_and_tree_sampler_are_refused():
    with pytest.raises(ValueError, match="weight_dtype"):
        SamplingConfig(weight_dtype="int4")
    from jaxrl_llm.rollout import TreeSampler

    gd, _ = init()
    with pytest.raises(ValueError, match="weight_dtype"):
        TreeSampler(gd, SamplingConfig(weight_dtype="bfloat16"), segment=2)


def test_trainer_recomputes_in_float32_and_logs_the_mismatch():
    with pytest.raises(ValueError, match="recipe.old_logp=recompute"):
        make("grpo", g=4, prompts_per_step=2, weight_dtype="bfloat16")
    tr = make("grpo", g=4, prompts_per_step=2, weight_dtype="bfloat16", old_logp="recompute",
              is_weights={"name": "tis"})
    params = jax.tree.map(jnp.copy, tr.state.params)
    met = tr.step()
    b = tr.last_batch
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    lm = np.asarray(b["loss_mask"], bool)
    lp = np.asarray(tr.logp(params, tr.frozen, b["tokens"], b["mask"], p))
    np.testing.assert_allclose(np.asarray(b["old_logp"])[lm], lp[lm], atol=1e-5)  # the float32 policy's
    gap = np.abs(np.asarray(b["rollout_logp"])[lm] - lp[lm])
    assert gap.max() > 1e-4 and gap.mean() < 0.1  # the sampler's are the bfloat16 model's: close, not equal
    assert met["sampler_mismatch/approx_kl_k3"] > 0 and np.isfinite(met["sampler_mismatch/approx_kl_k3"])
    assert any(k.startswith("correction/") for k in met)


def test_run_config_checks_name_the_field(tmp_path):
    from jaxrl_llm.config import ConfigError, apply_overrides
    from jaxrl_llm.training.runner import check_rl
    from test_shared_prefix_update import _tiny

    cfg = _tiny(tmp_path)
    for overrides, msg in ((["rollout.sampler_dtype=bf16"], "rollout.sampler_dtype='bf16'"),
                           (["rollout.sampler_dtype=bfloat16"], "recipe.old_logp=recompute"),
                           (["rollout.sampler_dtype=bfloat16", "recipe.old_logp=recompute", "rollout.tree_segment=2"],
                            "rollout.tree_segment=2 cannot be combined with rollout.sampler_dtype=bfloat16")):
        with pytest.raises(ConfigError, match=msg):
            check_rl(apply_overrides(cfg, overrides))
    check_rl(apply_overrides(cfg, ["rollout.sampler_dtype=bfloat16", "recipe.old_logp=recompute"]))


def test_shared_prompt_kv_reaches_the_sampler_and_refuses_the_tree_sampler(tmp_path):
    from jaxrl_llm.config import ConfigError, apply_overrides
    from jaxrl_llm.training.runner import _sampling, check_rl
    from test_shared_prefix_update import _tiny

    cfg = _tiny(tmp_path)
    assert _sampling(cfg, (3,), 0).shared_prompt_kv is False  # off by default: runs stay bit for bit
    on = apply_overrides(cfg, ["rollout.shared_prompt_kv=true"])
    check_rl(on)
    assert _sampling(on, (3,), 0).shared_prompt_kv is True
    with pytest.raises(ConfigError, match="rollout.shared_prompt_kv=true is not supported with rollout.tree_segment"):
        check_rl(apply_overrides(cfg, ["rollout.shared_prompt_kv=true", "rollout.tree_segment=2"]))


def test_unroll_layers_reaches_the_samplers(tmp_path, monkeypatch):
    import jaxrl_llm.rollout as rollout_pkg
    import jaxrl_llm.training.evaluate as evaluate_mod
    from jaxrl_llm.config import ConfigError, apply_overrides
    from jaxrl_llm.training.runner import _unroll_choice, check_rl, run_rl
    from test_shared_prefix_update import _tiny

    cfg = _tiny(tmp_path)
    assert _unroll_choice(cfg) == "auto"  # unset: the sampler's own rule, as before
    for text, want in (("true", True), ("false", False)):
        c = apply_overrides(cfg, [f"rollout.unroll_layers={text}"])
        check_rl(c)
        assert _unroll_choice(c) is want
    with pytest.raises(ConfigError, match="rollout.unroll_layers must be true, false or unset"):
        check_rl(dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, unroll_layers="false")))

    built = []

    class Recording(Sampler):  # every sampler the run builds: the trainer's and the evaluator's
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            built.append(self.unroll_layers)

    monkeypatch.setattr(rollout_pkg, "Sampler", Recording)
    monkeypatch.setattr(evaluate_mod, "Sampler", Recording)
    run = apply_overrides(_tiny(tmp_path / "run"), ["rollout.unroll_layers=false", "run.steps=1", "run.eval_every=1"])
    run_rl(run)
    assert len(built) >= 2 and all(u is False for u in built), built

"""Recipe resolution: presets are data, every field overrides, an explicit 0 is 0, choices keep or
reset their arguments, and the resolved recipe is what a run logs."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxrl_llm.core as core
from jaxrl_llm.config import Choice, apply_overrides
from jaxrl_llm.models import ModelConfig, Transformer
from jaxrl_llm.training import recipes as R
from jaxrl_llm.training.configs import KLSpec, RecipeSpec, RLRunConfig


@pytest.fixture
def kl_preset(monkeypatch):
    """A preset with a KL term and an entropy bonus (as DeepSeekMath's GRPO had), to override."""
    spec = dataclasses.replace(R.PRESETS["grpo"].spec, name="grpo_kl", kl=KLSpec(0.04, "low_var_kl", "loss",
                                                                                 Choice("fixed"), "none"),
                               entropy_coef=0.01)
    monkeypatch.setitem(R.PRESETS, "grpo_kl", R.Preset(spec, 8, "DeepSeekMath, arXiv:2402.03300"))
    return "grpo_kl"


def test_an_explicit_zero_is_zero(kl_preset):
    rec = R.build_recipe(RecipeSpec(kl_preset), num_samples=4)
    assert rec.objective.kl_coef == 0.04 and rec.objective.entropy_coef == 0.01 and rec.needs_reference
    cfg = apply_overrides(RLRunConfig(recipe=RecipeSpec(kl_preset)), ["recipe.kl.coef=0", "recipe.entropy_coef=0"])
    rec = R.build_recipe(cfg.recipe, num_samples=4)
    assert rec.objective.kl_coef == 0.0 and rec.objective.entropy_coef == 0.0 and not rec.objective.has_kl
    assert not rec.needs_reference and "ref_logp" not in rec.objective.batch_keys()
    assert (rec.spec.kl.coef, rec.spec.entropy_coef) == (0.0, 0.0)  # what config.json logs

    # ... and in the gradient: equal to the plain surrogate's
    mcfg = ModelConfig(vocab_size=13, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                       intermediate_size=32)
    gd, params = nnx.split(Transformer(mcfg, rngs=nnx.Rngs(0)))
    r = np.random.default_rng(0)
    batch = {"tokens": r.integers(0, 13, (4, 7)).astype(np.int32), "mask": np.ones((4, 7), bool),
             "loss_mask": np.tile([0, 0, 1, 1, 1, 1], (4, 1)).astype(bool),
             "old_logp": r.normal(-2, 0.1, (4, 6)).astype(np.float32),
             "advantages": r.normal(size=(4, 6)).astype(np.float32),
             "ref_logp": r.normal(-2, 0.5, (4, 6)).astype(np.float32)}

    def grad(obj):  # jitted: op-by-op (eager) it took ~20 s of suite time
        return jax.jit(jax.grad(lambda p: obj.loss_sum(nnx.merge(gd, p), batch, jax.random.key(0))[0]))(params)

    zero = grad(rec.objective)
    plain = grad(dataclasses.replace(rec.objective, kl_coef=0.0, entropy_coef=0.0))
    with_kl = grad(R.build_recipe(RecipeSpec(kl_preset), num_samples=4).objective)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(zero), jax.tree.leaves(plain)))
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(zero), jax.tree.leaves(with_kl)))


def test_a_choice_keeps_the_preset_arguments_or_starts_from_the_new_parts():
    rec = R.build_recipe(RecipeSpec("dapo", loss=Choice(args={"clip_high": 0.3})), num_samples=4)
    assert dict(rec.objective.policy_kwargs) == {"clip_low": 0.2, "clip_high": 0.3, "dual_clip": None}
    rec = R.build_recipe(RecipeSpec("dapo", loss=Choice("gspo", {"clip_low": 3e-4})), num_samples=4)
    assert rec.objective.policy_loss is core.gspo_loss
    assert dict(rec.objective.policy_kwargs) == {"clip_low": 3e-4, "clip_high": 4e-4}  # gspo's defaults, not dapo's


def test_the_issue_example_resolves_and_is_logged(tmp_path):
    """``jaxrl-llm train tiny_grpo recipe.advantage=optimal_token_baseline recipe.loss=gspo
    recipe.loss.clip_low=3e-4 recipe.agg=seq-mean-token-mean recipe.kl.coef=0``."""
    from jaxrl_llm.cli import load_experiment
    from jaxrl_llm.config import to_dict

    exp = load_experiment("experiments/tiny_grpo.py")
    cfg = apply_overrides(exp.default, ["recipe.advantage=optimal_token_baseline", "recipe.loss=gspo",
                                        "recipe.loss.clip_low=3e-4", "recipe.agg=seq-mean-token-mean",
                                        "recipe.kl.coef=0"])
    info = exp.check(cfg)
    rec = R.build_recipe(cfg.recipe, num_samples=cfg.rollout.num_samples)
    assert rec.estimator.name == "optimal_token_baseline" and rec.objective.policy_loss is core.gspo_loss
    assert {"old_logp", "sum_pi_squared", "token_rewards"} <= rec.requires
    logged = info["recipe"]
    assert logged["advantage"] == {"name": "optimal_token_baseline", "args": {}}
    assert logged["loss"] == {"name": "gspo", "args": {"clip_low": 3e-4}} and logged["kl"]["coef"] == 0.0
    assert json.loads(json.dumps(to_dict(rec.spec))) == logged


def test_estimate_reads_only_what_it_declares():
    from jaxrl_llm.algorithms import ESTIMATORS, Bound, EstimatorInputs, Part

    def sneaky(x):
        return x["values"]  # not declared in requires

    assert "values" in ESTIMATORS["gae"].requires  # declared where it is read
    part = Part("sneaky", sneaky, requires=frozenset())
    with pytest.raises(KeyError, match="estimator 'sneaky' reads 'values' but does not list it in requires"):
        R.estimate_advantages(Bound(part), None, 1, {"scores": jnp.zeros(2), "mask": jnp.ones((2, 3), bool),
                                                      "valid": jnp.ones(2, bool), "group_ids": jnp.zeros(2, int),
                                                      "values": jnp.zeros((2, 3))})
    x = EstimatorInputs({"scores": 1}, 1, allowed=frozenset({"values"}), owner="estimator 'e'")
    with pytest.raises(KeyError, match="estimator 'e' needs 'values', which the loop did not provide"):
        x["values"]


def test_preference_loss_override_keeps_the_presets_nll_weight_and_the_toy_refuses_what_it_cannot_run():
    from jaxrl_llm.config import ConfigError
    from jaxrl_llm.training.configs import PreferenceRecipeSpec, PreferenceRunConfig
    from jaxrl_llm.training.preference_runner import preference_run_objective
    from jaxrl_llm.training.toy import ToyRunConfig, check_toy

    obj = preference_run_objective(PreferenceRunConfig(recipe=PreferenceRecipeSpec("rpo", loss=Choice("robust"))))
    assert obj.name == "robust" and obj.sft_coef == 1.0  # RPO's NLL term stays
    obj = preference_run_objective(PreferenceRunConfig(recipe=PreferenceRecipeSpec("rpo", sft_coef=0.0)))
    assert obj.name == "dpo" and obj.sft_coef == 0.0
    cfg = apply_overrides(ToyRunConfig(), ["recipes.GRPO.loss=gspo", "recipes.GRPO.entropy_coef=0.1"])
    with pytest.raises(ConfigError, match="recipes.GRPO: .*set recipes.GRPO.entropy_coef to the default"):
        check_toy(cfg)
    assert check_toy(apply_overrides(ToyRunConfig(), ["recipes.GRPO.loss=gspo"]))["GRPO"] == "grpo"

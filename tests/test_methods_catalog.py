"""The method catalogue: every public core function is reachable from a config or listed as a
building block; every registered part is selectable from a recipe; docs/methods.md is current."""

import inspect
from pathlib import Path

import pytest

import jaxrl_llm.core as core
from jaxrl_llm import cli
from jaxrl_llm.algorithms import (AGGREGATIONS, BATCH_FILTERS, ESTIMATORS, GROUP_FILTERS, IS_CORRECTIONS,
                                  KL_CONTROLLERS, KL_ESTIMATORS, PREFERENCE_LOSSES, REJECTIONS, SHAPING, SURROGATES)
from jaxrl_llm.training import preference_objective, recipe
from jaxrl_llm.training.catalog import BUILDING_BLOCKS, _CONSTANTS, catalog, markdown, reachable_core_functions

ROOT = Path(__file__).resolve().parent.parent


def test_every_public_core_function_is_reachable_or_a_building_block():
    public = set(core.__all__)
    functions = {n for n in public if n not in _CONSTANTS}
    assert _CONSTANTS <= public, _CONSTANTS - public
    reachable = reachable_core_functions()
    assert reachable <= public, f"parts name core functions that do not exist: {reachable - public}"
    missing = functions - reachable - set(BUILDING_BLOCKS)
    assert not missing, f"public core functions neither selectable from a config nor a building block: {missing}"
    stale = set(BUILDING_BLOCKS) & reachable
    assert not stale, f"listed as building blocks but selectable: {stale}"
    assert set(BUILDING_BLOCKS) <= public


def test_catalogue_records_are_complete():
    rows = catalog(library_only=True)
    assert {r["key"] for r in rows} >= {"recipe.advantage", "recipe.loss", "recipe.agg", "recipe.kl.estimator",
                                        "recipe.kl.controller", "recipe.is_weights", "recipe.rejection",
                                        "recipe.shaping", "recipe.group_filter", "recipe.batch_filter",
                                        "preference recipe.loss", "recipe.name"}
    for r in rows:
        if r["name"] == "none" or r["key"] == "recipe.agg" and r["name"] == "token-sum":
            continue
        if r["key"] != "recipe.clusterer":  # clusterers are plain building blocks (no paper)
                assert "arXiv" in r["paper"] or "(19" in r["paper"] or "(20" in r["paper"], (r["key"], r["name"], r["paper"])
        for t in r["tests"].split(", "):
            assert (ROOT / t).is_file(), (r["name"], t)


def test_docs_methods_md_is_generated_from_the_registries():
    assert (ROOT / "docs" / "methods.md").read_text() == markdown(), \
        "docs/methods.md is stale: run `jaxrl-llm methods --markdown > docs/methods.md`"


# required arguments that must be integers (counts, step numbers): any valid value
_INT_ARGS = {"total_steps": 10, "samples_init": 2}


def _needs(name: str, registry) -> dict:
    """Arguments a part cannot do without (those without a default)."""
    fn = registry[name].fn
    params = inspect.signature(fn).parameters
    return {k: _INT_ARGS.get(k, 0.5) for k, p in params.items() if p.kind is p.KEYWORD_ONLY and p.default is p.empty
            and k != "key" and k not in registry[name].requires
            and not (k in ("entropy", "mean_logp") and registry[name].flag(k))}  # the objective passes these


@pytest.mark.parametrize("name", ESTIMATORS.names())
def test_every_estimator_is_selectable(name):
    kl = {"placement": "loss"}
    rec = recipe("grpo", num_samples=4, advantage={"name": name, **_needs(name, ESTIMATORS)}, kl=kl)
    assert rec.estimator.name == name and rec.requires >= ESTIMATORS[name].requires


@pytest.mark.parametrize("name", SURROGATES.names())
def test_every_policy_loss_is_selectable(name):
    hints = {"hints": "guide"} if "hinted" in SURROGATES[name].requires else {}  # Guide's loss needs its re-roll
    rec = recipe("grpo", num_samples=4, loss={"name": name, **_needs(name, SURROGATES)}, **hints)
    assert rec.objective.policy_loss is SURROGATES[name].fn


def test_every_other_part_is_selectable():
    for name in AGGREGATIONS.names():
        assert recipe("grpo", num_samples=4, agg=name).objective.agg_mode == name
    for name in KL_ESTIMATORS.names():
        assert recipe("grpo", num_samples=4, kl={"coef": 0.1, "estimator": name}).objective.kl_estimator == name
    assert recipe("grpo", num_samples=4, kl={"coef": 0.1, "controller": "adaptive"}).kl_controller is not None
    assert KL_CONTROLLERS.names() == ["fixed", "adaptive"]
    for name in IS_CORRECTIONS.names():
        rec = recipe("grpo", num_samples=4, is_weights=name, old_logp="recompute")
        assert (rec.is_correction is None) == (name == "none") and rec.objective.use_is_weights == (name != "none")
    for name in REJECTIONS.names():
        assert (recipe("grpo", num_samples=4, rejection=name, old_logp="recompute").rejection is None) == (name == "none")
    for name in SHAPING.names():
        rec = recipe("grpo", num_samples=4, shaping={"name": name, **{k: "x" for k in _needs(name, SHAPING)}})
        assert [p.name for p in rec.shaping] == ([] if name == "none" else [name])
    for name in GROUP_FILTERS.names():
        assert recipe("grpo", num_samples=4, group_filter=name).group_filter.max_rounds == (1 if name == "none" else 10)
    for name in BATCH_FILTERS.names():
        assert (recipe("grpo", num_samples=4, batch_filter=name).batch_filter is None) == (name == "none")
    for name in PREFERENCE_LOSSES.names():
        assert preference_objective(name).name == name


def test_methods_command(capsys):
    assert cli.main(["methods", "--kind", "recipe.advantage"]) == 0
    out = capsys.readouterr().out
    assert "optimal_token_baseline" in out and "arXiv:2602.07078" in out and "requires: old_logp" in out
    assert cli.main(["methods", "--kind", "recipe.advantag"]) == 2
    assert "did you mean 'recipe.advantage'" in capsys.readouterr().err
    assert cli.main(["methods", "--json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert {"kind", "key", "name", "paper", "core", "tests", "verified", "methods"} <= set(rows[0])


def test_readme_method_table_lists_every_seed_method():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Methods from the papers"):readme.index("## Add a method")]
    for r in catalog(library_only=True):
        for m in r["methods"]:
            assert f"`{r['name']}`" in table and f"#{m}" in table, (r["name"], m)

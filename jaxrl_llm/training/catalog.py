"""The method catalogue: every registered part and recipe preset, with its config name, paper,
core functions, tests and verification, generated from the registries (``jaxrl-llm methods``,
``docs/methods.md``). :data:`BUILDING_BLOCKS` lists the public core functions that no config
selects directly, each with the reason; together with the parts' ``core`` fields they cover
every public function of :mod:`jaxrl_llm.core` (a test keeps it so).
"""

from __future__ import annotations

from typing import Any

import jaxrl_llm.algorithms  # noqa: F401  (every registry module is imported, so REGISTRIES is full)
import jaxrl_llm.training.parts  # noqa: F401  (the loop parts registered by name: recipe.loop_part)
from jaxrl_llm.algorithms.registry import REGISTRIES, Registry
from jaxrl_llm.algorithms.estimators import AGENT_KINDS, ESTIMATORS, PROVIDED_INPUTS
from jaxrl_llm.training.preference import PREFERENCE_RECIPES
from jaxrl_llm.training.recipes import PRESETS

__all__ = ["catalog", "BUILDING_BLOCKS", "FEATURES", "KIND_ORDER", "markdown", "reachable_core_functions"]

#: registries in the order the catalogue shows them
KIND_ORDER = ("recipe.advantage", "recipe.loss", "recipe.agg", "recipe.kl.estimator", "recipe.kl.controller",
              "recipe.is_weights", "recipe.rejection", "recipe.shaping", "recipe.group_filter", "recipe.batch_filter",
              "preference recipe.loss")

#: public core functions that are building blocks rather than parts a config selects
BUILDING_BLOCKS: dict[str, str] = {
    "masked_sum": "statistics helper", "masked_mean": "statistics helper", "masked_var": "statistics helper",
    "masked_whiten": "statistics helper (used by GAE, REINFORCE++, GDPO)",
    "group_stats": "statistics helper (group estimators)", "group_sum": "statistics helper (group estimators)",
    "safe_divide": "statistics helper", "dense_group_ids": "host helper: uids -> dense group ids",
    "ratio_metrics": "the ratio diagnostics every policy loss logs",
    "entropy_from_logits": "the entropy bonus (recipe.entropy_coef) is computed by jaxrl_llm.models.token_logprobs, "
                           "fused with the log-probs; this is its dense reference (tested equal)",
    "chunked_entropy": "as entropy_from_logits, chunked over positions",
    "chunked_logprobs_and_entropy": "log-probs and entropy from given logits (the models compute them from hidden "
                                    "states: jaxrl_llm.models.token_logprobs)",
    "chunked_sum_pi_squared": "chunked form of sum_pi_squared_from_logits (the OTB provider chunks itself)",
    "dpo_loss": "TRL's loss_type dispatcher over the per-variant DPO losses (DPO_LOSSES), kept in the core for "
                "parity tests against TRL; configs select the per-variant functions by name",
    "pf_ppo_resample": "verl's resample over the whole batch; recipe.batch_filter=pf_ppo draws from the valid rows "
                       "only, with the same pf_ppo_weights",
}
#: presets whose runs tests/training/test_behaviour_kept.py compares bitwise with the code before the redesign
#: (dapo with recipe.loss.dual_clip=3, its old value)
GOLDEN_PRESETS = ("grpo", "ppo", "remax", "dapo", "reinforce_pp", "rloo", "dr_grpo", "gspo", "bnpo",
                  "reinforce_pp_baseline")
_CONSTANTS = {"AGG_MODES", "AggMode", "KL_ESTIMATORS", "KLControllerState", "PreferenceOutput", "DPO_LOSS_TYPES",
              "CPO_LOSS_TYPES", "DPO_LOSSES", "GroupStats", "COMMON_METRICS"}


#: methods that are how the trainer computes rather than a part a recipe selects: listed with their
#: config key (the same record fields as a registered part)
FEATURES: tuple[dict[str, Any], ...] = (
    {"kind": "training feature", "key": "train.shared_prefix", "name": "shared_prefix",
     "paper": "Prefix Grouper: Efficient GRPO Training through Shared-Prefix Forward (Liu et al.), arXiv:2506.05433",
     "core": [], "requires": [], "defaults": {}, "methods": [68],
     "verified": "equal to the row-by-row update to float rounding (loss, gradient, a run)",
     "tests": "tests/training/test_shared_prefix_update.py, tests/models/test_shared_prefix_attention.py",
     "note": "each prompt group's prompt is encoded once in every log-prob pass of the update and its rows "
             "attend to it; unset (the default): on wherever the update stays the same computation "
             "(jaxrl_llm.training.prefix, TrainSpec)"},
    {"kind": "training feature", "key": "pairs.split", "name": "mpo",
     "paper": "Mixed Preference Optimization: Reinforcement Learning with Data Selection and Better Reference Model "
              "(MPO; Gou and Nguyen), arXiv:2403.19443",
     "core": ["mpo_easy_pairs"], "requires": [], "defaults": {}, "methods": [201],
     "verified": "hand values; a two-stage run (DPO on the easy pairs, RL from its parameters as the reference)",
     "tests": "tests/training/test_mpo.py",
     "note": "stage 1: a preference run with pairs.split=easy, pairs.margin=<gap> on a pairs file with reward-model "
             "scores (pairs.score_fields); stage 2: an RL run with model.init_params=<its final_params> (policy and "
             "KL reference start from the DPO model); not reproduced: the RL stage on the hard pairs' prompts with "
             "the reward model (the RL run uses its task's reward), PPO's critic is recipe.name=ppo"},
)


def _registries() -> dict[str, Registry]:
    return {k: REGISTRIES[k] for k in KIND_ORDER if k in REGISTRIES} | {
        k: v for k, v in REGISTRIES.items() if k not in KIND_ORDER}


def _from_library(fn: Any) -> bool:
    fn = getattr(fn, "func", fn)  # functools.partial
    return str(getattr(fn, "__module__", "")).startswith("jaxrl_llm.")


def catalog(*, library_only: bool = False) -> list[dict[str, Any]]:
    """One record per registered part (and per recipe preset): ``kind``, ``key`` (the config
    key), ``name``, ``paper``, ``core``, ``requires``, ``defaults``, ``methods`` (METHODS.md
    numbers), ``verified``, ``tests``, ``note``. ``library_only``: leave out parts registered
    outside the package (an experiment's own estimator)."""
    out = []
    for key, reg in _registries().items():
        for name, p in reg.items():
            if library_only and not _from_library(p.fn):
                continue
            out.append({"kind": reg.kind, "key": key, "name": name, "paper": p.paper, "core": list(p.core),
                        "requires": sorted(p.requires), "defaults": dict(p.defaults), "methods": list(p.methods),
                        "verified": p.verified, "tests": p.tests, "note": p.note})
    out.extend(dict(f) for f in FEATURES)
    for name, pr in PRESETS.items():
        s = pr.spec
        parts = (f"advantage={s.advantage.name}, loss={s.loss.name} {s.loss.args}, agg={s.agg}"
                 + ("" if s.shaping.name == "none" else f", shaping={s.shaping.name}")
                 + ("" if s.group_filter.name == "none" else f", group_filter={s.group_filter.name}"))
        out.append({"kind": "RL recipe preset", "key": "recipe.name", "name": name, "paper": pr.paper, "core": [],
                    "requires": [], "defaults": {}, "methods": list(pr.methods),
                    "verified": "bitwise equal to the pre-redesign preset" if name in GOLDEN_PRESETS else "",
                    "tests": pr.tests or ("tests/training/test_agent_loop.py, tests/training/test_agent_runner.py"
                              if any(PROVIDED_INPUTS.get(k) in AGENT_KINDS for k in ESTIMATORS[s.advantage.name].requires)
                              else "tests/training/test_behaviour_kept.py, tests/training/test_rl_recipes_extra.py"),
                    "note": parts + (f"; {pr.note}" if pr.note else "")})
    for name, r in PREFERENCE_RECIPES.items():
        out.append({"kind": "preference recipe preset", "key": "recipe.name (preference)", "name": name,
                    "paper": r.paper, "core": [], "requires": [], "defaults": dict(r.loss_kwargs), "methods": [],
                    "verified": "bitwise equal to the pre-redesign preset" if name == "dpo" else "",
                    "tests": "tests/training/test_preference_trainer.py, tests/training/test_behaviour_kept.py",
                    "note": f"loss={r.loss}, sft_coef={r.sft_coef}" + (f"; {r.note}" if r.note else "")})
    return out


def reachable_core_functions() -> set[str]:
    """Core functions some registered part of the library is made of."""
    return ({c for key, reg in _registries().items() for p in reg.values() if _from_library(p.fn) for c in p.core}
            | {c for f in FEATURES for c in f["core"]})


def _cell(x: Any) -> str:
    text = ", ".join(map(str, x)) if isinstance(x, (list, tuple)) else str(x)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """``docs/methods.md``: the catalogue as Markdown tables, one per kind."""
    rows = catalog(library_only=True)
    lines = ["# Methods", "",
             "Generated from the registries by `jaxrl-llm methods --markdown` (do not edit by hand; "
             "`tests/test_methods_catalog.py` checks this file is current). Every part is chosen from a run's "
             "config by the key in its heading, e.g. `jaxrl-llm train tiny_grpo recipe.advantage=rloo "
             "recipe.loss=gspo recipe.loss.clip_low=3e-4`; arguments are the part's function's keyword "
             "arguments. **verl** / **TRL**: equal to the peer's code in value and gradient "
             "(`tests/conformance`); **paper identity**: a property the paper states holds as a test; "
             "**hand values**: hand-computed cases. The core functions, their formulas and the deliberate "
             "differences from the peers are in [core.md](core.md). `#` is the method's number in the seed "
             "catalogue (METHODS.md).", ""]
    seen: list[str] = []
    for r in rows:
        if r["key"] not in seen:
            seen.append(r["key"])
    for key in seen:
        group = [r for r in rows if r["key"] == key]
        lines += [f"## {group[0]['kind']} (`{key}`)", "", "| name | paper | # | core | requires | verified | tests | note |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in group:
            lines.append("| " + " | ".join([f"`{r['name']}`", _cell(r["paper"]), _cell(r["methods"]),
                                            _cell([f"`{c}`" for c in r["core"]]), _cell(r["requires"]),
                                            _cell(r["verified"]), _cell(r["tests"]),
                                            _cell(r["note"] + (f" (defaults {r['defaults']})" if r["defaults"]
                                                               else ""))]) + " |")
        lines.append("")
    lines += ["## Building blocks", "", "Public core functions no config selects directly:", "",
              "| function | role |", "|---|---|"]
    lines += [f"| `{k}` | {_cell(v)} |" for k, v in sorted(BUILDING_BLOCKS.items())]
    return "\n".join(lines) + "\n"

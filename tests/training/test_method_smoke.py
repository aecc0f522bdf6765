"""Every seed method in the catalogue runs: a 2-step tiny run per config name that carries a
METHODS.md number (``jaxrl-llm methods --json``), through the loop that serves it (single-turn RL,
the agent loop, the preference trainer). The runs compile a train step each, so they are marked
slow (``-m slow``); by default the dispatch table is checked to cover every seed method, and the
methods' own functions are tested in tests/core and the per-family training tests."""

from __future__ import annotations

import numpy as np
import pytest

from jaxrl_llm.training.catalog import catalog

SEED_ROWS = [r for r in catalog(library_only=True) if r["methods"]]

# arguments a part cannot run without (no default: the paper's value was not found, or a reward function's name)
REQUIRED = {("recipe.advantage", "stratified"): {"alpha": 0.5}, ("recipe.advantage", "eapo"): {"gamma": 0.9},
            ("recipe.advantage", "arm"): {"alpha": 0.1}, ("recipe.advantage", "kepo"): {"coef": 0.5, "threshold": 0.5}, ("recipe.advantage", "r3"): {"r_max": 0.5, "peak_frac": 0.2},
            ("recipe.advantage", "d3s"): {"total_steps": 2, "samples_init": 2, "tokens_init": 0.25},
            ("recipe.shaping", "fapo"): {"flaw_metric": "calls"}, ("recipe.shaping", "apo"): {"tau": 0.5},
            ("recipe.shaping", "group_contrastive_aux"): {"margin": 0.1},
            ("recipe.shaping", "cgpo"): {"reward_metric": "target_frac", "judges": ["calls"]},
            ("recipe.shaping", "posterior"): {"format_metric": "calls", "outcome_metric": "binary",
                                              "thinking_metric": "target_frac"},
            ("recipe.loss", "hdpo"): {"answer_index": 0, "calls_index": 1},
            ("recipe.loss", "etr"): {"alpha": 0.5, "beta": 1.0}, ("recipe.loss", "r2vpo"): {"delta": 0.01},
            ("recipe.selector", "sec"): {"column": "const"},
            ("recipe.hints", "guide"): {"column": "solution", "replace": False},
            ("recipe.hints", "critique_grpo"): {"column": "solution"}, ("recipe.hints", "icpo"): {"beta": 1.0},
            ("recipe.loop_part", "inspo"): {"instructions": ["1 1", "2 2"], "prune_every": 1, "min_uses": 1},
            ("recipe.loop_part", "bupo"): {"layer": 1, "steps": 1},
            ("recipe.hints", "scaf_grpo"): {"warmup_steps": 0},
            ("recipe.truncation", "siri"): {"low": 2, "high": 6, "compress_steps": 1, "expand_steps": 1},
            ("env.horizon", "scaling_inter"): {"stages": [1, 2], "every": 1}}


def _id(r):
    return f"{r['key'].replace('recipe.', '').replace(' ', '_')}={r['name']}#{'/'.join(map(str, r['methods']))}"


def _needs_agent(r):
    from jaxrl_llm.algorithms import AGENT_KINDS, ESTIMATORS, PROVIDED_INPUTS

    return r["key"] == "recipe.advantage" and any(PROVIDED_INPUTS.get(k) in AGENT_KINDS
                                                  for k in ESTIMATORS[r["name"]].requires)


def _kind(r) -> str:
    if r["key"] == "preference recipe.loss":
        return "preference"
    if _needs_agent(r):
        return "agent"
    if r["key"] in ("recipe.advantage", "recipe.loss", "recipe.shaping", "recipe.truncation", "recipe.is_weights",
                    "recipe.batch_filter", "recipe.selector", "recipe.allocator", "recipe.replay", "recipe.hints",
                    "recipe.loop_part"):
        return "rl"
    if r["key"] == "env.horizon":
        return "agent"
    if r["key"] == "recipe.name":  # a recipe study's preset
        return "rl"
    if r["key"] in ("train.shared_prefix", "pairs.split"):
        return "feature"
    return "unknown"


def test_every_seed_method_has_a_smoke_run():
    assert len({m for r in SEED_ROWS for m in r["methods"]}) >= 50
    unknown = [_id(r) for r in SEED_ROWS if _kind(r) == "unknown"]
    assert not unknown, f"seed methods without a smoke dispatch: {unknown}"


def _rl(r):
    from test_paper_losses import binary, calls
    from test_rl_recipes_extra import PPO_KW, make, target_frac

    from jaxrl_llm.algorithms import ESTIMATORS

    args = {"name": r["name"], **REQUIRED.get((r["key"], r["name"]), {})}
    field = r["key"].split(".", 1)[1]
    kw = {"g": 4, "reward": [binary, calls, target_frac]}
    preset = "grpo"
    if r["name"] == "brpo":  # its estimator reads its loop part's summary scores: both
        tr = make("grpo", g=4, reward=[target_frac], buckets=(32,), advantage={"name": "brpo"},
                  loop_part={"name": "brpo", "num_budgets": 2, "summaries": 2, "summary_text": ""})
        return [tr.step() for _ in range(2)]
    if r["name"] == "nash_md":  # its estimator, loss and loop part run together: the preset
        kw["ref"] = True
        return [t.step() for t in [make("nash_md", **kw)] for _ in range(2)]
    if r["key"] == "recipe.name":  # a preset: the whole recipe of a paper
        from jaxrl_llm.training.recipes import recipe

        kw["ref"] = recipe(r["name"]).needs_reference  # a KL term: the reference policy
        return [t.step() for t in [make(r["name"], **kw)] for _ in range(2)]
    if field == "advantage" and "values" in ESTIMATORS[r["name"]].requires:
        preset = "ppo"
        kw.update({k: v for k, v in PPO_KW.items() if k not in ("advantage", "reward")})
        kw["reward"] = [binary, calls, target_frac]
    if field == "is_weights":
        kw.update(old_logp="recompute", mismatch=True)
    if r["name"] in ("rto",) or (field == "advantage" and r["name"] == "kepo"):
        kw["aux"] = True
    if field == "loss" and r["name"] == "aligndistil":  # the DPO model and the reverse-DPO model (reference slot)
        kw.update(aux=True, ref=True)
    if field == "truncation":
        kw["stop"] = True
    if field == "loss" and r["name"] == "p3o":
        kw["g"] = 2
    if field == "replay" or (field == "loop_part" and r["name"] == "aepo"):
        kw["old_logp"] = "recompute"
    if field == "hints" or (field == "loss" and r["name"] in ("guide", "critique_grpo", "icpo")):
        from test_hints import HintData, encode

        kw.update(data=HintData(4), encoder=encode, buckets=(16,))
        if field == "loss":  # the loss reads the rows its hint part re-sampled
            kw["hints"] = {"name": r["name"], **REQUIRED[("recipe.hints", r["name"])]}
        if r["name"] in ("critique_grpo", "icpo"):  # rebuilt prompts as token ids (the digits of their text)
            from test_hints import encode_ints

            kw["encoder"] = lambda raw: (encode_ints(raw)[0][:14], raw)
        if r["name"] == "scaf_grpo":  # hint parts per problem; recomputed old log-probs
            from test_hints import ScafData, encode_ints

            kw.update(data=ScafData(4), encoder=encode_ints, old_logp="recompute")
    if field == "loop_part" and r["name"] == "inspo":  # prompts re-encoded under their instruction
        from test_hints import HintData, encode_ints

        kw.update(data=HintData(4), encoder=encode_ints, buckets=(16,))
    if field == "selector":
        kw["candidates"] = 2
        kw["pcl"] = r["name"] == "pcl"
        if r["name"] == "spo_priority":
            preset, kw["g"], kw["reward"] = "single_stream_po", 1, [target_frac]
    if field == "advantage" and r["name"] == "treepo":
        kw["tree"] = 2  # TreePO's advantage reads the tree sampler's paths
    if field == "advantage" and r["name"] == "single_stream_po":
        kw["reward"] = [target_frac]  # a success probability: rewards in [0, 1]
    tr = make(preset, **kw, **{field: args})
    return [tr.step() for _ in range(2)]


def _agent(r):
    from test_agent_loop import Echo, EchoWithAnswer, make as make_agent

    from jaxrl_llm.algorithms import ESTIMATORS

    if r["key"] == "env.horizon":
        from jaxrl_llm.algorithms import HORIZONS
        from jaxrl_llm.algorithms.registry import Bound

        tr = make_agent(horizon=Bound.of(HORIZONS[r["name"]], REQUIRED.get((r["key"], r["name"]), {})))
        return [tr.step() for _ in range(2)]
    req = ESTIMATORS[r["name"]].requires
    critic = "values" in req or "progress" in req
    tr = make_agent("spa" if r["name"] == "spa" else ("ppo" if critic else "grpo"),
                    env=EchoWithAnswer if "gt_logp" in req else Echo,  # IGPO scores a gold answer
                    advantage={"name": r["name"], **REQUIRED.get((r["key"], r["name"]), {})})
    return [tr.step() for _ in range(2)]


def _preference(r):
    import dataclasses

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxrl_llm.training import PreferenceTrainer, init_train_state, make_train_step, preference_objective
    from jaxrl_llm.training.optim import make_optimizer
    from test_aux_policy import CFG, pair_batch

    from jaxrl_llm.models import Transformer

    obj = preference_objective(r["name"])
    gd, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
    aux = nnx.split(Transformer(CFG, rngs=nnx.Rngs(2)))[1] if obj.token_weighted else None
    arrays = pair_batch()
    if obj.slots == 3:  # a rationale row per pair (the chosen row's tokens stand for it)
        arrays = {k: np.concatenate([v, v[:, :1]], axis=1) for k, v in arrays.items()}
    if "scope" in obj.extra_keys:  # C3PO: one pair of each scope (in, near, out)
        arrays["scope"] = np.arange(arrays["tokens"].shape[0], dtype=np.int32) % 3

    class Data:  # the same pairs every step (PreferenceTrainer.train_on takes arrays)
        def get_state(self):
            return {}

        def set_state(self, s):
            pass

    opt = make_optimizer(1e-2, 2)
    tr = PreferenceTrainer(gd, init_train_state(jax.tree.map(jnp.copy, params), opt), make_train_step(gd, opt, obj),
                           Data(), obj, ref_params=params if obj.needs_reference else None, aux_params=aux)
    out = []
    for _ in range(2):
        a = dict(arrays)
        if obj.token_weighted:
            from jaxrl_llm.training.preference import _add_token_weights

            a = _add_token_weights(obj, a, gd, tr.ref_params, aux, ())
        elif obj.needs_reference:
            a["ref_logps"] = tr.logps(tr.ref_params, (), a["tokens"], a["mask"], a["loss_mask"]).astype(np.float32)
        out.append(tr.train_on(a, int(a["mask"].sum()), {}))
    return out


def _feature(r):
    """A training feature (Prefix Grouper: ``train.shared_prefix=true``; MPO: ``pairs.split``): a
    two-step run of the runner (MPO: of its DPO stage on the easy pairs)."""
    import json
    import tempfile
    from pathlib import Path

    from test_shared_prefix_update import _tiny

    from jaxrl_llm.training.runner import TrainSpec, run_rl

    if r["key"] == "pairs.split":
        from test_mpo import dpo_on_easy_pairs

        with tempfile.TemporaryDirectory() as out:
            dpo_on_easy_pairs(Path(out), steps=2)
            rows = [json.loads(x) for x in (Path(out) / "dpo" / "metrics.jsonl").read_text().splitlines()]
            return [x for x in rows if "loss" in x]
    assert r["key"] == "train.shared_prefix", r
    with tempfile.TemporaryDirectory() as out:
        run_rl(_tiny(out, train=TrainSpec(shared_prefix=True)))
        return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("row", SEED_ROWS, ids=_id)
def test_seed_method_two_steps(row):
    run = {"rl": _rl, "agent": _agent, "preference": _preference, "feature": _feature}[_kind(row)]
    hist = run(row)
    assert len(hist) == 2
    for m in hist:
        bad = {k: v for k, v in m.items() if isinstance(v, float) and not np.isfinite(v)}
        assert not bad, bad
        assert m.get("skipped_updates", m.get("skipped", 0)) == 0

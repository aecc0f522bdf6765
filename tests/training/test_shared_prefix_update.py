"""Prefix Grouper in the update (``train.shared_prefix``): the block plan, the row order for the
step's micro-batches, the host check, the train step against the row-by-row one, and a short run
against the same run without it."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxrl_llm as jl
from jaxrl_llm.config import Choice, ConfigError
from jaxrl_llm.models import ModelConfig, Transformer
from jaxrl_llm.training import PolicyObjective, init_train_state, make_train_step
from jaxrl_llm.training.prefix import PrefixPlan, check_blocks, microbatch_order, plan_shared_prefix
from jaxrl_llm.training.runner import (DataSpec, KLSpec, ModelSpec, OptimSpec, RecipeSpec, RLRunConfig, RolloutSpec,
                                       RunSpec, SFTSpec, TrainSpec, check_rl, run_rl)
from jaxrl_llm.training.step import split_microbatches


@pytest.mark.parametrize("g, u, n, ways, want", [
    (8, 4, 1, 1, (8, True)),     # one micro-batch: blocks are whole groups
    (8, 4, 2, 1, (8, True)),     # 2 groups per micro-batch
    (8, 3, 2, 1, (4, False)),    # 3 groups do not split in 2: half of every group in each micro-batch
    (8, 4, 1, 8, (4, True)),     # 32 rows over 8 devices: 4 rows of a prompt per device
    (6, 4, 1, 8, (3, True)),     # 24 rows over 8 devices: gcd(6, 3)
    (3, 3, 2, 1, None),          # neither divides
    (1, 8, 1, 1, None),          # one sample per prompt: nothing is shared
    (4, 2, 1, 8, None),          # 1 row per device
])
def test_plan(g, u, n, ways, want):
    plan, why = plan_shared_prefix(g, u, n, ways)
    if want is None:
        assert plan is None and why
    else:
        assert (plan.rows_per_prompt, plan.whole_groups) == want and why == ""


@pytest.mark.parametrize("g, u, n", [(4, 6, 3), (4, 3, 2), (6, 2, 1)])
def test_microbatch_order_gives_each_microbatch_uniform_blocks(g, u, n):
    plan, _ = plan_shared_prefix(g, u, n)
    gid = np.repeat(np.arange(u), g)  # a group-contiguous mini-batch
    order = microbatch_order(len(gid), plan)
    assert sorted(order) == list(range(len(gid)))
    mbs = np.asarray(split_microbatches({"g": jnp.asarray(gid[order])}, n)["g"])  # the step's strided split
    for mb in mbs:
        blocks = mb.reshape(-1, plan.rows_per_prompt)
        assert np.all(blocks == blocks[:, :1])
        if plan.whole_groups:  # whole groups: every group of the micro-batch has all its g rows there
            assert all(np.sum(mb == x) == g for x in np.unique(mb))


def test_check_blocks_names_the_first_bad_block():
    toks = np.repeat(np.arange(3)[:, None], 4, axis=0) * np.ones((1, 5), np.int32)  # 3 prompts x 4 rows
    mask = np.ones_like(toks, bool)
    assert check_blocks(toks, mask, 5, 4) == ""
    assert check_blocks(toks, mask, 5, 2, num_microbatches=2) == ""  # each micro-batch: 2 rows of each prompt
    bad = mask.copy()
    bad[5, 0] = False  # the same tokens, a different padding
    assert "rows 4..7" in check_blocks(toks, bad, 5, 4)
    assert "do not split" in check_blocks(toks, mask, 5, 5)


CFG = ModelConfig(vocab_size=61, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=48)


@pytest.mark.slow  # 38 s of suite time; the default suite compares whole runs (below) and the row order (above)
def test_train_step_equals_the_row_by_row_step():
    """Two micro-batches of whole groups, a KL term and an entropy bonus: the same loss, metrics and
    update as the row-by-row step on the same rows."""
    rng = np.random.default_rng(0)
    g, u, p, t = 4, 4, 6, 5
    n = g * u
    prompts = rng.integers(1, CFG.vocab_size, (u, p))
    tokens = np.concatenate([np.repeat(prompts, g, axis=0), rng.integers(1, CFG.vocab_size, (n, t))], 1)
    mask = np.ones_like(tokens, bool)
    mask[np.repeat(np.arange(u) == 1, g), :2] = False  # group 1's prompt is left-padded
    for i in range(n):
        mask[i, p + 1 + i % t:] = False  # ragged completions
    loss_mask = np.zeros((n, p + t - 1), bool)
    loss_mask[:, p - 1:] = mask[:, p:]
    batch = {"tokens": tokens.astype(np.int32), "mask": mask, "loss_mask": loss_mask,
             "old_logp": rng.normal(-4.0, 0.3, loss_mask.shape).astype(np.float32) * loss_mask,
             "advantages": rng.normal(0, 1, loss_mask.shape).astype(np.float32) * loss_mask,
             "ref_logp": rng.normal(-4.0, 0.3, loss_mask.shape).astype(np.float32) * loss_mask,
             "group_ids": np.repeat(np.arange(u), g).astype(np.int32)}
    plan, _ = plan_shared_prefix(g, u, 2)
    order = microbatch_order(n, plan)
    batch = {k: v[order] for k, v in batch.items()}
    assert check_blocks(batch["tokens"], batch["mask"], p, plan.rows_per_prompt, 2) == ""
    batch["prefix_mask"] = batch["mask"][:, :p]
    opt = optax.sgd(0.5)
    gd, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
    state = init_train_state(params, opt, seed=0)
    obj = PolicyObjective(jl.ppo_clip_loss, (("clip_low", 0.2), ("clip_high", 0.28)), kl_coef=0.05,
                          entropy_coef=0.01)
    out = {}
    for r in (0, plan.rows_per_prompt):
        o = dataclasses.replace(obj, rows_per_prompt=r)
        out[r] = make_train_step(gd, opt, o, num_microbatches=2, donate=False)(
            state, {k: jnp.asarray(batch[k]) for k in o.batch_keys()})
    (s0, m0), (s1, m1) = out[0], out[plan.rows_per_prompt]
    moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(s0.params), jax.tree.leaves(params)))
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(s0.params), jax.tree.leaves(s1.params)))
    assert moved > 1e-3 and diff < 1e-6 * max(1.0, moved) * 10
    for k in ("loss", "grad_norm", "policy/kl_ref", "policy/entropy", "policy/logp_mean"):
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=2e-5, atol=1e-6, err_msg=k)


def _tiny(out, **kw) -> RLRunConfig:
    return RLRunConfig(
        model=ModelSpec(source="tiny", hidden_size=32, num_layers=1),
        data=DataSpec(task="arithmetic", task_args={"preset": "add1", "instruction": ""}, chat=False,
                      train_rows=64, eval_rows=8),
        rollout=RolloutSpec(prompts_per_step=2, num_samples=4, max_new_tokens=4, prompt_buckets=(32,)),
        # an entropy bonus moves the untrained policy (whose rewards are all 0) away from the reference
        recipe=RecipeSpec(name="grpo", kl=KLSpec(coef=0.05), entropy_coef=0.05),
        optim=OptimSpec(lr=1e-2),
        sft=SFTSpec(steps=0),
        run=RunSpec(out=str(out), steps=2, eval_every=0, checkpoint_every=0, log_samples_every=0,
                    export_hf=False, plot=False, tensorboard=False, progress=False), **kw)


def test_run_equals_the_row_by_row_run(tmp_path, caplog):
    """GRPO with a KL term and an entropy bonus (the loss and the reference log-prob pass
    grouped): the same losses, KL and rewards as the run with ``train.shared_prefix=false``, and the run says it is on."""
    runs = {}
    for sp in (False, None):
        out = tmp_path / str(sp)
        with caplog.at_level("INFO", logger="jaxrl_llm"):
            run_rl(_tiny(out, train=TrainSpec(shared_prefix=sp)))
        runs[sp] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "train.shared_prefix: on, blocks of 4 rows" in caplog.text
    assert "train.shared_prefix: off (train.shared_prefix=false)" in caplog.text
    assert len(runs[None]) == len(runs[False]) == 2
    for a, b in zip(runs[False], runs[None]):
        assert a["rewards/total/mean"] == b["rewards/total/mean"]  # the same samples (policies agree to rounding)
        for k in ("loss", "policy/kl_ref", "policy/logp_mean", "policy/entropy", "grad_norm"):
            np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
    assert runs[None][0]["grad_norm"] > 0 and runs[None][1]["policy/kl_ref"] > 0  # it trains; the policy moves
    for run in runs.values():  # one prompt bucket: after the first step nothing is compiled or read again
        assert run[1]["time/compiles"] == 0 and run[1]["time/compile_cache_hits"] == 0


def test_config_decisions(tmp_path):
    assert check_rl(_tiny(tmp_path))["shared_prefix"] == "blocks of 4 rows"
    # the default keeps row-shuffled mini-batches as they are (off), true deals whole groups
    two = dataclasses.replace(_tiny(tmp_path), rollout=RolloutSpec(prompts_per_step=4, num_samples=4,
                                                                    prompt_buckets=(32,)),
                              recipe=RecipeSpec(name="grpo", num_minibatches=2))
    assert check_rl(two)["shared_prefix"].startswith("off: recipe.num_minibatches=2 deals rows")
    assert check_rl(dataclasses.replace(two, train=TrainSpec(shared_prefix=True)))["shared_prefix"] == \
        "blocks of 4 rows"
    knap = dataclasses.replace(_tiny(tmp_path), recipe=RecipeSpec(name="grpo", allocator=Choice("knapsack")))
    assert "recipe.allocator" in check_rl(knap)["shared_prefix"]
    with pytest.raises(ConfigError, match="train.shared_prefix=true cannot hold: recipe.allocator"):
        check_rl(dataclasses.replace(knap, train=TrainSpec(shared_prefix=True)))
    with pytest.raises(ConfigError, match="one completion per prompt"):
        check_rl(dataclasses.replace(_tiny(tmp_path), rollout=RolloutSpec(num_samples=1, prompt_buckets=(32,)),
                                     recipe=RecipeSpec(name="remax"), train=TrainSpec(shared_prefix=True)))


def test_trainer_refuses_a_plan_that_disagrees_with_the_objective():
    from jaxrl_llm.training.loop import RLTrainer

    with pytest.raises(ValueError, match="rows_per_prompt=0 rows but shared_prefix"):
        RLTrainer.__init__(object.__new__(RLTrainer), None, None, None,
                           type("S", (), {"config": type("C", (), {"num_samples": 8, "greedy": False,
                                                                    "temperature": 1.0})()})(),
                           None, None, jl.training.build_recipe(RecipeSpec(name="grpo"), num_samples=8), None,
                           shared_prefix=PrefixPlan(8, True, 1))


def test_parts_with_their_own_forward_pass_turn_it_off_and_refuse_packing(tmp_path):
    """ROVER's loss reads each position's vocabulary mean and BuPO's update stops at an internal
    layer: both need each row's own forward pass, so the default turns shared prompts off (saying
    why), asking for them is refused, and so is packing, all at config time."""
    rover = dataclasses.replace(_tiny(tmp_path), recipe=RecipeSpec(name="rover"))
    assert check_rl(rover)["shared_prefix"].startswith("off: the recipe's loss (ROVER's)")
    with pytest.raises(ConfigError, match="shared_prefix=true cannot hold: the recipe's loss"):
        check_rl(dataclasses.replace(rover, train=TrainSpec(shared_prefix=True)))
    with pytest.raises(ConfigError, match="packing.*ROVER"):
        check_rl(dataclasses.replace(rover, train=TrainSpec(max_tokens_per_microbatch=64)))
    bupo = dataclasses.replace(_tiny(tmp_path), recipe=RecipeSpec(name="grpo", loop_part=Choice("bupo", {"layer": 1})))
    assert check_rl(bupo)["shared_prefix"].startswith("off: recipe.loop_part=bupo: the shared-prompt pass")
    with pytest.raises(ConfigError, match="packing.*recipe.loop_part=bupo"):
        check_rl(dataclasses.replace(bupo, train=TrainSpec(max_tokens_per_microbatch=64)))
    with pytest.raises(ConfigError, match="KL"):  # at config time too
        check_rl(dataclasses.replace(bupo, recipe=RecipeSpec(name="grpo", kl=KLSpec(coef=0.1),
                                                             loop_part=Choice("bupo", {"layer": 1}))))
    # and a whole run of the preset trains
    run_rl(dataclasses.replace(rover, optim=OptimSpec(lr=1e-2)))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) for r in rows) and "policy/rover_target" in rows[0]

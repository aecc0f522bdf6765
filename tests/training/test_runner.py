"""The experiment runner (`run_rl`, `check_rl`) end to end on the tiny model: outputs,
resume by re-running the same config, a critic recipe, and config checks."""

import dataclasses
import json

import pytest

from jaxrl_llm.training.runner import (DataSpec, MeshSpec, ModelSpec, OptimSpec, RecipeSpec, RLRunConfig, RolloutSpec,
                                       RunSpec, SFTSpec, check_rl, run_rl)


def tiny(out, **run) -> RLRunConfig:
    return RLRunConfig(
        model=ModelSpec(source="tiny", hidden_size=32, num_layers=1),
        data=DataSpec(task="arithmetic", task_args={"preset": "add2x1", "instruction": ""}, chat=False,
                      train_rows=256, eval_rows=16),
        rollout=RolloutSpec(prompts_per_step=2, num_samples=4, max_new_tokens=4, prompt_buckets=(32,)),
        optim=OptimSpec(lr=1e-3),
        sft=SFTSpec(steps=5, batch_size=8),
        run=RunSpec(**{**dict(out=str(out), steps=2, eval_every=2, checkpoint_every=1, log_samples_every=1,
                              export_hf=True, plot=True, progress=False), **run}))


def test_run_writes_everything_and_resumes(tmp_path):
    cfg = tiny(tmp_path / "run")
    s = run_rl(cfg)
    out = tmp_path / "run"
    for name in ("config.json", "metrics.jsonl", "samples.jsonl", "summary.json", "eval_before.json",
                 "reward_curve.png", "hf/config.json"):
        assert (out / name).exists(), name
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert s["steps"] == 2 and "eval_after" in s and "eval_after_sft" in s
    assert json.loads((out / "config.json").read_text())["rollout"]["num_samples"] == 4
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "rewards/total/mean" in x] == [1, 2]
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and {"prompt", "completion", "reward"} <= set(samples[0])

    # the same command with more steps resumes at step 2 (no SFT again, the first eval kept)
    s2 = run_rl(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, steps=3)))
    assert s2["steps"] == 3
    assert s2["eval_before"] == s["eval_before"] and s2["eval_after_sft"] == s["eval_after_sft"]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "rewards/total/mean" in x] == [1, 2, 3]
    assert json.loads((out / "summary.json").read_text())["steps"] == 3


@pytest.mark.slow  # PPO's critic path is covered by test_rl_recipes_extra; this adds the runner wiring
def test_run_with_a_critic(tmp_path):
    cfg = tiny(tmp_path / "ppo", steps=1, eval_every=0, export_hf=False, plot=False, log_samples_every=0)
    cfg = dataclasses.replace(cfg, recipe=RecipeSpec(name="ppo", num_minibatches=2), sft=SFTSpec(steps=0))
    s = run_rl(cfg)
    hist = [json.loads(x) for x in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert s["steps"] == 1 and any("critic/vf_loss" in h for h in hist)


def test_check_catches_bad_configs():
    cfg = tiny("unused")
    assert check_rl(cfg)["rows_per_step"] == 8
    with pytest.raises(ValueError, match="mesh: data\\*fsdp\\*tensor"):
        check_rl(dataclasses.replace(cfg, mesh=MeshSpec(data=2)), n_devices=1)
    with pytest.raises(ValueError, match="optim.num_microbatches"):
        check_rl(dataclasses.replace(cfg, optim=OptimSpec(num_microbatches=3)))
    with pytest.raises(ValueError, match="rollout.sampler_weights must be 'train' or 'tensor', got 'fsdp'"):
        check_rl(dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, sampler_weights="fsdp")))
    with pytest.raises(ValueError, match="HF model directory /nonexistent does not exist"):
        check_rl(dataclasses.replace(cfg, model=ModelSpec(source="hf:/nonexistent")))
    with pytest.raises(ValueError, match="model.preset"):
        check_rl(dataclasses.replace(cfg, model=ModelSpec(source="hf:/nonexistent", preset="nope")))
    with pytest.raises(ValueError, match="unknown recipe"):
        check_rl(dataclasses.replace(cfg, recipe=RecipeSpec(name="nope")))
    with pytest.raises(ValueError, match="sft.target_accuracy"):
        check_rl(dataclasses.replace(cfg, sft=SFTSpec(steps=10, target_accuracy=1.5)))
    with pytest.raises(ValueError, match="sft.probe_every"):
        check_rl(dataclasses.replace(cfg, sft=SFTSpec(steps=10, target_accuracy=0.5, probe_every=0)))
    with pytest.raises(ValueError, match="optim.schedule"):
        check_rl(dataclasses.replace(cfg, optim=OptimSpec(schedule="linear")))
    big = check_rl(dataclasses.replace(cfg, model=ModelSpec(source="hf:/x", preset="qwen2.5-1.5b"),
                                       mesh=MeshSpec(fsdp=8)), n_devices=8)
    assert 1.4e9 < big["params"] < 1.8e9

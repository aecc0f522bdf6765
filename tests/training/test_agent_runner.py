"""``jaxrl-llm train agent_grid_gigpo`` at CI size: SFT on the solver's transcripts, multi-turn RL,
held-out success, transcripts in the samples, a resumed command continues; config mistakes are
one line with exit code 2."""

from __future__ import annotations

import json

import pytest

from jaxrl_llm import cli

TINY = ["sft.steps=20", "sft.target_accuracy=0", "run.steps=2", "run.eval_every=0", "run.plot=false",
        "run.tensorboard=false", "run.progress=false", "run.checkpoint_every=1", "run.log_samples_every=1",
        "env.eval_episodes=8", "rollout.episodes_per_step=2", "rollout.num_samples=4"]


def test_agent_run_writes_everything_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", "agent_grid_gigpo", f"run.out={out}", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "held-out success (8 episodes, greedy): start " in printed and "after SFT" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["sft"]["steps"] == 20 and summary["sft"]["transcripts"] >= 64
    assert 0.0 <= summary["eval_after"]["eval/success"] <= 1.0 and summary["eval_after"]["eval/n"] == 8
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if "episodes/turns_mean" in r]
    assert len(rl) == 2 and all(1 <= r["episodes/turns_mean"] <= 8 for r in rl)
    assert all(r["episodes/env_errors"] == 0 for r in rl)
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    t = samples[0]["transcript"]
    assert t[0]["role"] == "user" and "Move A to G" in t[0]["content"] and t[1]["role"] == "assistant"
    # the same command with more steps resumes from the checkpoint; its final evaluation is sampled
    # (env.eval_samples=3: three sampled episodes per held-out seed, eval/n 24, the greedy success
    # reported next to it; the same key every time)
    capsys.readouterr()
    assert cli.main(["train", "agent_grid_gigpo", f"run.out={out}", *[x for x in TINY if not x.startswith("run.steps")],
                     "run.steps=3", "env.eval_samples=3"]) == 0
    assert "held-out success (24 episodes, sampled x 3)" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3
    ev = summary["eval_after"]
    assert ev["eval/n"] == 24 and 0 <= ev["eval/success_greedy"] <= 1 and 0 <= ev["eval/success"] <= 1


CASES = [
    (["env.eval_samples=-1"], "env.eval_samples must be an int >= 0"),
    (["env.name=gird_world"], "env.name='gird_world'.*unknown environment family 'gird_world'"),
    (["rollout.obs_buckets=[16]"], "an observation can take .* more than the largest of rollout.obs_buckets=\\[16\\]"),
    (["env.context_len=64"], "env.context_len=64 has no room for a prompt of the smallest bucket"),
    (["recipe.advantage=gigpo", "rollout.num_samples=1"], "rollout.num_samples must be >= 2"),
    (["env.args.size=2"], "GridWorld: size must be an int from 3 to 9, got 2"),
    (["model.aux_params=somewhere"], "model.aux_params is read by single-turn RL runs"),
]


@pytest.mark.parametrize("overrides,message", CASES, ids=[c[0][0] for c in CASES])
def test_agent_config_mistakes_are_one_line(overrides, message, capsys, tmp_path):
    import re

    code = cli.main(["train", "agent_grid_gigpo", f"run.out={tmp_path / 'out'}", *TINY, *overrides])
    err = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("jaxrl-llm: agent_grid_gigpo (")]
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("jaxrl-llm: error: "), err
    assert re.search(message, err[0]), err[0]

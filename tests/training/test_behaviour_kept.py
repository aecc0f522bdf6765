"""Regression guard of the training-layer redesign (issue 17): short runs of today's code equal,
bit for bit, what the code before the redesign (commit 283a3d4) produced.

``golden/runs.json`` was recorded by ``golden/record_pre_redesign.py`` on that commit: ten short
RL runs through ``run_rl`` (GRPO with a KL term and an entropy bonus, PPO with a critic and a KL in
the reward, ReMax, DAPO with dynamic sampling and overlong shaping, REINFORCE++ with a KL in the
reward, RLOO, Dr.GRPO, GSPO, BNPO, REINFORCE++-baseline: every RL preset) and the tiny DPO
experiment, each on the tiny model. For every run the metrics of
every logged line (without timings) and a digest of every array of the final checkpoint must be
equal. New metrics may be added; none may change.

The old configs are written here in today's syntax. Two differences are deliberate and show up
as overrides: the old ``dapo`` preset had verl's dual clip 3.0 (the paper's objective has none,
so the preset now has none: ``recipe.loss.dual_clip=3`` gives the old numbers), and the old
runner replaced a preset's mini-batch count with ``recipe.num_minibatches`` (default 1), where a
preset now keeps its own unless the field is set. Since issue 22 the update encodes each prompt
group's prompt once where that is the same computation (``train.shared_prefix``, on by default):
equal up to float rounding, not bit for bit, so these runs set ``train.shared_prefix=false`` to
keep comparing the row-by-row computation bit for bit (``tests/training/test_shared_prefix_update.py``
compares the two).

``test_reference_commands`` (slow) re-runs the four commands of issue 17 at full size (30 steps,
``golden/full_runs.json``); about 5 minutes.

XLA:CPU's floats depend on the CPU (its instruction set changes the generated code), so the
stored values hold on a machine like the one that recorded them (``cpu`` in the JSON files,
``golden/machine.py``). On another CPU the test records the old code's values first, on this
machine: it extracts commit 283a3d4 from git (``git archive``) and runs
``golden/record_pre_redesign.py`` (or the four commands) with that package, then compares. The
comparison is always old code against new code on one machine; without the git history it is
skipped with the reason.
"""

import json
import sys
from pathlib import Path

import pytest

from jaxrl_llm.config import Choice
from jaxrl_llm.training.preference_runner import run_preference
from jaxrl_llm.training.runner import (DataSpec, KLSpec, ModelSpec, OptimSpec, RecipeSpec, RLRunConfig, RolloutSpec,
                                       RunSpec, SFTSpec, TrainSpec, run_rl)

GOLDEN = Path(__file__).parent / "golden"
ROOT = Path(__file__).parents[2]
OLD_COMMIT = "283a3d4"
sys.path.insert(0, str(GOLDEN))
from machine import VOLATILE, cpu_id, metric_lines, state_digests  # noqa: E402


def tiny(out, recipe: RecipeSpec, num_samples=4, steps=3) -> RLRunConfig:
    return RLRunConfig(
        model=ModelSpec(source="tiny", hidden_size=32, num_layers=1),
        data=DataSpec(task="arithmetic", task_args={"preset": "add1", "instruction": ""}, chat=False,
                      train_rows=64, eval_rows=8),
        rollout=RolloutSpec(prompts_per_step=2, num_samples=num_samples, max_new_tokens=4, prompt_buckets=(32,)),
        recipe=recipe, optim=OptimSpec(lr=1e-3), sft=SFTSpec(steps=200, batch_size=16),
        train=TrainSpec(shared_prefix=False),
        run=RunSpec(out=str(out), steps=steps, eval_every=0, checkpoint_every=0, log_samples_every=0,
                    export_hf=False, plot=False, tensorboard=False, progress=False))


CASES = {
    "grpo_kl_entropy": dict(recipe=RecipeSpec(name="grpo", num_minibatches=2, kl=KLSpec(coef=0.05),
                                              entropy_coef=0.01)),
    "ppo_kl_in_reward": dict(recipe=RecipeSpec(name="ppo", num_minibatches=2, epochs=2, kl=KLSpec(coef=0.02),
                                               advantage=Choice(args={"lam": 0.95}))),
    "remax": dict(recipe=RecipeSpec(name="remax"), num_samples=1),
    "dapo_dual_clip_3": dict(recipe=RecipeSpec(name="dapo", num_minibatches=2, loss=Choice(args={"dual_clip": 3.0}),
                                               shaping=Choice(args={"buffer": 2}),
                                               group_filter=Choice(args={"max_rounds": 3}))),
    "reinforce_pp_kl_in_reward": dict(recipe=RecipeSpec(name="reinforce_pp", num_minibatches=1, kl=KLSpec(coef=0.05))),
    "rloo": dict(recipe=RecipeSpec(name="rloo")),
    "dr_grpo": dict(recipe=RecipeSpec(name="dr_grpo")),
    "gspo": dict(recipe=RecipeSpec(name="gspo")),
    "bnpo": dict(recipe=RecipeSpec(name="bnpo")),
    "reinforce_pp_baseline": dict(recipe=RecipeSpec(name="reinforce_pp_baseline")),
}








def assert_same(golden: dict, metrics: list[dict], state: dict, name: str) -> None:
    assert len(metrics) == len(golden["metrics"]), f"{name}: {len(metrics)} metric lines, golden has " \
                                                   f"{len(golden['metrics'])}"
    for i, (old, new) in enumerate(zip(golden["metrics"], metrics)):
        diff = {k: (v, new.get(k, "<missing>")) for k, v in old.items()
                if new.get(k, "<missing>") != v and not any(s in k for s in VOLATILE)}
        assert not diff, f"{name}: metrics line {i} differs (golden, now): {diff}"
    changed = [k for k, v in golden["state"].items() if state.get(k) != v]
    assert not changed, f"{name}: checkpoint arrays differ: {changed[:5]} ({len(changed)} of {len(golden['state'])})"


def _old_tree(tmp: Path) -> Path:
    """Commit 283a3d4's files, extracted with ``git archive`` (skip if the history is missing)."""
    import subprocess

    old = tmp / "old"
    if not (old / "jaxrl_llm").is_dir():
        old.mkdir(parents=True, exist_ok=True)
        arch = subprocess.run(["git", "-C", str(ROOT), "archive", OLD_COMMIT], capture_output=True)
        if arch.returncode != 0:
            pytest.skip(f"this CPU ({cpu_id()}) differs from the golden files' and commit {OLD_COMMIT} is not in the "
                        f"git history to record the old code's values here: {arch.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(old)], input=arch.stdout, check=True)
    return old


def _old_env(old: Path) -> dict:
    import os

    return dict(os.environ, PYTHONPATH=str(old) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture(scope="module")
def golden_runs(tmp_path_factory) -> dict:
    """The stored values when this machine's CPU is the recording one's, else the old code's
    values recorded now, on this machine."""
    import subprocess

    for path in sorted(GOLDEN.glob("runs*.json")):  # runs.json and runs.<machine>.json: one per recording CPU
        stored = json.loads(path.read_text())
        if stored.get("cpu") == cpu_id():
            return stored
    tmp = tmp_path_factory.mktemp("golden")
    old = _old_tree(tmp)
    subprocess.run([sys.executable, str(GOLDEN / "record_pre_redesign.py"), str(tmp / "runs.json")], check=True,
                   cwd=old, env=_old_env(old), capture_output=True)
    return json.loads((tmp / "runs.json").read_text())


# four cases in the default suite (a KL term and an entropy bonus, a critic with the KL in the reward,
# a greedy baseline rollout, dynamic sampling with shaping); the other six, whose differences are
# the estimator or the surrogate (unit-tested against verl), with -m slow
DEFAULT = ("grpo_kl_entropy", "ppo_kl_in_reward", "remax", "dapo_dual_clip_3")


@pytest.mark.parametrize("name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in CASES])
def test_rl_runs_equal_the_pre_redesign_runs(name, tmp_path, golden_runs):
    golden = golden_runs["rl"][name]
    run_rl(tiny(tmp_path, **CASES[name]))
    assert_same(golden, metric_lines(tmp_path / "metrics.jsonl"), state_digests(tmp_path / "ckpt"), name)


def test_dpo_run_equals_the_pre_redesign_run(tmp_path, golden_runs):
    from jaxrl_llm.cli import load_experiment
    from jaxrl_llm.config import apply_overrides

    golden = golden_runs["dpo"]
    exp = load_experiment(Path(__file__).parents[2] / "experiments" / "tiny_dpo.py")
    cfg = apply_overrides(exp.default, [f"run.out={tmp_path}", "data.task_args.preset=add1", "model.hidden_size=32",
                                        "model.num_layers=1", "sft.steps=200", "sft.batch_size=16",
                                        "pairs.prompts=16", "pairs.samples_per_prompt=2", "run.steps=3",
                                        "pairs.batch_size=4", "data.eval_rows=8", "control=false"])
    rep = run_preference(cfg)
    assert_same(golden, metric_lines(tmp_path / "metrics.jsonl"), state_digests(tmp_path / "ckpt"), "dpo")
    for k, v in golden["report"].items():
        assert {m: rep[k][m] for m in v} == v, k


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny_grpo", "tiny_ppo", "tiny_remax", "tiny_dpo"])
def test_reference_commands(name, tmp_path):
    """The four commands of issue 17 at full size (``python -m pytest -m slow -k reference_commands``)."""
    import subprocess

    full = json.loads((GOLDEN / "full_runs.json").read_text())
    cmd = full["commands"][name].split()[1:]  # drop "jaxrl-llm"
    if full.get("cpu") == cpu_id():
        golden = full["runs"][name]
    else:  # the old code's run on this machine (tiny_dpo took out=, not run.out=, before the redesign)
        old = _old_tree(tmp_path)
        arg = f"out={tmp_path / 'old_run'}" if name == "tiny_dpo" else f"run.out={tmp_path / 'old_run'}"
        subprocess.run([sys.executable, "-m", "jaxrl_llm", *cmd, arg], check=True, cwd=old, env=_old_env(old))
        golden = {"metrics": metric_lines(tmp_path / "old_run" / "metrics.jsonl"),
                  "state": state_digests(tmp_path / "old_run" / "ckpt")}
    new_cmd = cmd + ([] if name == "tiny_dpo" else ["train.shared_prefix=false"])  # the row-by-row update
    subprocess.run([sys.executable, "-m", "jaxrl_llm", *new_cmd, f"run.out={tmp_path / 'run'}"], check=True, cwd=ROOT)
    tmp_path = tmp_path / "run"
    assert_same(golden, metric_lines(tmp_path / "metrics.jsonl"), state_digests(tmp_path / "ckpt"), name)

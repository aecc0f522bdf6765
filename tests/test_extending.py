"""docs/extending.md's worked example: a new advantage estimator defined and registered in an
experiment file (experiments/median_baseline_grpo.py) runs from the CLI with no change to the
loop. Run in subprocesses, so the example's registration does not leak into other tests."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_group_median_estimator_values():
    code = """
import sys, json
sys.path.insert(0, "experiments")
import jax.numpy as jnp, numpy as np
import median_baseline_grpo as m
from jaxrl_llm.training import recipe
scores = jnp.array([1.0, 0.0, 0.0, 5.0, 2.0, 3.0, 9.0, 1.0])
valid = jnp.array([True] * 7 + [False])
gid = jnp.array([0, 0, 0, 0, 1, 1, 1, 1])
mask = jnp.ones((8, 2), bool)
adv = m.group_median_advantages(scores, mask, gid, valid)
rec = recipe("grpo", num_samples=4, advantage="group_median")
from jaxrl_llm.training import compute_advantages
same = compute_advantages(rec, scores, mask, gid, 2, valid=valid)
print(json.dumps({"adv": np.asarray(adv[:, 0]).tolist(), "same": bool(np.array_equal(adv, same))}))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # group 0: median of (1, 0, 0, 5) = 0.5; group 1: median of the valid (2, 3, 9) = 3; the invalid row gets 0
    assert r["adv"] == [0.5, -0.5, -0.5, 4.5, -1.0, 0.0, 6.0, 0.0] and r["same"]


def test_the_example_trains_from_the_cli(tmp_path):
    cmd = [sys.executable, "-m", "jaxrl_llm", "train", "median_baseline_grpo", f"run.out={tmp_path}", "sft.steps=0",
           "run.steps=2", "run.eval_every=0", "data.eval_rows=8", "rollout.prompts_per_step=2",
           "recipe.num_minibatches=1", "run.plot=false", "run.tensorboard=false"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["recipe"]["advantage"] == {"name": "group_median", "args": {}}
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "advantages/std" in x] == [1, 2]


def test_the_loop_part_walk_through_trains_from_the_cli(tmp_path):
    """docs/extending.md's second walk-through: a loop part (ReST-GRPO's variance filter) turned
    on from the command line. With min_std above any reward spread every trained prompt is set
    aside after its visit, so the second step's batch is replaced by later prompts."""
    cmd = [sys.executable, "-m", "jaxrl_llm", "train", "tiny_grpo", f"run.out={tmp_path}", "sft.steps=0",
           "run.steps=2", "run.eval_every=0", "data.eval_rows=8", "rollout.prompts_per_step=2",
           "recipe.num_minibatches=1", "run.plot=false", "run.tensorboard=false",
           "recipe.loop_part=variance_filter", "recipe.loop_part.min_std=100", "recipe.loop_part.cooldown=5"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["recipe"]["loop_part"] == {"name": "variance_filter", "args": {"min_std": 100, "cooldown": 5}}
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "variance_filter/set_aside" in x]
    assert [x["variance_filter/set_aside"] for x in steps] == [2.0, 4.0]
    bad = subprocess.run(cmd[:5] + [f"run.out={tmp_path}/bad", "recipe.loop_part=variance_filter",
                                    "recipe.loop_part.cooldown=-1"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "recipe.loop_part.cooldown must be an int >= 0, got -1" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) <= 2

"""Asynchronous rollout (``rollout.asynchronous``): on 8 simulated devices, the sampler on 4 and
the trainer on the other 4, the next step's rollout sampled during this step's update equals the
synchronous one-step-off-policy run with the same placement bit for bit, the two overlap in
time, and an asynchronous run resumes bit for bit from a checkpoint written with a rollout read
ahead."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_llm.cli import load_experiment, resolve_experiment
from jaxrl_llm.config import ConfigError, apply_overrides
from jaxrl_llm.training.runner import check_rl


def test_async_equals_sync_overlaps_and_resumes(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("async_worker.py")), str(tmp_path / "ckpt")],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["async"] == res["sync"]  # params digest and every non-timing metric of the 3 steps
    assert res["resumed"] == res["sync"]
    assert res["trainer_devices"] == ["[4, 5, 6, 7]"]
    # steps 2 and 3 took a rollout sampled during the previous update; the intervals intersect
    assert res["overlap"][0] is None and all(o is not None for o in res["overlap"][1:])
    assert all(o > 0 for o in res["overlap"][1:]), res["intervals"]
    for s0, s1, u0, u1 in res["intervals"][1:]:
        assert s0 <= u1 and u0 <= s1  # sampling [s0, s1] and the update [u0, u1] overlap


def test_async_config_errors_name_the_fields():
    cfg = load_experiment(resolve_experiment("tiny_grpo")).default
    with pytest.raises(ConfigError, match="rollout.sampler_devices >= 1 and rollout.staleness >= 1"):
        check_rl(apply_overrides(cfg, ["rollout.asynchronous=true"]))
    bad = apply_overrides(cfg, ["rollout.asynchronous=true", "rollout.sampler_devices=4", "rollout.staleness=1",
                        "recipe.old_logp=recompute", "recipe.allocator=knapsack"])
    with pytest.raises(ConfigError, match="rollout.asynchronous=true cannot be combined with recipe.allocator=knapsack: "
                                          ".* reads the prompt statistics"):
        check_rl(bad)
    ok = apply_overrides(cfg, ["rollout.asynchronous=true", "rollout.sampler_devices=4", "rollout.staleness=1",
                       "recipe.old_logp=recompute", "mesh.data=4"])
    check_rl(ok, n_devices=8)
    with pytest.raises(ConfigError, match="must equal the number of devices"):
        check_rl(ok, n_devices=6)

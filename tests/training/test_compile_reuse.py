"""No waste between steps: once a prompt bucket has been seen, a step builds no XLA program
(``time/compiles`` and ``time/compile_cache_hits`` per step), and ``run.compile_cache`` keeps
compiled programs on disk for the next run."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from jaxrl_llm.training.runner import DataSpec, RolloutSpec, run_rl

sys.path.insert(0, os.path.dirname(__file__))
from test_shared_prefix_update import _tiny  # noqa: E402


@pytest.mark.slow  # 45 s of suite time; the default suite checks one bucket (test_shared_prefix_update.py)
def test_a_seen_bucket_builds_no_program(tmp_path):
    cfg = _tiny(tmp_path)
    # mixed-length problems (1+1, 2+1 and 2+2 digits) over fine buckets: the steps' prompts land in two
    cfg = dataclasses.replace(
        cfg, data=DataSpec(task="arithmetic_mix", task_args={"preset": "add_three"}, chat=False, train_rows=64,
                           eval_rows=8),
        rollout=RolloutSpec(prompts_per_step=2, num_samples=4, max_new_tokens=4, prompt_buckets=(44, 46, 64)),
        run=dataclasses.replace(cfg.run, steps=8))
    run_rl(cfg)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    seen, repeats = set(), 0
    for m in lines:
        p = m["batch/prompt_len"]
        if p in seen:
            repeats += 1
            assert m["time/compiles"] == 0 and m["time/compile_cache_hits"] == 0, (m["step"], p)
        seen.add(p)
    assert len(seen) >= 2 and repeats >= 4, (seen, repeats)  # the check had something to check
    assert lines[0]["time/to_first_step"] > 0 and "time/to_first_step" not in lines[1]


def test_compile_cache_keeps_programs(tmp_path):
    code = ("import jax, jax.numpy as jnp\n"
            "from jaxrl_llm.training.host_loop import use_compile_cache, compile_counter\n"
            "import sys\n"
            "assert use_compile_cache(sys.argv[1]) == sys.argv[1]\n"
            "assert use_compile_cache('/elsewhere') == sys.argv[1]  # a configured cache is left alone\n"
            "compile_counter()\n"
            "jax.jit(lambda x: jnp.sin(x) * 3)(jnp.ones(7)).block_until_ready()\n"
            "print(*compile_counter())\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    runs = [subprocess.run([sys.executable, "-c", code, str(tmp_path / "xla")], capture_output=True, text=True,
                           env=env, timeout=300) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    built, _, hits = (int(float(x)) for x in runs[0].stdout.split())
    assert built >= 1 and hits == 0 and any((tmp_path / "xla").iterdir())
    built2, _, hits2 = (int(float(x)) for x in runs[1].stdout.split())
    assert built2 == built and hits2 == built  # the second process read every program from the cache

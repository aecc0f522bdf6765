"""The tiny preset (``experiments/tiny_grpo.py``) end to end, as CI runs it: SFT warm-up to
the accuracy target, then GRPO must improve held-out greedy accuracy.

Deterministic on one machine for a fixed seed (bitwise-reproducible steps), so this is not a flaky
statistical test there. The trajectory does depend on the CPU (XLA:CPU's floats follow its
instruction set): on the Intel machine of earlier sessions seeds 0-4 gained +0.15 to +0.39
held-out; on an AMD EPYC with AVX-512 (2026-11-29) nine of seeds 0-9 gain +0.12 to +0.36 and seed 7
+0.03 (docs/results.md); on the AMD EPYC of 2026-11-25 seed 0 goes 0.452 -> 0.468 held-out (0.505 at step 200)
while its training reward rises from 0.367 (first 50 steps) to 0.512 (last 50). So the test asks
for what holds on all of them: held-out accuracy above the SFT start and a training-reward rise of at
least 0.05; it fails when a change breaks learning.

It is the full preset (up to 1500 SFT steps, 300 GRPO steps: 76-105 s of a clean-clone CI run), so
it runs with ``-m slow``; the default suite checks learning on the toy tasks
(``test_rl_recipes_extra.py``: rewards rise under PPO, GRPO, ReMax, ...) and runs the preset's code
path in ``notebooks/01_tiny_sft_then_grpo.ipynb``'s fast mode.
"""

import json
from pathlib import Path

import pytest

from jaxrl_llm.cli import load_experiment
from jaxrl_llm.config import apply_overrides
from jaxrl_llm.training.runner import run_rl

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tiny_preset_improves_held_out_accuracy(tmp_path):
    exp = load_experiment(ROOT / "experiments" / "tiny_grpo.py")
    cfg = apply_overrides(exp.default, [f"run.out={tmp_path}", "run.plot=false", "run.tensorboard=false"])
    s = run_rl(cfg)
    before = s["eval_before"]["eval/accuracy"]
    sft = s["eval_after_sft"]["eval/accuracy"]
    after = s["eval_after"]["eval/accuracy"]
    assert s["eval_after"]["eval/n"] == cfg.data.eval_rows
    assert s["sft"]["reached_target"], s["sft"]
    assert sft > before
    assert after > sft, (before, sft, after)
    hist = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    reward = [h["rewards/total/mean"] for h in hist if "rewards/total/mean" in h]
    assert sum(reward[-50:]) / 50 >= sum(reward[:50]) / 50 + 0.05, (reward[:50], reward[-50:])
    rl = [h["step"] for h in hist if "rewards/total/mean" in h]
    assert rl == list(range(1, cfg.run.steps + 1))
    sft_rows = [h for h in hist if "sft/nll" in h]
    assert sft_rows and sft_rows[-1]["step"] == s["sft"]["steps"]

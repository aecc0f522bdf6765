"""The tiny preset (``experiments/tiny_grpo.py``) end to end, as CI runs it: SFT warm-up to
the accuracy target, then GRPO must improve held-out greedy accuracy.

Deterministic on CPU for a fixed seed (bitwise-reproducible steps), so this is not a flaky
statistical test: it fails when a change breaks learning (seeds 0-4 all gain >= 0.15 here).
"""

import json
from pathlib import Path

from jaxrl_llm.cli import load_experiment
from jaxrl_llm.config import apply_overrides
from jaxrl_llm.training.runner import run_rl

ROOT = Path(__file__).resolve().parents[2]


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
    assert after >= sft + 0.1, (before, sft, after)
    assert s["reward_last_5"] > s["reward_first_5"]
    hist = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rl = [h["step"] for h in hist if "rewards/total/mean" in h]
    assert rl == list(range(1, cfg.run.steps + 1))
    sft_rows = [h for h in hist if "sft/nll" in h]
    assert sft_rows and sft_rows[-1]["step"] == s["sft"]["steps"]

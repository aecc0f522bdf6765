import json

import pytest

from jaxrl_llm.training.telemetry import read_metrics


def test_read_metrics_keeps_the_last_line_of_a_relogged_step(tmp_path):
    lines = [{"step": 1, "a": 1.0}, {"step": 1, "sft/nll": 2.0}, {"step": 2, "a": 2.0}, {"step": 3, "a": 3.0},
             {"step": 2, "a": 20.0}, {"step": 3, "a": 30.0}]  # resumed after step 1
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert [(r["step"], r["a"]) for r in read_metrics(tmp_path, "a")] == [(1, 1.0), (2, 20.0), (3, 30.0)]
    assert read_metrics(tmp_path, "sft/nll") == [{"step": 1, "sft/nll": 2.0}]


def test_read_metrics_names_the_bad_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "a": 1}\n{"step": 2, "a"\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON line"):
        read_metrics(tmp_path, "a")

"""Telemetry: JSONL and TensorBoard round trips (the event files are parsed back), NaN and
non-numeric values, samples, console line, process gating, W&B wiring, construction errors."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import struct
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.training.telemetry import Telemetry


def read_events(tb_dir):
    """Every event of the TFRecord event files in ``tb_dir`` (length, crc, data, crc framing)."""
    from tensorboardX.proto import event_pb2
    from tensorboardX.record_writer import masked_crc32c

    files = sorted(tb_dir.glob("events.out.tfevents.*"))
    assert files, f"no event file in {tb_dir}"
    events = []
    for f in files:
        data, i = f.read_bytes(), 0
        while i < len(data):
            header = data[i:i + 8]
            (n,) = struct.unpack("<Q", header)
            assert struct.unpack("<I", data[i + 8:i + 12])[0] == masked_crc32c(header)
            body = data[i + 12:i + 12 + n]
            assert struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] == masked_crc32c(body)
            events.append(event_pb2.Event.FromString(body))
            i += 16 + n
    return events


def scalars(events) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list] = {}
    for e in events:
        for v in e.summary.value:
            if v.WhichOneof("value") == "simple_value":
                out.setdefault(v.tag, []).append((e.step, v.simple_value))
    return out


def texts(events) -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list] = {}
    for e in events:
        for v in e.summary.value:
            if v.metadata.plugin_data.plugin_name == "text":
                out.setdefault(v.tag, []).append((e.step, v.tensor.string_val[0].decode()))
    return out


def test_jsonl_and_tensorboard_round_trip(tmp_path, capsys):
    torch_before = "torch" in sys.modules
    out = tmp_path / "run"
    with Telemetry(out) as tel:  # process_index from jax: 0 in a single process
        assert tel.enabled
        tel({"step": 2, "rewards/total/mean": 0.5, "policy/kl_ref": jnp.float32(0.25), "loss": np.float64(-1.5),
             "n": np.int32(7), "ok": True, "eval": {"accuracy": 0.75}, "name": "grpo", "hist": np.arange(4),
             "bad": float("nan"), "huge": float("inf"), "none": None, "time/rollout": 1.25})
        tel({"step": 4, "rewards/total/mean": jnp.asarray([0.625]), "bad": 3.0, "tokens_per_s": 100.0})
        tel.log_samples(4, [{"prompt": "1+2=", "completion": "3 | yes\nsure", "reward": 1.0},
                            {"prompt": "2+2=", "completion": "5", "reward": float("nan"), "ids": np.array([5, 6])}])
    # (a) JSONL: numbers only, step first, non-finite -> null
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines == [
        {"step": 2, "rewards/total/mean": 0.5, "policy/kl_ref": 0.25, "loss": -1.5, "n": 7, "ok": 1,
         "eval/accuracy": 0.75, "bad": None, "huge": None, "time/rollout": 1.25},
        {"step": 4, "rewards/total/mean": 0.625, "bad": 3.0, "tokens_per_s": 100.0},
    ]
    assert list(lines[0])[0] == "step"
    assert tel.dropped_keys == {"name", "hist", "none"}
    # (b) TensorBoard: every finite numeric metric at its step; NaN/inf skipped and counted
    events = read_events(out / "tb")
    sc = scalars(events)
    assert sc["rewards/total/mean"] == [(2, 0.5), (4, 0.625)]
    assert sc["policy/kl_ref"] == [(2, 0.25)] and sc["eval/accuracy"] == [(2, 0.75)] and sc["n"] == [(2, 7.0)]
    assert sc["bad"] == [(4, 3.0)] and "huge" not in sc and "name" not in sc and "step" not in sc
    assert sc["telemetry/nonfinite_skipped"] == [(2, 2.0)] and tel.nonfinite_skipped == 2
    # (e) samples: JSONL rows with their step, and a markdown table in TensorBoard
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert samples == [{"step": 4, "prompt": "1+2=", "completion": "3 | yes\nsure", "reward": 1.0},
                       {"step": 4, "prompt": "2+2=", "completion": "5", "reward": None, "ids": [5, 6]}]
    (tag, [(step, table)]), = texts(events).items()
    assert tag.startswith("samples") and step == 4
    assert table.splitlines() == ["| prompt | completion | reward | ids |", "|---|---|---|---|",
                                  "| 1+2= | 3 \\| yes<br>sure | 1 |  |", "| 2+2= | 5 | null | [5, 6] |"]
    # (d) console: one compact line per call
    con = capsys.readouterr().out.splitlines()
    assert con == ["step 2 | reward 0.5 | acc 0.75 | kl 0.25 | rollout 1.25s", "step 4 | reward 0.625 | tok/s 100"]
    if not torch_before and importlib.util.find_spec("torch") is not None:
        assert "torch" not in sys.modules  # tensorboardX was imported without pulling in torch


def test_steps_console_every_and_appending(tmp_path, capsys):
    with Telemetry(tmp_path, tensorboard=False, console_every=2) as tel:
        for r in (0.1, 0.2, 0.3):
            tel({"reward": r})  # no step key: 0, 1, 2
        tel({"reward": 0.4}, step=10)
        tel({"iteration": 3, "reward": 0.5})
    with Telemetry(tmp_path, tensorboard=False, console_every=0, step_key="iteration") as tel:
        tel({"iteration": 3, "step": 6, "reward": 0.6})  # a second run appends
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward"]) for r in rows] == [(0, 0.1), (1, 0.2), (2, 0.3), (10, 0.4), (11, 0.5), (3, 0.6)]
    # with step_key="iteration" the optimiser-step metric is kept under another name
    assert rows[-1] == {"step": 3, "metrics/step": 6, "reward": 0.6}
    assert rows[-2] == {"step": 11, "iteration": 3, "reward": 0.5}
    assert capsys.readouterr().out.splitlines() == ["step 1 | reward 0.2", "step 10 | reward 0.4"]  # calls 2 and 4
    assert not (tmp_path / "tb").exists()


def test_other_processes_write_nothing(tmp_path):
    out = tmp_path / "p1"
    with Telemetry(out, process_index=1, wandb={"project": "x"}) as tel:  # wandb is not even imported
        assert not tel.enabled
        tel({"step": 1, "reward": 1.0})
        tel.log_samples(1, [{"prompt": "a", "completion": "b"}])
        tel.flush()
    tel({"step": 2})  # still a no-op after close
    assert not out.exists()


def test_unwritable_directory_fails_at_construction(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError, match=r"Telemetry cannot write to .*file/run"):
        Telemetry(blocker / "run")
    tel = Telemetry(tmp_path / "ok", tensorboard=False, console_every=0)
    tel.close()
    tel.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        tel({"step": 1})
    with pytest.raises(ValueError, match="console_every"):
        Telemetry(tmp_path / "x", console_every=-1)


def test_wandb_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match="pip install wandb"):
        Telemetry(tmp_path, tensorboard=False, wandb={"project": "p"})


def test_wandb_receives_metrics_samples_and_finish(tmp_path, monkeypatch):
    calls = []

    class Run:
        def log(self, data, step=None):
            calls.append(("log", data, step))

        def finish(self):
            calls.append(("finish",))

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    def init(**kwargs):
        calls.append(("init", kwargs))
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init, Table=Table))

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        lr: float = 1e-4
        buckets: tuple = (32, 64)

    with Telemetry(tmp_path, tensorboard=False, console_every=0,
                   wandb={"project": "p", "name": "n", "config": Cfg()}) as tel:
        tel({"step": 3, "reward": 0.5, "label": "x"})
        tel.log_samples(3, [{"prompt": "a", "completion": "b", "reward": 1}])
    assert calls[0] == ("init", {"project": "p", "name": "n", "config": {"lr": 1e-4, "buckets": [32, 64]},
                                 "dir": str(tmp_path)})
    assert calls[1] == ("log", {"reward": 0.5}, 3)
    kind, data, step = calls[2]
    assert kind == "log" and step == 3 and data["samples"].columns == ["prompt", "completion", "reward"]
    assert data["samples"].data == [["a", "b", 1]]
    assert calls[3] == ("finish",) and len(calls) == 4


def test_nan_everywhere_never_raises(tmp_path):
    with Telemetry(tmp_path, console_every=1) as tel:
        tel({"step": float("nan"), "a": float("nan"), "b": np.float32("nan"), "c": jnp.nan, "d": object(),
             "e": [1, 2], "f": complex(1, 2), "g": np.array(["s"])})
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row == {"step": 0, "a": None, "b": None, "c": None}
    assert all(math.isfinite(v) for vs in scalars(read_events(tmp_path / "tb")).values() for _, v in vs)

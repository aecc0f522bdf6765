"""Run telemetry: one ``log_fn`` that writes each step's metrics to JSON lines, TensorBoard,
optionally Weights & Biases, and a one-line console summary; plus sample completions.

::

    with Telemetry("runs/x", wandb=dict(project="rl", name="grpo-1", config=cfg)) as tel:
        trainer = RLTrainer(..., log_fn=tel)          # tel(metrics) after every step
        tel.log_samples(step, [{"prompt": p, "completion": c, "reward": r}, ...])

Files under ``out_dir``:

* ``metrics.jsonl``: one line per call, ``{"step": s, <numeric metrics>}``; a non-finite value is
  written as ``null`` (strict JSON), non-numeric values (strings, arrays, ...) are left out.
* ``tb/``: TensorBoard event files (``tensorboardX``; no TensorFlow), a scalar per numeric metric
  at ``step``. NaN/inf values are skipped and counted (``nonfinite_skipped``, also written as the
  scalar ``telemetry/nonfinite_skipped``).
* ``samples.jsonl``: one line per sample row, with its ``step``; the same rows go to TensorBoard
  as a markdown table (text tab) and to W&B as a table.

Only process 0 writes (``jax.process_index()`` unless ``process_index`` is given); on other
processes every method is a no-op and nothing is created. Bad *values* never raise (training
must not die for a NaN or a string in the metrics), but a directory that cannot be written
fails at construction with the path in the message.

The step is the ``step`` argument, else ``metrics[step_key]`` (``"step"``: the optimiser step
in :class:`~jaxrl_llm.training.RLTrainer`; pass ``step_key="iteration"`` to count RL
iterations; a metric named ``step`` is then logged as ``metrics/step``), else one more than the
previous call's.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Telemetry", "CONSOLE_KEYS", "jsonable"]

log = logging.getLogger(__name__)

# console summary: (label, candidate metric keys, first present wins)
CONSOLE_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("rewards/total/mean", "reward/mean", "reward")),
    ("acc", ("eval/accuracy", "accuracy")),
    ("kl", ("policy/kl_ref", "policy/approx_kl", "kl")),
    ("ent", ("policy/entropy", "entropy")),
    ("len", ("response/length_mean", "length_mean")),
    ("tok/s", ("tokens_per_s",)),
)
_NOT_A_NUMBER = object()
_MAX_CELL = 4000  # characters per markdown cell in TensorBoard


def _number(v: Any) -> Any:
    """A Python int/float for numeric scalars (bools -> 0/1, NumPy/JAX 0-d or size-1 arrays),
    else ``_NOT_A_NUMBER``. Never converts a large array just to find it is not a scalar."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, (str, bytes, Mapping, list, tuple, set)) or v is None:
        return _NOT_A_NUMBER
    shape = getattr(v, "shape", None)
    if shape is None and not isinstance(v, np.generic):
        return _NOT_A_NUMBER
    try:
        if shape is not None and math.prod(shape) != 1:
            return _NOT_A_NUMBER
        a = np.asarray(v)
    except Exception:
        return _NOT_A_NUMBER
    if a.dtype.kind not in "biuf":
        return _NOT_A_NUMBER
    x = a.reshape(()).item()
    return int(x) if isinstance(x, bool) else x


def _finite(x: Any) -> bool:
    return not isinstance(x, float) or math.isfinite(x)


def _flatten(metrics: Mapping, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def jsonable(v: Any, *, strict: bool = True) -> Any:
    """``v`` as JSON data: numbers (NumPy/JAX scalars and size-1 arrays included; non-finite ->
    ``null`` when ``strict``, kept as floats otherwise), strings, bools, lists (numeric arrays
    too), dicts with string keys; anything else as its ``str``. The one sanitiser of the package
    (metrics, sample rows, checkpoint records)."""
    if v is None or isinstance(v, (str, bool)):
        return v
    if isinstance(v, Mapping):
        return {str(k): jsonable(x, strict=strict) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x, strict=strict) for x in v]
    x = _number(v)
    if x is not _NOT_A_NUMBER:
        return x if (_finite(x) or not strict) else None
    if isinstance(v, (np.ndarray, np.generic)) or hasattr(v, "__array__"):
        try:
            a = np.asarray(v)
            if a.dtype.kind in "biuf":
                return jsonable(a.tolist(), strict=strict)
        except Exception:
            pass
    return str(v)


def _fmt(x: Any) -> str:
    if x is None:
        return "nan"
    if isinstance(x, int):
        return str(x)
    return f"{x:.4g}"


def _md_cell(v: Any) -> str:
    if isinstance(v, float):
        s = _fmt(v)
    elif isinstance(v, str):
        s = v
    else:
        s = json.dumps(jsonable(v))
    if len(s) > _MAX_CELL:
        s = s[:_MAX_CELL] + " …"
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def _markdown_table(rows: list[dict]) -> str:
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    lines = ["| " + " | ".join(_md_cell(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_md_cell(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def _process_index() -> int:
    try:
        import jax
    except ImportError:
        return 0
    return jax.process_index()


def _summary_writer_class():
    """tensorboardX's ``SummaryWriter``, imported without torch.

    ``tensorboardX.writer`` imports torch at module level only to widen an ``isinstance`` check
    for torch tensors (never passed here); when torch is installed next to JAX (the ``peers``
    extra) that import costs seconds and hundreds of MB. It is hidden for the duration of the
    import (the writer then falls back to NumPy, as without torch) and restored after.
    """
    hide = "torch" not in sys.modules and "tensorboardX" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # makes `import torch` raise ImportError
    try:
        from tensorboardX import SummaryWriter
    except ImportError as e:
        raise ImportError("Telemetry(tensorboard=True) needs tensorboardX, a core dependency of jaxrl_llm "
                          "(pip install tensorboardX), or pass tensorboard=False") from e
    finally:
        if hide and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter


class Telemetry:
    """A ``log_fn(metrics)`` writing JSONL, TensorBoard, W&B (optional) and console summaries.

    Args:
      out_dir: the run's folder (created): ``metrics.jsonl``, ``samples.jsonl``, ``tb/``.
      jsonl: write ``metrics.jsonl`` and ``samples.jsonl``.
      tensorboard: write TensorBoard event files under ``out_dir/tb``.
      wandb: ``None`` (off), or the keyword arguments of ``wandb.init`` (``project``, ``name``,
        ``config`` — a dataclass config is converted with :func:`jaxrl_llm.config.to_dict` —
        ...; ``dir`` defaults to ``out_dir``). ``True`` means ``{}``. Needs ``pip install wandb``.
      console_every: print a one-line summary every this many calls (0: never), with
        ``tqdm.write`` so it does not break a progress bar.
      process_index: this process's index; only index 0 writes. Default ``jax.process_index()``.
      step_key: the metric that holds the step (see the module docstring).
      console_keys: ``(label, candidate keys)`` pairs for the console line; default
        :data:`CONSOLE_KEYS` (reward, accuracy, KL, entropy, length, tokens/s), followed by
        every ``time/*`` phase time.
      flush_secs: how often TensorBoard's background writer flushes.

    Raises:
      OSError: ``out_dir`` cannot be created or written (on process 0).
      ImportError: W&B was requested but ``wandb`` is not installed.
    """

    def __init__(self, out_dir: str | Path, *, jsonl: bool = True, tensorboard: bool = True,
                 wandb: Mapping[str, Any] | bool | None = None, console_every: int = 1,
                 process_index: int | None = None, step_key: str = "step",
                 console_keys: Iterable[tuple[str, Iterable[str]]] = CONSOLE_KEYS, flush_secs: float = 30.0):
        if console_every < 0:
            raise ValueError(f"console_every must be >= 0, got {console_every}")
        self.out_dir = Path(out_dir)
        self.process_index = _process_index() if process_index is None else int(process_index)
        self.enabled = self.process_index == 0
        self.console_every, self.step_key = int(console_every), step_key
        self.console_keys = tuple((label, tuple(keys)) for label, keys in console_keys)
        self.nonfinite_skipped = 0  # TensorBoard values skipped because NaN/inf
        self.dropped_keys: set[str] = set()  # metric keys seen with non-numeric values
        self.calls = 0
        self.last_step: int | None = None
        self._jsonl = self._samples = self._tb = self._wandb = None
        self._closed = False
        if not self.enabled:
            return
        try:
            if jsonl or tensorboard or wandb:
                self.out_dir.mkdir(parents=True, exist_ok=True)
            if jsonl:
                self._jsonl = open(self.out_dir / "metrics.jsonl", "a", encoding="utf-8")
                self._samples_path = self.out_dir / "samples.jsonl"
            if tensorboard:
                (self.out_dir / "tb").mkdir(exist_ok=True)
        except OSError as e:
            self._close_files()
            raise OSError(f"Telemetry cannot write to {self.out_dir}: {e.strerror or e}") from e
        try:
            if tensorboard:
                self._tb = _summary_writer_class()(logdir=str(self.out_dir / "tb"), flush_secs=flush_secs)
            if wandb is not None and wandb is not False:
                self._wandb = self._start_wandb({} if wandb is True else dict(wandb))
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- writers

    def _start_wandb(self, kwargs: dict):
        try:
            import wandb
        except ImportError as e:
            raise ImportError("Telemetry(wandb=...) needs the wandb package: pip install wandb") from e
        cfg = kwargs.get("config")
        if cfg is not None and not isinstance(cfg, Mapping):
            from jaxrl_llm.config import to_dict

            kwargs["config"] = to_dict(cfg)
        kwargs.setdefault("dir", str(self.out_dir))
        return wandb.init(**kwargs)

    def _resolve_step(self, flat: dict, step: int | None) -> int:
        if step is None:
            x = _number(flat.get(self.step_key))
            if x is not _NOT_A_NUMBER and _finite(x):
                step = int(x)
            else:
                step = 0 if self.last_step is None else self.last_step + 1
        self.last_step = int(step)
        return self.last_step

    def __call__(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log one step's metrics (nested dicts are flattened with ``/``)."""
        if not self.enabled:
            return
        if self._closed:
            raise RuntimeError(f"Telemetry({self.out_dir}) is closed")
        self.calls += 1
        flat = _flatten(metrics)
        step = self._resolve_step(flat, step)
        numbers: dict[str, Any] = {}
        for k, v in flat.items():
            x = _number(v)
            if x is _NOT_A_NUMBER:
                if k not in self.dropped_keys:
                    self.dropped_keys.add(k)
                    log.info("telemetry: metric %r is not a number (%s); not logged", k, type(v).__name__)
                continue
            numbers[k] = x
        numbers.pop(self.step_key, None)
        if "step" in numbers:  # a metric named "step" that is not the step key: keep it, renamed
            numbers["metrics/step"] = numbers.pop("step")
        if self._jsonl is not None:
            row = {"step": step, **{k: (x if _finite(x) else None) for k, x in numbers.items()}}
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            skipped = 0
            for k, x in numbers.items():
                if _finite(x):
                    self._tb.add_scalar(k, x, step)
                else:
                    skipped += 1
            if skipped:
                self.nonfinite_skipped += skipped
                self._tb.add_scalar("telemetry/nonfinite_skipped", self.nonfinite_skipped, step)
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)
        if self.console_every and self.calls % self.console_every == 0:
            self._console(self.summary_line(step, numbers))

    def summary_line(self, step: int, numbers: Mapping[str, Any]) -> str:
        """The console line for one step's numeric metrics."""
        parts = [f"step {step}"]
        for label, keys in self.console_keys:
            k = next((k for k in keys if k in numbers), None)
            if k is not None:
                parts.append(f"{label} {_fmt(numbers[k])}")
        times = [f"{k[5:]} {numbers[k]:.2f}s" for k in numbers if k.startswith("time/") and _finite(numbers[k])]
        if times:
            parts.append(" ".join(times))
        return " | ".join(parts)

    @staticmethod
    def _console(line: str) -> None:
        try:
            from tqdm import tqdm
        except ImportError:
            print(line, flush=True)
        else:
            tqdm.write(line)

    def log_samples(self, step: int, rows: Iterable[Mapping[str, Any]], *, tag: str = "samples") -> None:
        """Append sample rows (``prompt``, ``completion``, ``reward``, ...) at ``step`` to
        ``samples.jsonl``, TensorBoard (a markdown table under ``tag``) and W&B (a table)."""
        if not self.enabled:
            return
        if self._closed:
            raise RuntimeError(f"Telemetry({self.out_dir}) is closed")
        rows = [{str(k): jsonable(v) for k, v in r.items()} for r in rows]
        if not rows:
            return
        step = int(step)
        if self._jsonl is not None:
            if self._samples is None:
                self._samples = open(self._samples_path, "a", encoding="utf-8")
            for r in rows:
                self._samples.write(json.dumps({"step": step, **r}) + "\n")
            self._samples.flush()
        if self._tb is not None:
            self._tb.add_text(tag, _markdown_table(rows), step)
        if self._wandb is not None:
            import wandb

            cols: list[str] = []
            for r in rows:
                cols.extend(k for k in r if k not in cols)
            table = wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in rows])
            self._wandb.log({tag: table}, step=step)

    # ---------------------------------------------------------------- lifetime

    def flush(self) -> None:
        for f in (self._jsonl, self._samples):
            if f is not None:
                f.flush()
        if self._tb is not None:
            self._tb.flush()

    def _close_files(self) -> None:
        for f in (self._jsonl, self._samples):
            if f is not None:
                f.close()
        self._jsonl = self._samples = None

    def close(self) -> None:
        """Flush and close every writer (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._tb is not None:
                self._tb.close()
            if self._wandb is not None:
                self._wandb.finish()
        finally:
            self._close_files()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(out_dir: str | Path, key: str) -> list[dict]:
    """The lines of ``out_dir/metrics.jsonl`` that carry ``key``, one per step in step order; a
    step logged twice (a run resumed from a checkpoint before that step re-logs it) keeps its last
    line. A line that is not JSON raises with the file and line number."""
    path = Path(out_dir) / "metrics.jsonl"
    by_step: dict[int, dict] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
            if key in row:
                by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]

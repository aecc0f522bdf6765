"""Orbax checkpoints of a whole run, and clean exits on SIGTERM (TPU preemption).

A checkpoint holds the :class:`~jaxrl_llm.training.TrainState` (params, optimiser state, step,
RNG key data, skip counter) as arrays, and a JSON record with everything else a bit-exact
resume needs: the data iterator's state, the loop's own RNG and counters, the resolved
config and the metric history. Saves are asynchronous (training continues while the
arrays are written) and atomic: Orbax writes into a temporary directory and renames it when
complete, so a process killed in the middle of a save leaves the previous checkpoint as
the latest usable one. Retention: the last ``keep_last`` checkpoints, plus the
``keep_best`` best by a metric.

Restoring takes a *template* state (a freshly initialised one, or its
``jax.eval_shape``), so arrays come back with the template's dtypes and shardings, which
may belong to a different mesh than the one that saved them.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as cm

from jaxrl_llm.training.telemetry import jsonable

__all__ = ["Checkpointer", "PreemptionGuard", "UnreadableCheckpoint"]

log = logging.getLogger("jaxrl_llm")


class UnreadableCheckpoint(RuntimeError):
    """A committed checkpoint that cannot be read back (its one-line message names the step,
    the directory and the cause; ``cause``: the cause alone)."""

    def __init__(self, message: str, *, cause: str = ""):
        super().__init__(message)
        self.cause = cause or message


def _all_processes(ok: bool) -> bool:
    """Whether ``ok`` holds on every process (a collective when there are several)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.array([ok], np.int32))).all())


def _jsonable(x: Any) -> Any:
    # non-finite metrics stay floats in the history (a resumed run reports what it reported)
    return jsonable(x, strict=False)


def _root_cause(e: BaseException) -> str:
    """``Type: message`` of the innermost exception in ``e``'s chain, on one line (TensorStore's
    spec dumps cut off)."""
    seen = []
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    for x in reversed(seen):
        text = " ".join(str(x).split()).split(" See full TensorStore details")[0]
        if text:
            return f"{type(x).__name__}: {text[:400]}"
    return type(seen[-1]).__name__


def _silence_abandoned_reads() -> None:
    """From now on, drop the "Exception ignored" reports of Orbax's abandoned read coroutines
    (each array is read in its own coroutine; when one fails, the others that failed too print
    their tracebacks whenever they are collected, hundreds of lines saying what the warning
    said), and the "Event loop is closed" of the reads still in flight when Orbax gave up. Anything
    else still goes to the previous hook. Installed once, on the first failure."""
    previous = sys.unraisablehook
    if getattr(previous, "_jaxrl_llm_orbax_filter", False):
        return

    def hook(u):
        code = getattr(u.object, "cr_code", None)
        if (code is not None and "orbax" in code.co_filename
                and str(u.exc_value).startswith("Encountered error while reading")):
            return
        # the reads still in flight finish on TensorStore's threads after Orbax closed their loop
        if (u.object is None and isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed"
                and u.exc_traceback is not None and "call_soon_threadsafe" in {
                    f.name for f in traceback.extract_tb(u.exc_traceback)}):
            return
        previous(u)

    hook._jaxrl_llm_orbax_filter = True
    sys.unraisablehook = hook
    gc.collect()


class Checkpointer:
    """Save and restore runs in ``directory`` (one sub-directory per step).

    Args:
      directory: where checkpoints live (created).
      keep_last: how many of the most recent checkpoints to keep.
      keep_best: additionally keep this many best checkpoints by ``best_metric`` (0: off).
      best_metric: key of the ``metrics`` dict given to :meth:`save` (e.g. ``"eval/accuracy"``).
      best_mode: ``"max"`` or ``"min"``.
      async_save: write arrays in the background (call :meth:`wait` before reading them).
    """

    def __init__(self, directory: str | os.PathLike, *, keep_last: int = 3, keep_best: int = 0,
                 best_metric: str | None = None, best_mode: str = "max", async_save: bool = True):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        if keep_best and best_metric is None:
            raise ValueError("keep_best needs best_metric (the metrics key to rank checkpoints by)")
        if best_mode not in ("max", "min"):
            raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
        self.directory = Path(directory).absolute()
        policies: list[Any] = [cm.LatestN(n=keep_last)]
        if keep_best:
            sign = 1.0 if best_mode == "max" else -1.0
            policies.append(cm.BestN(get_metric_fn=lambda m: sign * float(m[best_metric]), reverse=False, n=keep_best,
                                     keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            create=True, enable_async_checkpointing=async_save, cleanup_tmp_directories=True,
            preservation_policy=cm.AnyPreservationPolicy(policies))
        self._mgr = ocp.CheckpointManager(self.directory, options=options)
        self.best_metric = best_metric

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._mgr.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._mgr.all_steps())

    def save(self, step: int, state: Any, *, data_state: Any = None, loop: dict | None = None,
             config: Any = None, history: list | None = None, metrics: dict | None = None) -> None:
        """Save ``state`` (arrays) and the JSON record at ``step`` (asynchronously)."""
        record = {"data_state": _jsonable(data_state), "loop": _jsonable(loop or {}), "config": _jsonable(config),
                  "history": _jsonable(history or [])}
        if self.best_metric is not None and (metrics is None or self.best_metric not in metrics):
            metrics = None  # ranked only when the metric is there
        self._mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     record=ocp.args.JsonSave(record)),
                       metrics=None if metrics is None else {k: float(v) for k, v in metrics.items()})

    def restore(self, template: Any, step: int | None = None, *,
                apply: Callable[[Any, dict], None] | None = None) -> tuple[Any, dict]:
        """``(state, record)`` of ``step``; ``template`` gives the tree, dtypes and shardings of
        the state (concrete arrays or ``jax.ShapeDtypeStruct``).

        Without ``step``: the newest *readable* checkpoint. The steps are tried newest first;
        reading a step means its arrays, its record and ``apply(state, record)`` (a trainer
        putting them in place), so the state comes from one step or none. When an older step
        reads, each newer one that did not (a truncated or missing array file, missing
        metadata, a missing item directory, an unparsable record) is reported in one warning
        naming the step and the cause, and moved aside to ``<step>.unreadable`` (kept for
        inspection, out of the way of that step's next save); the older step's ``apply`` has
        overwritten whatever a failed one set. When no step reads (a template that does not
        fit, e.g. another model or recipe, fails every step alike) nothing is moved and
        :class:`UnreadableCheckpoint` gives each step's cause in one line. With several
        processes a step counts as read only if every process read it. With ``step``: that
        step, or :class:`UnreadableCheckpoint`.
        """
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), template)
        if step is not None:
            return self._restore_step(step, abstract, apply)
        steps = sorted(self.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        failed: list[tuple[int, str]] = []
        for s in steps:
            try:
                out = self._restore_step(s, abstract, apply)
            except UnreadableCheckpoint as e:
                failed.append((s, e.cause))
                continue
            for bad, cause in failed:  # an older step reads: the newer ones are damaged
                aside = self._move_aside(bad)
                where = f"moved to {aside}" if aside is not None else "its directory is gone"
                log.warning("checkpoint step %d in %s is unreadable: %s; %s; resuming from step %d", bad,
                            self.directory, cause, where, s)
            return out
        causes = "; ".join(f"step {s}: {c[:200]}" for s, c in failed)
        raise UnreadableCheckpoint(f"no checkpoint in {self.directory} could be read (all left in place): {causes}",
                                   cause=failed[0][1])

    def _restore_step(self, step: int, abstract: Any, apply: Callable[[Any, dict], None] | None) -> tuple[Any, dict]:
        path = self.directory / str(step)
        cause = None
        if not path.is_dir():
            cause = f"{path} is missing"
        else:
            try:
                out = self._mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                      record=ocp.args.JsonRestore()))
                state, record = out["state"], out["record"]
                if not isinstance(record, dict) or not {"data_state", "loop", "history"} <= set(record):
                    raise ValueError(f"the record holds {sorted(record) if isinstance(record, dict) else type(record)}")
                if apply is not None:
                    apply(state, dict(record))
            except Exception as e:  # noqa: BLE001 - reported in one line with its root cause (debug log: traceback)
                log.debug("reading checkpoint step %d failed", step, exc_info=True)
                cause = _root_cause(e)
        if cause is not None:
            _silence_abandoned_reads()
        if not _all_processes(cause is None):
            cause = cause or "another process could not read it"
        if cause is not None:
            raise UnreadableCheckpoint(f"checkpoint step {step} in {self.directory} is unreadable: {cause}", cause=cause)
        return state, dict(record)

    def _move_aside(self, step: int) -> Path | None:
        """Rename a damaged step's directory to ``<step>.unreadable`` (``.unreadable-2``, ... when
        taken; the primary process renames, every process names the same place) and forget the
        step. None if its directory is gone."""
        src = self.directory / str(step)
        exists = src.exists()
        dest = self.directory / f"{step}.unreadable"
        k = 1
        while dest.exists():
            k += 1
            dest = self.directory / f"{step}.unreadable-{k}"
        several = jax.process_count() > 1
        if several:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"jaxrl_llm checkpoint {step}: named")
        if exists and jax.process_index() == 0:
            src.rename(dest)
        if several:
            multihost_utils.sync_global_devices(f"jaxrl_llm checkpoint {step}: moved aside")
        self._mgr.reload()
        return dest if exists else None

    def wait(self) -> None:
        """Block until pending asynchronous saves are complete."""
        self._mgr.wait_until_finished()

    def close(self) -> None:
        self._mgr.wait_until_finished()
        self._mgr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PreemptionGuard:
    """Turns SIGTERM (a TPU VM's preemption notice, ``kill``) into a flag the training loop
    checks after each step: it then saves a checkpoint and exits cleanly instead of dying
    mid-step. On several hosts, :meth:`should_stop` agrees across processes (any host
    signalled -> all stop at the same step). Use as a context manager; the previous handler
    is restored on exit."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)):
        self.signals = signals
        self._flag = threading.Event()
        self._previous: dict[int, Any] = {}

    def _handler(self, signum, frame):
        self._flag.set()

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

    @property
    def requested(self) -> bool:
        return self._flag.is_set()

    def should_stop(self) -> bool:
        """Whether any process received the signal (a collective when there are several)."""
        return not _all_processes(not self.requested)

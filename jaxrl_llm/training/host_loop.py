"""The host side of a training run, shared by the offline trainers: one ``step()`` per batch,
evaluation every N steps, logging, checkpoints every N steps / on SIGTERM / at the end, and
an exact resume (train state, data-iterator state and metric history).

A subclass implements :meth:`HostLoop.step` (one update; returns its metrics) and gets
:meth:`~HostLoop.run`, :meth:`~HostLoop.save` and :meth:`~HostLoop.restore`. The checkpoint
record has the layout of :class:`~jaxrl_llm.training.RLTrainer`'s (``data_state``, ``loop =
{iteration, seed}``, ``config``, ``history``), so the two kinds of runs restore alike; a loop
that checkpoints more than its train state overrides :meth:`~HostLoop.checkpoint_state` and
:meth:`~HostLoop.load_checkpoint_state`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxrl_llm.training.checkpoint import Checkpointer, PreemptionGuard

__all__ = ["HostLoop", "compile_counter", "use_compile_cache"]

_COMPILES = [0, 0.0, 0]  # programs built in this process, their seconds, how many came from the persistent cache
_LISTENING = []


def use_compile_cache(path: str) -> str | None:
    """Turn on JAX's persistent compilation cache in ``path`` (``run.compile_cache``) unless a
    cache is configured already; returns the directory in use (``None``: off). Every program is
    kept, however fast it compiled (a warm run then compiles nothing it compiled before)."""
    import logging
    import os

    current = jax.config.jax_compilation_cache_dir
    if current or not path:
        return current or None
    directory = os.path.expanduser(path)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:  # an unwritable home: the run goes on without the cache, and says so
        logging.getLogger("jaxrl_llm").warning("run.compile_cache=%s: cannot create it (%s); compiling without "
                                               "the persistent cache", path, e)
        return None
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return directory


def compile_counter() -> tuple[int, float, int]:
    """``(programs, seconds, cache_hits)``: the XLA programs this process has built so far
    (compiled, or read from the persistent compilation cache), the seconds that took, and how
    many were read from the cache. ``programs - cache_hits`` were compiled. The first call
    starts the count (``jax.monitoring`` listeners)."""
    if not _LISTENING:
        def on_duration(name: str, duration: float, **kw: Any) -> None:
            if name == "/jax/core/compile/backend_compile_duration":  # wraps compile-or-read-the-cache
                _COMPILES[0] += 1
                _COMPILES[1] += duration

        def on_event(name: str, **kw: Any) -> None:
            if name == "/jax/compilation_cache/cache_hits":
                _COMPILES[2] += 1

        jax.monitoring.register_event_duration_secs_listener(on_duration)
        jax.monitoring.register_event_listener(on_event)
        _LISTENING.append((on_duration, on_event))
    return _COMPILES[0], _COMPILES[1], _COMPILES[2]


class HostLoop:
    """Base of a host training loop (see the module docstring).

    Args:
      graphdef: the model's graph (``nnx.split``); ``state.params`` are its trained params.
      state: the initial :class:`~jaxrl_llm.training.TrainState`.
      train_step: from :func:`~jaxrl_llm.training.make_train_step`.
      data: a checkpointable iterator (``next``, ``get_state``, ``set_state``), e.g. a
        :class:`~jaxrl_llm.data.DataIterator`.
      seed: the run's seed (stored with checkpoints).
      frozen: further state parts for ``nnx.merge`` (e.g. frozen base weights under LoRA).
      checkpointer, checkpoint_every: save every N steps (and on SIGTERM and at the end).
      eval_fn, eval_every: ``eval_fn(params, *frozen) -> dict`` of metrics every N steps.
      log_fn: called with each step's metrics dict.
      config: the resolved run config, stored with checkpoints.
    """

    #: the metric shown next to the progress bar
    progress_metric = "loss"
    #: the progress bar's label
    progress_desc = "train"

    def __init__(self, graphdef: Any, state: Any, train_step: Callable, data: Any, *, seed: int = 0,
                 frozen: tuple = (), checkpointer: Checkpointer | None = None, checkpoint_every: int = 0,
                 eval_fn: Callable[..., dict] | None = None, eval_every: int = 0,
                 log_fn: Callable[[dict], None] | None = None, config: Any = None):
        if checkpoint_every < 0 or eval_every < 0:
            raise ValueError(f"checkpoint_every and eval_every must be >= 0, got {checkpoint_every}, {eval_every}")
        self.graphdef, self.state, self.train_step, self.data = graphdef, state, train_step, data
        self.seed, self.frozen = seed, tuple(frozen)
        self.checkpointer, self.checkpoint_every = checkpointer, checkpoint_every
        self.eval_fn, self.eval_every, self.log_fn, self.config = eval_fn, eval_every, log_fn, config
        self.history: list[dict] = []
        self.iteration = 0  # batches consumed

    # ------------------------------------------------------------------ one step

    def step(self) -> dict:
        """One update; returns its metrics (:meth:`run` appends them to ``history``)."""
        raise NotImplementedError

    def train_on(self, arrays: dict, tokens: int, metrics: dict) -> dict:
        """Run the train step on ``arrays`` and complete ``metrics`` (which holds the timings
        so far) with the step's metrics, ``time/update``, ``tokens`` and ``tokens_per_s``
        (``tokens`` real tokens over the time spent since the data arrived)."""
        t0 = time.perf_counter()
        self.state, m = self.train_step(self.state, arrays, *self.frozen)
        m = jax.device_get(m)
        metrics["time/update"] = time.perf_counter() - t0
        self.iteration += 1
        busy = sum(v for k, v in metrics.items() if k.startswith("time/") and k != "time/data")
        out: dict[str, Any] = {"step": int(self.state.step), "iteration": self.iteration}
        out.update({k: float(np.asarray(v)) for k, v in m.items()})
        out.update(tokens=tokens, tokens_per_s=tokens / max(busy, 1e-9))
        out.update(metrics)
        return out

    # ------------------------------------------------------------------ the run

    def checkpoint_state(self) -> Any:
        """The arrays a checkpoint holds (the train state; a subclass may add e.g. a critic's)."""
        return self.state

    def load_checkpoint_state(self, state: Any) -> None:
        """Put restored arrays (of :meth:`checkpoint_state`'s structure) back in place."""
        self.state = state

    def data_state(self) -> Any:
        """The data iterator's state a checkpoint records (a loop that reads ahead returns the
        state before what it has read ahead)."""
        return self.data.get_state()

    def loop_state(self) -> dict:
        """JSON-able loop state a subclass adds to the checkpoint record (besides the counters)."""
        return {}

    def load_loop_state(self, record: dict) -> None:
        """Put :meth:`loop_state`'s entries of a restored record back in place."""

    def save(self, metrics: dict | None = None) -> None:
        """Checkpoint the train state, the data iterator's state and the history."""
        if self.checkpointer is None:
            return
        self.checkpointer.save(self.iteration, self.checkpoint_state(), data_state=self.data_state(),
                               loop={"iteration": self.iteration, "seed": self.seed, **self.loop_state()},
                               config=self.config,
                               history=self.history, metrics=metrics)

    def restore(self) -> bool:
        """Resume from the newest readable checkpoint, if any; True if one was restored. A damaged
        newest checkpoint is reported in one warning and the next older one is used
        (:meth:`Checkpointer.restore`); the arrays, the data iterator, the counters, every part's
        loop state and the history come from one step."""
        if self.checkpointer is None or self.checkpointer.latest_step() is None:
            return False

        def apply(state, record):
            self.load_checkpoint_state(state)
            self.data.set_state(record["data_state"])
            self.iteration = int(record["loop"]["iteration"])
            self.load_loop_state(record["loop"])
            self.history = list(record["history"])

        self.checkpointer.restore(self.checkpoint_state(), apply=apply)
        return True

    def run(self, steps: int, *, progress: bool = False) -> list[dict]:
        """Train until ``steps`` steps are done (counting those of a resumed run); SIGTERM
        saves a checkpoint and returns early. Returns the history."""
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=steps, initial=self.iteration, desc=self.progress_desc, dynamic_ncols=True)
        t_run, first = time.perf_counter(), True
        with PreemptionGuard() as guard:
            while self.iteration < steps:
                n0, s0, h0 = compile_counter()
                metrics = self.step()
                n1, s1, h1 = compile_counter()
                # programs compiled in this step (after the first step and a new prompt bucket: 0), those
                # read from the persistent compilation cache instead, and the seconds of both
                metrics["time/compiles"] = float((n1 - n0) - (h1 - h0))
                metrics["time/compile_cache_hits"] = float(h1 - h0)
                metrics["time/compile"] = s1 - s0
                if first:  # this process's first step, compilation included (shorter from a warm compile cache)
                    metrics["time/to_first_step"] = time.perf_counter() - t_run
                    first = False
                if self.eval_fn is not None and self.eval_every and self.iteration % self.eval_every == 0:
                    metrics.update(self.eval_fn(self.state.params, *self.frozen))
                self.history.append(metrics)
                if self.log_fn is not None:
                    self.log_fn(metrics)
                if bar is not None:
                    bar.update(1)
                    if self.progress_metric in metrics:
                        bar.set_postfix({self.progress_metric: f"{metrics[self.progress_metric]:.4g}"})
                stop = guard.should_stop()
                if self.checkpointer is not None and (
                        stop or self.iteration == steps
                        or (self.checkpoint_every and self.iteration % self.checkpoint_every == 0)):
                    self.save({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
                if stop:
                    break
        if bar is not None:
            bar.close()
        if self.checkpointer is not None:
            self.checkpointer.wait()
        return self.history

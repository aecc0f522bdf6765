"""``rollout.asynchronous``: the next step's first sampling round runs in a background thread
(on the sampler's own devices) while this step's update runs."""

from __future__ import annotations

import concurrent.futures
import time

import jax

from jaxrl_llm.training.parts.base import Clash, LoopPart, Need, loop_part
from jaxrl_llm.training.rounds import take_rollout_rows

__all__ = ["Asynchronous"]

_STATS = "the prompt statistics of the step still being trained (run it synchronously)"


@loop_part
class Asynchronous(LoopPart):
    """Reads the next step's data batch and starts its rollout before this step's update, with
    the policy that step samples with (a stale one); the next step takes it as its first round."""

    key = "rollout.asynchronous"
    phases = frozenset({"sample", "update", "after_update"})
    requires = (Need("stale_policy", "set rollout.staleness >= 1 (the rollout of the next step is sampled during this "
                                     "step's update, with the policy from before it)"),
                Need("one_process", "run it in one process (a background sampling thread and the trainer's "
                                    "collectives could interleave differently on each host)"))
    conflicts = (Clash("recipe.selector", f"the next step is sampled before this one is observed, and a selector reads "
                                          f"{_STATS}"),
                 Clash("recipe.allocator", f"the next step is sampled before this one is observed, and an allocator "
                                           f"reads {_STATS}"),
                 Clash("episodes", "the agent loop plays episodes synchronously"))

    def __init__(self):
        self.name = "true"
        self.pool = None
        self.pending: tuple | None = None  # (iteration, batch, future) of the read-ahead rollout
        self.interval = (0.0, 0.0)
        self._u0 = 0.0

    @classmethod
    def from_run(cls, run):
        return cls() if run.asynchronous else None

    def sample(self, ctx, rnd):
        """Round 0 of a step whose rollout was read ahead: that batch and rollout, with the overlap
        of its sampling and the last update (wall-clock intervals) in the step's timings."""
        if rnd.index or self.pending is None:
            return rnd
        it, batch, fut = self.pending
        self.pending, ctx.data_state_ahead = None, None
        if it != ctx.iteration:
            raise RuntimeError(f"internal: a rollout read ahead for iteration {it} taken at {ctx.iteration}")
        t = ctx.timings
        wait0 = time.perf_counter()
        roll, start, end = fut.result()
        u0, u1 = self.interval
        t["time/rollout"] += time.perf_counter() - wait0
        t["async/wait_s"] = time.perf_counter() - wait0
        t["async/sample_s"] = end - start
        t["async/overlap_s"] = max(0.0, min(end, u1) - max(start, u0))
        t["async/sample_start"], t["async/sample_end"] = start, end
        t["async/update_start"], t["async/update_end"] = u0, u1
        rnd.batch, rnd.roll, rnd.ahead = batch, roll, True
        return rnd

    def update(self, ctx, plan):
        """Start sampling the next step's first round (its data batch is drawn now, in order)."""
        params = ctx.parts.provider("stale_policy").upcoming()
        if self.pool is None:
            self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxrl-sampler")
        it = ctx.iteration + 1
        ctx.data_state_ahead = ctx.data.get_state()
        batch = ctx.next_batch(0)
        key = ctx.round_key(jax.random.split(ctx.rollout_key(it))[0], 0)
        sampler, frozen = ctx.sampler, ctx.frozen

        def work():
            start = time.time()
            roll = take_rollout_rows(sampler(params, batch.prompt_ids, key, *frozen))  # wait here, not in the trainer
            return roll, start, time.time()
        self.pending = (it, batch, self.pool.submit(work))
        self._u0 = time.time()
        return plan

    def after_update(self, ctx, step):
        self.interval = (self._u0, time.time())
        return step

    def restored(self, ctx):
        self.pending, ctx.data_state_ahead = None, None  # a read-ahead rollout of the state being replaced

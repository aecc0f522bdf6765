"""Experience replay into sampled groups: earlier successes put back where a group collapsed.

With ``recipe.replay=<name>`` the RL loop calls the part once per sampling round, after the
round is scored (and truncated) and before its rewards are shaped. The part sees each group's
prompt key, every row's outcome value and its buffer (a JSON-able dict in the run's prompt
store, checkpointed with it), and returns which rows to replace by which stored responses and
the new buffer. The replaced rows train on the stored response (its tokens, its reward and
reward components; the sampler's log-probs of the policy that produced it become the row's
``rollout_logp``); the prompt statistics, the reward metrics and the buffer itself see the
round as sampled. A replay part requires ``recipe.old_logp=recompute``: the ratio's old policy
is then the current one for every row (as in ARPO), and ``recipe.is_weights`` can correct for
the stored behaviour policy if wanted.

A part is ``fn(x: ReplayInputs, **params) -> (replace {row: entry}, new buffer, metrics)``;
entries are what :meth:`ReplayInputs.entry` returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from jaxrl_llm.algorithms.registry import Part, new_registry

__all__ = ["ReplayInputs", "REPLAYS"]


@dataclasses.dataclass(frozen=True)
class ReplayInputs:
    """What a replay part sees for one sampling round (host values).

    ``keys`` the groups' prompt keys; ``values`` ``[N]`` each row's outcome (the reward total,
    or the reward function named by the part's ``metric``, "does not apply" counting 0);
    ``group_ids`` ``[N]``; ``rng`` a NumPy generator of (seed, iteration, round);
    ``buffer`` the part's state (a copy: return the new one); ``entry(i)`` the storable record
    of row ``i`` (``{"ids", "logprobs", "length", "stopped", "total", "per_fn", "step"}``:
    the response's token ids and the sampler's log-probs up to its length, its reward total and
    components, the iteration it was sampled at); ``step`` the iteration."""

    keys: tuple[str, ...]
    values: np.ndarray
    group_ids: np.ndarray
    rng: np.random.Generator
    buffer: dict
    entry: Callable[[int], dict]
    step: int


REPLAYS = new_registry("replay", "recipe.replay",
                       "fn(x: ReplayInputs, **params) -> ({row: entry}, new buffer, metrics)")


def _none(x: ReplayInputs):
    return {}, x.buffer, {}


REPLAYS.register(Part("none", _none, note="no replay"))


def arpo(x: ReplayInputs, *, capacity: int = 8, success_threshold: float = 0.1, collapse_std: float = 0.05,
         collapse_mean: float = 0.2, metric: str | None = None):
    """ARPO's replay (arXiv:2505.16282; dvlab-research/ARPO @7489ae3, ``verl/trainer/replay_buffer.py``
    and ``ray_trainer.apply_replay``): per prompt a FIFO buffer of at most ``capacity`` successful
    responses (outcome ``> success_threshold``). A group whose outcomes have population std below
    ``collapse_std`` and mean below ``collapse_mean`` (all failed) gets its **first** row replaced by
    one response drawn uniformly from the prompt's buffer (when it has one); all-success groups are
    never touched. The buffer is updated afterwards from the round as sampled, so a success is
    replayed from the next step on and a replayed response is never stored again. ``metric``:
    (our generalisation) a reward function's name to read the outcome from, as ARPO reads the
    environment's score without its format reward; default the reward total."""
    del metric  # read by the loop (the values it passes)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"recipe.replay.capacity must be an int >= 1, got {capacity!r}")
    buf = {k: list(v) for k, v in x.buffer.items()}
    vals = np.nan_to_num(np.asarray(x.values, np.float64), nan=0.0)
    gid = np.asarray(x.group_ids)
    replace: dict[int, dict] = {}
    collapsed = 0
    for g, key in enumerate(x.keys):
        rows = np.flatnonzero(gid == g)
        if not rows.size:
            continue
        v = vals[rows]
        if v.std() < collapse_std and v.mean() < collapse_mean:
            collapsed += 1
            stored = buf.get(key)
            if stored:
                replace[int(rows[0])] = dict(stored[int(x.rng.integers(len(stored)))])
    for g, key in enumerate(x.keys):
        for i in np.flatnonzero((gid == g) & (vals > success_threshold)):
            lst = buf.setdefault(key, [])
            lst.append(x.entry(int(i)))
            if len(lst) > capacity:
                lst.pop(0)
    return replace, buf, {"replay/collapsed_groups": float(collapsed), "replay/injected": float(len(replace)),
                          "replay/buffer_prompts": float(len(buf)),
                          "replay/buffer_responses": float(sum(len(v) for v in buf.values()))}


REPLAYS.register(Part(
    "arpo", arpo, paper="ARPO: End-to-End Policy Optimization for GUI Agents with Experience Replay (Lu et al.), "
                        "arXiv:2505.16282", methods=(27,), verified="hand values (the authors' code's rules)",
    tests="tests/training/test_replay.py",
    note="the authors' code (dvlab-research/ARPO @7489ae3): FIFO buffer of 8 successes (outcome > 0.1) per prompt; "
         "a group with outcome std < 0.05 and mean < 0.2 has its first row replaced by a random stored success; "
         "old log-probs recomputed (no off-policy weight); metric=<reward function> reads the outcome from one "
         "reward (ARPO: the environment score, not the format reward)"))


def entry_of(roll, out, i: int, step: int) -> dict:
    """The storable record of row ``i`` of a rollout and its rewards (JSON-able, exact)."""
    n = int(np.asarray(roll.lengths)[i])
    return {"ids": [int(t) for t in np.asarray(roll.tokens)[i][:n]],
            "logprobs": [float(v) for v in np.asarray(roll.logprobs)[i][:n]],
            "length": n, "stopped": bool(np.asarray(roll.stopped)[i]), "total": float(np.asarray(out.total)[i]),
            "per_fn": {k: float(np.asarray(v)[i]) for k, v in out.per_fn.items()},
            "failed": {k: bool(np.asarray(v)[i]) for k, v in out.failed.items()}, "step": int(step)}


def apply_replacements(roll, out, replace: Mapping[int, dict]):
    """Copies of a rollout and its rewards with rows replaced by stored entries."""
    if not replace:
        return roll, out
    tokens = np.array(roll.tokens, copy=True)
    mask = np.array(roll.mask, copy=True)
    logprobs = np.array(roll.logprobs, copy=True)
    lengths = np.array(roll.lengths, copy=True)
    stopped = np.array(roll.stopped, copy=True)
    total = np.array(out.total, copy=True)
    per_fn = {k: np.array(v, copy=True) for k, v in out.per_fn.items()}
    failed = {k: np.array(v, copy=True) for k, v in out.failed.items()}
    width = tokens.shape[1]
    for i, e in replace.items():
        n = e["length"]
        if n > width or set(e["per_fn"]) != set(per_fn):
            raise ValueError(f"a replayed response of {n} tokens / rewards {sorted(e['per_fn'])} does not fit this run "
                             f"({width} new tokens, rewards {sorted(per_fn)}): start the buffer again")
        tokens[i] = 0
        tokens[i, :n] = e["ids"]
        mask[i] = np.arange(width) < n
        logprobs[i] = 0.0
        logprobs[i, :n] = e["logprobs"]
        lengths[i], stopped[i], total[i] = n, e["stopped"], e["total"]
        for k in per_fn:
            per_fn[k][i] = e["per_fn"][k]
            failed[k][i] = e["failed"].get(k, False)
    return (roll._replace(tokens=tokens, mask=mask, logprobs=logprobs.astype(np.asarray(roll.logprobs).dtype),
                          lengths=lengths, stopped=stopped),
            type(out)(total, per_fn, failed, out.metrics))

"""Sequence packing: rows of a padded batch laid out as segments of fixed-budget packed rows.

A padded batch wastes the padding of every row up to the longest; with long-tailed lengths (RL
responses of 200 to 20,000 tokens) most of a step's tokens can be padding. Packing is a batch
*layout*, not a model feature: each row's real tokens (one contiguous run: a left-padded prompt,
its completion, right padding) are copied into a packed row of ``budget`` tokens as a *segment*
(segment ids ``1, 2, ...``; ``0`` is padding), with positions restarting at 0, and the model
attends within segments (:mod:`jaxrl_llm.models.attn`). Rows are assigned to packed rows by
first-fit decreasing (largest first, each into the first packed row with room); ``ways`` packed
rows (one per device the batch is split over) make one micro-batch.

Everything per row stays in the row layout: per-token arrays (``loss_mask``, ``old_logp``,
``advantages`` ... ``[N, L - 1]``, target-aligned) and per-row arrays (``scores``, ``group_ids``
... ``[N]``) are copied into the micro-batch's row slots ``[ways * slots, ...]`` (bin-major, so a
device's slots are its own packed row's segments; empty slots are zeros: no token, no weight),
and ``packed_index [ways * slots, L - 1]`` says where in its packed row each target sits (-1 where a
row has no real target: padding, an empty slot). A
forward pass on the packed tokens gathers its log-probs back into the row layout
(:func:`jaxrl_llm.training.objectives.policy_logprobs`), so every loss, aggregation mode and
normaliser reads the same arrays as without packing (exact up to float summation order).

The same layout as verl's remove-padding with dynamic batch size (``use_remove_padding``,
``ppo_max_token_len_per_gpu``) and tunix's ``pack_sequences`` (first-fit decreasing into a
per-device token budget); written here for JAX's static shapes: the number of row slots per
packed row is rounded up to a power of two, so a run compiles a handful of shapes.
"""

from __future__ import annotations

import dataclasses
import numpy as np

__all__ = ["PackLayout", "row_runs", "first_fit_decreasing", "plan_packing", "pack_microbatches",
           "unpack_rows", "PACKED_KEYS"]

#: the micro-batch keys that describe the packed rows (everything else is in the row layout)
PACKED_KEYS = ("packed_tokens", "packed_segments", "packed_positions", "packed_index", "packed_valid")


def row_runs(mask: np.ndarray, *, what: str = "batch") -> tuple[np.ndarray, np.ndarray]:
    """``(first, length)`` of each row's run of real tokens; raises if a row's real tokens are
    not one contiguous run (packing would change what its tokens attend to)."""
    m = np.asarray(mask, bool)
    n = m.sum(axis=1).astype(np.int64)
    first = np.where(n > 0, m.argmax(axis=1), 0).astype(np.int64)
    idx = np.arange(m.shape[1])[None]
    run = (idx >= first[:, None]) & (idx < (first + n)[:, None])
    bad = np.nonzero((run != m).any(axis=1))[0]
    if len(bad):
        raise ValueError(f"packing: row {int(bad[0])} of the {what} has real tokens that are not one contiguous run "
                         "(mask with holes); pack rows of left/right padding only")
    return first, n


def first_fit_decreasing(lengths: np.ndarray, budget: int, key: str = "train.max_tokens_per_microbatch"
                         ) -> list[list[int]]:
    """Bins of row indices whose lengths sum to at most ``budget`` each: rows taken longest first
    (ties by index), each into the first bin with room. Rows of length 0 go into no bin. ``key``:
    the setting the budget comes from (named by the error of a row longer than it)."""
    lengths = np.asarray(lengths, np.int64)
    if len(lengths) and int(lengths.max()) > budget:
        r = int(lengths.argmax())
        raise ValueError(f"packing: row {r} has {int(lengths[r])} tokens, more than the budget of {budget} tokens per "
                         f"packed row ({key})")
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = int(lengths[i])
        if n == 0:
            continue
        for b, r in enumerate(room):
            if r >= n:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(budget - n)
    return bins


@dataclasses.dataclass(frozen=True)
class PackLayout:
    """Where every row goes: ``bins[b]`` lists the rows of packed row ``b`` in order; micro-batch
    ``m`` holds packed rows ``m * ways ... m * ways + ways - 1`` (missing ones empty); each packed
    row has ``slots`` row slots (a power of two >= its most rows). A *row* may be a unit of
    ``seqs`` sequences (a preference pair: chosen and rejected), packed side by side into one
    packed row, each its own segment."""

    budget: int
    ways: int
    slots: int
    bins: tuple[tuple[int, ...], ...]
    first: np.ndarray  # [N, seqs] start of each sequence's real tokens
    length: np.ndarray  # [N, seqs] its number of real tokens
    num_rows: int
    row_width: int  # L: the padded sequences' width
    seqs: int | None = None  # sequences per row (None: a row is one sequence, mask [N, L])

    @property
    def num_microbatches(self) -> int:
        return max(1, -(-len(self.bins) // self.ways))

    @property
    def padding_fraction(self) -> float:
        """Share of the packed tokens that are padding."""
        total = self.num_microbatches * self.ways * self.budget
        return 1.0 - float(self.length.sum()) / total if total else 0.0


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def plan_packing(mask: np.ndarray, budget: int, ways: int = 1, *, min_slots: int = 1,
                 key: str = "train.max_tokens_per_microbatch") -> PackLayout:
    """The :class:`PackLayout` of a padded batch's ``mask [N, L]`` (or ``[N, k, L]``: rows of ``k``
    sequences kept together, e.g. preference pairs): ``budget`` tokens per packed row, ``ways``
    packed rows per micro-batch (``key``: the setting the budget comes from)."""
    if budget < 2:
        raise ValueError(f"packing: the budget must be >= 2 tokens per packed row, got {budget}")
    if ways < 1:
        raise ValueError(f"packing: ways must be >= 1, got {ways}")
    m = np.asarray(mask, bool)
    seqs = None if m.ndim == 2 else int(m.shape[1])
    first, length = row_runs(m.reshape(-1, m.shape[-1]))
    k = seqs or 1
    first, length = first.reshape(m.shape[0], k), length.reshape(m.shape[0], k)
    bins = first_fit_decreasing(length.sum(axis=1), budget, key)
    slots = _pow2(max([len(b) for b in bins] + [min_slots, 1]))
    return PackLayout(int(budget), int(ways), slots, tuple(tuple(b) for b in bins), first, length,
                      int(m.shape[0]), int(m.shape[-1]), seqs)


def pack_microbatches(batch: dict[str, np.ndarray], layout: PackLayout, *, tokens_key: str = "tokens",
                      drop: tuple[str, ...] = ("tokens", "mask")) -> list[dict[str, np.ndarray]]:
    """The micro-batches of ``batch`` (host arrays, leading dimension ``N``) under ``layout``.

    Each micro-batch has ``packed_tokens``, ``packed_segments`` (0 = padding), ``packed_positions``
    ``[ways, budget]``, ``packed_index [ways * slots, L - 1]`` (``[ways * slots, k, L - 1]`` for rows
    of ``k`` sequences), ``packed_valid [ways * slots]`` (the slot holds a row) and every other array
    of ``batch`` (but ``drop``) in the row layout ``[ways * slots, ...]``, empty slots zero."""
    tokens = np.asarray(batch[tokens_key])
    n, width = tokens.shape[0], tokens.shape[-1]
    want = (layout.num_rows,) + ((layout.seqs,) if layout.seqs else ()) + (layout.row_width,)
    if tokens.shape != want:
        raise ValueError(f"packing: the batch's tokens are {tokens.shape}, the layout was planned for {want}")
    toks3 = tokens.reshape(n, layout.seqs or 1, width)
    k_seq = layout.seqs or 1
    w, s, budget = layout.ways, layout.slots, layout.budget
    rows = {k: np.asarray(v) for k, v in batch.items() if k not in drop}
    for k, v in rows.items():
        if v.ndim == 0 or v.shape[0] != n:
            raise ValueError(f"packing: batch[{k!r}] has shape {v.shape}; every array needs the {n} rows first")
    out = []
    for m in range(layout.num_microbatches):
        toks = np.zeros((w, budget), np.int32)
        seg = np.zeros((w, budget), np.int32)
        pos = np.zeros((w, budget), np.int32)
        index = np.full((w * s, k_seq, width - 1), -1, np.int32)  # -1: no target of a real token there
        take = np.full(w * s, -1, np.int64)  # the batch row in each slot (-1: empty)
        for j in range(w):
            b = m * w + j
            if b >= len(layout.bins):
                continue
            off, segment = 0, 0
            for k, r in enumerate(layout.bins[b]):
                for q in range(k_seq):
                    f, ln = int(layout.first[r, q]), int(layout.length[r, q])
                    if ln == 0:
                        continue
                    segment += 1
                    toks[j, off:off + ln] = toks3[r, q, f:f + ln]
                    seg[j, off:off + ln] = segment
                    pos[j, off:off + ln] = np.arange(ln)
                    # target t (token t + 1 from the hidden state at t): packed target off + t - f
                    t = np.arange(f, f + ln - 1)
                    index[j * s + k, q, t] = off + t - f
                    off += ln
                take[j * s + k] = r
        filled = take >= 0
        mb = {"packed_tokens": toks, "packed_segments": seg, "packed_positions": pos,
              "packed_index": index if layout.seqs else index[:, 0], "packed_valid": filled}
        for k, v in rows.items():
            x = np.zeros((w * s,) + v.shape[1:], v.dtype)
            x[filled] = v[take[filled]]
            mb[k] = x
        mb["_rows"] = take  # host bookkeeping (not sent to the device): which batch row each slot holds
        out.append(mb)
    return out


def unpack_rows(values: list[np.ndarray], microbatches: list[dict], num_rows: int) -> np.ndarray:
    """Row-layout results of each micro-batch (``[ways * slots, ...]``) back in the batch's row order
    ``[N, ...]`` (rows without real tokens, in no slot, get zeros)."""
    first = np.asarray(values[0])
    out = np.zeros((num_rows,) + first.shape[1:], first.dtype)
    for v, mb in zip(values, microbatches):
        take = mb["_rows"]
        filled = take >= 0
        out[take[filled]] = np.asarray(v)[filled]
    return out


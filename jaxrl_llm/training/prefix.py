"""Prefix Grouper in the update (``train.shared_prefix``): each prompt group's prompt is
encoded once per log-prob pass instead of once per completion.

The RL batch holds ``G`` completions of every prompt, each row ``[prompt | completion]``. A
row-by-row forward pass runs the prompt's ``P`` tokens through every layer ``G`` times; with
shared-prefix attention (:func:`jaxrl_llm.models.logprobs.shared_prefix_logprobs`, arXiv
2506.05433) they run once, and the completions attend to the prompt's keys/values. Values and
gradients are those of the row-by-row computation up to float rounding.

What the loop has to arrange is the row order: the train step sees blocks of ``r``
consecutive rows with one prompt in every micro-batch. :func:`plan_shared_prefix` picks ``r``
from the batch geometry, :func:`microbatch_order` orders a mini-batch's rows for the step's
strided micro-batch split, and :func:`check_blocks` verifies on the host, before every pass,
that each block's prompts are equal (the compiled step cannot check it).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["PrefixPlan", "plan_shared_prefix", "microbatch_order", "check_blocks", "block_rows"]


@dataclasses.dataclass(frozen=True)
class PrefixPlan:
    """How the rows of an update share their prompts.

    Attributes:
      rows_per_prompt: ``r``, rows per prompt block in every micro-batch of the train step.
      whole_groups: each micro-batch holds whole prompt groups (the loop reorders a mini-batch's
        rows for the strided split); ``False``: each holds ``G / n`` rows of every group.
      num_microbatches: the train step's micro-batches (``n``).
      batch_ways: devices the batch is split over (``data * fsdp``); ``r`` divides each device's
        rows, so no block spans two devices.
    """

    rows_per_prompt: int
    whole_groups: bool
    num_microbatches: int
    batch_ways: int = 1


def block_rows(group_size: int, rows: int, batch_ways: int = 1) -> int:
    """The largest block of consecutive rows of one prompt in a group-contiguous batch of
    ``rows`` rows split over ``batch_ways`` devices: ``gcd(G, rows / ways)``."""
    if rows % batch_ways:
        return 1
    return math.gcd(group_size, rows // batch_ways)


def plan_shared_prefix(group_size: int, groups_per_minibatch: int, num_microbatches: int,
                       batch_ways: int = 1) -> tuple[PrefixPlan | None, str]:
    """``(plan, "")``, or ``(None, why)`` when no block of two or more rows can share a prompt.

    Preferred: whole groups in every micro-batch (``groups_per_minibatch`` divisible by the
    micro-batches), blocks of ``gcd(G, rows per device)``; else ``G / n`` rows of every group
    per micro-batch (``G`` divisible by ``n``), blocks of ``gcd(G / n, rows per device)``.
    """
    g, u, n = int(group_size), int(groups_per_minibatch), int(num_microbatches)
    if g < 2:
        return None, f"one completion per prompt (num_samples={g}): no prompt is shared"
    if u % n == 0:
        rows = u // n * g
        r, whole = block_rows(g, rows, batch_ways), True
    elif g % n == 0:
        rows = u * (g // n)
        r, whole = block_rows(g // n, rows, batch_ways), False
    else:
        return None, (f"neither the {u} prompt groups per mini-batch nor the {g} samples per prompt divide into "
                      f"optim.num_microbatches={n}")
    if r < 2:
        return None, (f"a micro-batch of {rows} rows over {batch_ways} devices leaves no two rows of one prompt on "
                      f"a device")
    return PrefixPlan(r, whole, n, batch_ways), ""


def microbatch_order(rows: int, plan: PrefixPlan) -> np.ndarray:
    """The order of a group-contiguous mini-batch of ``rows`` rows in which the train step's
    strided split (micro-batch ``j`` = rows ``j, j + n, ...``) gives micro-batch ``j`` the
    ``j``-th contiguous run of whole groups. Identity when micro-batches take ``G / n`` rows of
    every group (the strided split of a group-contiguous batch already keeps them adjacent)."""
    n = plan.num_microbatches
    if not plan.whole_groups or n == 1:
        return np.arange(rows)
    return np.arange(rows).reshape(n, rows // n).T.reshape(-1)


def check_blocks(tokens: np.ndarray, mask: np.ndarray, prompt_len: int, rows_per_prompt: int,
                 num_microbatches: int = 1) -> str:
    """``""`` if every block of ``rows_per_prompt`` consecutive rows of every micro-batch (the
    strided split into ``num_microbatches``) has one prompt (tokens and mask of the first
    ``prompt_len`` columns, padding included), else a description of the first block that
    does not."""
    r, n = int(rows_per_prompt), int(num_microbatches)
    toks = np.asarray(tokens)[:, :prompt_len]
    msk = np.asarray(mask)[:, :prompt_len].astype(bool)
    if toks.shape[0] % (r * n):
        return f"{toks.shape[0]} rows do not split into {n} micro-batches of blocks of {r}"
    for j in range(n):
        t = toks[j::n].reshape(-1, r, prompt_len)
        m = msk[j::n].reshape(-1, r, prompt_len)
        bad = ~(np.all(t == t[:, :1], axis=(1, 2)) & np.all(m == m[:, :1], axis=(1, 2)))
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            return (f"micro-batch {j}: rows {b * r}..{b * r + r - 1} should share one prompt but their first "
                    f"{prompt_len} tokens differ")
    return ""

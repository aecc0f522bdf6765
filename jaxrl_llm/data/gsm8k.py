"""GSM8K-format datasets: rows ``{"question": ..., "answer": "<reasoning> #### <number>"}``.

The layout of openai/gsm8k (``main/train.jsonl`` from the original repository, or the HF
parquet files ``main/train-00000-of-00001.parquet``, or a ``save_to_disk`` folder). Nothing is
downloaded: point :func:`load_gsm8k` at the files you have.
"""

from __future__ import annotations

import os
from typing import Any

from jaxrl_llm.data.sources import WHERE, DataError, Malformed, open_source
from jaxrl_llm.rewards.math import gsm8k_gold

__all__ = ["GSM8KSource", "load_gsm8k", "GSM8K_SUFFIX"]

GSM8K_SUFFIX = "\nPut your final answer within \\boxed{}."


class GSM8KSource:
    """A source of RL/SFT rows from a GSM8K-format source: ``prompt`` (the question +
    ``suffix``), ``answer`` (the final number after ``####``, commas removed) and
    ``solution`` (the reasoning with the final answer boxed, for SFT). A row without
    ``question``/``answer`` or without ``####`` raises :class:`DataError` naming the file
    and line (or becomes a skipped :class:`Malformed` row with ``on_error="skip"``)."""

    def __init__(self, source: Any, suffix: str = GSM8K_SUFFIX, on_error: str = "raise"):
        self.source, self.suffix, self.on_error = source, suffix, on_error

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict | Malformed:
        rec = self.source[index]
        if isinstance(rec, Malformed):
            return rec
        where = rec.get(WHERE, "?")
        try:
            for k in ("question", "answer"):
                if k not in rec:
                    raise DataError(f"{where}: missing field {k!r} (GSM8K rows have 'question' and 'answer'; "
                                    f"the row has {sorted(x for x in rec if x != WHERE)})")
            try:
                gold = gsm8k_gold(rec["answer"])
            except ValueError as e:
                raise DataError(f"{where}: {e}") from None
        except DataError as e:
            if self.on_error == "skip":
                return Malformed(where, str(e))
            raise
        reasoning = rec["answer"].rsplit("####", 1)[0].strip()
        return {"prompt": rec["question"] + self.suffix, "answer": gold,
                "solution": f"{reasoning}\nThe answer is \\boxed{{{gold}}}.", WHERE: where}


def load_gsm8k(path: str | os.PathLike, *, split: str | None = None, suffix: str = GSM8K_SUFFIX,
               on_error: str = "raise") -> GSM8KSource:
    """A :class:`GSM8KSource` over a local GSM8K file or folder (see :func:`open_source`)."""
    return GSM8KSource(open_source(path, split=split, on_error=on_error), suffix=suffix, on_error=on_error)

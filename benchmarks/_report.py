"""Shared helpers of the benchmark scripts: machine description and docs/benchmarks.md sections."""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
HEADER = "# Benchmarks\n\nSide-by-side measurements; each section names its command.\n\n"


def machine() -> str:
    import jax

    return f"{platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__} ({jax.default_backend()})"


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def write_section(name: str, body: str) -> None:
    """Replace (or append) the ``## name`` section of docs/benchmarks.md."""
    section = f"## {name}\n\n{body.strip()}\n"
    text = DOC.read_text() if DOC.exists() else HEADER
    start = text.find(f"## {name}\n")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + ("" if end < 0 else text[end:])
    else:
        text = text.rstrip() + "\n\n" + section
    DOC.write_text(text)
    print(f"wrote section {name!r} of {DOC}")

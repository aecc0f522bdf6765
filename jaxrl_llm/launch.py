"""Process-level settings that must be in place before the interpreter starts.

XLA:CPU allocates every large temporary of a jitted step (activations, residuals, gradients:
gigabytes per GRPO update) with ``posix_memalign``. glibc serves an allocation above its mmap
threshold (at most 32 MiB) with a fresh ``mmap`` and returns it with ``munmap`` when freed, so each
step touches its working set again through 4 KiB page faults, each zeroing a page in the
kernel: measured on the 8.7M model's grouped update (shape (a) of docs/benchmarks.md) as 1.2
million faults and 3.6 s of system time in an 8.7 s step (``benchmarks/allocator_ab.py``).

glibc >= 2.35 can back those mappings with transparent huge pages (``GLIBC_TUNABLES=
glibc.malloc.hugetlb=1``: ``madvise(MADV_HUGEPAGE)`` on each mapping): 43 thousand faults,
1.9 s of system time and a 7.8 s step there.

Tunables are read once at start-up, so with ``JAXRL_LLM_HUGEPAGES=1`` the ``jaxrl-llm``
command re-executes itself with the tunable set (same pid, argv and environment plus the
tunable) before it imports anything heavy. It is opt-in: the main job (LoRA on SmolLM2, small
batches) ran slower with it, 372-382 s against 339 s (one machine, back to back), while large
updates gain. :func:`malloc_environment` says what it would set. A notebook or a script of your
own gets the same by exporting the variable before Python starts
(``export GLIBC_TUNABLES=glibc.malloc.hugetlb=1``).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

TUNABLE = "glibc.malloc.hugetlb"
OPT_IN = "JAXRL_LLM_HUGEPAGES"
_THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def _glibc_version() -> tuple[int, int] | None:
    name, version = platform.libc_ver()
    if name != "glibc":
        return None
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def _thp_mode(path: str = _THP) -> str | None:
    """The selected transparent-huge-page mode (``always``, ``madvise``, ``never``), or None."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def malloc_environment(environ: Mapping[str, str] | None = None, *, glibc: tuple[int, int] | None | str = "detect",
                       thp: str | None = "detect") -> dict[str, str] | None:
    """The environment to re-execute with so that glibc backs large allocations with huge pages,
    or None when there is nothing to do: not asked for (``JAXRL_LLM_HUGEPAGES`` unset or not 1), not glibc >= 2.35,
    transparent huge pages off (``never``) or unknown, or ``glibc.malloc.hugetlb`` already set
    (to any value: the user's choice wins)."""
    env = dict(os.environ if environ is None else environ)
    if env.get(OPT_IN, "0").strip().lower() not in ("1", "true", "yes", "on"):
        return None
    version = _glibc_version() if glibc == "detect" else glibc
    if version is None or version < (2, 35):
        return None
    mode = _thp_mode() if thp == "detect" else thp
    if mode not in ("always", "madvise"):
        return None
    current = env.get("GLIBC_TUNABLES", "")
    if any(item.split("=", 1)[0] == TUNABLE for item in current.split(":") if item):
        return None
    env["GLIBC_TUNABLES"] = f"{current}:{TUNABLE}=1" if current else f"{TUNABLE}=1"
    return env


def reexec_with_hugepages() -> None:
    """Replace this process with the same command under :func:`malloc_environment`, when it
    returns one. Call it first thing in a program's entry point (nothing printed or imported
    that matters yet); it returns only when there is nothing to do."""
    env = malloc_environment()
    if env is None or not sys.orig_argv:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)

"""Execute the notebooks with a real Jupyter kernel (nbclient).

``python scripts/run_notebooks.py [--fast] [--save] [NAME ...]``: every notebook of
``notebooks/`` (or those whose file name contains a NAME), top to bottom in a fresh kernel, in the
repository root. ``--fast`` sets ``JAXRL_NOTEBOOK_FAST=1``: each notebook's parameter cell then
picks its small setting (the test suite's mode). ``--save`` writes the executed notebook, outputs
and plots included, back to its file (``scripts/run_notebooks.sh``: full size, saved). A failing
cell stops that notebook with the cell's source and traceback (a failed notebook is not saved:
its file keeps the last good outputs); the exit code is the number of notebooks that failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def execute(path: Path, *, fast: bool, save: bool, timeout: int = 3600, cwd: Path | None = None):
    """Run one notebook; returns the executed notebook (``nbformat`` node)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    # the kernel inherits this process's environment: the fast flag set, and no MPLBACKEND (a
    # non-interactive backend such as Agg would keep the kernel's inline backend from saving plots)
    # and large allocations on huge pages when asked for (JAXRL_LLM_HUGEPAGES=1, jaxrl_llm.launch)
    from jaxrl_llm.launch import malloc_environment

    saved = {k: os.environ.get(k) for k in ("JAXRL_NOTEBOOK_FAST", "MPLBACKEND", "GLIBC_TUNABLES")}
    os.environ["JAXRL_NOTEBOOK_FAST"] = "1" if fast else "0"
    os.environ.pop("MPLBACKEND", None)
    tuned = malloc_environment()
    if tuned is not None:
        os.environ["GLIBC_TUNABLES"] = tuned["GLIBC_TUNABLES"]
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(cwd or ROOT)}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if save:
        nbformat.write(nb, path)
    return nb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="run only notebooks whose file name contains one of these")
    ap.add_argument("--fast", action="store_true", help="the small setting (JAXRL_NOTEBOOK_FAST=1)")
    ap.add_argument("--save", action="store_true", help="write the outputs back into the notebooks")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    a = ap.parse_args(argv)
    paths = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if a.names:
        unknown = [n for n in a.names if not any(n in p.name for p in paths)]
        if unknown:
            ap.error(f"no notebook in notebooks/ has a file name containing {unknown}; there are: "
                     + ", ".join(p.stem for p in paths))
        paths = [p for p in paths if any(n in p.name for n in a.names)]
    failed = 0
    for p in paths:
        t0 = time.perf_counter()
        try:
            execute(p, fast=a.fast, save=a.save, timeout=a.timeout)
            print(f"ok     {p.name}  {time.perf_counter() - t0:.0f} s", flush=True)
        except Exception as e:  # a failing cell: report it, go on with the next notebook
            failed += 1
            print(f"FAILED {p.name}  {time.perf_counter() - t0:.0f} s\n{e}", file=sys.stderr, flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())

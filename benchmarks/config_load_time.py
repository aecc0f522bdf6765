"""Start-up cost of reading an HF model directory's config (issue 38): ``load_config`` on a
complete Qwen2 ``config.json`` (read as JSON; no transformers or torch import) against
``transformers.AutoConfig`` (whose import pulls torch when torch is installed), each in a fresh
process, the import of the loader included. Medians of ``--repeats`` processes.

Run: ``.venv/bin/python benchmarks/config_load_time.py [--repeats 5] [--write]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _report import machine, write_section  # noqa: E402

TIMED = {
    "load_config": "from jaxrl_llm.models.config import load_config; load_config(d)",
    "AutoConfig": "from transformers import AutoConfig; from jaxrl_llm.models.config import from_hf_config; "
                  "from_hf_config(AutoConfig.from_pretrained(d, local_files_only=True))",
}


def once(stmt: str, d: str) -> tuple[float, bool]:
    code = ("import sys, time; import jaxrl_llm.models.config; d = sys.argv[1]; t = time.perf_counter(); "
            f"{stmt}; print(time.perf_counter() - t, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, d], capture_output=True, text=True, check=True)
    s, torch = out.stdout.split()[-2:]
    return float(s), torch == "True"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    from jaxrl_llm.models import PRESETS
    from jaxrl_llm.models.config import to_hf_config

    rows = []
    with tempfile.TemporaryDirectory() as d:
        to_hf_config(PRESETS["qwen2.5-1.5b"]).save_pretrained(d)
        for name, stmt in TIMED.items():
            runs = [once(stmt, d) for _ in range(a.repeats)]
            rows.append(f"| {name} | {statistics.median(s for s, _ in runs):.3f} | {runs[0][1]} |")
            print(rows[-1], flush=True)
    body = ("Reading the config of an HF model directory (Qwen2.5-1.5B's `config.json`), in a fresh process each "
            f"time, the loader's import included; medians of {a.repeats} processes. Machine: {machine()}. "
            "Reproduce: `.venv/bin/python benchmarks/config_load_time.py --write`.\n\n"
            "| reader | seconds | torch imported |\n|---|---|---|\n" + "\n".join(rows))
    print(body)
    if a.write:
        write_section("config_load_time", body)


if __name__ == "__main__":
    main()

"""Run a peer-library oracle script in the peer interpreter (.venv-peers).

The peer environment holds torch 2.13 (CPU), verl 0.9.1 and TRL 1.16 (scripts/setup_peers.sh).
Outside CI a missing peer environment skips the conformance tests; with ``CI=true`` it is
an error, so that CI can never pass without checking parity.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def peer_python() -> str:
    exe = os.environ.get("JAXRL_LLM_PEER_PYTHON", str(ROOT / ".venv-peers" / "bin" / "python"))
    if not Path(exe).exists():
        msg = (f"peer interpreter {exe} not found: run scripts/setup_peers.sh "
               "or set JAXRL_LLM_PEER_PYTHON")
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def run_oracle(script: str, cases: list[dict]) -> dict:
    """Pickle ``cases``, run ``script`` under the peer python, return its results by id."""
    exe = peer_python()
    with tempfile.TemporaryDirectory() as d:
        inp, out = Path(d) / "in.pkl", Path(d) / "out.pkl"
        with open(inp, "wb") as f:
            pickle.dump(cases, f)
        env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
        env["PYTHONWARNINGS"] = "ignore"
        proc = subprocess.run([exe, str(Path(__file__).parent / script), str(inp), str(out)],
                              capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"oracle {script} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        with open(out, "rb") as f:
            return pickle.load(f)


if __name__ == "__main__":  # pragma: no cover
    print(peer_python(), file=sys.stderr)

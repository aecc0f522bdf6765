"""Case I/O shared by the oracle scripts that run in the peer interpreter (.venv-peers).

``serve(run)`` reads the pickled list of case dicts named by ``argv[1]``, calls ``run(case)``
for each, and pickles ``{case id: result}`` to ``argv[2]``. A case that raises is reported as
``{"error": "..."}`` so the corresponding test fails with the peer's own message.
"""

from __future__ import annotations

import pickle
import sys
from typing import Callable


def serve(run: Callable[[dict], dict]) -> None:
    with open(sys.argv[1], "rb") as f:
        cases = pickle.load(f)
    out = {}
    for c in cases:
        try:
            out[c["id"]] = run(c)
        except Exception as e:  # reported per case; the test fails on it with this message
            out[c["id"]] = {"error": f"{type(e).__name__}: {e}"}
    with open(sys.argv[2], "wb") as f:
        pickle.dump(out, f)

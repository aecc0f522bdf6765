"""GTAlign's mutual-welfare reward (METHODS.md #259) against the authors' code: a transcription
of ``compute_score`` of ``recipe/gamellm/tasks/math_hard.py`` and its helpers in
``recipe/gamellm/tasks/format.py`` from ``ulab-uiuc/GTAlign`` @1e35360 (the LLM judge replaced by
a given answer score), on random completions with valid, malformed and missing blocks."""

import ast
import json
import math
import re

import numpy as np
import pytest

from jaxrl_llm.algorithms import SHAPING, ShapingInputs

KEYS = {"DQ_AQ", "DQ_CQ", "DQ_DA", "VQ_AQ", "VQ_CQ", "VQ_DA"}


def block(text, tag):
    m = re.search(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    if not m:
        raise ValueError(tag)
    return m.group(1).strip()


def parse_payoff(s):
    s = s.strip()
    try:
        json.loads(s)
    except Exception:
        s = json.dumps(ast.literal_eval(s.replace("\u201c", "\"").replace("\u201d", "\"").replace("\u2018", "'")
                                        .replace("\u2019", "'")))
    data = json.loads(s)
    if set(data) != KEYS:
        raise ValueError("keys")
    for v in data.values():
        if not isinstance(v, dict) or set(v) != {"LLM", "user"}:
            raise ValueError("sub")
        for val in v.values():
            if not isinstance(val, (float, int)):
                raise ValueError("type")
    return data


def fmt_reward(content):
    pattern = (r"^<thinking>.*?</thinking>\s*<payoff>.*?</payoff>\s*<analyze>.*?</analyze>\s*"
               r"<response>.*?</response>$")
    if not re.match(pattern, content, re.DOTALL | re.MULTILINE):
        return 0.0
    try:
        parse_payoff(block(content, "payoff"))
        return 1.0
    except Exception:
        return 0.0


def logistic(text, L_min, L_max, k=0.005):
    n = len(text.split())
    return 1 / (1 + math.exp(k * (L_min - n))) * 1 / (1 + math.exp(k * (n - L_max)))


def their_score(solution_str, answer_reward):
    try:
        f = fmt_reward(solution_str)
        ori = solution_str
        reasoning = solution_str.split("<response>")[0]
        solution_str = block(solution_str, "response")
        payoff = parse_payoff(block(ori, "payoff"))
    except Exception:
        return 0.0
    p = 0.0
    for v in payoff.values():
        if v["user"] != v["LLM"]:
            p += 1 / 12
        if abs(v["user"] - v["LLM"]) / max(abs(v["user"]), abs(v["LLM"]), 1e-8) > 0.1:
            p += 1 / 12
    a = max(0, min(1, answer_reward))
    user = 1e-4 + 0.5 * a + 0.2 * logistic(solution_str, 20, 500) + 0.3 * math.exp(-len(reasoning) / 500)
    llm = 1e-4 + 0.2 * f + 0.2 * p + 0.4 * a + 0.2 * logistic(ori, 500, 1000)
    return (user * llm) ** 0.5


def completion(rng):
    words = lambda n: " ".join(rng.choice(["x", "the", "answer", "is", "4"], n))  # noqa: E731
    cells = {k: {"LLM": float(rng.integers(0, 5)), "user": float(rng.integers(0, 5))} for k in sorted(KEYS)}
    pay = json.dumps(cells) if rng.random() < 0.5 else repr(cells)
    kind = rng.integers(0, 6)
    if kind == 1:
        pay = pay.replace("VQ_DA", "VQ_XX")  # a wrong cell
    if kind == 2:
        pay = "{not a payoff"
    parts = [f"<thinking>{words(rng.integers(0, 300))}</thinking>", f"<payoff>{pay}</payoff>",
             f"<analyze>{words(3)}</analyze>", f"<response>{words(rng.integers(1, 700))}</response>"]
    if kind == 3:
        parts = parts[1:]  # no thinking block: the layout fails, the rest is scored
    if kind == 4:
        parts = parts[:3]  # no response: 0
    return "\n".join(parts) + (" trailing" if rng.random() < 0.2 else "")


@pytest.mark.parametrize("seed", [0, 1])
def test_mutual_welfare_equals_the_authors_code(seed):
    rng = np.random.default_rng(seed)
    texts = [completion(rng) for _ in range(48)]
    acc = rng.integers(0, 2, 48).astype(np.float32)
    x = ShapingInputs(acc, np.ones(48, np.int32), np.repeat(np.arange(12), 4), 12, 64, {}, tuple(texts))
    got = x.scores + SHAPING["gtalign"].fn(x)
    want = [their_score(t, float(a)) for t, a in zip(texts, acc)]
    assert any(w == 0 for w in want) and any(w > 0.5 for w in want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

"""ARES (METHODS.md #90) against the authors' code: a transcription of the hierarchical entropy
reward of ``examples/reward_function/aepo.py`` (``compute_score``'s entropy term) from
``shawn0728/ARES`` @146620e, on random counts, targets, outcomes and buckets; and the window
counts against a direct loop over each response's windows."""

import math

import numpy as np
import pytest

import jaxrl_llm.core as C

LEVELS = ("easy", "medium", "hard")


def their_entropy_score(gen, target, accuracy, difficulty, alpha=0.5):
    margin_frac = {"easy": 0.15, "medium": 0.25, "hard": 0.35}
    kappa_t = {"easy": 2.0, "medium": 3.0, "hard": 4.0}
    temp_t = {"easy": 2.0, "medium": 2.5, "hard": 3.0}
    cap_t = {"easy": 1.0, "medium": 1.0, "hard": 1.2}

    def huber(x, kappa):
        x = max(float(x), 0.0)
        return 0.5 * x * x / kappa if x <= kappa else x - 0.5 * kappa

    def sat(x, temp):
        return 1.0 / (1.0 + math.exp(-x / max(float(temp), 1e-6)))

    delta = gen - target
    margin = max(1.0, margin_frac[difficulty] * max(float(target), 1.0))
    kappa, temp, cap = kappa_t[difficulty], temp_t[difficulty], alpha * cap_t[difficulty]
    if difficulty in ("easy", "medium"):
        if accuracy == 1.0:
            dev = max(delta - margin, 0.0) if difficulty == "easy" else max(abs(delta) - margin, 0.0)
            return -min(cap, huber(dev, kappa) / (margin + kappa) * cap)
        return sat(max(delta - margin, 0.0), temp) * cap * (0.6 if difficulty == "easy" else 0.8)
    if accuracy == 1.0:
        if delta >= -margin:
            return sat(delta + margin, temp) * cap
        return -min(cap, 0.5 * huber(-delta - margin, kappa) / (margin + kappa) * cap)
    return sat(max(delta - margin, 0.0), temp) * cap


@pytest.mark.parametrize("seed", [0, 1])
def test_ares_entropy_reward_equals_the_authors_code(seed):
    rng = np.random.default_rng(seed)
    n = 200
    counts = rng.integers(0, 30, n).astype(np.float32)
    targets = rng.integers(0, 25, n).astype(np.float32)
    correct = rng.integers(0, 2, n).astype(bool)
    level = rng.integers(0, 3, n).astype(np.int32)
    got = np.asarray(C.ares_entropy_reward(counts, targets, correct, level, alpha=0.7))
    want = [their_entropy_score(float(c), float(t), float(a), LEVELS[lv], alpha=0.7)
            for c, t, a, lv in zip(counts, targets, correct, level)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_window_counts_equal_a_loop_over_the_windows():
    rng = np.random.default_rng(0)
    b, t, w = 5, 16, 4
    ent = rng.uniform(0, 2, (b, t)).astype(np.float32)
    starts, lens = rng.integers(0, 4, b), rng.integers(2, 12, b)
    mask = np.zeros((b, t), bool)
    for i in range(b):
        mask[i, starts[i]:starts[i] + lens[i]] = True
    counts, thr = C.window_entropy_counts(ent, mask, window=w, threshold=1.0)
    for i in range(b):
        h = ent[i][mask[i]]
        want = sum(1 for j in range(len(h) - 1) if j + 1 + w <= len(h) and h[j + 1:j + 1 + w].mean() >= 1.0)
        assert counts[i] == want, i
    # the batch threshold: the median over responses of each one's 95th percentile of its window means
    _, thr = C.window_entropy_counts(ent, mask, window=w)
    p95 = [np.percentile([ent[i][mask[i]][j:j + w].mean() for j in range(mask[i].sum() - w + 1)], 95)
           for i in range(b) if mask[i].sum() >= w]
    np.testing.assert_allclose(float(thr), np.median(p95), rtol=1e-5)

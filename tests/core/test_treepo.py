"""TreePO's tree advantage by hand: the worked example of the authors' rule, the two combine
modes, and its identities (no branching below the root = REINFORCE++-baseline; invalid rows)."""

import numpy as np
import pytest

import jaxrl_llm.core as C

# leaves q#A#A1 (1), q#A#A2 (0), q#B#B1#B1a (1), q#B#B1#B1b (1); ids dense per depth column
S = np.array([1, 0, 1, 1], np.float32)
IDS = np.array([[0, 0, 0, -1], [0, 0, 1, -1], [0, 1, 2, 0], [0, 1, 2, 1]], np.int32)
LENGTHS = [3, 5, 2, 4]


def _mask(lengths, t=5):
    m = np.zeros((len(lengths), t), bool)
    for i, n in enumerate(lengths):
        m[i, :n] = True
    return m


def _whiten(a, lengths):
    tok = np.concatenate([np.full(n, x) for x, n in zip(a, lengths)])
    return (np.asarray(a) - tok.mean()) / np.sqrt(tok.var(ddof=1) + 1e-8)


def test_worked_example():
    m = _mask(LENGTHS)
    # average: d0 terms [.25, -.75, .25, .25]; A's subtree (mean .5) [.5, -.5]; B's and B#B1's (mean 1) 0;
    # one-leaf subtrees skipped
    avg = [0.375, -0.625, 0.25 / 3, 0.25 / 3]
    got = np.asarray(C.treepo_advantages(S, IDS, m))
    np.testing.assert_allclose(got[:, 0], _whiten(avg, LENGTHS), rtol=1e-5)
    np.testing.assert_allclose(got[:, 0], [1.1574, -1.2431, 0.4572, 0.4572], atol=1e-4)  # the note's figures
    assert np.all(got[~m] == 0) and np.all(got == got[:, :1] * m)  # constant over each response
    # group_size: terms weighted by the subtree's size
    gs = [(0.25 * 4 + 0.5 * 2) / 6, (-0.75 * 4 - 0.5 * 2) / 6, (0.25 * 4) / 8, (0.25 * 4) / 8]  # the note: .333, -.667, .125
    got = np.asarray(C.treepo_advantages(S, IDS, m, combine="group_size"))
    np.testing.assert_allclose(got[:, 0], _whiten(gs, LENGTHS), rtol=1e-5)


def test_identities():
    rng = np.random.default_rng(0)
    s = rng.normal(size=8).astype(np.float32)
    gid = np.array([0, 0, 0, 1, 1, 1, 2, 3], np.int32)  # prompts 2 and 3 have one leaf
    lengths = rng.integers(1, 6, 8)
    m = _mask(lengths)
    # no branching below the root: each leaf's own node only (singletons): REINFORCE++-baseline
    ids = np.stack([gid, np.arange(8)], 1).astype(np.int32)
    np.testing.assert_allclose(np.asarray(C.treepo_advantages(s, ids, m)),
                               np.asarray(C.reinforce_pp_baseline_advantages(s, m, gid, 4)), rtol=1e-5, atol=1e-6)
    # an invalid row takes no part: the same as without it
    valid = np.ones(8, bool)
    valid[1] = False
    a = np.asarray(C.treepo_advantages(s, ids, m, valid=valid))
    keep = np.flatnonzero(valid)
    sub_ids = ids[keep].copy()
    sub_ids[:, 1] = np.arange(len(keep))  # dense again
    b = np.asarray(C.treepo_advantages(s[keep], sub_ids, m[keep]))
    np.testing.assert_allclose(a[keep], b, rtol=1e-5, atol=1e-6)
    assert np.all(a[1] == 0)
    with pytest.raises(ValueError, match="combine"):
        C.treepo_advantages(s, ids, m, combine="sum")
    with pytest.raises(ValueError, match="prefix_ids must be"):
        C.treepo_advantages(s, gid, m)

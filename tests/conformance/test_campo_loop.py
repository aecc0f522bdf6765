"""CAMPO's loop detection (METHODS.md #141) against the authors' code: a transcription of
``find_infinite_loop_start`` (exact matching) from ``MiroMindAsia/MiroMind-M1`` @3ace1ab
(``verl/trainer/ppo/core_algos.py``) on random token sequences with and without loops."""

import numpy as np
import pytest

from jaxrl_llm.algorithms.reward_designs import trailing_loop_fraction


def their_fraction(token_ids, min_repeats=2):
    n = len(token_ids)
    longest_valid_length, start_of_loop = 0, n
    for length in range(1, n // min_repeats + 1):
        count, right = 1, n - length
        while right - length >= 0:
            if list(token_ids[right - length:right]) == list(token_ids[right:right + length]):
                count += 1
            else:
                break
            right -= length
        if count >= min_repeats:
            longest_valid_length, start_of_loop = length, right
    if longest_valid_length == 0:
        return 0.0
    return (n - start_of_loop) / n


@pytest.mark.parametrize("seed", range(4))
def test_trailing_loop_fraction_equals_the_authors_code(seed):
    rng = np.random.default_rng(seed)
    for _ in range(200):
        head = rng.integers(0, 4, rng.integers(0, 12))
        block = rng.integers(0, 3, rng.integers(1, 5))
        seq = np.concatenate([head, np.tile(block, rng.integers(1, 5))])[: rng.integers(1, 30)]
        for k in (2, 3):
            assert trailing_loop_fraction(seq, k) == their_fraction(seq, k), (seq, k)

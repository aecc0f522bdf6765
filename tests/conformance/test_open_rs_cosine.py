"""The cosine length reward against Open-RS's code (METHODS.md #88): a transcription of
``get_cosine_scaled_reward``'s arithmetic from ``knoveleng/open-rs`` @2889c474949b
(``src/open_r1/rewards.py``; the verifier replaced by a given correctness), with Open-RS's
configured bounds and open-r1's own defaults, on random lengths past ``max_len`` too."""

import math

import numpy as np
import pytest

import jaxrl_llm.core as C


def open_rs_cosine(is_correct, gen_len, *, min_value_wrong, max_value_wrong, min_value_correct, max_value_correct,
                   max_len):
    progress = gen_len / max_len
    cosine = math.cos(progress * math.pi)
    if is_correct:
        min_value, max_value = min_value_correct, max_value_correct
    else:  # Swap min/max for incorrect answers
        min_value, max_value = max_value_wrong, min_value_wrong
    return min_value + 0.5 * (max_value - min_value) * (1.0 + cosine)


@pytest.mark.parametrize("theirs", [dict(min_value_wrong=0.0, max_value_wrong=-0.5),    # Open-RS's grpo.py
                                    dict(min_value_wrong=-1.0, max_value_wrong=-0.5)])  # open-r1's defaults
def test_cosine_length_reward_equals_the_open_rs_code(theirs):
    rng = np.random.default_rng(0)
    correct = rng.integers(0, 2, 64).astype(bool)
    lengths = rng.integers(0, 2500, 64).astype(np.float32)
    want = [open_rs_cosine(c, float(n), **theirs, min_value_correct=0.5, max_value_correct=1.0, max_len=1000)
            for c, n in zip(correct, lengths)]
    # theirs (value at 0, value at L_max) for wrong answers = (min_value_wrong, max_value_wrong)
    ours = C.cosine_length_reward(correct, lengths, max_length=1000.0, min_correct=0.5, max_correct=1.0,
                                  max_wrong=theirs["min_value_wrong"], min_wrong=theirs["max_value_wrong"])
    np.testing.assert_allclose(np.asarray(ours), want, rtol=1e-5, atol=1e-6)

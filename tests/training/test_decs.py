"""DECS in the loop (recipe.advantage=decs, METHODS.md #178): the thinking chunks, the necessary
prefix found by scoring chunk prefixes with the run's verifier, the token rewards and the
per-position advantages. The formulas: tests/core/test_group_advantages.py."""

import numpy as np

from test_paper_losses import binary
from test_rl_recipes_extra import TARGET, Tok, make

from jaxrl_llm.training.providers import decs_chunk_ends


def test_chunks_start_at_the_marker_words():
    pieces = ["So", " x", " is", " 4", ".", " Wait", ",", " check", ".", "\n", "But", " yes", "</think>", "4"]
    assert decs_chunk_ends(pieces) == [5, 10, 13]
    assert decs_chunk_ends(["a", "Waiting"]) == [2]  # not at a word start
    assert decs_chunk_ends(["a", " b"]) == [2]


class MarkerTok(Tok):
    """The toy's ids as text, with the target token written as a chunk marker."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(" Wait" if int(i) == TARGET else f" {int(i)}" for i in ids)


def test_necessary_tokens_end_at_the_first_correct_prefix():
    tr = make("grpo", g=4, reward=[binary], advantage={"name": "decs", "beta": 0.1})
    tr.tokenizer = MarkerTok()
    for _ in range(3):
        m = tr.step()
        b = tr.last_batch
        cm = b["completion_mask"]
        p = b["tokens"].shape[1] - cm.shape[1]
        r = b["decs_token_rewards"][:, p - 1:]
        toks = b["tokens"][:, p:]
        for i in range(len(cm)):
            ids = toks[i][cm[i]]
            row = r[i][cm[i]]
            if (ids == TARGET).sum() < 2:  # wrong: all 0
                assert np.all(row == 0)
                continue
            # the first prefix with two targets ends right before the chunk after the second target
            where = np.flatnonzero(ids == TARGET)
            later = [e for e in where if e > where[1]]
            nec = later[0] if later else len(ids)
            np.testing.assert_allclose(row[:nec], 1.1, rtol=1e-6)
            if nec < len(ids):  # the redundant tokens after it
                np.testing.assert_allclose(row[nec:], 1 + 0.1 * (1 - len(ids) / tr.sampler.config.max_new_tokens),
                                           rtol=1e-5)
        assert 0.0 <= m["decs/redundant_frac"] <= 1.0

"""PAPO in the loop (recipe.loss=papo, METHODS.md #8): the masked_logp provider masks prompt
tokens only, at the loss's mask_prob, with a fresh mask each step, and computes the sampled
tokens' log-probs under the policy given the masked prompt. The loss: tests/core/test_policy_losses.py."""

import jax
import numpy as np

from test_rl_recipes_extra import make

from jaxrl_llm.training.providers import mask_prompt_tokens


def test_mask_prompt_tokens_masks_only_real_prompt_tokens():
    tokens = np.arange(1, 25, dtype=np.int32).reshape(3, 8)
    mask = np.ones((3, 8), bool)
    mask[0, :2] = False  # left padding of row 0's prompt
    out, n = mask_prompt_tokens(tokens, mask, 5, jax.random.key(0), 1.0, 0)
    assert (out[:, 5:] == tokens[:, 5:]).all()  # the completions are untouched
    assert (out[0, :2] == tokens[0, :2]).all() and (out[0, 2:5] == 0).all() and (out[1:, :5] == 0).all()
    assert n == 3 + 5 + 5
    half, k = mask_prompt_tokens(np.ones((64, 40), np.int32), np.ones((64, 40), bool), 40, jax.random.key(1), 0.6, 0)
    assert abs(k / half.size - 0.6) < 0.03


def test_the_loop_provides_masked_log_probs():
    tr = make("grpo", g=4, loss={"name": "papo", "gamma": 0.02, "mask_prob": 0.5})
    m = [tr.step() for _ in range(2)]
    assert all(0.2 < x["papo/masked_prompt_frac"] < 0.8 for x in m)
    assert all(x["policy/papo_kl"] > 0 for x in m)  # the output depends on the prompt
    b = tr.last_batch
    lm = b["loss_mask"]
    assert not np.allclose(b["masked_logp"][lm], b["old_logp"][lm])
    assert (b["masked_logp"][~lm] == 0).all()

"""Critique-GRPO's loss (METHODS.md #225) against the authors' code: a torch transcription of
``compute_token_on_off_policy_loss`` from ``zhangxy-2019/critique-GRPO`` @e8f03a2
(``verl/verl/critique_grpo/critique_core_algos.py``) with the scripts' settings (no on-policy
reshape, ``off_policy_reshape="p_div_p_0.1"``, no off-policy clips, ``loss_remove_clip`` on and
off, the token mean), the refinement rows as its ``prefix_mask``; values and gradients on random
inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.core as C

torch = pytest.importorskip("torch")


def masked_mean(x, m):
    return (x * m).sum() / m.sum()


def their_loss(old_log_prob, log_prob, advantages, response_mask, prefix_mask, cliprange=0.2, remove_clip=True):
    ratio = torch.exp(log_prob - old_log_prob)
    on = -advantages * ratio
    if not remove_clip:
        on2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, max(1.0, 1.0 + cliprange))
        on = torch.max(on, on2)
    off_ratio = torch.exp(log_prob)
    off_ratio = off_ratio / (off_ratio + 0.1)
    off = -advantages * off_ratio
    pm = prefix_mask.float()
    losses = off * pm + on * (1 - pm)
    return masked_mean(losses, response_mask)


@pytest.mark.parametrize("remove_clip", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_critique_grpo_loss_equals_the_authors_code(seed, remove_clip):
    rng = np.random.default_rng(seed)
    b, t = 6, 8
    lp = np.log(rng.uniform(0.05, 0.95, (b, t))).astype(np.float32)
    old = (lp - rng.normal(0, 0.5, (b, t))).astype(np.float32)
    adv = np.repeat(rng.normal(size=(b, 1)), t, 1).astype(np.float32)
    mask = (np.arange(t)[None] < rng.integers(2, t + 1, b)[:, None]).astype(np.float32)
    hinted = np.array([1, 0, 0, 1, 0, 0], np.float32)
    lp_t = torch.tensor(lp, requires_grad=True)
    want = their_loss(torch.tensor(old), lp_t, torch.tensor(adv), torch.tensor(mask),
                      torch.tensor(np.repeat(hinted[:, None], t, 1) > 0), remove_clip=remove_clip)
    want.backward()

    def ours(x):
        per, _ = C.critique_grpo_loss(x, old, adv, mask, hinted, clip=not remove_clip)
        return jnp.sum(per * mask) / jnp.sum(mask)

    val, grad = jax.value_and_grad(ours)(jnp.asarray(lp))
    np.testing.assert_allclose(float(val), float(want.detach()), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad) * mask, lp_t.grad.numpy() * mask, rtol=1e-4, atol=1e-6)

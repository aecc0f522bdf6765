"""AEPO's (agentic, METHODS.md #72) entropy-balanced loss against the authors' code: a torch
transcription of ``compute_policy_loss_entropy_balanced_clipping`` from ``RUC-NLPIR/ARPO``
@81e3a5d (``AEPO/verl_aepo_entropy/verl/trainer/ppo/core_algos.py``, both flags on,
``token-mean`` aggregation), on random inputs: the per-token losses (through the mean) and the
gradient with respect to the log-probs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.core as C

torch = pytest.importorskip("torch")


def their_loss(old_log_prob, log_prob, entropy, advantages, response_mask, cliprange=0.2, clip_ratio_c=3.0):
    valid = entropy[response_mask.bool()]
    mean, std = valid.mean(), valid.std()
    if std == 0:
        std = 1.0
    advantages = advantages * (1 + 0.2 * ((entropy - mean) / std).detach())
    ratio = torch.exp(log_prob - old_log_prob)
    pg1 = -advantages * ratio
    min_bound = torch.full_like(ratio, 1 - cliprange)
    max_bound = (1 + cliprange) / ratio.detach() * ratio
    pg2 = -advantages * torch.clamp(ratio, min_bound, max_bound)
    clip1 = torch.maximum(pg1, pg2)
    clip2 = torch.min(-advantages * clip_ratio_c, clip1)
    losses = torch.where(advantages < 0, clip2, clip1)
    return (losses * response_mask).sum() / response_mask.sum()  # verl's token-mean


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_entropy_balanced_loss_equals_the_authors_code(seed):
    rng = np.random.default_rng(seed)
    b, t = 5, 9
    lp = np.log(rng.uniform(0.05, 0.95, (b, t))).astype(np.float32)
    old = (lp - rng.normal(0, 0.5, (b, t))).astype(np.float32)  # ratios well outside [0.8, 1.2]
    adv = rng.normal(size=(b, t)).astype(np.float32)
    ent = rng.uniform(0.0, 3.0, (b, t)).astype(np.float32)
    mask = (np.arange(t)[None] < rng.integers(2, t + 1, b)[:, None]).astype(np.float32)

    lp_t = torch.tensor(lp, requires_grad=True)
    want = their_loss(torch.tensor(old), lp_t, torch.tensor(ent), torch.tensor(adv), torch.tensor(mask))
    want.backward()

    def ours(x):
        per, _ = C.entropy_balanced_loss(x, old, adv, mask, entropy=ent)
        return jnp.sum(per * mask) / jnp.sum(mask)

    val, grad = jax.value_and_grad(ours)(jnp.asarray(lp))
    np.testing.assert_allclose(float(val), float(want.detach()), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad) * mask, lp_t.grad.numpy() * mask, rtol=1e-4, atol=1e-6)

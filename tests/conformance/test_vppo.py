"""VPPO's loss (METHODS.md #48) against the authors' code: a torch transcription of the
perception part of ``DataParallelPPOActor.update_policy`` (``verl/workers/actor/dp_actor.py``:
the dependency k3 scores, the mini-batch min / max normalisation, the dynamic scaling range, the
top-40 % token mask) and of ``compute_policy_loss`` with its token mask and token-mean
(``verl/trainer/core_algos.py``) from ``huaixuheqing/VPPO-RL`` @a23c54b, one micro-batch per
mini-batch, on random inputs with tied dependency scores avoided; loss and gradient."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.core as C

torch = pytest.importorskip("torch")


def their_loss(old, lp, aug, adv, mask, beta_min=0.9, top_p=0.4, cl=0.2, ch=0.28, dual=3.0):
    d = (aug - old).clamp(-20.0, 20.0)
    kl = torch.clamp(d.exp() - d - 1, min=0.0, max=10.0)
    n_valid = mask.sum(1)
    score = (kl * mask).sum(1) / torch.clamp(n_valid, min=1)
    lo, hi = torch.quantile(score, 0.0), torch.quantile(score, 1.0)
    scale = torch.ones_like(score)
    if hi - lo > 1e-6:
        norm = torch.clamp((score - lo) / (hi - lo), 0.0, 1.0)
        mu = norm.mean()
        tmax = beta_min + (1.0 - beta_min) / (mu + 1e-8)
        scale = beta_min + norm * (tmax - beta_min)
    adv = adv * scale.unsqueeze(1)
    srt = kl.clone()
    srt[~mask.bool()] = -torch.inf
    k = torch.ceil(n_valid * top_p).int()
    _, idx = torch.sort(srt, dim=1, descending=True)
    rank_mask = torch.arange(srt.size(1)).expand_as(srt) < k.unsqueeze(1)
    keep = torch.zeros_like(srt, dtype=torch.bool)
    keep.scatter_(1, idx, rank_mask)
    keep = (keep & mask.bool()).to(lp.dtype)
    lr = lp - old
    ratio = torch.exp(torch.clamp(lr, -20.0, 20.0))
    clipped = torch.exp(torch.clamp(lr, math.log(1 - cl), math.log(1 + ch)))
    l1, l2, l3 = -adv * ratio, -adv * clipped, -adv * dual
    higher = torch.max(l1, l2)
    final = torch.where(adv < 0, torch.min(higher, l3), higher) * keep
    return (final * mask).sum() / (mask.sum() + 1e-8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vppo_loss_equals_the_authors_code(seed):
    rng = np.random.default_rng(seed)
    b, t = 6, 10
    lp = np.log(rng.uniform(0.05, 0.95, (b, t))).astype(np.float32)
    old = (lp - rng.normal(0, 0.3, (b, t))).astype(np.float32)
    aug = (old + rng.normal(0, 1.0, (b, t))).astype(np.float32)
    adv = np.repeat(rng.normal(size=(b, 1)), t, 1).astype(np.float32)
    mask = (np.arange(t)[None] < rng.integers(3, t + 1, b)[:, None]).astype(np.float32)
    lp_t = torch.tensor(lp, requires_grad=True)
    want = their_loss(torch.tensor(old), lp_t, torch.tensor(aug), torch.tensor(adv), torch.tensor(mask))
    want.backward()
    val, grad = jax.value_and_grad(lambda x: C.vppo_loss(x, old, adv, mask, masked_logp=aug, dual_clip=3.0)[0])(
        jnp.asarray(lp))
    np.testing.assert_allclose(float(val), float(want.detach()), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad) * mask, lp_t.grad.numpy() * mask, rtol=1e-4, atol=1e-6)

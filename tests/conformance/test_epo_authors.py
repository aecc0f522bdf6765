"""EPO's loss (METHODS.md #203) in its released form against the authors' code: a torch
transcription of the loss of ``DataParallelPPOActor.update_policy`` with ``entropy_smooth`` on
and token mode (``generate_entropy_penalty``, the entropy and penalty terms, ``compute_policy_loss``
with the dual clip, token-mean) from ``WujiangXu/EPO`` @5b6fa98, on random inputs, against
``core.epo_loss(smooth="released")``: the loss and its gradients with respect to the log-probs and
the entropies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.core as C

torch = pytest.importorskip("torch")


def masked_mean(x, m):
    return (x * m).sum() / m.sum()


def their_loss(old, lp, adv, mask, entropy, hist, w, coef=0.001, smooth_coef=1.0, penalty=0.1, lo=0.8, hi=1.2,
               clip=0.2, c=3.0):
    ref = hist.unsqueeze(-1).expand_as(entropy)
    within = (entropy > ref * lo) & (entropy < ref * hi)
    emask = torch.where(within, 0, penalty) * w
    ratio = torch.exp(lp - old)
    l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
    clip1 = torch.maximum(l1, l2)
    pg = torch.where(adv < 0, torch.min(-adv * c, clip1), clip1)
    pg_loss = masked_mean(pg, mask)
    entropy_loss = masked_mean(entropy, mask) - masked_mean(emask, mask) * smooth_coef
    return pg_loss - entropy_loss * coef


@pytest.mark.parametrize("seed", [0, 1])
def test_epo_released_loss_equals_the_authors_code(seed):
    rng = np.random.default_rng(seed)
    b, t = 5, 8
    lp = np.log(rng.uniform(0.05, 0.95, (b, t))).astype(np.float32)
    old = (lp - rng.normal(0, 0.4, (b, t))).astype(np.float32)
    adv = np.repeat(rng.normal(size=(b, 1)), t, 1).astype(np.float32)
    ent = rng.uniform(0.2, 2.0, (b, t)).astype(np.float32)
    hist = rng.uniform(0.5, 1.5, b).astype(np.float32)  # each sample's turn history
    mask = (np.arange(t)[None] < rng.integers(2, t + 1, b)[:, None]).astype(np.float32)
    lp_t, ent_t = torch.tensor(lp, requires_grad=True), torch.tensor(ent, requires_grad=True)
    want = their_loss(torch.tensor(old), lp_t, torch.tensor(adv), torch.tensor(mask), ent_t, torch.tensor(hist), 0.7,
                      coef=0.05)
    want.backward()

    def ours(x, h):
        per, _ = C.epo_loss(x, old, adv, mask, entropy=h, epo_entropy_ref=np.repeat(hist[:, None], t, 1) * mask,
                            epo_phase_weight=np.full(b, 0.7, np.float32), entropy_coef=0.05, smooth="released")
        return jnp.sum(per * mask) / jnp.sum(mask)

    val, (g_lp, g_h) = jax.value_and_grad(ours, argnums=(0, 1))(jnp.asarray(lp), jnp.asarray(ent))
    np.testing.assert_allclose(float(val), float(want.detach()), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(g_lp) * mask, lp_t.grad.numpy() * mask, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(g_h) * mask, ent_t.grad.numpy() * mask, rtol=1e-4, atol=1e-7)

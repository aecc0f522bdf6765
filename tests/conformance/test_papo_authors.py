"""PAPO's loss terms (METHODS.md #8) against the authors' code: a torch transcription of the
``kl_prcp`` and double-entropy part of ``DataParallelPPOActor.update_policy``
(``verl/workers/actor/dp_actor.py``) and of ``compute_kl``'s ``low_var_kl``
(``verl/trainer/core_algos.py``) from ``MikeWangWZHL/PAPO`` @fb63bf4 (token-mean averaging,
weighting 1, no token mask or clipping: the scripts' settings), added to the PPO term, on random
inputs: the loss and its gradient with respect to the policy's log-probs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.core as C

torch = pytest.importorskip("torch")


def masked_mean(x, m):
    return (x * m).sum() / m.sum()


def their_extra(log_probs, aug_log_probs, mask, coef, eta_aug, eta_ori):
    entropy_loss = -masked_mean(log_probs, mask)
    aug_entropy_loss = -masked_mean(aug_log_probs, mask)
    kl = (aug_log_probs - log_probs).clamp(-20.0, 20.0)
    kld = torch.clamp(kl.exp() - kl - 1, min=-10.0, max=10.0)
    loss = -masked_mean(kld, mask) * coef
    return loss + eta_aug * aug_entropy_loss + eta_ori * entropy_loss


@pytest.mark.parametrize("coef,eta", [(0.02, 0.0), (0.01, 0.05)])
def test_papo_terms_equal_the_authors_code(coef, eta):
    rng = np.random.default_rng(3)
    b, t = 6, 7
    lp = np.log(rng.uniform(0.05, 0.95, (b, t))).astype(np.float32)
    old = (lp - rng.normal(0, 0.3, (b, t))).astype(np.float32)
    masked = np.log(rng.uniform(0.01, 0.99, (b, t))).astype(np.float32)
    adv = rng.normal(size=(b, t)).astype(np.float32)
    mask = (np.arange(t)[None] < rng.integers(2, t + 1, b)[:, None]).astype(np.float32)

    def ours(x, gamma, eta_):
        per, _ = C.papo_loss(x, old, adv, mask, masked_logp=masked, gamma=gamma, eta_ori=eta_, eta_aug=eta_)
        return jnp.sum(per * mask) / jnp.sum(mask)

    def ppo(x):
        per, _ = C.ppo_clip_loss(x, old, adv, mask)
        return jnp.sum(per * mask) / jnp.sum(mask)

    lp_t = torch.tensor(lp, requires_grad=True)
    extra = their_extra(lp_t, torch.tensor(masked), torch.tensor(mask), coef, eta, eta)
    extra.backward()
    val, grad = jax.value_and_grad(lambda x: ours(x, coef, eta) - ppo(x))(jnp.asarray(lp))
    np.testing.assert_allclose(float(val), float(extra.detach()), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad) * mask, lp_t.grad.numpy() * mask, rtol=1e-4, atol=1e-6)

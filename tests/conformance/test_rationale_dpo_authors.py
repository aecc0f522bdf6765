"""Rationale-enriched DPO (METHODS.md #236) against the authors' code: a torch transcription of
``RDPOTrainer.loss`` from ``reds-lab/preference-learning-with-rationales`` @16111a1
(``trainers.py``; the DPO term on the log-ratios, ``-logsigmoid(gamma * rationale logps)``
added, batch mean) on random sequence sums: values and gradients with respect to the policy's
sums."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.core as C

torch = pytest.importorskip("torch")
F = torch.nn.functional


def their_loss(pc, pr, rc, rr, prat, beta, gamma):
    logits = (pc - pr) - (rc - rr)
    losses = -F.logsigmoid(beta * logits) - F.logsigmoid(gamma * prat)
    return losses.mean()


@pytest.mark.parametrize("beta,gamma", [(0.1, 0.1), (0.5, 0.001), (0.1, 2.0)])
def test_rationale_dpo_equals_the_authors_code(beta, gamma):
    rng = np.random.default_rng(0)
    b = 16
    pc, pr, rc, rr = (-np.abs(rng.normal(size=b) * 20).astype(np.float32) for _ in range(4))
    prat = -np.abs(rng.normal(size=b) * 50).astype(np.float32)
    t = [torch.tensor(x, requires_grad=True) for x in (pc, pr, prat)]
    want = their_loss(t[0], t[1], torch.tensor(rc), torch.tensor(rr), t[2], beta, gamma)
    want.backward()

    def ours(a, b_, c):
        return jnp.mean(C.rationale_dpo_loss(a, b_, rc, rr, c, beta=beta, gamma=gamma).losses)

    val, grads = jax.value_and_grad(ours, argnums=(0, 1, 2))(pc, pr, prat)
    np.testing.assert_allclose(float(val), float(want.detach()), rtol=1e-5)
    for g, x in zip(grads, t):
        np.testing.assert_allclose(np.asarray(g), x.grad.numpy(), rtol=1e-4, atol=1e-7)

"""Nash-MD against TRL (METHODS.md #200). TRL 1.16, the version installed with the peers, no longer
ships ``trl.experimental.nash_md``; this is a line-by-line transcription into JAX of
``NashMDTrainer._compute_losses`` and of its preference from the reward scores, from
``huggingface/trl`` @054a0dabfa87860dcfb7a031ff6bd482c5ce2bcf
(``trl/experimental/nash_md/nash_md_trainer.py``), compared with the library's surrogate
aggregated as the preset does (``seq-mean-token-sum``) on random inputs: values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.core as C


def trl_compute_losses(model_logprobs_model_data, ref_logprobs_model_data, probability, beta):
    # transcription of _compute_losses (padding already masked to 0 by _compute_logprobs)
    score = (probability - 0.5) * model_logprobs_model_data.sum(1)
    log_ratio = jax.lax.stop_gradient(model_logprobs_model_data - ref_logprobs_model_data)
    kl_div_loss = (log_ratio * model_logprobs_model_data).sum(1)
    loss = beta * kl_div_loss - score
    return loss.mean()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nash_md_loss_equals_trl(seed):
    rng = np.random.default_rng(seed)
    b, t = 5, 7
    lengths = rng.integers(1, t + 1, b)
    m = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
    lp = (np.log(rng.uniform(0.05, 0.95, (b, t))) * m).astype(np.float32)
    ref = (np.log(rng.uniform(0.05, 0.95, (b, t))) * m).astype(np.float32)
    scores, mix = rng.normal(size=b).astype(np.float32), rng.normal(size=b).astype(np.float32)
    prob = np.asarray(jax.nn.sigmoid(scores - mix))  # TRL: F.sigmoid(model_scores - mixture_scores)
    np.testing.assert_allclose(C.nash_md_preference(scores, mix), prob, rtol=1e-6)
    beta = float(rng.uniform(0.01, 0.5))
    adv = (prob - 0.5)[:, None] * m

    def ours(x):
        per, _ = C.nash_md_loss(x, x, adv, m, ref_logp=ref, beta=beta)
        return C.aggregate(per, m, "seq-mean-token-sum")

    def trl(x):
        return trl_compute_losses(x * m, ref, jnp.asarray(prob), beta)

    np.testing.assert_allclose(ours(jnp.asarray(lp)), trl(jnp.asarray(lp)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.grad(ours)(jnp.asarray(lp)), jax.grad(trl)(jnp.asarray(lp)) * m, rtol=1e-5,
                               atol=1e-6)

"""AlignDistil (METHODS.md #230) against the authors' code: a torch transcription of the
``reward_boost_type == "aligndistil"`` branch of ``aligndistil_trainer.py`` from
``songmzhang/AlignDistil`` @f80ca4e (``OpenRLHF/openrlhf/trainer/``; ``kd_temperature`` 1) on
random logits: the teacher's log-probs and weights equal ``core.aligndistil_teacher``, and the
expectation over the sampled token of the gradient of ``core.aligndistil_loss`` (the score-function
form we train with) equals the gradient of their full-vocabulary loss, position by position."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_llm.core as C

torch = pytest.importorskip("torch")


def their_loss(student_logits, teacher_logits, reference_logits, beta, beta2):
    stu_probs = torch.softmax(student_logits, dim=-1)
    stu_lprobs = torch.log_softmax(student_logits, dim=-1)
    tea_lprobs = torch.log_softmax(teacher_logits, dim=-1)
    ref_lprobs = torch.log_softmax(reference_logits, dim=-1)
    tvd = (tea_lprobs.exp() - ref_lprobs.exp()).abs().sum(-1)
    weight = tvd * beta2 + 1e-3
    b2 = beta / weight
    final = weight.unsqueeze(-1) * (teacher_logits - reference_logits) + teacher_logits
    final_lprobs = torch.log_softmax(final, dim=-1)
    return (stu_probs * (stu_lprobs - final_lprobs)).sum(-1) * b2, final_lprobs, weight


@pytest.mark.parametrize("seed", [0, 1])
def test_aligndistil_teacher_and_gradient_equal_the_authors_code(seed):
    rng = np.random.default_rng(seed)
    p, v, beta, beta2 = 5, 7, 0.1, 15.0
    s, t, r = (rng.normal(size=(p, v)).astype(np.float32) for _ in range(3))
    s_t = torch.tensor(s, requires_grad=True)
    loss, final_lprobs, weight = their_loss(s_t, torch.tensor(t), torch.tensor(r), beta, beta2)
    loss.sum().backward()
    # the teacher at every vocabulary token
    for tok in range(v):
        lt, w = C.aligndistil_teacher(t, r, np.full(p, tok, np.int32), beta2=beta2)
        np.testing.assert_allclose(np.asarray(lt), final_lprobs[:, tok].detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(w), weight.detach().numpy(), rtol=1e-5)

    # E_{y ~ pi}[grad of our per-token loss at y] over the whole vocabulary
    teacher = final_lprobs.detach().numpy()
    w = weight.detach().numpy()

    def expected(logits):
        lp = jax.nn.log_softmax(logits, axis=-1)  # [P, V]: each column a possible sampled token
        per, _ = C.aligndistil_loss(lp, lp, jnp.zeros_like(lp), jnp.ones_like(lp), teacher_logp=teacher,
                                    teacher_weight=np.repeat(w[:, None], v, 1), beta=beta)
        return jnp.sum(jax.lax.stop_gradient(jnp.exp(lp)) * per)

    g = np.asarray(jax.grad(expected)(jnp.asarray(s)))
    np.testing.assert_allclose(g, s_t.grad.numpy(), rtol=1e-4, atol=1e-6)

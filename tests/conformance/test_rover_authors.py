"""ROVER (METHODS.md #204) against the authors' code: a transcription of ``yuxiaooye/ROVER``
@ea5ce63 --

* ``Math/verl/utils/torch_functional.py`` ``sum_log_softmax`` (the uniform-policy value of a
  position: the mean of the logits minus their logsumexp);
* ``Math/verl/workers/actor/dp_actor.py`` ``DataParallelROVERActor.update_policy``'s ROVER block
  (the next-position value from the current and old values, the target, ``logIS``, the optional
  ``use_rover_clip``) and ``Math/verl/trainer/ppo/core_algos.py`` ``compute_rover_loss`` (the
  masked mean of the squared error);

run on random inputs against :func:`jaxrl_llm.core.rover_loss` and
:func:`jaxrl_llm.models.token_mean_logprobs`.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jaxrl_llm.core as C  # noqa: E402
from jaxrl_llm.models import token_mean_logprobs  # noqa: E402


def their_sum_log_softmax(x):
    x_float = x.float()
    d = x_float.shape[-1]
    return (x_float / d).sum(dim=-1) - torch.logsumexp(x_float, dim=-1)


def their_rover_loss(current_q, old_logits, log_prob, old_log_prob, low_var_reward, response_mask, rover_t=1.0,
                     next_q_scale_factor=1.0, use_rover_clip=False, clip_ratio=0.2):
    next_q = rover_t * torch.cat([(current_q[:, 1:] - old_logits[:, 1:]) * response_mask[:, 1:],
                                  torch.zeros_like(response_mask[:, :1])], dim=1)
    target = low_var_reward + next_q * next_q_scale_factor
    log_is = rover_t * (log_prob - old_log_prob)
    if use_rover_clip:
        clip_high = torch.log(torch.tensor(1.0 + clip_ratio, dtype=log_is.dtype))
        clip_low = torch.log(torch.tensor(1.0 - clip_ratio, dtype=log_is.dtype))
        condition_high = (target > log_is) & (log_is > clip_high)
        condition_low = (target < log_is) & (log_is < clip_low)
        q_values = torch.where(condition_high, clip_high.detach(),
                               torch.where(condition_low, clip_low.detach(), log_is)) * response_mask
    else:
        q_values = log_is * response_mask
    loss = (q_values - target.detach()) ** 2
    return (loss * response_mask).sum() / response_mask.sum()  # verl_F.masked_mean


@pytest.mark.parametrize("rho,scale,clip", [(1.0, 1.0, None), (0.5, 2.0, None), (1.0, 1.0, 0.2), (2.0, 0.5, 0.1)])
def test_loss_equals_the_code(rho, scale, clip):
    rng = np.random.default_rng(int(rho * 10 + scale * 3 + (clip or 0) * 100))
    b, t = 6, 9
    mask = np.arange(t)[None] < rng.integers(1, t + 1, b)[:, None]
    lp = np.log(rng.uniform(0.05, 0.95, (b, t)))
    old = lp + rng.normal(0, 0.3, (b, t))
    cur_v = -rng.uniform(3, 6, (b, t))
    old_v = cur_v + rng.normal(0, 0.2, (b, t))
    adv = np.repeat(rng.normal(size=(b, 1)), t, 1) * mask
    mf = torch.tensor(mask, dtype=torch.float64)
    want = their_rover_loss(torch.tensor(cur_v), torch.tensor(old_v), torch.tensor(lp), torch.tensor(old),
                            torch.tensor(adv), mf, rover_t=rho, next_q_scale_factor=scale,
                            use_rover_clip=clip is not None, clip_ratio=clip or 0.2).item()
    f32 = np.float32
    per, _ = C.rover_loss(lp.astype(f32), old.astype(f32), adv.astype(f32), mask, mean_logp=cur_v.astype(f32),
                          old_mean_logp=old_v.astype(f32), rho=rho, next_scale=scale, clip_ratio=clip)
    got = float(np.sum(per) / mask.sum())
    np.testing.assert_allclose(got, want, rtol=2e-5)


def test_uniform_value_equals_the_code():
    rng = np.random.default_rng(3)
    h = rng.normal(size=(2, 5, 8)).astype(np.float32)
    w = rng.normal(size=(8, 33)).astype(np.float32)
    for temp in (1.0, 0.6):
        want = their_sum_log_softmax(torch.tensor(h.astype(np.float64) @ w.astype(np.float64)) / temp).numpy()
        got = np.asarray(token_mean_logprobs(h, w, chunk_size=2, temperature=temp))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

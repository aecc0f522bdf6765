"""DECS's decoupled token rewards and advantages (METHODS.md #178) against the authors' code: a
torch transcription of ``compute_grpo_proc_length_advantage_return`` from ``pixas/DECS`` @0d12e53
(``src_valid/valid_ray_trainer.py``; its ``chunk_aware_adv`` negative from the first redundant
token to the response's end, the padded width as ``L_max``) on random groups of correct and wrong
responses of random lengths."""

from collections import defaultdict

import numpy as np
import pytest

import jaxrl_llm.core as C

torch = pytest.importorskip("torch")


def their_advantages(token_level_rewards, chunk_aware_adv, response_mask, index, beta, epsilon=1e-6):
    scores = token_level_rewards.sum(-1)
    length = response_mask.sum(-1)
    width = response_mask.shape[-1]
    final = scores.unsqueeze(-1).repeat(1, token_level_rewards.shape[1]) * (1 + beta)
    length_reward = torch.zeros_like(token_level_rewards)
    for i in range(len(scores)):
        if scores[i] > 0:
            n = int(length[i])
            length_reward[i, :n] = (1 - n / width) * beta
            neg = (chunk_aware_adv[i] < 0).nonzero(as_tuple=True)[0]
            if neg.numel() > 0:
                first, last = neg[0].item(), neg[-1].item() + 1
                final[i, first:last] = scores[i] + length_reward[i, first:last]
    by = defaultdict(list)
    for i in range(len(scores)):
        by[index[i]].append(final[i])
    stats = {}
    for k, v in by.items():
        if len(v) == 1:
            stats[k] = (torch.tensor(0.0), torch.tensor(1.0))
        else:
            st = torch.stack(v, 0)
            stats[k] = (st.mean(0), st.std(0))
    adv = torch.stack([(final[i] - stats[index[i]][0]) / (stats[index[i]][1] + epsilon) for i in range(len(scores))])
    return adv * response_mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decs_equals_the_authors_code(seed):
    rng = np.random.default_rng(seed)
    groups, g, width = 3, 4, 12
    n = groups * g
    lengths = rng.integers(2, width + 1, n)
    correct = rng.integers(0, 2, n).astype(bool)
    necessary = np.array([rng.integers(1, L + 1) for L in lengths])  # the first chunk holding the answer ends here
    mask = (np.arange(width)[None] < lengths[:, None]).astype(np.float32)
    tlr = np.zeros((n, width), np.float32)
    tlr[np.arange(n), lengths - 1] = correct.astype(np.float32)  # the outcome on the last token
    chunk = np.where((np.arange(width)[None] >= necessary[:, None]) & (mask > 0), -1.0, 1.0).astype(np.float32)
    index = np.repeat(np.arange(groups), g)
    want = their_advantages(torch.tensor(tlr), torch.tensor(chunk), torch.tensor(mask), index, 0.1).numpy()
    r = C.decs_token_rewards(correct, necessary.astype(np.float32), mask, beta=0.1, max_length=float(width))
    got = np.asarray(C.decs_advantages(r, mask, index, groups))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

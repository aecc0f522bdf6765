"""MatchTIR's dual-level advantage (METHODS.md #165) against the authors' code: a torch
transcription of ``compute_grpo_outcome_advantage`` from ``quchangle1/MatchTIR`` @f614ce1
(``Code/verl/trainer/ppo/core_algos.py``: turns as the runs of the response mask, each turn's
reward at its last token, gamma 0.9, the mean of the trajectory and turn advantages) on random
multi-turn episodes, against ``core.matchtir_advantages`` per turn."""

from collections import defaultdict

import numpy as np
import pytest

import jaxrl_llm.core as C

torch = pytest.importorskip("torch")


def their_advantages(token_level_rewards, response_mask, index, epsilon=1e-6):
    scores = token_level_rewards.sum(dim=-1)
    by = defaultdict(list)
    for i in range(len(scores)):
        by[index[i]].append(scores[i])
    stat = {k: (torch.tensor(0.0), torch.tensor(1.0)) if len(v) == 1 else
            (torch.mean(torch.tensor(v)), torch.std(torch.tensor([v]))) for k, v in by.items()}
    group_adv = torch.stack([(scores[i] - stat[index[i]][0]) / (stat[index[i]][1] + epsilon)
                             for i in range(len(scores))])
    seq_len = token_level_rewards.size(1)
    turns_list, disc_list = [], []
    for i in range(len(scores)):
        turns, start = [], None
        for t in range(seq_len):
            if response_mask[i, t] == 1 and start is None:
                start = t
            if response_mask[i, t] == 0 and start is not None:
                turns.append((start, t - 1))
                start = None
        if start is not None:
            turns.append((start, seq_len - 1))
        turns_list.append(turns)
        tr = torch.stack([token_level_rewards[i, e] for _, e in turns])
        disc, acc = torch.zeros_like(tr), 0.0
        for t in reversed(range(len(tr))):
            acc = tr[t] + 0.9 * acc
            disc[t] = acc
        disc_list.append(disc)
    step = defaultdict(list)
    for i, d in enumerate(disc_list):
        for j in range(len(d)):
            step[f"{index[i]}-{j}"].append(d[j])
    sstat = {k: (torch.tensor(0.0), torch.tensor(1.0)) if len(v) == 1 else
             (torch.stack(v).mean(), torch.stack(v).std()) for k, v in step.items()}
    out = []
    for i, d in enumerate(disc_list):
        adv = [(d[j] - sstat[f"{index[i]}-{j}"][0]) / (sstat[f"{index[i]}-{j}"][1] + epsilon) for j in range(len(d))]
        out.append([float((group_adv[i] + a) / 2) for a in adv])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matchtir_advantages_equal_the_authors_code(seed):
    rng = np.random.default_rng(seed)
    groups, g, k = 3, 4, 4
    n = groups * g
    turns = rng.integers(1, k + 1, n)
    rewards = np.zeros((n, k), np.float32)
    seq, masks = [], []
    for i in range(n):
        rewards[i, :turns[i]] = rng.choice([0.0, 0.25, 0.5, 1.0], turns[i])
        toks, m = [], []
        for t in range(turns[i]):
            length = int(rng.integers(1, 4))
            toks += [0.0] * (length - 1) + [float(rewards[i, t])]
            m += [1] * length
            toks += [0.0] * 2  # an observation between turns
            m += [0, 0]
        seq.append(toks)
        masks.append(m)
    width = max(len(s) for s in seq)
    tlr = torch.zeros(n, width)
    rm = torch.zeros(n, width, dtype=torch.long)
    for i in range(n):
        tlr[i, :len(seq[i])] = torch.tensor(seq[i])
        rm[i, :len(masks[i])] = torch.tensor(masks[i])
    index = np.repeat(np.arange(groups), g)
    want = their_advantages(tlr, rm, index)
    tm = np.arange(k)[None] < turns[:, None]
    got = np.asarray(C.matchtir_advantages(rewards, tm, index, groups, gamma=0.9, traj_weight=0.5))
    for i in range(n):
        np.testing.assert_allclose(got[i, :turns[i]], want[i], rtol=1e-4, atol=1e-5)

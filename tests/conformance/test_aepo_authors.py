"""AEPO's injected responses (METHODS.md #81) against the authors' code: a torch transcription of
the AEPO branch of ``RayPPOTrainer.fit`` (``verl/trainer/ray_trainer.py`` of ``597358816/AEPO``
@b353a05: ``_select_by_advantage(threshold=0.05, absolute=False)`` on the re-sampled quarter's
GRPO advantages -- EasyR1's outcome advantage, unbiased std + 1e-6, a one-response group 0 / 1 --
and ``sample_num = min(reinforce_sample_num, found)``, halved when the entropy is above its base)
on random rewards: the same responses, in the same order, as ``aepo_picks``."""

from collections import defaultdict

import numpy as np
import pytest

from jaxrl_llm.training.parts.aepo import aepo_picks

torch = pytest.importorskip("torch")


def their_picks(scores, index, hot, reinforce_sample_num=60, epsilon=1e-6):
    by = defaultdict(list)
    for i, s in enumerate(scores):
        by[index[i]].append(s)
    stat = {k: (torch.tensor(0.0), torch.tensor(1.0)) if len(v) == 1 else
            (torch.mean(torch.tensor(v)), torch.std(torch.tensor([v]))) for k, v in by.items()}
    adv = torch.stack([(scores[i] - stat[index[i]][0]) / (stat[index[i]][1] + epsilon) for i in range(len(scores))])
    selected = (adv > 0.05).nonzero(as_tuple=False).squeeze(-1).tolist()
    n = min(reinforce_sample_num, len(selected))
    return selected[:n // 2 if hot else n]


@pytest.mark.parametrize("hot", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aepo_picks_equal_the_authors_selection(seed, hot):
    rng = np.random.default_rng(seed)
    p, g = 6, 8
    totals = rng.choice([0.0, 0.5, 1.0], (p, g)).astype(np.float32)
    want = their_picks(torch.tensor(totals.ravel()), np.repeat(np.arange(p), g), hot, reinforce_sample_num=7)
    got = aepo_picks(totals, hot, max_rows=7)
    assert [pp * g + j for pp, j in got] == want

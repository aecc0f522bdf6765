"""BRPO's advantage (AnytimeReasoner, METHODS.md #13) against the authors' code: a torch
transcription of ``compute_cot_advantage`` from ``sail-sg/AnytimeReasoner`` @7e3f5bb
(``verl/verl/trainer/ppo/brpo.py``; the budget prior passed in for ``get_budget_probs()``, its
module-level ``VARIANCE_REDUCTION`` as an argument) on random summary scores, every variant."""

import numpy as np
import pytest

import jaxrl_llm.core as C

torch = pytest.importorskip("torch")


def their_cot_advantage(summary_scores, G, S, budget_probs, variance_reduction):
    B = summary_scores.shape[0] // G
    A = summary_scores.shape[1] // S
    budget_probs = budget_probs / budget_probs.sum()
    discount_probs = torch.pow(2.0, torch.arange(S))
    scores = torch.reshape(summary_scores, (B, G, S, A)).mean(dim=-1)
    out = torch.zeros_like(scores)
    for b in range(B):
        for g in range(G):
            for s in range(S):
                cot_return = (scores[b, g, s:] * budget_probs[s:]).sum()
                avg_return = 0
                if G > 1:
                    avg_return = (scores[b, :, s:] * budget_probs[s:]).sum(dim=-1).mean()
                last = 0
                if s > 0:
                    d = discount_probs[:s]
                    last = (scores[b, g, :s] * d).sum() / d.sum() * budget_probs[s:].sum()
                baseline = {"brpo": (s * last + (S - s) * avg_return) / S, "v1only": last, "v2only": avg_return,
                            "none": 0.0}[variance_reduction]
                out[b, g, s] = cot_return - baseline
    return out.reshape(B * G, S)


@pytest.mark.parametrize("variant", ["brpo", "v1only", "v2only", "none"])
def test_brpo_advantages_equal_the_authors_code(variant):
    rng = np.random.default_rng(0)
    B, G, S, A = 3, 4, 4, 2
    raw = rng.integers(0, 2, (B * G, S * A)).astype(np.float32)  # A summaries per budget, scored 0 / 1
    prior = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    want = their_cot_advantage(torch.tensor(raw), G, S, torch.tensor(prior), variant).numpy()
    budget_scores = raw.reshape(B * G, S, A).mean(-1)
    got = np.asarray(C.brpo_advantages(budget_scores, np.repeat(np.arange(B), G), B, prior=prior, variant=variant))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

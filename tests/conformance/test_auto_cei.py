"""Auto-CEI's reward (METHODS.md #193) against the authors' code: a transcription of
``reward_processor`` with its conservative reward (``src/utils/utils.py`` of
``SalesforceAIResearch/Auto-CEI`` @b7ea2f5; the evaluator replaced by a given accuracy, the
generic task's line count and the MATH task's ``".\\n"`` count) on random completions."""

import numpy as np
import pytest

from jaxrl_llm.algorithms import SHAPING, ShapingInputs


def their_scores(responses, accuracy, c1, c2, task="generic"):
    def sigmoid(x):
        return 2 / (1 + np.exp(-c2 * (x - c1))) - 1

    score = list(accuracy)
    for i, r in enumerate(responses):
        low = r.lower()
        if "i don't know" in low or "sorry" in low or "too difficult" in low or "unfortunate" in low \
                or "no answer" in low:
            depth = len(r.split(".\n")) if task == "MATH" else len(r.split("\n"))
            score[i] = sigmoid(depth)
        elif score[i] != 1.0:
            score[i] = -1.0
    return score


@pytest.mark.parametrize("task,sep", [("generic", "\n"), ("MATH", ".\n")])
def test_auto_cei_reward_equals_the_authors_code(task, sep):
    rng = np.random.default_rng(0)
    pieces = ["x = 2.", "so y = 3.", "", "Sorry, I cannot.", "I don't know", "It is Unfortunate.", "ok", "No answer."]
    texts = ["\n".join(rng.choice(pieces, rng.integers(1, 9))) for _ in range(64)]
    acc = rng.integers(0, 2, 64).astype(np.float32)
    x = ShapingInputs(acc, np.ones(64, np.int32), np.repeat(np.arange(16), 4), 16, 64, {}, tuple(texts))
    got = x.scores + SHAPING["auto_cei"].fn(x, c1=5.0, c2=0.7, step_sep=sep)
    np.testing.assert_allclose(got, their_scores(texts, acc, 5.0, 0.7, task), rtol=1e-5, atol=1e-6)

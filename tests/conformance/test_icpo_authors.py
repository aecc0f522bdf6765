"""ICPO (METHODS.md #22) against the authors' code: a transcription of ``Celine-hxy/ICPO``
@287ac48 --

* ``verl/recipe/icpo/utils/core_algos.py`` ``compute_icpo_policy_loss`` (PPO clip with the dual
  clip on the own rows, ``p / (p + 0.1)`` on the demonstration-guided rows), token-mean;
* ``verl/recipe/icpo/utils/prompt_builder.py`` ``ICLPromptBuilder.construct_n_shot_prompt`` for a
  prompt without a system message (``w_inst=True, w_prefix=True``);
* ``verl/recipe/icpo/utils/reward_score.py`` ``decay_by_step(method="linear", T=400)``, the
  annealed expert bonus;

run on random inputs against ``recipe.loss=icpo``, :func:`jaxrl_llm.algorithms.hints.icpo_prompt`
and the hint part's bonus.
"""

import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from jaxrl_llm.algorithms.hints import icpo_prompt  # noqa: E402
from jaxrl_llm.algorithms.losses import icpo_surrogate  # noqa: E402
from jaxrl_llm.training.parts.hints import Hints  # noqa: E402
from jaxrl_llm.training.recipes import recipe  # noqa: E402


def their_loss(old_log_prob, log_prob, advantages, response_mask, hinted, clip_low=0.2, clip_high=0.2, clip_c=3.0):
    t = response_mask.shape[-1]
    hinted = torch.tensor(hinted).unsqueeze(-1).expand(-1, t)
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    hinted_ratio = torch.exp(torch.clamp(log_prob, min=-20.0, max=20.0))
    hinted_ratio = hinted_ratio / (hinted_ratio + 0.1)
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip1 = torch.maximum(pg1, pg2)
    clip2 = torch.min(-advantages * clip_c, clip1)
    pg = torch.where(advantages < 0, clip2, clip1)
    h = hinted.float()
    pg = pg * (1 - h) + (-advantages * hinted_ratio) * h
    return (pg * response_mask).sum() / response_mask.sum()  # agg_loss token-mean


def test_loss_equals_the_code():
    rng = np.random.default_rng(0)
    b, t = 8, 7
    mask = np.arange(t)[None] < rng.integers(1, t + 1, b)[:, None]
    lp = np.log(rng.uniform(0.02, 0.98, (b, t)))
    old = lp + rng.normal(0, 2.0, (b, t))  # ratios far outside the clip range: both clips act
    adv = np.repeat(np.abs(rng.normal(0, 1.5, (b, 1))) * np.array([[1.0], [-1.0]] * (b // 2)), t, 1)
    hinted = np.array([1, 0, 0, 0] * (b // 4), np.int64)  # own rows with negative advantages: rows 1, 3, 5, 7
    want = their_loss(torch.tensor(old), torch.tensor(lp), torch.tensor(adv), torch.tensor(mask, dtype=torch.float64),
                      hinted).item()
    f32 = np.float32
    per, _ = icpo_surrogate(lp.astype(f32), old.astype(f32), adv.astype(f32), mask, hinted.astype(f32))
    np.testing.assert_allclose(float(np.sum(per) / mask.sum()), want, rtol=2e-5)
    # the dual clip acts on these inputs (the comparison would fail without it)
    no_dual, _ = icpo_surrogate(lp.astype(f32), old.astype(f32), adv.astype(f32), mask, hinted.astype(f32),
                                dual_clip=None)
    assert abs(float(np.sum(no_dual) - np.sum(per))) > 1e-3
    assert recipe("icpo", num_samples=4).objective.policy_loss is icpo_surrogate


class TheirBuilder:  # ICLPromptBuilder(w_inst=True, w_prefix=True), no system prompt
    instruction = " Let's think step by step and output the final answer within \\boxed{{}}"

    def construct(self, demonstrations, raw_question):
        icl_template = "Question: {question}" + self.instruction + "\n" + "Answer: {answer}"
        shots = "\n\n\n".join(icl_template.format(question=q, answer=a) for q, a in demonstrations)
        raw_question = raw_question + self.instruction
        final_prompt = shots + "\n\n\n" + "Question: " + raw_question + "\n" + "Answer: "
        return final_prompt[:-1]


@pytest.mark.parametrize("n", [1, 2, 4])
def test_prompt_equals_the_code(n):
    rng = np.random.default_rng(n)
    demos = [(f"What is {rng.integers(100)} + {rng.integers(100)}?", f"\\boxed{{{rng.integers(200)}}}")
             for _ in range(n)]
    question = "Find x such that 2x = 6."
    want = TheirBuilder().construct(demos, question)
    # the code's main question keeps the literal doubled braces of its instruction: single ones here
    assert icpo_prompt(demos, question) == want.replace("\\boxed{{}}\nAnswer:", "\\boxed{}\nAnswer:")


def test_annealed_bonus_equals_the_code_decay():
    def their_decay(step_t, T=400):  # decay_by_step(method="linear")
        return max(0.0, 1 - step_t / T)

    part = Hints(recipe("icpo", num_samples=4, hints={"name": "icpo", "beta": 1.0}).hints)
    for step in (0, 1, 57, 399, 400, 1000):
        assert part._expert_bonus(types.SimpleNamespace(iteration=step)) == pytest.approx(their_decay(step))

"""SPIN on the tiny preset: self-play fine-tuning from the SFT model, three iterations.

SPIN (Chen et al., arXiv:2401.01335) trains the policy to tell the human (reference) answer
from its *own* samples: each iteration pairs every training prompt's reference solution
(chosen) with the current policy's first sample (rejected, right or wrong), trains DPO's
logistic loss against the current policy as the frozen reference (the opponent), on this
round's pairs plus the previous round's, and the result is the next round's opponent. Same
model, task and SFT warm-up as ``experiments/tiny_dpo.py``; the control continues SFT for as
many steps (3 x 100) instead.

Run: ``jaxrl-llm train tiny_spin [pairs.iterations=2 run.seed=1 ...]``.
"""

import dataclasses

from jaxrl_llm.training.configs import PairsSpec, PreferenceRecipeSpec, PreferenceRunConfig


def config() -> PreferenceRunConfig:
    base = PreferenceRunConfig()
    return dataclasses.replace(base, pairs=PairsSpec(source="spin", iterations=3),
                               recipe=PreferenceRecipeSpec(name="spin"),
                               run=dataclasses.replace(base.run, out="runs/tiny_spin"))

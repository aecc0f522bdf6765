"""TGDPO on the tiny preset: DPO with token-level reward guidance from a DPO model (run tiny_dpo first).

TGDPO (Zhu et al., arXiv:2506.14574) weighs every token of DPO's log-ratios by the token reward
of a previously trained policy: ``1 + alpha beta log(pi_rm / pi_ref)`` on the chosen answer,
``1 - alpha beta log(pi_rm / pi_ref)`` on the rejected one (alpha 0.5, beta 0.1). The token-reward
model is the DPO model of ``jaxrl-llm train tiny_dpo`` (``runs/tiny_dpo/final_params``); the rest
(SFT, self-generated pairs, control) is ``experiments/tiny_dpo.py``.

Run: ``jaxrl-llm train tiny_dpo && jaxrl-llm train tiny_tgdpo [model.aux_params=<dir> ...]``.
"""

import dataclasses

from jaxrl_llm.training.configs import PreferenceRecipeSpec, PreferenceRunConfig


def config() -> PreferenceRunConfig:
    base = PreferenceRunConfig()
    return dataclasses.replace(base, model=dataclasses.replace(base.model, aux_params="runs/tiny_dpo/final_params"),
                               recipe=PreferenceRecipeSpec(name="tgdpo"),
                               run=dataclasses.replace(base.run, out="runs/tiny_tgdpo"))

"""RTO on the tiny preset: PPO on a DPO model's token-level rewards (run tiny_dpo first).

RTO (Zhong et al., arXiv:2404.18922) turns a DPO-trained policy into a dense reward: every
sampled token earns ``clip(0.05 log(pi_dpo / pi_ref), +-0.05)`` on top of the task's outcome
reward and the per-token KL penalty, and PPO (GAE with a critic) optimises the sum. The DPO
model is the one ``jaxrl-llm train tiny_dpo`` writes to ``runs/tiny_dpo/final_params`` (same
2-layer model and task); the rest is ``experiments/tiny_grpo.py`` with PPO's critic.

Run: ``jaxrl-llm train tiny_dpo && jaxrl-llm train tiny_rto [model.aux_params=<dir> ...]``.
"""

import dataclasses
from pathlib import Path

from jaxrl_llm.cli import load_experiment
from jaxrl_llm.config import Choice
from jaxrl_llm.training.configs import KLSpec
from jaxrl_llm.training.runner import RecipeSpec, RLRunConfig


def config() -> RLRunConfig:
    base = load_experiment(Path(__file__).with_name("tiny_grpo.py")).default
    return dataclasses.replace(
        base, model=dataclasses.replace(base.model, aux_params="runs/tiny_dpo/final_params"),
        recipe=RecipeSpec(name="ppo", advantage=Choice("rto"), kl=KLSpec(coef=0.01), num_minibatches=2),
        run=dataclasses.replace(base.run, out="runs/tiny_rto"))

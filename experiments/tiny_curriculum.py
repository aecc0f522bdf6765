"""Tiny curriculum: SEC's category bandit (recipe.selector=sec over the problems' level) against uniform sampling on mixed-difficulty addition (arithmetic_mix add_levels: 1+1, 2+1, 2+2 and 3+3 digits).

The tiny model of ``tiny_grpo`` is warmed up by SFT to 0.25 greedy accuracy on training prompts
(at most 3000 steps; a first probe with 1500 steps stopped at 0.11, held-out 0.07, and RL did not
move it in 200 steps), then GRPO runs 200 steps of 16 prompts x 8 samples. With SEC each step draws 4 x 16 candidate
prompts from the data stream and picks 16: a level is drawn from ``softmax(Q / tau)`` per slot,
``Q`` moved by TD(0) (alpha 0.5) towards the mean |advantage| of the level's prompts in the
previous step (the paper's learning-gain proxy). The uniform arm is the same run with
``recipe.selector=none rollout.candidates=1``. Held-out greedy accuracy is evaluated every 25
steps; ``scripts/curriculum_compare.sh`` runs both arms over seeds and prints the table.

Run: ``jaxrl-llm train tiny_curriculum [run.seed=1 recipe.selector.temperature=0.4 ...]``.
"""

from jaxrl_llm.config import Choice
from jaxrl_llm.training.runner import (DataSpec, ModelSpec, OptimSpec, RecipeSpec, RLRunConfig, RolloutSpec, RunSpec,
                                       SFTSpec)


def config() -> RLRunConfig:
    return RLRunConfig(
        model=ModelSpec(source="tiny", hidden_size=64, num_layers=2),
        data=DataSpec(task="arithmetic_mix", task_args={"preset": "add_levels", "instruction": ""}, chat=False,
                      train_rows=4096, eval_rows=256),
        rollout=RolloutSpec(prompts_per_step=16, num_samples=8, max_new_tokens=6, temperature=1.0,
                            prompt_buckets=(32,), candidates=4),
        recipe=RecipeSpec(name="grpo", num_minibatches=2,
                          selector=Choice("sec", {"column": "level", "alpha": 0.5, "temperature": 1.0})),
        optim=OptimSpec(lr=1e-4, max_grad_norm=1.0),
        sft=SFTSpec(steps=3000, batch_size=32, lr=3e-3, target_accuracy=0.25, probe_every=25),
        run=RunSpec(out="runs/tiny_curriculum", steps=200, eval_every=25, eval_batch_size=256, checkpoint_every=100,
                    log_samples_every=100, export_hf=False, progress=False),
    )

"""Tiny preset: a 2-layer model learns 2-digit + 1-digit addition by SFT, then GRPO improves it (about 1-2 min on 2 CPU cores; CI runs it).

The model is a random Llama-style decoder (d = 64) over a character-level tokenizer (95
tokens). SFT on the task's reference solutions is deliberately short, so the model leaves it
partly right and GRPO's groups have mixed outcomes to learn from; the summary reports
held-out greedy accuracy at the start, after SFT and after GRPO.

Run: ``jaxrl-llm train tiny_grpo [run.seed=1 rl.steps=...]`` (or ``python -m jaxrl_llm``);
every field of :class:`jaxrl_llm.training.runner.RLRunConfig` can be overridden.
"""

from jaxrl_llm.training.runner import (DataSpec, ModelSpec, OptimSpec, RecipeSpec, RLRunConfig, RolloutSpec, RunSpec,
                                       SFTSpec, check_rl, run_rl)


def config() -> RLRunConfig:
    return RLRunConfig(
        model=ModelSpec(source="tiny", hidden_size=64, num_layers=2),
        data=DataSpec(task="arithmetic", task_args={"preset": "add2x1", "instruction": ""}, chat=False,
                      train_rows=4096, eval_rows=128),
        rollout=RolloutSpec(prompts_per_step=8, num_samples=8, max_new_tokens=6, temperature=1.0,
                            prompt_buckets=(32,)),
        recipe=RecipeSpec(name="grpo", num_minibatches=2),
        optim=OptimSpec(lr=1e-4, max_grad_norm=1.0),
        sft=SFTSpec(steps=500, batch_size=32, lr=3e-3),
        run=RunSpec(out="runs/tiny_grpo", steps=60, eval_every=20, eval_batch_size=128, checkpoint_every=20,
                    log_samples_every=20, export_hf=False, progress=False),
    )


def check(cfg: RLRunConfig) -> None:
    check_rl(cfg)


main = run_rl

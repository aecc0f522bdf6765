"""Main job: GRPO on the embedded SmolLM2-135M-Instruct for small-number arithmetic (about 5 min on 2 CPU cores).

The model starts from its instruction tuning (no SFT): held-out greedy accuracy is measured
before and after, and the run saves a checkpoint (``ckpt/``), an HF export with the LoRA
adapters merged (``hf/``, loads with transformers), TensorBoard and JSONL metrics, sample
completions and ``reward_curve.png``. Re-running the same command resumes.

Run: ``jaxrl-llm train smollm2_grpo [run.seed=1 ...]``.
"""

from jaxrl_llm.training.runner import (DataSpec, ModelSpec, OptimSpec, RecipeSpec, RLRunConfig, RolloutSpec, RunSpec)


def config() -> RLRunConfig:
    return RLRunConfig(
        model=ModelSpec(source="smollm2", lora_rank=16),
        data=DataSpec(task="arithmetic", task_args={"ops": ["+", "-", "*"], "operand_ranges": [[2, 20], [2, 12]]},
                      chat=True, train_rows=4096, eval_rows=88),
        rollout=RolloutSpec(prompts_per_step=4, num_samples=8, max_new_tokens=12, temperature=0.7,
                            prompt_buckets=(48, 64)),
        recipe=RecipeSpec(name="grpo"),
        optim=OptimSpec(lr=1e-4, warmup_steps=3, max_grad_norm=1.0),
        run=RunSpec(out="runs/smollm2_grpo", steps=40, eval_every=20, checkpoint_every=10, log_samples_every=10),
    )


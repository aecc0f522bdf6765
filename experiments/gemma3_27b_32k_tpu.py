"""Scale: GRPO with 32k-token rows (1,024-token prompts, 31,744-token responses) on Gemma 3 27B, on
a TPU v5p-64 slice (32 chips; config-checked and compiled for the chips here by the TPU compiler;
not run).

The 32k recipes of the seed list (NeMo-RL's and Klear's 32k runs) on a model whose five of six
layers attend over a 1,024-token window: splash attention builds the local and the global kernel
and each layer picks its own; each row's tokens are split over 2 chips (``mesh.context=2``: 16,384
per chip) and packed into one 32,768-token row per FSDP group and micro-batch; full remat,
bfloat16 compute over float32 master weights.

    jaxrl-llm plan gemma3_27b_32k_tpu --target v5p-64     # docs/scaling.md
"""

from jaxrl_llm.training.runner import (DataSpec, MeshSpec, ModelSpec, OptimSpec, RecipeSpec, RLRunConfig, RolloutSpec,
                                       RunSpec, TrainSpec)


def config() -> RLRunConfig:
    return RLRunConfig(
        model=ModelSpec(source="hf:/data/gemma-3-27b-it", preset="gemma3-27b", dtype="bfloat16",
                        param_dtype="float32", remat="full"),
        data=DataSpec(dataset="/data/dapo-math-17k.jsonl", eval_dataset="/data/aime-2024.jsonl",
                      dataset_format="rows", eval_rows=30, chat=True, max_prompt_tokens=1024),
        rollout=RolloutSpec(prompts_per_step=8, num_samples=8, max_new_tokens=31744, temperature=1.0,
                            prompt_buckets=(512, 1024)),
        recipe=RecipeSpec(name="grpo", num_minibatches=4),
        optim=OptimSpec(lr=1e-6, warmup_steps=10, weight_decay=0.1, max_grad_norm=1.0),
        train=TrainSpec(max_tokens_per_microbatch=32768),
        mesh=MeshSpec(data=1, fsdp=16, tensor=1, context=2),
        run=RunSpec(out="runs/gemma3_27b_32k", steps=200, eval_every=20, eval_batch_size=16,
                    checkpoint_every=10, keep_last=3, log_samples_every=10),
    )

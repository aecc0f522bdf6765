"""Scale: GRPO with 16,384-token responses on Qwen2.5-32B, on a TPU v5p-64 slice (32 chips, 95 GiB
each; config-checked and compiled for the chips here by the TPU compiler; not run).

The 32B setting of the seed papers' long-reasoning runs (DAPO's 32B base, 16k-20k responses):
8 prompts x 16 responses per step, 4 mini-batches (one row per chip), one packed 17,408-token row per chip and
micro-batch (``train.max_tokens_per_microbatch``), FSDP over the 32 chips, splash attention, full
remat, bfloat16 compute over float32 master weights (12.3 GiB of parameters and AdamW moments per
chip).

    jaxrl-llm plan qwen25_32b_16k_tpu --target v5p-64      # docs/scaling.md
"""

from jaxrl_llm.training.runner import (DataSpec, MeshSpec, ModelSpec, OptimSpec, RecipeSpec, RLRunConfig, RolloutSpec,
                                       RunSpec, TrainSpec)


def config() -> RLRunConfig:
    return RLRunConfig(
        model=ModelSpec(source="hf:/data/Qwen2.5-32B", preset="qwen2.5-32b", dtype="bfloat16", param_dtype="float32",
                        remat="full"),
        data=DataSpec(dataset="/data/dapo-math-17k.jsonl", eval_dataset="/data/aime-2024.jsonl",
                      dataset_format="rows", eval_rows=30, chat=True, max_prompt_tokens=1024),
        rollout=RolloutSpec(prompts_per_step=8, num_samples=16, max_new_tokens=16384, temperature=1.0,
                            prompt_buckets=(512, 1024)),
        recipe=RecipeSpec(name="grpo", num_minibatches=4),
        optim=OptimSpec(lr=1e-6, warmup_steps=10, weight_decay=0.1, max_grad_norm=1.0),
        train=TrainSpec(max_tokens_per_microbatch=17408),
        mesh=MeshSpec(data=1, fsdp=32, tensor=1),
        run=RunSpec(out="runs/qwen25_32b_16k", steps=200, eval_every=20, eval_batch_size=32,
                    checkpoint_every=10, keep_last=3, log_samples_every=10),
    )

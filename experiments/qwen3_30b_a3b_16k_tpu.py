"""Scale: GRPO with 16,384-token responses on Qwen3-30B-A3B (a mixture of 128 experts, 8 active),
on a TPU v5p-64 slice (32 chips; config-checked and compiled for the chips here by the TPU
compiler; not run).

Experts split 8 ways over an ``expert`` mesh axis and the rest FSDP (``mesh.fsdp=4 mesh.expert=8``),
the expert matmuls over capacity buffers (``moe_capacity_factor=1.25`` per sequence, dropped
assignments logged), routing replay from the sampler (Rollout Routing Replay, arXiv 2510.11370).
A mixture of experts trains on padded rows (packing does not take its per-row routes yet): one
17,408-token row per chip and micro-batch (``optim.num_microbatches``); splash attention, full
remat, bfloat16 compute over float32 master weights.

    jaxrl-llm plan qwen3_30b_a3b_16k_tpu --target v5p-64   # docs/scaling.md
"""

from jaxrl_llm.training.runner import (DataSpec, MeshSpec, ModelSpec, OptimSpec, RecipeSpec, RLRunConfig, RolloutSpec,
                                       RunSpec, TrainSpec)


def config() -> RLRunConfig:
    return RLRunConfig(
        model=ModelSpec(source="hf:/data/Qwen3-30B-A3B", preset="qwen3-30b-a3b", dtype="bfloat16",
                        param_dtype="float32", remat="full", moe_capacity_factor=1.25),
        data=DataSpec(dataset="/data/dapo-math-17k.jsonl", eval_dataset="/data/aime-2024.jsonl",
                      dataset_format="rows", eval_rows=30, chat=True, max_prompt_tokens=1024),
        rollout=RolloutSpec(prompts_per_step=8, num_samples=16, max_new_tokens=16384, temperature=1.0,
                            prompt_buckets=(512, 1024)),
        recipe=RecipeSpec(name="grpo", num_minibatches=4),
        optim=OptimSpec(lr=1e-6, warmup_steps=10, weight_decay=0.1, max_grad_norm=1.0),
        train=TrainSpec(routing_replay=True),
        mesh=MeshSpec(data=1, fsdp=4, tensor=1, expert=8),
        run=RunSpec(out="runs/qwen3_30b_a3b_16k", steps=200, eval_every=20, eval_batch_size=32,
                    checkpoint_every=10, keep_last=3, log_samples_every=10),
    )

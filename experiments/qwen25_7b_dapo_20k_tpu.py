"""Scale: DAPO at the paper's lengths on Qwen2.5-7B, on a TPU v5e-64 slice (config-checked and
compiled for the chips here by the TPU compiler; not run).

DAPO (arXiv:2503.14476) trains with 20,480-token responses (an overlong penalty over the last 4,096)
and prompts of up to 2,048 tokens: clip-higher 0.2/0.28, token-mean loss, dynamic sampling, 16
mini-batches per rollout batch. Here 32 prompts x 16 responses per step. Each update packs its
rows into micro-batches of one 22,528-token row per FSDP group (``train.max_tokens_per_microbatch``,
verl's remove-padding and dynamic batch size), and each row's tokens are split over 4 chips
(``mesh.context=4``: 5,632 tokens per chip); splash attention (``model.attention=auto`` on TPU),
full remat, bfloat16 compute over float32 master weights.

    jaxrl-llm plan qwen25_7b_dapo_20k_tpu --target v5e-64            # fits: docs/scaling.md
    jaxrl-llm plan qwen25_7b_dapo_20k_tpu mesh.fsdp=8 mesh.context=1 --target v5p-16   # 8 v5p chips
    jaxrl-llm train qwen25_7b_dapo_20k_tpu model.source=hf:/data/Qwen2.5-7B \\
        data.dataset=/data/dapo-math-17k.jsonl data.eval_dataset=/data/aime-2024.jsonl   # on the pod

The data files are jsonl rows with ``prompt`` and ``answer`` (``data.dataset_format=rows``).
"""

from jaxrl_llm.config import Choice
from jaxrl_llm.training.runner import (DataSpec, MeshSpec, ModelSpec, OptimSpec, RecipeSpec, RLRunConfig, RolloutSpec,
                                       RunSpec, TrainSpec)


def config() -> RLRunConfig:
    return RLRunConfig(
        model=ModelSpec(source="hf:/data/Qwen2.5-7B", preset="qwen2.5-7b", dtype="bfloat16", param_dtype="float32",
                        remat="full"),
        data=DataSpec(dataset="/data/dapo-math-17k.jsonl", eval_dataset="/data/aime-2024.jsonl",
                      dataset_format="rows", eval_rows=30, chat=True, max_prompt_tokens=2048),
        rollout=RolloutSpec(prompts_per_step=32, num_samples=16, max_new_tokens=20480, temperature=1.0,
                            prompt_buckets=(512, 1024, 2048)),
        recipe=RecipeSpec(name="dapo", shaping=Choice("overlong", {"buffer": 4096})),
        optim=OptimSpec(lr=1e-6, warmup_steps=10, weight_decay=0.1, max_grad_norm=1.0),
        train=TrainSpec(max_tokens_per_microbatch=22528),
        mesh=MeshSpec(data=1, fsdp=16, tensor=1, context=4),
        run=RunSpec(out="runs/qwen25_7b_dapo_20k", steps=200, eval_every=20, eval_batch_size=64,
                    checkpoint_every=10, keep_last=3, log_samples_every=10),
    )

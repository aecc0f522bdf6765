"""Scale: DAPO on Qwen2.5-7B-Instruct for GSM8K with 16,384-token responses on one 8-GPU host (H100
80 GB; config-checked and compiled for 8 H100s here, `jaxrl-llm plan qwen25_7b_gsm8k_dapo_gpu
--target h100:8`; not run).

DAPO (arXiv:2503.14476): clip-higher 0.2/0.28, token-mean loss, overlong shaping and dynamic
sampling (groups whose 16 completions all get the same reward are dropped and more prompts are
drawn, up to 10 rounds), 16 mini-batches per rollout batch, responses up to 16,384 tokens (the
paper's 20,480 needs more cache than 16 prompts x 16 responses leave on 8 GPUs). Each update packs
its rows into one 16,640-token row per GPU and micro-batch (``train.max_tokens_per_microbatch``);
cuDNN attention where it applies (``model.attention=auto`` on GPU; packed rows use blockwise),
bfloat16 compute over float32 master weights, full remat, FSDP over the 8 GPUs. Needs local files::

    pip install -e ".[cuda]"
    jaxrl-llm train qwen25_7b_gsm8k_dapo_gpu \\
        model.source=hf:/data/Qwen2.5-7B-Instruct \\
        data.dataset=/data/gsm8k/train.jsonl data.eval_dataset=/data/gsm8k/test.jsonl
"""

from jaxrl_llm.training.runner import (DataSpec, MeshSpec, ModelSpec, OptimSpec, RecipeSpec, RLRunConfig, RolloutSpec,
                                       RunSpec, TrainSpec)


def config() -> RLRunConfig:
    return RLRunConfig(
        model=ModelSpec(source="hf:/data/Qwen2.5-7B-Instruct", preset="qwen2.5-7b", dtype="bfloat16",
                        param_dtype="float32", remat="full"),
        data=DataSpec(dataset="/data/gsm8k/train.jsonl", eval_dataset="/data/gsm8k/test.jsonl",
                      dataset_format="gsm8k", eval_rows=512, chat=True, max_prompt_tokens=256),
        rollout=RolloutSpec(prompts_per_step=16, num_samples=16, max_new_tokens=16384, temperature=1.0,
                            prompt_buckets=(128, 256)),
        recipe=RecipeSpec(name="dapo", num_minibatches=16),
        optim=OptimSpec(lr=1e-6, warmup_steps=10, weight_decay=0.1, max_grad_norm=1.0),
        train=TrainSpec(max_tokens_per_microbatch=16640),
        mesh=MeshSpec(data=1, fsdp=8, tensor=1),
        run=RunSpec(out="runs/qwen25_7b_gsm8k_dapo", steps=300, eval_every=25, eval_batch_size=128,
                    checkpoint_every=25, keep_last=3, log_samples_every=25),
    )


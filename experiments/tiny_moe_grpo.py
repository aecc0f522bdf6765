"""Tiny mixture of experts: the tiny preset's task (2-digit + 1-digit addition, SFT then GRPO)
with a Qwen3-MoE-style model, 8 experts and top-2 in each of its 2 layers, and the sampler's
routing replayed in the update (``train.routing_replay=true``; set it false to let the trainer's
routers choose).

Either way the run logs ``moe/router_mismatch`` (the fraction of (token, layer) pairs whose
trainer-side router picks another expert set than the sampler did) and
``moe/load_balancing_loss`` (here also in the loss, ``train.router_aux_coef=0.001``). Seeds and
figures: docs/results.md ("A mixture of experts trains, with and without routing replay").

Run: ``jaxrl-llm train tiny_moe_grpo [run.seed=1 train.routing_replay=false ...]``.
"""

from jaxrl_llm.training.runner import (DataSpec, ModelSpec, OptimSpec, RecipeSpec, RLRunConfig, RolloutSpec, RunSpec,
                                       SFTSpec, TrainSpec)


def config() -> RLRunConfig:
    return RLRunConfig(
        model=ModelSpec(source="tiny-moe", hidden_size=64, num_layers=2),
        data=DataSpec(task="arithmetic", task_args={"preset": "add2x1", "instruction": ""}, chat=False,
                      train_rows=4096, eval_rows=188),
        rollout=RolloutSpec(prompts_per_step=16, num_samples=8, max_new_tokens=6, temperature=1.0,
                            prompt_buckets=(32,)),
        recipe=RecipeSpec(name="grpo", num_minibatches=2),
        train=TrainSpec(routing_replay=True, router_aux_coef=0.001),
        optim=OptimSpec(lr=1e-4, max_grad_norm=1.0),
        sft=SFTSpec(steps=1500, batch_size=32, lr=3e-3, target_accuracy=0.4, probe_every=25),
        run=RunSpec(out="runs/tiny_moe_grpo", steps=300, eval_every=100, eval_batch_size=188, checkpoint_every=100,
                    log_samples_every=100, export_hf=False, progress=False),
    )

"""The embedded SmolLM2-135M-Instruct as a grid world agent: its own chat template (each board
after a move is a user turn, the KV cache carried across turns), LoRA rank 16, GiGPO after a short SFT
warm-up on the BFS solver's transcripts (60 steps), full-layer remat and 4 micro-batches.

The environment is ``agent_grid_gigpo``'s (4 x 4 board, 2 walls, at most 8 moves, reward 1 at
the goal). Compare with the episode-level baseline at equal steps and samples:
``jaxrl-llm train agent_grid_gigpo_smollm2 recipe.advantage=grpo``.

Run: ``jaxrl-llm train agent_grid_gigpo_smollm2``; the tiny-model version is ``agent_grid_gigpo``.
"""

from jaxrl_llm.training.agent_runner import AgentRolloutSpec, AgentRunConfig, EnvRunSpec
from jaxrl_llm.training.configs import KLSpec, ModelSpec, OptimSpec, RecipeSpec, RunSpec, SFTSpec


def config() -> AgentRunConfig:
    return AgentRunConfig(
        model=ModelSpec(source="smollm2", lora_rank=16, remat="full"),
        env=EnvRunSpec(name="grid_world", args={"size": 4, "n_walls": 2, "max_turns": 8}, context_len=1024, chat=True,
                       max_observation_tokens=96, eval_episodes=64),
        rollout=AgentRolloutSpec(episodes_per_step=4, num_samples=8, max_new_tokens=16, temperature=0.7,
                                 prompt_buckets=(128, 256), obs_buckets=(64, 128), episode_buckets=(256, 512, 1024)),
        recipe=RecipeSpec(name="gigpo", kl=KLSpec(coef=0.0)),
        optim=OptimSpec(lr=1e-4, warmup_steps=3, max_grad_norm=1.0, num_microbatches=4),
        sft=SFTSpec(steps=60, batch_size=8, lr=1e-3),
        run=RunSpec(out="runs/agent_grid_gigpo_smollm2", steps=40, eval_every=20, eval_batch_size=64,
                    checkpoint_every=10, log_samples_every=10, export_hf=False),
    )

"""The embedded SmolLM2-135M-Instruct as a search qa agent: its own chat template (observations as
user turns, the KV cache carried across turns), LoRA rank 16, Flow-GRPO after a short SFT
warm-up on the solver's transcripts (60 steps): on ``agent_tool_arith_smollm2`` the 135M
instruct model did not write the tool-call or answer format once in 64 held-out episodes from the
system prompt alone (0.000), which leaves RL no reward to learn from. Full-layer remat and 4 micro-batches keep the train step's
memory in bounds (32 episodes of up to 1408 tokens).

Run: ``jaxrl-llm train agent_search_qa_smollm2``; the tiny-model version is ``agent_search_qa``.
"""

from jaxrl_llm.training.agent_runner import AgentRolloutSpec, AgentRunConfig, EnvRunSpec
from jaxrl_llm.training.configs import ModelSpec, OptimSpec, RecipeSpec, RunSpec, SFTSpec


def config() -> AgentRunConfig:
    return AgentRunConfig(
        model=ModelSpec(source="smollm2", lora_rank=16, remat="full"),
        env=EnvRunSpec(name="search_qa", args={"k": 2, "max_turns": 3}, context_len=1536, chat=True, max_observation_tokens=192,
                       eval_episodes=64),
        rollout=AgentRolloutSpec(episodes_per_step=4, num_samples=8, max_new_tokens=64, temperature=0.7,
                                 prompt_buckets=(256, 384), obs_buckets=(64, 256), episode_buckets=(256, 512, 1024)),
        recipe=RecipeSpec(name="flow_grpo"),
        optim=OptimSpec(lr=1e-4, warmup_steps=3, max_grad_norm=1.0, num_microbatches=4),
        sft=SFTSpec(steps=60, batch_size=8, lr=1e-3),
        run=RunSpec(out="runs/agent_search_qa_smollm2", steps=40, eval_every=20, eval_batch_size=64, checkpoint_every=10,
                    log_samples_every=10, export_hf=False),
    )

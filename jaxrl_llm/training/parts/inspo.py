"""INSPO, instruction-policy co-evolution (METHODS.md #42), as a loop part:
``recipe.loop_part=inspo``.

INSPO keeps a population of instructions (system prompts) next to the policy. Each question is
asked under one instruction drawn from the population by ``softmax(w / tau)`` over the
instructions' importance weights ``w``; the rewards of a question's rollouts are credited to its
instruction, and instructions that do worst are pruned from time to time (the paper's sampling rule,
arXiv:2512.01945; its code was not available to us).

This part:

- **select**: draws an instruction for each prompt of the step (seeded by the run's seed, the
  iteration and the round) and asks the prompt under it (a system message for chat prompts; text
  prompts get it as a prefix line), re-encoded with the run's prompt encoder;
- **observe**: credits each trained group's mean reward total to its instruction; an instruction's
  weight is the mean of the rewards credited to it (our choice: the paper's update rule was not
  available); unused instructions keep weight ``init_weight``;
- every ``prune_every`` steps (0: never) the instruction with the lowest weight among those used at
  least ``min_uses`` times is removed, while more than ``min_population`` remain.

A prompt that no longer fits the sampler's largest prompt bucket with its instruction is asked
without one (``inspo/too_long``); the batch's raw prompts carry the instruction (hints re-ask with
it). The held-out evaluation asks the plain prompts. Not reproduced: the reflection on a replay
buffer of failures by an LLM optimiser that proposes new instructions, and their on-policy
verification. The population, weights and counts are
checkpointed (a resume is exact). Metrics: ``inspo/population``, ``inspo/best_weight``,
``inspo/entropy`` (of the sampling distribution), ``inspo/pruned``.
"""

from __future__ import annotations

import numpy as np

from jaxrl_llm.algorithms.registry import Part
from jaxrl_llm.config import ConfigError
from jaxrl_llm.data.pipeline import PromptBatch
from jaxrl_llm.training.parts.base import Clash, Need, loop_part
from jaxrl_llm.training.parts.options import LOOP_PART_OPTIONS, NamedLoopPart
from jaxrl_llm.training.prompt_store import prompt_keys

__all__ = ["INSPO", "instruction_probs", "with_instruction"]


def instruction_probs(weights, temperature: float) -> np.ndarray:
    """``softmax(w / temperature)``, INSPO's sampling distribution over the population."""
    z = np.asarray(weights, np.float64) / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


def with_instruction(raw, instruction: str):
    """``raw`` asked under ``instruction``: a chat prompt gets it as its system message (replacing
    one it has), a text prompt as a first line."""
    if isinstance(raw, str):
        return f"{instruction}\n{raw}"
    msgs = [dict(m) for m in raw if m.get("role") != "system"]
    return [{"role": "system", "content": instruction}, *msgs]


@loop_part
class INSPO(NamedLoopPart):
    key = "recipe.loop_part=inspo"
    phases = frozenset({"select", "observe"})
    requires = (Need("prompt_encoder", "it asks each prompt under an instruction: pass prompt_encoder (raw prompt -> "
                                       "(token ids, rendered text), the data pipeline's rendering)"),)
    conflicts = (Clash("recipe.selector", "both choose how the step's prompts are asked"),
                 Clash("rollout.asynchronous", "the next step's prompts are drawn before this step's rewards are "
                                               "credited"),
                 Clash("episodes", "it rewrites data prompts; the agent loop draws environment seeds"))

    def __init__(self, *, instructions, temperature: float = 1.0, init_weight: float = 0.0, prune_every: int = 0,
                 min_uses: int = 4, min_population: int = 2):
        if isinstance(instructions, str) or not instructions or not all(
                isinstance(i, str) and i.strip() for i in instructions):
            raise ConfigError("recipe.loop_part.instructions must be a list of non-empty instruction strings, got "
                              f"{instructions!r:.120}")
        if len(set(instructions)) != len(instructions):
            raise ConfigError("recipe.loop_part.instructions has duplicates")
        if not (isinstance(temperature, (int, float)) and temperature > 0):
            raise ConfigError(f"recipe.loop_part.temperature must be a number > 0, got {temperature!r}")
        for name, v in (("prune_every", prune_every), ("min_uses", min_uses), ("min_population", min_population)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"recipe.loop_part.{name} must be an int >= 0, got {v!r}")
        self.temperature, self.init_weight = float(temperature), float(init_weight)
        self.prune_every, self.min_uses, self.min_population = prune_every, min_uses, max(1, min_population)
        self.population = list(instructions)
        self.sums = {i: 0.0 for i in self.population}
        self.uses = {i: 0 for i in self.population}
        self.name = "inspo"
        self._chosen: dict[str, str] = {}  # this step's prompt key -> its instruction
        self._metrics: dict[str, float] = {}

    def weight(self, instruction: str) -> float:
        n = self.uses.get(instruction, 0)
        return self.sums[instruction] / n if n else self.init_weight

    def probs(self) -> np.ndarray:
        return instruction_probs([self.weight(i) for i in self.population], self.temperature)

    def select(self, ctx, batch):
        keys = prompt_keys(batch.where, batch.columns)
        rng = np.random.default_rng([ctx.seed, ctx.iteration, ctx.round_index, 0x1475])
        p = self.probs()
        picks = rng.choice(len(self.population), size=len(batch), p=p)
        ids, texts, raws = [], [], []
        longest, too_long = max(ctx.sampler.length_buckets), 0
        for i, (raw, j) in enumerate(zip(batch.raw_prompts, picks)):
            asked = with_instruction(raw, self.population[j])
            enc = ctx.prompt_encoder(asked)
            if len(enc[0]) > longest:  # does not fit the sampler's buckets: asked without an instruction
                too_long += 1
                ids.append(list(batch.prompt_ids[i]))
                texts.append(batch.prompts[i])
                raws.append(raw)
                continue
            ids.append(list(enc[0]))
            texts.append(enc[1])
            raws.append(asked)
            self._chosen[keys[i]] = self.population[j]
        self._metrics = {"inspo/population": float(len(self.population)),
                         "inspo/entropy": float(-(p * np.log(np.maximum(p, 1e-30))).sum()),
                         "inspo/best_weight": float(max(self.weight(i) for i in self.population)),
                         "inspo/pruned": 0.0, "inspo/too_long": float(too_long)}
        return PromptBatch(ids, texts, raws, batch.columns, list(batch.where))

    def observe(self, ctx, step):
        arrays, _, valid = step.rows_as_sampled()
        gid = np.asarray(arrays["group_ids"])
        totals = np.nan_to_num(np.asarray(step.totals, np.float64), nan=0.0)
        for g, key in enumerate(step.keys):
            inst = self._chosen.get(key)
            rows = (gid == g) & np.asarray(valid)
            if inst is None or inst not in self.sums or not rows.any():
                continue
            self.sums[inst] += float(totals[rows].mean())
            self.uses[inst] += 1
        self._chosen = {}
        if self.prune_every and (ctx.iteration + 1) % self.prune_every == 0 and len(self.population) > \
                self.min_population:
            used = [i for i in self.population if self.uses[i] >= self.min_uses]
            if used:
                worst = min(used, key=lambda i: (self.weight(i), self.population.index(i)))
                self.population.remove(worst)
                self._metrics["inspo/pruned"] = 1.0
        step.metrics.update(self._metrics)
        return step

    def state_dict(self) -> dict:
        return {"population": list(self.population), "sums": dict(self.sums), "uses": dict(self.uses)}

    def load_state_dict(self, state) -> None:
        if state:
            self.population = list(state["population"])
            self.sums = {k: float(v) for k, v in state["sums"].items()}
            self.uses = {k: int(v) for k, v in state["uses"].items()}


LOOP_PART_OPTIONS.register(Part(
    "inspo", INSPO,
    paper="Agentic Policy Optimization via Instruction-Policy Co-Evolution (INSPO), arXiv:2512.01945",
    methods=(42,), verified="hand values (the paper's softmax sampling; the weight and pruning rules are ours)",
    tests="tests/training/test_inspo.py",
    note="a population of instructions (recipe.loop_part.instructions) asked as the system prompt, drawn by "
         "softmax(w / temperature); each trained group's mean reward is credited to its instruction (w: the mean "
         "credit), the worst is pruned every prune_every steps; checkpointed; not reproduced: the LLM optimiser that "
         "writes new instructions from failed trajectories"))

"""BuPO, Bottom-up Policy Optimization (METHODS.md #28), as a loop part: ``recipe.loop_part=bupo``.

BuPO ("Bottom-up Policy Optimization", arXiv:2512.19673) reads an **internal policy** from a lower
layer of the model, ``pi_l = softmax(h_l E^T / T)``: the residual stream ``h_l`` after the first
``l`` decoder layers (no final norm) through the shared unembedding ``E``, and optimises it for the
first steps of training before the ordinary policy takes over. The authors' code (Trae1ounG/BuPO
@d3a85c6: ``verl/workers/actor/dp_actor.py`` ``_forward_micro_batch_layer_k``, ``compute_log_prob``,
``update_policy``; ``modeling_qwen3.py``'s ``mid_layer_logits``) does, for ``global_steps <=
iterative_steps`` (30):

* old log-probs and the update's log-probs both from ``pi_l`` (``hidden_states[k + 1]`` of
  Hugging Face's tuple: decoder layer ``k + 1``, 1-based; ``startk=5``, i.e. ``l = 6``, for
  Qwen3-4B), the ordinary PPO-clip loss on them with the GRPO advantage;
* the rollouts still sampled from the whole model; gradients reach the embeddings, the first ``l``
  layers and the unembedding only;

then a hard switch to the whole model's log-probs. No mixing.

This part does that: during the first ``steps`` iterations, **assemble** replaces the batch's old
log-probs by ``pi_l``'s (the policy before the update, at the sampling temperature) and **update**
runs the recipe's own train step on the batch with a ``policy_layer`` column, which makes the
objective read ``pi_l`` (:meth:`jaxrl_llm.models.Transformer.__call__`'s ``exit_layer``: the later
layers run as the identity, so the forward pass costs as much as the whole model's and the later
layers get no gradient; an optimiser's weight decay still moves them, and optax's Adam counts its
steps for all parameters at once, where PyTorch's counts per parameter, so the later layers' first
updates after the switch are bias-corrected differently). An entropy bonus (``recipe.entropy_coef``,
0 in the authors' scripts) is the internal policy's entropy here; the code's is the whole model's.
From iteration ``steps`` on it does nothing. ``layer`` counts decoder
layers from 1, as the paper does (the code's ``startk`` is ``layer - 1``). It refuses what would
compare ``pi_l`` with another policy's log-probs: a KL to the reference (in the loss or the reward),
importance weights or rejection against the sampler, and the packed or shared-prompt passes (their
forward does not stop early). The final soft-cap of a model that has one (Gemma 2) applies to the
internal logits too (our choice; the code's Qwen3 and Llama have none). Not reproduced: the paper's
analysis of the internal policies' entropies. Metrics: ``bupo/internal`` (1 while ``pi_l`` trains).
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np

from jaxrl_llm.algorithms.registry import Part
from jaxrl_llm.config import ConfigError
from jaxrl_llm.parallel.multihost import gather
from jaxrl_llm.training.objectives import policy_logprobs
from jaxrl_llm.training.parts.base import Clash, loop_part
from jaxrl_llm.training.parts.options import LOOP_PART_OPTIONS, NamedLoopPart

__all__ = ["BuPO", "internal_policy_logp"]


@partial(jax.jit, static_argnums=(0, 1, 2))
def internal_policy_logp(graphdef, chunk_size, temperature, params, others, tokens, mask, layer, routes=None):
    """``[N, L - 1]`` log-probs of ``tokens[:, 1:]`` under the internal policy after the first
    ``layer`` decoder layers (``layer`` may be traced)."""
    from flax import nnx

    import jax.numpy as jnp

    batch = {"tokens": tokens, "mask": mask, "policy_layer": jnp.full((tokens.shape[0],), layer, jnp.int32)}
    if routes is not None:
        batch["routes"] = routes
    lp, _ = policy_logprobs(nnx.merge(graphdef, params, *others), batch, chunk_size=chunk_size,
                            temperature=temperature, routing_replay=routes is not None)
    return jax.lax.stop_gradient(lp)


@loop_part
class BuPO(NamedLoopPart):
    key = "recipe.loop_part=bupo"
    phases = frozenset({"assemble", "update"})
    conflicts = (Clash("episodes", "it trains single-turn responses' internal policy; the agent loop does not run it"),
                 Clash("train.shared_prefix", "the shared-prompt pass does not stop at an internal layer"))
    packed_update = False  # the packed pass does not stop at an internal layer

    def __init__(self, *, layer: int, steps: int = 30):
        for name, v, low in (("layer", layer, 1), ("steps", steps, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"recipe.loop_part.{name} must be an int >= {low}, got {v!r}")
        self.layer, self.steps = layer, steps
        self.name = "bupo"
        self._metrics: dict[str, float] = {}

    @classmethod
    def from_run(cls, run):
        part = super().from_run(run)
        if part is not None:  # at config time too (the recipe is known there)
            part.check_recipe(run.recipe)
        return part

    def attach(self, ctx) -> None:
        from flax import nnx

        self.check_recipe(ctx.recipe)
        cfg = nnx.merge(ctx.graphdef, ctx.state.params, *ctx.frozen).cfg
        if self.layer > cfg.num_layers:
            raise ConfigError(f"recipe.loop_part.layer={self.layer}: the model has {cfg.num_layers} decoder layers")
        if cfg.is_moe and ctx.recipe.objective.router_aux_coef:
            raise ConfigError("recipe.loop_part=bupo with a mixture of experts' load-balancing loss: the later layers' "
                              "routers would still get a gradient; set the router loss coefficient to 0")
        if getattr(ctx, "logprob_packing", None) is not None:
            raise ConfigError("recipe.loop_part=bupo cannot be combined with train.max_tokens_per_microbatch (the "
                              "packed pass does not stop at an internal layer)")

    @staticmethod
    def check_recipe(rec) -> None:
        if rec.kl_reward is not None or rec.objective.has_kl:
            raise ConfigError("recipe.loop_part=bupo trains an internal layer's policy, whose log-probs a KL to the "
                              "reference (the whole model's) would compare with another policy's: set the recipe's "
                              "KL coefficient to 0 (the authors' runs use none)")
        if rec.is_correction is not None or rec.rejection is not None:
            raise ConfigError("recipe.loop_part=bupo: the internal policy's log-probs are not the sampler's policy: it "
                              "cannot be combined with recipe.is_weights or recipe.rejection")

    def active(self, ctx) -> bool:
        return ctx.iteration < self.steps

    def assemble(self, ctx, step):
        on = self.active(ctx)
        self._metrics = {"bupo/internal": float(on)}
        if not on:
            return step
        a, obj = step.arrays, ctx.recipe.objective
        routes = a.get("routes") if obj.routing_replay else None
        lp = gather(internal_policy_logp(ctx.graphdef, obj.chunk_size, obj.temperature, ctx.state.params, ctx.frozen,
                                         a["tokens"], a["mask"], self.layer, routes))
        a["old_logp"] = np.where(a["loss_mask"], np.asarray(lp), 0.0).astype(np.float32)
        return step

    def update(self, ctx, plan):
        if not self.active(ctx) or not plan.train_policy:  # another part holds the policy back (a critic's warm-up)
            return plan
        keys = sorted(ctx.recipe.objective.batch_keys())
        plan.train_policy = False
        cur = ctx.current

        def step(mb):
            batch = {k: mb[k] for k in keys}
            batch["policy_layer"] = np.full((mb["loss_mask"].shape[0],), self.layer, np.int32)
            ctx.state, m = ctx.train_step(ctx.state, batch, *ctx.frozen)
            cur.policy_metrics.append(m)

        plan.steps.append(step)
        return plan


LOOP_PART_OPTIONS.register(Part(
    "bupo", BuPO,
    paper="Bottom-up Policy Optimization: Your Language Model Policy Secretly Contains Internal Policies (BuPO), "
          "arXiv:2512.19673",
    methods=(28,), verified="the internal policy against Hugging Face's hidden states; the schedule and the loss's "
                            "log-probs as the authors' code (Trae1ounG/BuPO @d3a85c6)",
    tests="tests/models/test_exit_layer.py, tests/training/test_bupo.py",
    note="for the first steps (30) the update's and the old log-probs are those of the internal policy "
         "softmax(h_l E^T / T) after the first `layer` decoder layers (required; 6 of Qwen3-4B's in the paper), then the "
         "whole model's; rollouts from the whole model; refuses a KL to the reference and importance weights"))

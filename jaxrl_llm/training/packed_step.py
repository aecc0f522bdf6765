"""The train step over packed micro-batches: ``state, metrics = step(state, batch, *frozen)``.

:func:`make_packed_train_step` takes the same padded row batch as
:func:`~jaxrl_llm.training.make_train_step` and returns the same ``(state, metrics)``, but
instead of cutting the rows into a fixed number of micro-batches it packs their real tokens
into micro-batches of ``ways`` packed rows of ``budget`` tokens each
(:mod:`jaxrl_llm.data.packing`; ``ways`` = the devices the batch is split over, so each
device gets one packed row per micro-batch: verl's ``ppo_max_token_len_per_gpu``). The number of
micro-batches follows the batch's tokens, so the step is a host loop over one jitted
micro-step (gradient of the micro-batch's loss sum over the batch's global weight, added into
a donated float32 accumulator) and one jitted update: no recompilation when a step needs more
or fewer micro-batches, and the normalisation stays exact and global (the weight is computed on
the whole batch first, as in the unpacked step). Values and gradients equal the unpacked step's
up to float summation order, for every aggregation mode.

Coupled surrogates (DisCO, BAPO, ...: a loss on the whole batch) take their first pass the same
way: every micro-batch's log-probs, gathered back into the row order, the batch-level context,
then the linear term per micro-batch.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl_llm.core.stats import safe_divide
from jaxrl_llm.data.packing import pack_microbatches, plan_packing, unpack_rows
from jaxrl_llm.parallel.multihost import gather
from jaxrl_llm.training.step import TrainState, apply_update

__all__ = ["PackedTrainStep", "make_packed_train_step", "PackedLogprobs"]


class PackedTrainStep:
    """See the module docstring; build with :func:`make_packed_train_step`.

    ``last_layout``: the :class:`~jaxrl_llm.data.packing.PackLayout` of the last call."""

    def __init__(self, graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, objective: Any, *,
                 budget: int, ways: int = 1, state_shardings: Any = None, frozen_shardings: Any = None,
                 mesh: Any = None, donate: bool = True):
        if budget < 2:
            raise ValueError(f"train.max_tokens_per_microbatch must be >= 2, got {budget}")
        self.graphdef, self.optimizer, self.objective = graphdef, optimizer, objective
        self.budget, self.ways, self.mesh = int(budget), int(ways), mesh
        self.coupled = bool(getattr(objective, "coupled", False))
        self.last_layout = None
        metric_weight = getattr(objective, "metric_weight", objective.weight)
        keys = set(objective.batch_keys()) if hasattr(objective, "batch_keys") else None
        self._keys = keys

        def weights(rows):
            return (jax.lax.stop_gradient(objective.weight(rows)).astype(jnp.float32),
                    jax.lax.stop_gradient(metric_weight(rows)).astype(jnp.float32))

        def micro(params, mb, weight, key, *frozen):
            model = nnx.merge(graphdef, params, *frozen)
            s, metrics = objective.loss_sum(model, mb, key)
            return safe_divide(s, weight), metrics

        grad_fn = jax.value_and_grad(micro, has_aux=True)

        def accumulate(acc, params, mb, weight, key, *frozen):
            (loss, metrics), g = grad_fn(params, mb, weight, key, *frozen)
            w = jax.lax.stop_gradient(metric_weight(mb)).astype(jnp.float32)
            g = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), acc["grads"], g)
            msum = {n: acc["metrics"][n] + w * jnp.asarray(v, jnp.float32) for n, v in metrics.items()}
            return {"grads": g, "loss": acc["loss"] + loss, "metrics": msum}

        def first(params, mb, weight, key, *frozen):
            (loss, metrics), g = grad_fn(params, mb, weight, key, *frozen)
            w = jax.lax.stop_gradient(metric_weight(mb)).astype(jnp.float32)
            return {"grads": jax.tree.map(lambda b: b.astype(jnp.float32), g), "loss": loss,
                    "metrics": {n: w * jnp.asarray(v, jnp.float32) for n, v in metrics.items()}}

        def apply(state, acc, weight, mweight):
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), acc["grads"], state.params)
            loss = acc["loss"]
            key = jax.random.split(jax.random.wrap_key_data(state.key))[0]
            new_state, ok, update_norm = apply_update(optimizer, state, grads, loss, key)
            metrics = {n: safe_divide(v, mweight) for n, v in acc["metrics"].items()}
            metrics.update(loss=loss, weight=weight, grad_norm=optax.tree.norm(grads), update_norm=update_norm,
                           skipped=(~ok).astype(jnp.float32))
            return new_state, metrics

        def forward_logp(params, mb, *frozen):
            return objective.forward_logp(nnx.merge(graphdef, params, *frozen), mb)

        def context(logp, rows, key):
            return objective.coupled_context(logp, rows, key)

        jit_apply = dict(donate_argnums=(0,) if donate else ())
        if state_shardings is not None:
            jit_apply.update(out_shardings=(state_shardings, None))
        self._weights = jax.jit(weights)
        self._first = jax.jit(first)
        self._accumulate = jax.jit(accumulate, donate_argnums=(0,))
        self._apply = jax.jit(apply, **jit_apply)
        self._forward_logp = jax.jit(forward_logp)
        self._context = jax.jit(context)
        del frozen_shardings  # the frozen parts keep the layout they arrive in (the unpacked step's in_shardings)

    # ------------------------------------------------------------------------------------ host
    def _put(self, mb: dict) -> dict:
        """A micro-batch's arrays on the devices: split over the batch axes (first dimension)."""
        arrays = {k: v for k, v in mb.items() if not k.startswith("_")}
        if self.mesh is None:
            return arrays
        from jaxrl_llm.parallel import logical_sharding

        return {k: jax.device_put(v, logical_sharding(("batch",) + (None,) * (np.ndim(v) - 1), self.mesh,
                                                      shape=np.shape(v)))
                for k, v in arrays.items()}

    def _mesh_ctx(self):
        import contextlib

        return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    def __call__(self, state: TrainState, batch: dict, *frozen: Any):
        rows = {k: np.asarray(v) for k, v in batch.items()}
        if self._keys is not None:
            rows = {k: v for k, v in rows.items() if k in self._keys or k in ("tokens", "mask")}
        layout = plan_packing(rows["mask"], self.budget, self.ways)
        self.last_layout = layout
        step_key = jax.random.split(jax.random.wrap_key_data(state.key))[1]
        keys = jax.random.split(step_key, layout.num_microbatches)
        with self._mesh_ctx():
            weight, mweight = self._weights({k: v for k, v in rows.items() if k not in ("tokens", "mask")})
            extra_metrics: dict = {}
            if self.coupled:
                mbs = pack_microbatches(rows, layout)
                per = [np.asarray(gather(self._forward_logp(state.params, self._put(mb), *frozen))) for mb in mbs]
                logp = unpack_rows(per, mbs, layout.num_rows)
                ctx, extra_metrics = self._context(jnp.asarray(logp), {k: jnp.asarray(v) for k, v in rows.items()},
                                                   keys[0])
                n = logp.shape[0]
                rows = {**rows, **{k: np.asarray(v) for k, v in ctx.items()},
                        "coupled_weight": np.full((n,), float(weight), np.float32)}
            mbs = pack_microbatches(rows, layout)
            acc = None
            for mb, k in zip(mbs, keys):
                dev = self._put(mb)
                if acc is None:
                    acc = self._first(state.params, dev, weight, k, *frozen)
                else:
                    acc = self._accumulate(acc, state.params, dev, weight, k, *frozen)
            state, metrics = self._apply(state, acc, weight, mweight)
        metrics = dict(metrics)
        metrics.update(extra_metrics)
        metrics["packing/microbatches"] = jnp.asarray(float(layout.num_microbatches), jnp.float32)
        metrics["packing/padding_fraction"] = jnp.asarray(layout.padding_fraction, jnp.float32)
        return state, metrics


def make_packed_train_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, objective: Any, *,
                           budget: int, ways: int = 1, state_shardings: Any = None, frozen_shardings: Any = None,
                           mesh: Any = None, donate: bool = True) -> PackedTrainStep:
    """A :class:`PackedTrainStep`: ``budget`` tokens per packed row, ``ways`` packed rows per
    micro-batch (the devices the batch is split over; ``mesh`` places each micro-batch's rows on
    them). The batch must hold ``tokens`` and ``mask`` ``[N, L]`` (``[B, 2, L]`` preference pairs,
    packed side by side) and the objective's row arrays. A preference objective runs coupled
    (its loss once on the whole batch's sequence sums): exact for every preference loss."""
    from jaxrl_llm.training.preference import PreferenceObjective

    if isinstance(objective, PreferenceObjective) and not objective.coupled:
        import dataclasses

        objective = dataclasses.replace(objective, coupled=True)
    return PackedTrainStep(graphdef, optimizer, objective, budget=budget, ways=ways, state_shardings=state_shardings,
                           frozen_shardings=frozen_shardings, mesh=mesh, donate=donate)



@partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _packed_logp(graphdef, chunk_size, temperature, from_host, params, others, mb):
    """``[ways * slots, L - 1]`` log-probs of one packed micro-batch (forward only)."""
    from jaxrl_llm.training.objectives import packed_logprobs

    if from_host:  # a reference policy kept in host memory (model.offload_reference)
        params = jax.device_put(params, jax.memory.Space.Device)
    lp, _ = packed_logprobs(nnx.merge(graphdef, params, *others), mb, chunk_size=chunk_size, temperature=temperature)
    return jax.lax.stop_gradient(lp)


class PackedLogprobs:
    """Teacher-forced log-probs of a padded batch through packed micro-batches of ``ways`` rows of
    ``budget`` tokens (forward only: verl's ``log_prob_max_token_len_per_gpu``, usually larger than
    the update's budget): ``fn(chunk_size, temperature, from_host, params, others, tokens, mask)
    -> [N, L - 1]`` host array (every process gets all of it), 0 outside each row's real targets. The RL loop's old, reference and
    auxiliary log-prob passes use it when the run packs (``train.max_tokens_per_microbatch``)."""

    def __init__(self, graphdef: nnx.GraphDef, budget: int, ways: int = 1, mesh: Any = None):
        self.graphdef, self.budget, self.ways, self.mesh = graphdef, int(budget), int(ways), mesh

    def __call__(self, chunk_size, temperature, from_host, params, others, tokens, mask) -> np.ndarray:
        import contextlib

        tokens, mask = np.asarray(tokens), np.asarray(mask)
        layout = plan_packing(mask, self.budget, self.ways, key="train.logprob_tokens_per_microbatch")
        mbs = pack_microbatches({"tokens": tokens, "mask": mask}, layout)
        outs = []
        ctx = jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()
        with ctx:
            for mb in mbs:
                dev = {k: v for k, v in mb.items() if not k.startswith("_")}
                if self.mesh is not None:
                    from jaxrl_llm.parallel import logical_sharding

                    dev = {k: jax.device_put(v, logical_sharding(("batch",) + (None,) * (v.ndim - 1), self.mesh,
                                                                 shape=v.shape)) for k, v in dev.items()}
                outs.append(np.asarray(gather(_packed_logp(self.graphdef, chunk_size, temperature, from_host, params,
                                                           others, dev))))
        return unpack_rows(outs, mbs, layout.num_rows)

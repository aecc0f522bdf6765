"""A/B of the GRPO loss gradient: the earlier formulations vs the current ones, same process.

Reproduces the figures quoted in ``jaxrl_llm.models.transformer.dense``,
``jaxrl_llm.models.logprobs`` and ``docs/benchmarks.md`` (section
``grpo_step_where_the_time_goes``). Same batch as ``update_breakdown.py`` (1 prompt x 8
completions, 27 + 64 tokens, float32, ``recipe("grpo")``). Variants, each traced with the
library's functions temporarily swapped, compiled once, checked against the current gradient,
then timed in interleaved rounds (this VM drifts by ~30% over minutes):

- ``nd_autodiff``: projections as one N-d ``lax.dot_general`` and log-probs by autodiff through a
  ``jax.checkpoint``-ed chunk (the code before the change);
- ``2d_autodiff``: projections as 2-D matmuls (``transformer.dense``), log-probs by autodiff;
- ``2d_vjp``: the current code (2-D matmuls, the hand-written log-prob VJP).

Run: ``.venv/bin/python benchmarks/backward_ab.py --model smollm2 --rounds 5`` (or ``tiny``).
Prints JSON lines; writes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", choices=("tiny", "smollm2"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    from flax import nnx

    sys.path.insert(0, str(Path(__file__).parent))
    from grpo_step_vs_peers import prepare
    from update_breakdown import grpo_batch

    import jaxrl_llm.models.logprobs as LP
    import jaxrl_llm.models.transformer as TR
    from jaxrl_llm.models import load_hf
    from jaxrl_llm.parallel.sharding import constrain
    from jaxrl_llm.training import recipe

    def nd_dot(self, x, w):  # the projection before the change
        n = self.n_in
        dims = ((tuple(range(x.ndim - n, x.ndim)), tuple(range(n))), ((), ()))
        return jax.lax.dot_general(x.astype(self.dtype), w.astype(self.dtype), dims,
                                   preferred_element_type=jnp.float32)

    def autodiff_chunk(h, w, y, temperature, with_entropy, dt):  # the log-prob chunk before the change
        @jax.checkpoint
        def one(h, w):
            z = jnp.einsum("bcd,dv->bcv", h.astype(dt), w.astype(dt), preferred_element_type=jnp.float32)
            z = constrain(z, ("act_batch", "act_seq", "act_vocab")) / temperature
            lse = jax.nn.logsumexp(z, axis=-1)
            lp = jnp.take_along_axis(z, y[..., None], axis=-1)[..., 0] - lse
            if not with_entropy:
                return lp, jnp.zeros_like(lp)
            return lp, lse - jnp.sum(jnp.exp(z - lse[..., None]) * z, axis=-1)
        return one(h, w)

    @contextlib.contextmanager
    def swapped(nd: bool, autodiff: bool):
        old_dot, old_chunk = TR.Proj._dot, LP._chunk
        if nd:
            TR.Proj._dot = nd_dot
        if autodiff:
            LP._chunk = autodiff_chunk
        try:
            yield
        finally:
            TR.Proj._dot, LP._chunk = old_dot, old_chunk

    with tempfile.TemporaryDirectory() as tmp:
        model_dir, _ = prepare(args.model, Path(tmp))
        model = load_hf(model_dir)
    gd, params = nnx.split(model)
    obj = recipe("grpo", num_samples=8).objective
    batch = jax.device_put(grpo_batch(model.cfg.vocab_size))
    key = jax.random.key(0)

    def loss(p):
        return obj.loss_sum(nnx.merge(gd, p), batch, key)[0]

    variants = {"nd_autodiff": (True, True), "2d_autodiff": (False, True), "2d_vjp": (False, False)}
    fns, grads = {}, {}
    for name, (nd, autodiff) in variants.items():
        with swapped(nd, autodiff):
            fns[name] = jax.jit(jax.grad(loss)).lower(params).compile()
        grads[name] = jax.block_until_ready(fns[name](params))
    ref = jax.tree.leaves(grads["2d_vjp"])
    times = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, f in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(f(params))
            times[name].append(time.perf_counter() - t)
    for name in variants:
        diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(grads[name]), ref))
        print(json.dumps({"model": args.model, "variant": name, "median_s": round(statistics.median(times[name]), 4),
                          "all_s": [round(x, 4) for x in times[name]], "max_grad_diff_vs_current": diff}))


if __name__ == "__main__":
    main()

"""Where the time of one GRPO update goes: the whole jitted train step vs its parts.

Same shapes as ``grpo_step_vs_peers.py`` (1 prompt x 8 completions, 27 + 64 tokens, float32,
``recipe("grpo")``, clipping + AdamW) on a fixed random batch, for the 8.7M Qwen2-style model
(``tiny``) or SmolLM2-135M-Instruct (``smollm2``). Variants, each compiled once and then timed
in interleaved rounds (this VM's timings drift by 30% over minutes, so A/B pairs must
alternate):

- ``step``: ``make_train_step`` (grad + optimiser + non-finite guard), state donated and
  threaded through as in a training loop; ``step_not_donated``: the same on a fixed state
  (fresh output buffers every call);
- ``fwd`` / ``grad``: the objective's loss and its gradient alone (layers in a ``lax.scan``);
- ``fwd_unrolled`` / ``grad_unrolled``: a plain policy-gradient sum (same forward and backward
  work as GRPO's clipped loss) with the layers as an unrolled Python loop;
- ``optimizer``: clipping + AdamW + apply on a fixed gradient.

Also prints the ideal time of ``6 * params * tokens`` FLOPs at ``--peak`` GFLOP/s.

Run: ``.venv/bin/python benchmarks/update_breakdown.py --model tiny --rounds 5``
(``--model smollm2`` needs ~6 GB). Prints JSON lines; writes nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def grpo_batch(vocab_size: int, n: int = 8, length: int = 91, prompt: int = 27) -> dict:
    """A fixed random GRPO batch (numpy): ``n`` rows of ``prompt`` prompt tokens + completion,
    one advantage per row, old log-probs -5 on the completion tokens."""
    import numpy as np

    rng = np.random.default_rng(0)
    lm = np.zeros((n, length - 1), bool)
    lm[:, prompt - 1:] = True
    return dict(tokens=rng.integers(0, vocab_size, (n, length)).astype(np.int32),
                mask=np.ones((n, length), bool), loss_mask=lm,
                old_logp=np.where(lm, -5.0, 0.0).astype(np.float32),
                advantages=np.where(lm, rng.standard_normal((n, 1)), 0.0).astype(np.float32),
                ref_logp=np.zeros((n, length - 1), np.float32))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", choices=("tiny", "smollm2"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--peak", type=float, default=270.0, help="matmul peak GFLOP/s of this machine")
    ap.add_argument("--only", default="", help="comma-separated variants")
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    sys.path.insert(0, str(Path(__file__).parent))
    from grpo_step_vs_peers import prepare

    from jaxrl_llm.models import load_hf, token_logprobs
    from jaxrl_llm.models.transformer import unstack_layers
    from jaxrl_llm.training import init_train_state, make_train_step, recipe

    with tempfile.TemporaryDirectory() as tmp:
        model_dir, _ = prepare(args.model, Path(tmp))
        model = load_hf(model_dir)
    gd, params = nnx.split(model)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6))
    obj = recipe("grpo", num_samples=8).objective
    n, length = 8, 91
    batch = jax.device_put(grpo_batch(model.cfg.vocab_size, n, length))
    key = jax.random.key(0)

    def loss(p):
        return obj.loss_sum(nnx.merge(gd, p), batch, key)[0]

    def loss_unrolled(p):  # a policy-gradient sum of the same shape, layers unrolled
        m = nnx.merge(gd, p)
        hidden, _ = m(batch["tokens"], batch["mask"], layers=unstack_layers(p))
        logp, _ = token_logprobs(hidden[:, :-1], m.unembedding(), batch["tokens"][:, 1:], with_entropy=False)
        ratio = jnp.exp(logp - jax.lax.stop_gradient(logp))
        return jnp.sum(jnp.where(batch["loss_mask"], -ratio * batch["advantages"], 0.0))

    def optimizer(st, g):
        u, o = opt.update(g, st.opt_state, st.params)
        return optax.apply_updates(st.params, u), o

    state = init_train_state(params, opt, seed=0)
    grads = jax.jit(jax.grad(loss))(params)
    donated = make_train_step(gd, opt, obj)
    holder = [init_train_state(jax.tree.map(jnp.copy, params), opt, seed=0)]

    def step_donated():  # as in a training loop: the state's buffers are updated in place
        holder[0], m = donated(holder[0], batch)
        return holder[0], m

    variants = {
        "step": (step_donated, ()),
        "step_not_donated": (make_train_step(gd, opt, obj, donate=False), (state, batch)),
        "fwd": (jax.jit(loss), (params,)),
        "grad": (jax.jit(jax.grad(loss)), (params,)),
        "fwd_unrolled": (jax.jit(loss_unrolled), (params,)),
        "grad_unrolled": (jax.jit(jax.grad(loss_unrolled)), (params,)),
        "optimizer": (jax.jit(optimizer), (state, grads)),
    }
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only.split(",")}
    first = {}
    for name, (f, a) in variants.items():
        t = time.perf_counter()
        jax.block_until_ready(f(*a))
        first[name] = time.perf_counter() - t
    times = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, (f, a) in variants.items():
            t = time.perf_counter()
            jax.block_until_ready(f(*a))
            times[name].append(time.perf_counter() - t)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    for name in variants:
        print(json.dumps({"model": args.model, "variant": name, "median_s": round(statistics.median(times[name]), 4),
                          "all_s": [round(x, 4) for x in times[name]], "first_call_s": round(first[name], 2)}))
    print(json.dumps({"model": args.model, "params": int(n_params), "tokens": n * length,
                      "ideal_update_s_at_peak": round(6 * n_params * n * length / (args.peak * 1e9), 4)}))


if __name__ == "__main__":
    main()

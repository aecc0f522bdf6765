"""Toy sequence RL on CPU: compare policy-optimisation recipes built from jaxrl_llm.core.

Task: the prompt is a target ``s`` in ``[0, 27]``; the policy writes 3 digits; reward 1 if they
sum to ``s``. The policy is an autoregressive tabular softmax over digits conditioned on
(target, position, previous digit): small enough to train in seconds, yet a real sequence
policy with groups of G samples per prompt, old/new logprobs, PPO epochs and masks (a
random half of the batch's last token is masked as "padding" to exercise ragged responses).

Every recipe is a composition of the library's pure functions: an advantage estimator, a
policy loss and an aggregation mode. The whole step (sampling, reward, advantages, two
PPO epochs with optax Adam) is one jitted function.

Run: ``python experiments/toy_sum_rl.py [--steps N] [--out runs/toy_sum_rl]``.
Writes ``metrics.jsonl`` (one line per recipe and step) and ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxrl_llm as jl

N_TARGETS, LEN, VOCAB = 28, 3, 10


@dataclass(frozen=True)
class Recipe:
    name: str
    advantage: Callable  # (scores, mask, group_ids, num_groups) -> [B, T]
    loss: Callable  # (logp, old_logp, adv, mask) -> (loss [B, T], metrics)
    agg: str


RECIPES = [
    Recipe("GRPO", jl.grpo_advantages, lambda *a: jl.ppo_clip_loss(*a, clip_low=0.2), "seq-mean-token-mean"),
    Recipe("Dr.GRPO", jl.dr_grpo_advantages, lambda *a: jl.ppo_clip_loss(*a, clip_low=0.2),
           "seq-mean-token-sum-norm"),
    Recipe("DAPO-loss", jl.grpo_advantages, lambda *a: jl.ppo_clip_loss(*a, clip_low=0.2, clip_high=0.28),
           "token-mean"),
    Recipe("RLOO", jl.rloo_advantages, lambda *a: jl.ppo_clip_loss(*a, clip_low=0.2), "token-mean"),
    Recipe("REINFORCE++-baseline", jl.reinforce_pp_baseline_advantages,
           lambda *a: jl.ppo_clip_loss(*a, clip_low=0.2), "token-mean"),
    Recipe("NGRPO", jl.ngrpo_advantages, lambda *a: jl.ppo_clip_loss(*a, clip_low=0.16, clip_high=0.24),
           "token-mean"),
    Recipe("BNPO", jl.bnpo_advantages, lambda *a: jl.ppo_clip_loss(*a, clip_low=0.2), "token-mean"),
    Recipe("GSPO", jl.grpo_advantages, lambda *a: jl.gspo_loss(*a, clip_low=3e-3, clip_high=4e-3),
           "seq-mean-token-mean"),
    Recipe("CISPO", jl.grpo_advantages, lambda *a: jl.cispo_loss(*a, clip_low=1.0, clip_high=0.28), "token-mean"),
    Recipe("GPPO", jl.grpo_advantages, lambda *a: jl.gppo_loss(*a), "token-mean"),
]


def _logits(params, targets, prev):
    # params: [N_TARGETS, LEN, VOCAB + 1 (prev, VOCAB = BOS), VOCAB]
    return params[targets[:, None], jnp.arange(LEN)[None], prev]  # [B, LEN, VOCAB]


def sample(params, targets, key, greedy=False):
    """Autoregressive sampling with lax.scan; returns tokens [B, LEN] and their logprobs."""
    b = targets.shape[0]

    def step(carry, pos):
        prev, key = carry
        key, sub = jax.random.split(key)
        logits = params[targets, pos, prev]  # [B, VOCAB]
        tok = jnp.argmax(logits, -1) if greedy else jax.random.categorical(sub, logits)
        lp = jnp.take_along_axis(jax.nn.log_softmax(logits), tok[:, None], -1)[:, 0]
        return (tok, key), (tok, lp)

    _, (toks, lps) = jax.lax.scan(step, (jnp.full((b,), VOCAB), key), jnp.arange(LEN))
    return toks.T, lps.T


def token_logprobs(params, targets, toks):
    prev = jnp.concatenate([jnp.full((toks.shape[0], 1), VOCAB), toks[:, :-1]], 1)
    logits = _logits(params, targets, prev)
    return jnp.take_along_axis(jax.nn.log_softmax(logits), toks[..., None], -1)[..., 0]


def make_step(recipe: Recipe, n_prompts: int, group: int, opt, epochs: int = 2):
    b = n_prompts * group
    gid = jnp.repeat(jnp.arange(n_prompts), group)

    @jax.jit
    def step(params, opt_state, key):
        k1, k2, k3 = jax.random.split(key, 3)
        targets = jnp.repeat(jax.random.randint(k1, (n_prompts,), 0, N_TARGETS), group)
        toks, old_lp = sample(params, targets, k2)
        scores = (jnp.sum(toks, -1) == targets).astype(jnp.float32)
        # ragged responses: drop the last token of a random half of the rows from the loss
        mask = jnp.ones((b, LEN)).at[:, -1].set(jax.random.bernoulli(k3, 0.5, (b,)).astype(jnp.float32))
        adv = recipe.advantage(scores, mask, gid, n_prompts)

        def loss_fn(p):
            lp = token_logprobs(p, targets, toks)
            loss, met = recipe.loss(lp, old_lp, adv, mask)
            return jl.aggregate(loss, mask, recipe.agg), met

        def epoch(carry, _):
            p, s = carry
            (loss, met), g = jax.value_and_grad(loss_fn, has_aux=True)(p)
            upd, s = opt.update(g, s, p)
            return (optax.apply_updates(p, upd), s), (loss, met["approx_kl"])

        (params, opt_state), (losses, kls) = jax.lax.scan(epoch, (params, opt_state), None, length=epochs)
        groups_mixed = jnp.mean(jl.dynamic_sampling_mask(scores, gid, n_prompts).astype(jnp.float32))
        return params, opt_state, {"reward": jnp.mean(scores), "loss": losses[-1], "approx_kl": kls[-1],
                                   "mixed_groups": groups_mixed}

    return step


@jax.jit
def greedy_accuracy(params):
    targets = jnp.arange(N_TARGETS)
    toks, _ = sample(params, targets, jax.random.key(0), greedy=True)
    return jnp.mean((jnp.sum(toks, -1) == targets).astype(jnp.float32))


@jax.jit
def sampled_accuracy(params, key):
    targets = jnp.tile(jnp.arange(N_TARGETS), 64)
    toks, _ = sample(params, targets, key)
    return jnp.mean((jnp.sum(toks, -1) == targets).astype(jnp.float32))


def run(steps: int, out: Path, seed: int = 0, n_prompts: int = 16, group: int = 8, lr: float = 0.05):
    out.mkdir(parents=True, exist_ok=True)
    opt = optax.adam(lr)
    init = jnp.zeros((N_TARGETS, LEN, VOCAB + 1, VOCAB), jnp.float32)
    summary = {}
    print(f"devices: {jax.devices()}  task: 3 digits summing to a target in [0, {N_TARGETS - 1}]  "
          f"batch {n_prompts} prompts x {group} samples, {steps} steps, 2 PPO epochs per batch")
    print(f"{'recipe':24s} {'sampled acc':>16s} {'greedy acc':>14s} {'final KL':>9s} {'secs':>6s}  reward curve")
    with open(out / "metrics.jsonl", "w") as f:
        for r in RECIPES:
            t0 = time.perf_counter()
            params, state = init, opt.init(init)
            step = make_step(r, n_prompts, group, opt)
            key = jax.random.key(seed)
            before = (float(sampled_accuracy(params, jax.random.key(1))), float(greedy_accuracy(params)))
            curve = []
            for i in range(steps):
                key, sub = jax.random.split(key)
                params, state, met = step(params, state, sub)
                met = {k: float(v) for k, v in met.items()}
                if not all(np.isfinite(v) for v in met.values()):
                    raise FloatingPointError(f"{r.name}: non-finite metrics at step {i}: {met}")
                f.write(json.dumps({"recipe": r.name, "step": i, **met}) + "\n")
                curve.append(met["reward"])
            after = (float(sampled_accuracy(params, jax.random.key(1))), float(greedy_accuracy(params)))
            secs = time.perf_counter() - t0
            chunks = np.array_split(np.array(curve), 8)
            spark = " ".join(f"{c.mean():.2f}" for c in chunks)
            print(f"{r.name:24s} {before[0]:6.3f} -> {after[0]:5.3f}  {before[1]:5.3f} -> {after[1]:5.3f} "
                  f"{met['approx_kl']:9.4f} {secs:6.1f}  {spark}")
            summary[r.name] = {"sampled_acc_before": before[0], "sampled_acc_after": after[0],
                               "greedy_acc_before": before[1], "greedy_acc_after": after[1], "seconds": secs}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {out / 'metrics.jsonl'} and {out / 'summary.json'}")
    return summary


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/toy_sum_rl"))
    a = p.parse_args(argv)
    run(a.steps, a.out, a.seed)


if __name__ == "__main__":
    main()

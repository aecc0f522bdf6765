"""How fast could one GRPO step be on this machine? A floor from measured XLA:CPU rates.

The step of ``grpo_step_vs_peers.py`` (1 prompt x G completions, P prompt + T completion
tokens, float32) is a rollout (one prefill, then T decode steps at batch G) and an update
(forward + backward over G x (P + T) tokens, then AdamW). This script measures three rates
on this machine, with XLA itself, and turns them into a lower bound for each phase:

- ``matmul``: a large float32 matmul (``--n`` cubed), in GFLOP/s: the compute peak;
- ``decode dots``: one decode step's weight matmuls alone (per layer q, k, v, o, gate, up,
  down at batch G, plus the unembedding; the faster of a ``lax.scan`` over stacked layer
  weights and an unrolled layer loop; T such steps in one ``fori_loop``), the rate at which XLA's dot streams float32 weights when the batch is small, in GB/s;
- ``grad dots``: the forward, input-gradient and weight-gradient matmuls of every projection
  and the unembedding over the update's G x (P + T) tokens (the faster layer loop);
- ``adamw``: one ``optax.adamw`` update and apply on weights of the model's shapes, state
  donated (as a training loop runs it): the optimiser's memory-bound pass.

Floors (no attention, norms, sampling, loss or Python; so real steps cannot reach them):
rollout >= T x (decode-dots time) + prefill FLOPs at the matmul peak; update >= 6 x params
x tokens at the matmul peak (or the grad dots, if slower) + the measured AdamW pass. With ``--peers-s TRL,TUNIX`` it also prints the 2x target.

Run: ``.venv/bin/python benchmarks/step_floor.py --model smollm2-135m [--write --peers-s 9.75,12.27]``
(``--prompts B --prompt-tokens P --completion-tokens T [--shared-prefix] [--reference]`` for the realistic shapes; ``--model``: a ``jaxrl_llm.models.PRESETS`` name, or ``qwen2-8m`` for the tiny model; weights are random, only shapes matter).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _report import machine, median_time, write_section  # noqa: E402


def rates(cfg, batch: int, steps: int, tokens: int, n: int, repeats: int, logit_tokens: int | None = None) -> dict:
    import jax
    import jax.numpy as jnp
    import optax

    key = jax.random.key(0)
    a = jax.random.normal(key, (n, n), jnp.float32)
    mm = jax.jit(lambda a: a @ a)
    jax.block_until_ready(mm(a))
    t_mm = median_time(lambda: jax.block_until_ready(mm(a)), repeats)

    d, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes = {"q": (d, q), "k": (d, kv), "v": (d, kv), "o": (q, d), "gate": (d, f), "up": (d, f), "down": (f, d)}
    if not cfg.gated_mlp:
        shapes.pop("gate")
    keys = jax.random.split(key, len(shapes) + 2)
    layers = {k: 0.02 * jax.random.normal(kk, (L, *s), jnp.float32) for kk, (k, s) in zip(keys, shapes.items())}
    emb = 0.02 * jax.random.normal(keys[-1], (d, cfg.vocab_size), jnp.float32)
    x = jax.random.normal(keys[-2], (batch, max(d, f, q)), jnp.float32)

    def body(h, w):
        outs = [jnp.dot(h[:, : w[k].shape[0]], w[k]) for k in w]
        return h + 1e-3 * sum(o[:, :1] for o in outs), None  # a carried dependency, like a residual

    def scanned(layers, h):
        return jax.lax.scan(body, h, layers)[0]

    def unrolled(layers, h):
        for i in range(L):
            h, _ = body(h, {k: w[i] for k, w in layers.items()})
        return h

    def decode(layer_loop):  # `steps` decode steps in one while loop, as a sampler runs them
        def run(layers, emb, x):
            def one(_, h):
                h = layer_loop(layers, h)
                return h.at[:, :1].add(1e-3 * jnp.dot(h[:, :d], emb)[:, :1])
            return jax.lax.fori_loop(0, steps, one, x).sum()
        return jax.jit(run)

    t_dd = float("inf")
    for loop in (scanned, unrolled):  # the faster of the two layer loops
        dd = decode(loop)
        jax.block_until_ready(dd(layers, emb, x))
        t_dd = min(t_dd, median_time(lambda: jax.block_until_ready(dd(layers, emb, x)), repeats) / steps)

    xt = jax.random.normal(keys[-2], (tokens, max(d, f, q)), jnp.float32)

    def grad_body(h, w):  # each projection's forward, input-gradient and weight-gradient matmuls
        dws = {}
        for k, W in w.items():
            xin = h[:, : W.shape[0]]
            y = jnp.dot(xin, W)
            h = h.at[:, :1].add(1e-3 * jnp.dot(y, W.T)[:, :1])
            dws[k] = jnp.dot(xin.T, y)
        return h, dws

    def grad_dots(layer_loop):
        def run(layers, emb, h):
            h, dws = layer_loop(layers, h)
            hl = h[:logit_tokens, :d]  # the rows whose next token is scored (all, or the completions')
            logits = jnp.dot(hl, emb)
            return jnp.dot(logits, emb.T).sum(), jnp.dot(hl.T, logits), dws
        return jax.jit(run)

    def grad_scanned(layers, h):
        return jax.lax.scan(grad_body, h, layers)

    def grad_unrolled(layers, h):
        out = []
        for i in range(L):
            h, dws = grad_body(h, {k: w[i] for k, w in layers.items()})
            out.append(dws)
        return h, out

    t_gd = float("inf")
    for loop in (grad_scanned, grad_unrolled):
        gd = grad_dots(loop)
        jax.block_until_ready(gd(layers, emb, xt))
        t_gd = min(t_gd, median_time(lambda: jax.block_until_ready(gd(layers, emb, xt)), repeats))

    opt = optax.adamw(1e-6)
    params = {"layers": layers, "emb": emb}
    grads = jax.tree.map(lambda w: 1e-3 * w, params)

    def adamw(params, opt_state, grads):
        u, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, u), opt_state

    step = jax.jit(adamw, donate_argnums=(0, 1))
    holder = [jax.tree.map(jnp.copy, params), opt.init(params)]

    def run():
        holder[:] = step(holder[0], holder[1], grads)
        jax.block_until_ready(holder)

    run()
    t_opt = median_time(run, repeats)
    nbytes = 4 * (sum(w.size for w in jax.tree.leaves(layers)) + emb.size)
    return {"matmul_gflops": 2 * n**3 / t_mm / 1e9, "decode_dots_s": t_dd, "decode_dots_gbs": nbytes / t_dd / 1e9,
            "grad_dots_s": t_gd, "adamw_s": t_opt, "weight_bytes": nbytes}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a jaxrl_llm.models.PRESETS name or qwen2-8m")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt")
    ap.add_argument("--prompts", type=int, default=1, help="distinct prompts per step (decode batch = prompts x group)")
    ap.add_argument("--shared-prefix", action="store_true",
                    help="the update encodes each prompt once (train.shared_prefix) and scores completion tokens only")
    ap.add_argument("--reference", action="store_true", help="beta > 0: add the reference model's log-prob forward")
    ap.add_argument("--prompt-tokens", type=int, default=27)
    ap.add_argument("--completion-tokens", type=int, default=64)
    ap.add_argument("--n", type=int, default=2048, help="matmul size for the compute peak")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--peers-s", default="", help="TRL,tunix step seconds (from grpo_step_vs_peers) for the 2x target")
    ap.add_argument("--ours-s", type=float, default=None, help="our measured step seconds, for the table")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()

    from jaxrl_llm.models import ModelConfig, preset

    if args.model == "qwen2-8m":  # the tiny model of grpo_step_vs_peers.py (rollout_vs_hf.qwen2_8m's shapes)
        cfg = ModelConfig(family="qwen2", vocab_size=16384, hidden_size=256, num_layers=6, num_heads=8,
                          num_kv_heads=2, head_dim=32, intermediate_size=768, tie_embeddings=True)
    else:
        cfg = preset(args.model, dtype="float32", param_dtype="float32")
    G, B, P, T = args.group, args.prompts, args.prompt_tokens, args.completion_tokens
    # tokens through the layers in the update, and tokens whose next-token log-prob is computed
    layer_tokens = B * P + B * G * T if args.shared_prefix else B * G * (P + T)
    logit_tokens = B * G * T if args.shared_prefix else layer_tokens
    r = rates(cfg, B * G, T, layer_tokens, args.n, args.repeats, logit_tokens)
    emb = cfg.vocab_size * cfg.hidden_size
    body = cfg.num_layers * (cfg.hidden_size * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
                             + cfg.num_heads * cfg.head_dim * cfg.hidden_size
                             + (3 if cfg.gated_mlp else 2) * cfg.hidden_size * cfg.intermediate_size)
    params = body + emb * (1 if cfg.tie_embeddings else 2)
    peak = r["matmul_gflops"] * 1e9
    prefill = 2 * (body + emb) * B * P / peak
    rollout = prefill + T * r["decode_dots_s"]
    fwd_flops = 2 * (body * layer_tokens + emb * logit_tokens)
    update_mm = max(3 * fwd_flops / peak, r["grad_dots_s"])
    reference = fwd_flops / peak if args.reference else 0.0
    adamw = r["adamw_s"]
    floor = rollout + reference + update_mm + adamw
    shape = ("default" if (B, P, T) == (1, 27, 64) and not args.shared_prefix and not args.reference
             else f"{B}x{G}, {P}+{T}" + (", shared prefix" if args.shared_prefix else "")
             + (", reference" if args.reference else ""))
    out = {"model": args.model, "params": params, **{k: round(v, 4) for k, v in r.items()},
           "rollout_floor_s": round(rollout, 3), "reference_floor_s": round(reference, 3),
           "update_floor_s": round(update_mm + adamw, 3),
           "step_floor_s": round(floor, 3)}
    peers = [float(x) for x in args.peers_s.split(",") if x]
    if peers:
        out["target_2x_s"] = round(min(peers) / 2, 3)
    print(json.dumps(out))
    if args.write:
        lines = [
            f"{machine()}. Reproduce: `.venv/bin/python benchmarks/step_floor.py --model {args.model} "
            + (f"--prompts {B} --prompt-tokens {P} --completion-tokens {T} " if shape != "default" else "")
            + ("--shared-prefix " if args.shared_prefix else "") + ("--reference " if args.reference else "")
            + f"--peers-s {args.peers_s}" + (f" --ours-s {args.ours_s}" if args.ours_s else "") + " --write`.",
            "",
            f"Lower bounds for one GRPO step of `{args.model}` ({params / 1e6:.0f}M params, float32; "
            f"{B} prompt{'s' if B > 1 else ''} x {G} completions, {P} + {T} tokens"
            + ("; the update encodes each prompt once and scores the completion tokens only" if args.shared_prefix
               else "") + ("; a reference log-prob forward" if args.reference else "")
            + ") from rates XLA reaches on this machine. They leave "
            "out attention, norms, sampling, the loss and all overhead, so no implementation reaches them. "
            "They bound JAX code on XLA:CPU (its dot is the only matmul JAX has here), not torch's kernels.",
            "",
            "| rate | measured |",
            "|---|---|",
            f"| float32 matmul {args.n}^3 | {r['matmul_gflops']:.0f} GFLOP/s |",
            f"| decode step's weight matmuls at batch {B * G} | {r['decode_dots_s'] * 1e3:.1f} ms, "
            f"{r['decode_dots_gbs']:.1f} GB/s of weights |",
            f"| forward + backward matmuls of the update ({layer_tokens} tokens, {logit_tokens} scored) "
            f"| {r['grad_dots_s']:.2f} s |",
            f"| `optax.adamw` update + apply, donated | {r['adamw_s']:.2f} s |",
            "",
            "| phase | floor s |",
            "|---|---|",
            f"| rollout: prefill at peak + {T} x decode dots | {rollout:.2f} |",
            *([f"| reference log-probs: the forward matmuls at peak | {reference:.2f} |"] if args.reference else []),
            f"| update: forward + backward matmuls + the AdamW pass | {update_mm + adamw:.2f} |",
            f"| **step** | **{floor:.2f}** |",
        ]
        if peers:
            lines += ["", f"Peers' step (TRL, tunix; `grpo_step_vs_peers`): {peers[0]:.2f} s, {peers[1]:.2f} s; "
                          f"2x faster than both means <= {min(peers) / 2:.2f} s"
                          + (f"; ours measured {args.ours_s:.2f} s" if args.ours_s else "") + "."]
        title = f"grpo_step_floor ({args.model})" if shape == "default" else f"grpo_step_floor ({args.model}, {shape})"
        write_section(title, "\n".join(lines))


if __name__ == "__main__":
    main()

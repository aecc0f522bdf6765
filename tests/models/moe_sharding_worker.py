"""Run in a subprocess with 8 simulated CPU devices (XLA_FLAGS set before jax starts).

A tiny mixture of experts on (data, expert) meshes, against the single-device model: the
forward logits, the routers' choices, the loss gradient (load-balancing term included), a
forward with replayed routes, a KV-cache decode step (which records the routes) and the
capacity-buffer experts (``moe_capacity_factor``, some tokens dropped). Checks
that the stacked experts really are split over the ``expert`` axis. Prints one JSON line;
exits non-zero on the first failure.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from jaxrl_llm.models import Transformer, init_cache, preset, token_logprobs  # noqa: E402
from jaxrl_llm.models.transformer import load_balancing_loss  # noqa: E402
from jaxrl_llm.parallel import logical_sharding, make_mesh, state_shardings  # noqa: E402

assert jax.device_count() == 8, jax.devices()
MESHES = [(2, 4), (1, 8), (4, 2)]
if len(sys.argv) > 1:
    MESHES = [tuple(int(x) for x in m.split(",")) for m in sys.argv[1:]]
CFG = preset("tiny-moe")
B, T = 8, 12

gd, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
rng = np.random.default_rng(0)
tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (B, T)), jnp.int32)
mask = np.ones((B, T), bool)
mask[::3, :4] = False
mask = jnp.asarray(mask)
replay = jnp.asarray(rng.integers(0, CFG.num_experts, (B, T, CFG.num_layers, 1)), jnp.int32)
replay = jnp.concatenate([replay, (replay + 1 + rng.integers(0, CFG.num_experts - 1, replay.shape))
                          % CFG.num_experts], axis=-1)  # k = 2 distinct experts per token


def forward(p, t, m):
    mod = nnx.merge(gd, p)
    h, _, stats = mod(t, m, return_routing=True)
    return mod.logits(h), stats.choice


def replayed(p, t, m, r):
    mod = nnx.merge(gd, p)
    h, _ = mod(t, m, routes=r)
    return mod.logits(h)


def loss(p, t, m):
    mod = nnx.merge(gd, p)
    h, _, stats = mod(t, m, return_routing=True)
    lp, _ = token_logprobs(h[:, :-1], mod.unembedding(), t[:, 1:], with_entropy=False)
    return -jnp.sum(lp * m[:, 1:]) / jnp.sum(m[:, 1:]) + 0.01 * load_balancing_loss(stats)


def decode(p, t, m, cache):
    mod = nnx.merge(gd, p)
    h, cache = mod(t, m, cache=cache)
    return mod.logits(h), cache


gd_cap = nnx.graphdef(Transformer(CFG.replace(moe_capacity_factor=1.0), rngs=nnx.Rngs(0)))


def forward_capacity(p, t, m):  # experts in [E, C, D] buffers, C = tokens * k / E: some tokens dropped
    mod = nnx.merge(gd_cap, p)
    h, _, stats = mod(t, m, return_routing=True)
    return mod.logits(h), jnp.sum(stats.dropped)


ref_logits, ref_choice = jax.jit(forward)(params, tokens, mask)
ref_cap, ref_dropped = jax.jit(forward_capacity)(params, tokens, mask)
ref_replay = np.asarray(jax.jit(replayed)(params, tokens, mask, replay))
ref_grad = jax.jit(jax.grad(loss))(params, tokens, mask)
ref_dec, ref_cache = jax.jit(decode)(params, tokens, mask, init_cache(CFG, B, T + 1))
results = {}
for shape in MESHES:
    mesh = make_mesh(shape, ("data", "expert"))
    sp = jax.device_put(params, state_shardings(params, mesh))
    gate = sp["blocks"]["moe"]["gate"][...]
    assert gate.sharding.spec[1] == "expert", gate.sharding.spec  # [L, E, D, I]: experts split
    assert gate.addressable_shards[0].data.shape[1] == CFG.num_experts // shape[1]
    sh = logical_sharding(("batch", None), mesh, shape=tokens.shape)
    t, m = jax.device_put(tokens, sh), jax.device_put(mask, sh)
    with jax.set_mesh(mesh):
        lg, choice = jax.jit(forward)(sp, t, m)
        rp = jax.jit(replayed)(sp, t, m, replay)
        gr = jax.jit(jax.grad(loss))(sp, t, m)
        dec, cache = jax.jit(decode)(sp, t, m, init_cache(CFG, B, T + 1))
        cap, dropped = jax.jit(forward_capacity)(sp, t, m)
    grad_err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(gr), jax.tree.leaves(ref_grad)))
    results[str(shape)] = {
        "forward": float(np.abs(np.asarray(lg) - np.asarray(ref_logits)).max()),
        "choice_equal": bool(np.array_equal(np.asarray(choice), np.asarray(ref_choice))),
        "replay": float(np.abs(np.asarray(rp) - ref_replay).max()),
        "grad": grad_err,
        "decode": float(np.abs(np.asarray(dec) - np.asarray(ref_dec)).max()),
        "routes_equal": bool(np.array_equal(np.asarray(cache.routes), np.asarray(ref_cache.routes))),
        "capacity": float(np.abs(np.asarray(cap) - np.asarray(ref_cap)).max()),
        "dropped_equal": float(dropped) == float(ref_dropped),
    }
# the decode cache recorded the forward's choices ([L, B, T, k] -> [B, T, L, k])
rec = np.asarray(ref_cache.routes)[:, :T]
own_choice = np.moveaxis(np.asarray(ref_choice), 0, 2)
real = np.asarray(mask)  # padding positions attend to nothing: their routes are arbitrary
assert np.array_equal(rec[real], own_choice[real]), "cache.routes != the forward's choices"
# replaying the model's own choices changes nothing
own = np.asarray(jax.jit(replayed)(params, tokens, mask, jnp.moveaxis(ref_choice, 0, 2)))
results["self_replay"] = float(np.abs(own - np.asarray(ref_logits)).max())
results["replay_differs"] = float(np.abs(ref_replay - np.asarray(ref_logits)).max())
results["capacity_dropped"] = float(ref_dropped)
print(json.dumps(results))

"""Run in a subprocess with 8 simulated CPU devices (XLA_FLAGS set before jax starts).

Checks, for several (data, fsdp, tensor) meshes: the sharded forward and a KV-cache decode
step equal the single-device results; parameters really are sharded; loading an HF
directory straight onto a mesh gives the same model; a second call with new inputs of the
same shapes compiles nothing. Prints one JSON line; exits non-zero on the first failure.
"""

import json
import os
import sys
import tempfile

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from jaxrl_llm.models import Transformer, init_cache, load_hf, preset, save_hf  # noqa: E402
from jaxrl_llm.parallel import logical_sharding, make_mesh, state_shardings  # noqa: E402
from jaxrl_llm.rollout import Sampler, SamplingConfig  # noqa: E402

COMPILES = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, d, **kw: COMPILES.append(name) if name == "/jax/core/compile/backend_compile_duration" else None)

assert jax.device_count() == 8, jax.devices()
MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 1, 8)]
if len(sys.argv) > 1:  # "2,2,2 1,1,8": only these meshes
    MESHES = [tuple(int(x) for x in m.split(",")) for m in sys.argv[1:]]
CFG = preset("tiny", vocab_size=256, hidden_size=64, num_heads=8, num_kv_heads=8, head_dim=8, intermediate_size=128)
B, T = 8, 12

model = Transformer(CFG, rngs=nnx.Rngs(0))
gd, params = nnx.split(model)
rng = np.random.default_rng(0)
tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (B, T)), jnp.int32)
mask = np.ones((B, T), bool)
mask[::3, :4] = False
mask = jnp.asarray(mask)


def forward(p, t, m):
    mod = nnx.merge(gd, p)
    h, _ = mod(t, m)
    return mod.logits(h)


def decode(p, t, m, cache):
    mod = nnx.merge(gd, p)
    h, cache = mod(t, m, cache=cache)
    return mod.logits(h), cache


ref = np.asarray(jax.jit(forward)(params, tokens, mask))
cache0 = init_cache(CFG, B, T + 1)
ref_pre, c = jax.jit(decode)(params, tokens, mask, cache0)
ref_dec, _ = jax.jit(decode)(params, tokens[:, :1], jnp.ones((B, 1), bool), c)
ref_dec = np.asarray(ref_dec)
PROMPTS = [list(rng.integers(1, CFG.vocab_size, n)) for n in (3, 7, 5, 8)]
SCFG = SamplingConfig(max_new_tokens=6, num_samples=2, greedy=True)
ref_roll = Sampler(gd, SCFG, length_buckets=(8,))(params, PROMPTS, jax.random.key(0))
out = {}
with tempfile.TemporaryDirectory() as d:
    save_hf(model, d)
    for shape in MESHES:
        mesh = make_mesh(shape)
        psh = state_shardings(params, mesh)
        p = jax.device_put(params, psh)
        bsh = logical_sharding(("batch", None), mesh, shape=(B, T))
        osh = logical_sharding(("batch", None, "vocab"), mesh, shape=(B, T, CFG.vocab_size))
        f = jax.jit(forward, in_shardings=(psh, bsh, bsh), out_shardings=osh)
        t_s, m_s = jax.device_put(tokens, bsh), jax.device_put(mask, bsh)
        got = f(p, t_s, m_s)
        err = float(np.abs(np.asarray(jax.device_get(got)) - ref)[np.asarray(mask)].max())
        assert err < 1e-5, (shape, "forward", err)
        t2, m2 = jax.device_put(tokens[::-1], bsh), jax.device_put(mask[::-1], bsh)
        n = len(COMPILES)
        f(p, t2, m2).block_until_ready()
        assert len(COMPILES) == n, (shape, "recompiled on a second call with the same shapes")
        sharded = [k for k, v in nnx.to_flat_state(psh) if any(a is not None for a in v.get_value().spec)]
        if shape[1] * shape[2] > 1:  # fsdp or tensor axes: parameters must be split
            assert sharded, (shape, "no parameter is sharded")
        else:
            assert not sharded, (shape, "pure data parallelism must replicate parameters")
        # KV cache on the mesh: prefill + one decode step
        csh = jax.tree.map(lambda x: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), cache0)
        csh = csh._replace(k=logical_sharding(("layers", "batch", "kv_heads", "head_dim", "cache_seq"), mesh,
                                              shape=cache0.k.shape),
                           v=logical_sharding(("layers", "batch", "kv_heads", "cache_seq", "head_dim"), mesh,
                                              shape=cache0.v.shape))
        dec = jax.jit(decode, donate_argnums=3)
        lp, cc = dec(p, t_s, m_s, jax.device_put(init_cache(CFG, B, T + 1), csh))
        ld, _ = dec(p, jax.device_put(tokens[:, :1], bsh), jax.device_put(jnp.ones((B, 1), bool), bsh), cc)
        derr = float(np.abs(np.asarray(jax.device_get(ld)) - ref_dec).max())
        assert derr < 1e-5, (shape, "decode", derr)
        # HF directory straight onto the mesh
        loaded = load_hf(d, mesh=mesh)
        lgd, lparams = nnx.split(loaded)
        q = nnx.to_flat_state(lparams)
        kernel = dict((tuple(map(str, k)), v) for k, v in q)[("blocks", "q", "kernel")].get_value()
        expect = psh["blocks"]["q"]["kernel"].get_value()
        assert kernel.sharding.is_equivalent_to(expect, kernel.ndim), (shape, kernel.sharding, expect)
        lerr = float(np.abs(np.asarray(jax.device_get(f(lparams, t_s, m_s))) - ref)[np.asarray(mask)].max())
        assert lerr < 1e-5, (shape, "loaded", lerr)
        # activation constraints (jax.set_mesh): same numbers, and they reach the program
        with jax.set_mesh(mesh):
            fa = jax.jit(forward, in_shardings=(psh, bsh, bsh), out_shardings=osh)
            aerr = float(np.abs(np.asarray(jax.device_get(fa(p, t_s, m_s))) - ref)[np.asarray(mask)].max())
            n_with = fa.lower(p, t_s, m_s).as_text().count("sharding_constraint")
        n_without = f.lower(p, t_s, m_s).as_text().count("sharding_constraint")
        assert aerr < 1e-5, (shape, "constrained forward", aerr)
        assert n_with > n_without == 0, (shape, "activation constraints missing", n_with, n_without)
        # the sampler on the mesh: batch over the data axes, heads over tensor
        roll = Sampler(gd, SCFG, length_buckets=(8,), mesh=mesh)(p, PROMPTS, jax.random.key(0))
        assert np.array_equal(roll.tokens, ref_roll.tokens), (shape, "sampler tokens differ")
        serr = float(np.abs(roll.logprobs - ref_roll.logprobs).max())
        assert serr < 1e-4, (shape, "sampler logprobs", serr)
        out[str(shape)] = dict(forward=err, decode=derr, loaded=lerr, sharded_params=len(sharded))
print(json.dumps(out))
sys.exit(0)

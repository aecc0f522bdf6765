"""Run in a subprocess with 8 simulated CPU devices (XLA_FLAGS set before jax starts).

Context parallelism: on meshes with a ``context`` axis, the teacher-forced log-probs and
entropies of packed and padded rows and the gradient of a loss on them equal the single-device
results, for each attention implementation given (``splash`` in Pallas interpret mode), with a
grouped-query model with sliding-window and global layers. Also checks that the activations
really are split over the context axis. Prints one JSON line: the largest differences per
(mesh, implementation).
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from jaxrl_llm.models import Transformer, preset  # noqa: E402
from jaxrl_llm.models import attn as A  # noqa: E402
from jaxrl_llm.models.logprobs import sequence_logprobs  # noqa: E402
from jaxrl_llm.parallel import logical_sharding, make_mesh, state_shardings  # noqa: E402

assert jax.device_count() == 8, jax.devices()
AXES = ("data", "fsdp", "tensor", "context")
MESHES = [(1, 2, 1, 4), (2, 1, 2, 2)]
IMPLS = ["blockwise", "dense", "splash"]
args = sys.argv[1:]
if args and args[0] == "--impls":
    IMPLS, args = args[1].split(","), args[2:]
if args:
    MESHES = [tuple(int(x) for x in m.split(",")) for m in args]

B, T = 4, 48
CFG0 = preset("tiny-gemma", attn_softcap=20.0, sliding_window=6)  # GQA, local + global layers, soft-caps
rng = np.random.default_rng(0)
tokens = jnp.asarray(rng.integers(0, CFG0.vocab_size, (B, T)), jnp.int32)
seg = np.ones((B, T), np.int32)
seg[0, 20:] = 2
seg[0, 41:] = 0  # a packed row: two segments, then padding
seg[1, :7] = 0  # a left-padded row (segment ids still given: padding 0)
seg[2, 30:] = 0  # right padding
segments = jnp.asarray(seg)
mask = segments > 0
weights = (mask[:, 1:] & (segments[:, 1:] == segments[:, :-1])).astype(jnp.float32)


def loss(params, gd):
    lp, ent = sequence_logprobs(nnx.merge(gd, params), tokens, mask, segment_ids=segments, chunk_size=8)
    return jnp.sum((lp + 0.1 * ent) * weights), (lp, ent)


out = {}
for impl in IMPLS:
    cfg = CFG0.replace(attention=impl, attention_block=8)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    gd, params = nnx.split(model)
    with A.splash_interpret():
        (_, (lp0, ent0)), g0 = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)(params, gd)
    for shape in MESHES:
        mesh = make_mesh(shape, AXES)
        p_sh = state_shardings(params, mesh)
        sp = jax.device_put(params, p_sh)
        tok_sh = logical_sharding(("batch", None), mesh, shape=(B, T))

        def sharded(p):
            return loss(p, gd)

        with jax.set_mesh(mesh), A.splash_interpret():
            (_, (lp, ent)), g = jax.jit(jax.value_and_grad(sharded, has_aux=True))(sp)
            # the hidden states of a forward pass are split over the context axis
            hid = jax.jit(lambda p: nnx.merge(gd, p)(tokens, mask, segment_ids=segments)[0])(sp)
        ctx = shape[3]
        assert hid.sharding.shard_shape(hid.shape)[1] == T // ctx, (shape, hid.sharding)
        w = np.asarray(weights) > 0
        dl = float(np.max(np.abs(np.where(w, np.asarray(lp) - np.asarray(lp0), 0))))
        de = float(np.max(np.abs(np.where(w, np.asarray(ent) - np.asarray(ent0), 0))))
        dg = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
                 zip(jax.tree.leaves(jax.device_get(g)), jax.tree.leaves(g0)))
        gscale = max(float(np.max(np.abs(np.asarray(b)))) for b in jax.tree.leaves(g0))
        out[f"{shape}/{impl}"] = {"logp": dl, "entropy": de, "grad": dg, "grad_scale": gscale}
print(json.dumps(out))

"""Run with 8 simulated CPU devices: the train step on (data, fsdp, tensor) meshes equals the
single-device step. Prints one JSON line (max abs param and loss differences per mesh)."""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as PS  # noqa: E402

import jaxrl_llm as jl  # noqa: E402
from jaxrl_llm.models import Transformer, preset  # noqa: E402
from jaxrl_llm.parallel import make_mesh  # noqa: E402
from jaxrl_llm.training import (PolicyObjective, init_train_state, make_train_step,  # noqa: E402
                                train_state_shardings)

assert jax.device_count() == 8
MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 1, 8)]
if len(sys.argv) > 1:  # "2,2,2 1,1,8": only these meshes
    MESHES = [tuple(int(x) for x in m.split(",")) for m in sys.argv[1:]]
CFG = preset("tiny", vocab_size=256, hidden_size=64, num_heads=8, num_kv_heads=8, head_dim=8, intermediate_size=128)
B, L = 16, 12
rng = np.random.default_rng(0)
mask = np.ones((B, L), bool)
mask[::3, :4] = False
loss_mask = mask[:, 1:].copy()
loss_mask[:, :5] = False
loss_mask[5] = False
batch = {"tokens": jnp.asarray(rng.integers(0, CFG.vocab_size, (B, L)), jnp.int32), "mask": jnp.asarray(mask),
         "loss_mask": jnp.asarray(loss_mask),
         "old_logp": jnp.asarray(rng.normal(-5.5, 0.2, (B, L - 1)), jnp.float32),
         "advantages": jnp.asarray(rng.normal(0, 1, (B, L - 1)), jnp.float32)}
obj = PolicyObjective(jl.ppo_clip_loss, agg_mode="seq-mean-token-mean", entropy_coef=0.01)
# sgd then momentum: linear in the gradients (compares them exactly) and has per-parameter state
opt = optax.sgd(0.5, momentum=0.9)
gd, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
state0 = init_train_state(params, opt, seed=0)

ref_state = state0
step = make_train_step(gd, opt, obj, num_microbatches=2, donate=False)
for _ in range(2):
    ref_state, ref_m = step(ref_state, batch)
ref_state = jax.device_get(ref_state)

out = {}
for shape in MESHES:
    mesh = make_mesh(shape)
    st_sh = train_state_shardings(opt, state0, mesh)
    data_sh = NamedSharding(mesh, PS(("data", "fsdp")))
    b_sh = {k: data_sh for k in batch}
    state = jax.device_put(jax.device_get(state0), st_sh)  # fresh buffers: the step donates them
    sstep = make_train_step(gd, opt, obj, num_microbatches=2, state_shardings=st_sh, batch_shardings=b_sh)
    with jax.set_mesh(mesh):
        for _ in range(2):
            state, m = sstep(state, jax.device_put(batch, b_sh))
    sharded = any(len(x.sharding.device_set) > 1 and not x.sharding.is_fully_replicated
                  for x in jax.tree.leaves(state.params))
    got = jax.device_get(state)
    dp = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
             for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(ref_state.params)))
    out[str(shape)] = {"params": dp, "loss": abs(float(m["loss"]) - float(ref_m["loss"])), "sharded": sharded,
                       "step": int(got.step)}
print(json.dumps(out))

"""Two train steps and a checkpoint on a (2, 2, 2) mesh of 8 CPU devices, either as one of
several ``jax.distributed`` processes (``--process-id I --num-processes N --port P``, 8 / N
local devices each) or as a single process with 8 devices (``--num-processes 1``); or, with
``--restore DIR``, restore DIR's checkpoint in one process onto one device.

Each process supplies only its own rows of the batch (``host_to_global``). Process 0 writes
the final parameters (gathered) to ``OUT/params.npz``; the checkpoint goes to ``OUT/ckpt``.
"""

import argparse
import os

ap = argparse.ArgumentParser()
ap.add_argument("--process-id", type=int, default=0)
ap.add_argument("--num-processes", type=int, default=1)
ap.add_argument("--port", type=int, default=0)
ap.add_argument("--out", required=True)
ap.add_argument("--restore", default=None)
args = ap.parse_args()
local = 8 // args.num_processes if args.restore is None else 1
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

from jaxrl_llm.parallel import (gather, global_to_host, host_to_global, initialize, local_rows,  # noqa: E402
                                make_mesh, replicated_to_global)

multi = initialize(f"localhost:{args.port}", args.num_processes, args.process_id) if args.num_processes > 1 \
    else False

import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as PS  # noqa: E402

import jaxrl_llm as jl  # noqa: E402
from jaxrl_llm.models import Transformer, preset  # noqa: E402
from jaxrl_llm.training import (Checkpointer, PolicyObjective, init_train_state, make_train_step,  # noqa: E402
                                train_state_shardings)

CFG = preset("tiny", vocab_size=256, hidden_size=64, num_heads=8, num_kv_heads=8, head_dim=8, intermediate_size=128)
B, L = 16, 12
rng = np.random.default_rng(0)
mask = np.ones((B, L), bool)
mask[::3, :4] = False
loss_mask = mask[:, 1:].copy()
loss_mask[:, :5] = False
loss_mask[5] = False
batch = {"tokens": rng.integers(0, CFG.vocab_size, (B, L)).astype(np.int32), "mask": mask, "loss_mask": loss_mask,
         "old_logp": rng.normal(-5.5, 0.2, (B, L - 1)).astype(np.float32),
         "advantages": rng.normal(0, 1, (B, L - 1)).astype(np.float32)}
obj = PolicyObjective(jl.ppo_clip_loss, agg_mode="seq-mean-token-mean", entropy_coef=0.01)
opt = optax.adamw(1e-2)
gd, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
state0 = jax.device_get(init_train_state(params, opt, seed=0))

if args.restore:  # one process, one device: a different mesh than the one that saved
    with Checkpointer(args.restore) as ck:
        restored, record = ck.restore(init_train_state(params, opt, seed=0))
    np.savez(os.path.join(args.out, "restored.npz"),
             **{str(i): np.asarray(x) for i, x in enumerate(jax.tree.leaves(restored))})
    print("restored step", int(restored.step), record["loop"])
    raise SystemExit(0)

assert jax.device_count() == 8 and jax.process_count() == args.num_processes
mesh = make_mesh((2, 2, 2))
st_sh = train_state_shardings(opt, state0, mesh)
data_sh = NamedSharding(mesh, PS(("data", "fsdp")))
state = replicated_to_global(state0, st_sh)
rows = local_rows(data_sh, (B, L))  # this host's rows of every batch
step = make_train_step(gd, opt, obj, num_microbatches=2, state_shardings=st_sh,
                       batch_shardings={k: data_sh for k in batch})
with jax.set_mesh(mesh):
    for i in range(2):
        local_batch = {k: v[rows] for k, v in batch.items()}
        state, metrics = step(state, host_to_global(local_batch, data_sh, global_rows=B))
back = global_to_host(host_to_global({"t": batch["tokens"][rows]}, data_sh, global_rows=B)["t"])
assert np.array_equal(back, batch["tokens"][rows]), "global_to_host is not the inverse of host_to_global"
ck = Checkpointer(os.path.join(args.out, "ckpt"))
ck.save(2, state, loop={"rows_of_process": rows.tolist(), "processes": jax.process_count()})
ck.close()
full = gather(state)
if jax.process_index() == 0:
    np.savez(os.path.join(args.out, "params.npz"), **{str(i): x for i, x in enumerate(jax.tree.leaves(full))})
print("process", jax.process_index(), "rows", rows.tolist(), "loss", float(metrics["loss"]), flush=True)

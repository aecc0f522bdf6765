"""Multi-host (multi-controller) JAX without Pathways or Ray.

Every host runs the same program; :func:`initialize` connects them through
``jax.distributed`` (a coordinator address, the number of processes and this process's id,
or auto-detection on TPU pods and SLURM), after which ``jax.devices()`` lists every device of
every host and a mesh spans them all. What differs per host is only its data: each host
reads its own share of every batch (:mod:`jaxrl_llm.data` splits by ``process_index``) and
:func:`host_to_global` assembles the shares into one global array that a jitted step takes
with its pjit-style shardings. Values every host already holds in full (freshly initialised
parameters from the same seed, a restored config) go through :func:`replicated_to_global`.
Orbax checkpoints are written collectively (every process calls ``save``; each writes its
own shards), and only process 0 logs and writes side files (:func:`is_primary`).
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import jax
import numpy as np

__all__ = ["initialize", "is_primary", "host_to_global", "replicated_to_global", "global_to_host", "gather",
           "local_rows", "allgather_objects"]

_ENV = ("JAXRL_COORDINATOR", "JAXRL_NUM_PROCESSES", "JAXRL_PROCESS_ID")


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: Any = None) -> bool:
    """Connect this process to the others (``jax.distributed.initialize``); call it first,
    before any other JAX call. Returns True if running with several processes.

    Arguments not given come from ``$JAXRL_COORDINATOR`` (``host:port`` of process 0),
    ``$JAXRL_NUM_PROCESSES`` and ``$JAXRL_PROCESS_ID``; with none of them, JAX's own
    auto-detection runs (TPU pod slices, SLURM, Open MPI; it raises where there is nothing to
    detect). ``num_processes=1`` returns False without initialising. On CPU, cross-process
    collectives use gloo.
    """
    env = [os.environ.get(k) for k in _ENV]
    coordinator_address = coordinator_address or env[0]
    if num_processes is None and env[1]:
        num_processes = int(env[1])
    if process_id is None and env[2]:
        process_id = int(env[2])
    given = [x is not None for x in (coordinator_address, num_processes, process_id)]
    if any(given) and not all(given):
        raise ValueError("multi-host: set all of coordinator_address, num_processes and process_id "
                         f"(or {', '.join(_ENV)}); got coordinator={coordinator_address!r}, "
                         f"num_processes={num_processes!r}, process_id={process_id!r}")
    if all(given) and not 0 <= process_id < num_processes:
        raise ValueError(f"multi-host: process_id={process_id} must be in [0, num_processes={num_processes})")
    if all(given) and num_processes == 1:
        return False
    if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if all(given):
        jax.distributed.initialize(coordinator_address, num_processes=num_processes, process_id=process_id,
                                   local_device_ids=local_device_ids)
    else:
        jax.distributed.initialize()  # TPU pod / SLURM / Open MPI auto-detection
    return jax.process_count() > 1


def is_primary() -> bool:
    """Whether this is process 0 (the one that logs and writes side files)."""
    return jax.process_index() == 0


def local_rows(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> np.ndarray:
    """The rows (indices on axis 0) of a global array of ``shape`` that live on this
    process's devices under ``sharding``, sorted: the rows this host must supply."""
    rows: set[int] = set()
    for idx in sharding.addressable_devices_indices_map(tuple(shape)).values():
        sl = idx[0] if idx else slice(None)
        rows.update(range(*sl.indices(shape[0])))
    return np.asarray(sorted(rows), np.int64)


def host_to_global(tree: Any, shardings: Any, global_rows: int | None = None) -> Any:
    """Assemble each host's rows into global arrays (``jax.make_array_from_process_local_data``).

    ``tree``: this host's numpy arrays (its :func:`local_rows` of the global batch, in
    order); ``shardings``: one sharding per leaf, or a single one for all; ``global_rows``:
    the global batch size (default: local rows x process count)."""
    leaves, treedef = jax.tree.flatten(tree)
    shs = [shardings] * len(leaves) if isinstance(shardings, jax.sharding.Sharding) else jax.tree.leaves(shardings)
    if len(shs) != len(leaves):
        raise ValueError(f"host_to_global: {len(leaves)} arrays but {len(shs)} shardings")
    out = []
    for x, sh in zip(leaves, shs):
        x = np.asarray(x)
        rows = global_rows if global_rows is not None else x.shape[0] * jax.process_count()
        out.append(jax.make_array_from_process_local_data(sh, x, (rows,) + x.shape[1:]))
    return jax.tree.unflatten(treedef, out)


def replicated_to_global(tree: Any, shardings: Any) -> Any:
    """Global arrays from values every process holds in full (same on every host): each
    device takes its slice. Works with one process too (it is then a ``device_put``)."""
    def one(x, sh):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx])

    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(lambda x: one(x, shardings), tree)
    return jax.tree.map(one, tree, shardings)


def global_to_host(x: jax.Array) -> np.ndarray:
    """This process's rows of a global array sharded on axis 0 (the inverse of
    :func:`host_to_global`), as numpy, in :func:`local_rows` order."""
    rows = local_rows(x.sharding, x.shape)
    parts: dict[int, np.ndarray] = {}
    for s in x.addressable_shards:
        sl = s.index[0] if s.index else slice(None)
        start = sl.indices(x.shape[0])[0]
        if tuple(s.data.shape[1:]) != tuple(x.shape[1:]):
            raise ValueError(f"global_to_host: the array is split on an axis other than 0 ({x.sharding})")
        parts.setdefault(start, np.asarray(s.data))
    got = np.concatenate([parts[k] for k in sorted(parts)], axis=0) if parts else np.zeros((0,) + x.shape[1:])
    if got.shape[0] != len(rows):
        raise ValueError(f"global_to_host: local shards hold {got.shape[0]} rows, expected {len(rows)}")
    return got


def gather(tree: Any) -> Any:
    """Every (global) array of ``tree`` in full on every process, as numpy (a collective
    when there are several processes: all must call it). The RL loop fetches rollouts and
    log-probabilities this way (a batch of tokens is small next to the model); avoid it for
    parameters except at export."""
    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, jax.device_get(tree))
    from jax.experimental import multihost_utils

    def one(x):  # arrays held whole by this process (computed locally, or replicated) need no exchange
        if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
            return np.asarray(jax.device_get(x))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)


def allgather_objects(obj: Any) -> list[Any]:
    """``[obj of process 0, obj of process 1, ...]`` on every process, for small picklable
    host values that differ per process (e.g. reward outputs of each host's rows). A
    collective: every process must call it. One process: ``[obj]``."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils

    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32))).reshape(-1)
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[:data.size] = data
    every = np.asarray(multihost_utils.process_allgather(buf))
    return [pickle.loads(every[i, :int(n)].tobytes()) for i, n in enumerate(sizes)]

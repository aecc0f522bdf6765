"""Meshes and logical-axis sharding rules.

Arrays carry *logical* axis names (``"embed"``, ``"heads"``, ``"batch"`` ...); a small rules
table maps each name to zero, one or several *mesh* axes (``data``, ``fsdp``, ``tensor``,
``expert`` for the stacked experts of a mixture of experts: a mesh made with
``axes=("data", "expert")`` splits them over devices, and ``context`` for context parallelism:
the tokens of every activation, ``act_seq``, split over it, the attention all-gathering keys and
values over it (:mod:`jaxrl_llm.models.attn`), the parameters split over it like over ``fsdp``).
Changing the parallelism strategy means changing the table, not the model. A dimension that
the mesh axes do not divide evenly is replicated rather than failing (e.g. SmolLM2's 9 heads
on a 2-way tensor axis), and a mesh axis is never used twice in one array.

Activations get the same treatment through :func:`constrain`, with their own logical names
(``act_batch``, ``act_heads`` ...: activations are split by batch where parameters are split
by ``fsdp``). It applies a sharding constraint only when a mesh is set (``with
jax.set_mesh(mesh):``) and is the identity otherwise, so model code calls it unconditionally.

Meshes are created with ``AxisType.Auto`` axes: on this jax, ``jax.make_mesh`` defaults to
Explicit axes, under which ops mixing differently sharded arrays raise
``ShardingTypeError``; Auto lets XLA's SPMD partitioner propagate shardings from the
inputs, which is what the pjit-style ``in_shardings``/``out_shardings`` of our steps rely on.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Iterable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "MESH_AXES",
    "DEFAULT_RULES",
    "SAMPLER_RULES",
    "decode_rules",
    "active_rules",
    "make_mesh",
    "logical_to_spec",
    "logical_sharding",
    "variable_axes",
    "state_shardings",
    "shard_state",
    "constrain",
    "constrain_lookup",
    "logical_rules",
    "to_host_memory",
    "in_host_memory",
    "device_memory_bytes",
]

MESH_AXES = ("data", "fsdp", "tensor")
#: further axes a mesh may have: ``expert`` (a mixture of experts' stacked experts) and
#: ``context`` (context parallelism: the sequence of every activation split over it)
OPTIONAL_AXES = ("expert", "context")

# logical name -> mesh axis, tuple of mesh axes, or None (replicated)
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp", "expert")),
    ("vocab", "tensor"),
    # parameters are split over the context axis too (it holds no rows of its own: ZeRO-3 over
    # every device a row's computation does not need whole)
    ("embed", ("fsdp", "context")),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("expert", "expert"),  # stacked experts of a mixture of experts: expert parallelism
    ("expert_router", None),
    ("layers", None),
    ("lora_rank", None),
    ("labels", None),
    ("norm", None),
    ("positions", None),
    ("seq", None),
    ("cache_seq", None),
    # activations
    ("act_batch", ("data", "fsdp", "expert")),
    ("act_seq", "context"),  # context parallelism: a row's tokens split over the context axis
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_expert", "expert"),
    ("act_batch_no_expert", ("data", "fsdp")),  # a mixture of experts' token buffers on the experts' devices
    ("act_vocab", "tensor"),
)

# for the sampler's copy of the weights: like DEFAULT_RULES but not split over fsdp (sharded
# over tensor only). Decoding with FSDP-split weights all-gathers every layer at every token;
# resharding once per rollout (Sampler(param_rules=SAMPLER_RULES)) gathers them once.
SAMPLER_RULES: tuple[tuple[str, Any], ...] = tuple((k, None if k == "embed" else v) for k, v in DEFAULT_RULES)

class _Rules(threading.local):
    """The stack of :class:`logical_rules` tables, one per thread (the asynchronous sampler's thread
    traces with decoding rules while the main thread traces the update)."""

    def __init__(self):
        self.stack: list[tuple[tuple[str, Any], ...]] = [DEFAULT_RULES]


_RULES = _Rules()


def active_rules() -> tuple[tuple[str, Any], ...]:
    """The rules :func:`constrain` uses now (the innermost :class:`logical_rules`, else
    :data:`DEFAULT_RULES`)."""
    return _RULES.stack[-1]


def decode_rules(rules: Iterable[tuple[str, Any]] = DEFAULT_RULES) -> tuple[tuple[str, Any], ...]:
    """``rules`` for sampling: a decode step has one token per row, no sequence to split, so the
    ``context`` axis splits the rows (the batch, the KV cache's rows) like ``data`` and ``fsdp``.
    Meshes without a context axis are unaffected (the axis is dropped)."""
    out = []
    for name, target in rules:
        if name in ("batch", "act_batch"):
            axes = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
            target = axes if "context" in axes else axes + ("context",)
        elif name == "act_seq":
            target = None
        out.append((name, target))
    # marks the rules as decoding's for constrain_lookup (rows that do not fill the batch axes)
    return tuple(out) + (("_decoding", None),)


def make_mesh(shape: Sequence[int] = (1, 1, 1), axes: Sequence[str] = MESH_AXES,
              devices: Sequence[Any] | None = None) -> Mesh:
    """A mesh of ``shape`` over ``axes`` (Auto axis types), from ``devices`` or all devices.

    ``prod(shape)`` must equal the number of devices used.
    """
    shape, axes = tuple(int(s) for s in shape), tuple(axes)
    if len(shape) != len(axes):
        raise ValueError(f"mesh shape {shape} and axes {axes} differ in length")
    devs = list(jax.devices() if devices is None else devices)
    n = math.prod(shape)
    if n != len(devs):
        raise ValueError(f"mesh shape {shape} needs {n} devices, got {len(devs)}")
    types = (jax.sharding.AxisType.Auto,) * len(axes)
    return jax.make_mesh(shape, axes, axis_types=types, devices=devs)


def _rules_dict(rules: Iterable[tuple[str, Any]]) -> dict[str, tuple[str, ...]]:
    out = {}
    for name, target in rules:
        out[name] = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
    return out


def logical_to_spec(names: Sequence[str | None], rules: Iterable[tuple[str, Any]] = DEFAULT_RULES,
                    mesh: Mesh | None = None, shape: Sequence[int] | None = None) -> PartitionSpec:
    """``PartitionSpec`` for an array whose axes have the logical ``names``.

    With ``mesh`` and ``shape``, mesh axes absent from the mesh, of size 1, already used by an
    earlier dimension, or not dividing the dimension are dropped (that dimension is then
    sharded over the remaining axes or replicated).
    """
    table = _rules_dict(rules)
    used: set[str] = set()
    spec = []
    for i, name in enumerate(names):
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise ValueError(f"logical axis {name!r} has no sharding rule (known: {sorted(table)})")
        chosen = []
        size = 1
        for ax in table[name]:
            if ax in used:
                continue
            if mesh is not None:
                if ax not in mesh.shape or mesh.shape[ax] == 1:
                    continue
                if shape is not None and shape[i] % (size * mesh.shape[ax]) != 0:
                    continue
                size *= mesh.shape[ax]
            chosen.append(ax)
        used.update(chosen)
        spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
    while spec and spec[-1] is None:
        spec.pop()
    return PartitionSpec(*spec)


def logical_sharding(names: Sequence[str | None], mesh: Mesh, rules: Iterable[tuple[str, Any]] = DEFAULT_RULES,
                     shape: Sequence[int] | None = None) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(names, rules, mesh, shape))


def variable_axes(var: Any) -> tuple[str | None, ...]:
    """Logical axes of an NNX variable (its ``logical_axes`` metadata).

    Variables of the scanned layer stack have one more dimension than their metadata names
    (the layer axis, created by ``nnx.vmap``): ``"layers"`` is prepended for them.
    """
    value = var.get_value()
    ndim = len(np.shape(value))
    axes = tuple(getattr(var, "logical_axes", None) or (None,) * ndim)
    if len(axes) == ndim - 1:
        axes = ("layers",) + axes
    if len(axes) != ndim:
        raise ValueError(f"variable of shape {np.shape(value)} has logical axes {axes}")
    return axes


def state_shardings(state: Any, mesh: Mesh, rules: Iterable[tuple[str, Any]] = DEFAULT_RULES) -> Any:
    """Pytree of ``NamedSharding`` matching an NNX ``State`` (concrete or abstract)."""
    from flax import nnx

    def one(var):
        value = var.get_value()
        return var.replace(logical_sharding(variable_axes(var), mesh, rules, np.shape(value)))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_state(state: Any, mesh: Mesh, rules: Iterable[tuple[str, Any]] = DEFAULT_RULES) -> Any:
    """``device_put`` every variable of ``state`` onto its logical sharding."""
    shardings = state_shardings(state, mesh, rules)
    return jax.device_put(state, shardings)


def to_host_memory(tree: Any) -> Any:
    """A copy of ``tree``'s arrays in pinned host memory, each keeping its sharding (the
    same layout over the same devices, in the hosts' RAM instead of HBM). A jitted function
    takes them as arguments and moves them in with ``jax.device_put(x, jax.memory.Space.Device)``
    when it runs: device memory then holds them only during that call. Used to keep a frozen
    reference policy off the accelerators between its log-prob passes."""
    return jax.tree.map(lambda x: jax.device_put(x, x.sharding.with_memory_kind("pinned_host")), tree)


def in_host_memory(tree: Any) -> bool:
    """Whether the arrays of ``tree`` live in host memory (:func:`to_host_memory`); raises
    if some do and some do not."""
    kinds = {getattr(x.sharding, "memory_kind", None) in ("pinned_host", "unpinned_host")
             for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)}
    if len(kinds) > 1:
        raise ValueError("in_host_memory: the tree mixes arrays in host and in device memory")
    return kinds == {True}


def device_memory_bytes() -> int:
    """Bytes of this process's live arrays in device memory (not host memory), summed over
    its devices: what the arrays alone occupy in HBM. Buffers seen through several arrays
    (a shard's ``.data`` view and its global array) count once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for x in jax.live_arrays():
        if getattr(x.sharding, "memory_kind", "device") in ("pinned_host", "unpinned_host"):
            continue
        for s in x.addressable_shards:
            key = (s.device.id, s.data.unsafe_buffer_pointer())
            if key not in seen:
                seen.add(key)
                total += s.data.nbytes
    return total


class logical_rules:  # noqa: N801 (used as a context manager)
    """``with logical_rules(rules):`` -- the table :func:`constrain` uses inside the block."""

    def __init__(self, rules: Iterable[tuple[str, Any]]):
        self.rules = tuple(rules)

    def __enter__(self):
        _RULES.stack.append(self.rules)
        return self.rules

    def __exit__(self, *exc):
        _RULES.stack.pop()


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """Sharding constraint of activation ``x`` from its logical axis ``names``.

    The identity unless a mesh is set (``jax.set_mesh``); dimensions the mesh axes do not
    divide stay unsplit (as for parameters).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return x
    if len(names) != x.ndim:
        raise ValueError(f"constrain: {len(names)} axis names {tuple(names)} for an array of shape {x.shape}")
    spec = logical_to_spec(names, _RULES.stack[-1], mesh, x.shape)
    return jax.lax.with_sharding_constraint(x, spec)


def constrain_lookup(x: jax.Array) -> jax.Array:
    """The layout of a ``[B, T, D]`` embedding lookup on its way to the activation layout.

    A lookup's result has its ``D`` split like the table's ``"embed"`` axis; the activations
    split ``B`` over the ``"act_batch"`` axes. When those share a mesh axis (``fsdp`` under
    :data:`DEFAULT_RULES`) and another axis splits the batch too (``data``), XLA's SPMD
    partitioner has no efficient path between the two layouts for the backward pass (the
    cotangent, split over the whole batch, must become ``D``-split and replicated over
    ``data`` for the table's scatter-add) and logs "Involuntary full rematerialization": it
    replicates the tensor. This constraint puts the layout in between, ``B`` over the batch
    axes the table does not use and ``D`` like the table: from it each direction is one
    collective (an all-to-all over the shared axis, an all-gather over the others). With
    context parallelism the table's ``D`` is split over the ``context`` axis too, which the
    activations use for ``T``: a second layout in between moves it there first (``T`` over the
    shared sequence axes, ``D`` over the rest of the table's), one all-to-all per step. The
    identity without a mesh, like :func:`constrain`.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return x
    rules = _RULES.stack[-1]
    table = _rules_dict(rules)
    if "_decoding" in table:
        # decode_rules: forward only. When the rows do not fill every batch axis the TPU
        # compiler's partitioner failed on the layout in between (Qwen3-30B-A3B, fsdp x expert,
        # 8 prompts on 64 chips): leave those to the partitioner. When they do fill them, the
        # layout in between is what keeps XLA from replicating the lookup (8 CPU devices).
        ways = 1
        for a in table.get("act_batch", ()):
            ways *= mesh.shape.get(a, 1)
        if x.shape[0] % ways:
            return x
    embed = table.get("embed", ())
    between = tuple(rules) + (("_lookup_batch", tuple(a for a in table.get("act_batch", ()) if a not in embed)),
                              ("_lookup_embed", embed))
    spec = logical_to_spec(("_lookup_batch",) + (None,) * (x.ndim - 2) + ("_lookup_embed",), between, mesh, x.shape)
    x = jax.lax.with_sharding_constraint(x, spec)
    seq = tuple(a for a in table.get("act_seq", ()) if a in embed and a in mesh.shape and mesh.shape[a] > 1)
    if seq and x.ndim == 3:
        between += (("_lookup_seq", seq), ("_lookup_rest", tuple(a for a in embed if a not in seq)))
        spec = logical_to_spec(("_lookup_batch", "_lookup_seq", "_lookup_rest"), between, mesh, x.shape)
        x = jax.lax.with_sharding_constraint(x, spec)
    return x


def __getattr__(name: str) -> Any:
    # init_sharded builds a model, so it lives in jaxrl_llm.models (above this package, which
    # the models import); this keeps `from jaxrl_llm.parallel.sharding import init_sharded`
    # working without importing the models when this module is imported (no import cycle).
    if name == "init_sharded":
        from jaxrl_llm.models.transformer import init_sharded

        return init_sharded
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Mesh and sharding rules as data: regex on a '/'-joined parameter path -> PartitionSpec.

Mesh axes: `data` (pure replicas: parameters replicated, batch split), `fsdp` (batch split and
parameters split, gathered per layer by XLA), `tensor` (heads / hidden features split). A rule's
spec describes one layer's tensor; stacked (scanned) layer axes in front of it are left
replicated, so the same table serves scanned and unrolled models. First match wins; a
parameter no rule matches is an error naming its path.
"""
from __future__ import annotations

import math
import re
from typing import Any, Sequence

import jax
import numpy as np
from absl import logging
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from trsi_jax.config import MeshConfig

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch dimension is split over both
Rules = tuple[tuple[str, P], ...]

# Parameters of `trsi_jax.models` (qwen3_5 hybrid and dense qwen3; Linear kernels are [in, out]).
# Inputs of a projection go on `fsdp`, its outputs (heads, MLP features, vocab) on `tensor`;
# the output projections are the transpose. Vectors (norms, per-head decay) stay replicated.
RULES: Rules = (
    (r"embed\w*/embedding$", P("tensor", "fsdp")),  # [V, D]
    (r"lm_head/kernel$", P("fsdp", "tensor")),  # [D, V]
    (r"(q_proj|k_proj|v_proj)/kernel$", P("fsdp", "tensor")),  # [D, heads*hd]
    (r"o_proj/kernel$", P("tensor", "fsdp")),  # [heads*hd, D]
    (r"(q_norm|k_norm)/scale$", P(None)),  # [hd]
    (r"(in_proj_qkv|in_proj_z|in_proj_b|in_proj_a)/kernel$", P("fsdp", "tensor")),  # [D, *]
    (r"out_proj/kernel$", P("tensor", "fsdp")),  # [Hv*dv, D]
    (r"conv1d$", P(None, "tensor")),  # depthwise causal conv [K, C]
    (r"(A_log|dt_bias)$", P(None)),  # [Hv]
    (r"(gate_proj|up_proj)/kernel$", P("fsdp", "tensor")),  # [D, I]
    (r"down_proj/kernel$", P("tensor", "fsdp")),  # [I, D]
    (r"norm\w*/scale$", P(None)),  # RMSNorm weights, incl. the GDN gated norm
    (r"value_head/kernel$", P("fsdp", None)),  # critic [D, 1]
    (r"value_head/bias$", P(None)),
)

# Decode cache of `trsi_jax.models.init_cache` (spec of one layer's entry; batch first).
CACHE_RULES: Rules = (
    (r"^(k|v)$", P(BATCH_AXES, "tensor", None, None)),  # KV [B, Hkv, S, hd]
    (r"^state$", P(BATCH_AXES, "tensor", None, None)),  # GDN recurrent state [B, Hv, dk, dv]
    (r"^conv$", P(BATCH_AXES, None, "tensor")),  # last K-1 conv inputs [B, K-1, C]
    (r"^valid$", P(BATCH_AXES, None)),  # [B, S]
    (r"^pos$", P(BATCH_AXES)),  # [B]
    (r"^length$", P()),  # [] slots written
)

# A tensor this large (elements) left fully replicated on a mesh that splits parameters is a
# memory bug, not a fallback: `param_shardings` raises instead of warning.
REPLICATED_LIMIT = 1 << 20


def make_mesh(cfg: MeshConfig, devices: Sequence[Any] | None = None) -> Mesh:
    """Mesh over `devices` (default: all) with axes (data, fsdp, tensor); one -1 takes the rest."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = [cfg.data, cfg.fsdp, cfg.tensor]
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"MeshConfig {cfg}: sizes must be positive with at most one -1")
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if len(devices) % known:
            raise ValueError(f"MeshConfig {cfg}: {len(devices)} devices are not divisible by the "
                             f"fixed axes' product {known}")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(f"MeshConfig {cfg}: data*fsdp*tensor = {math.prod(sizes)} but there are "
                         f"{len(devices)} devices; make the product match or use -1 on one axis")
    return jax.make_mesh(tuple(sizes), AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def path_str(path: tuple) -> str:
    """'/'-joined key path of a pytree leaf, without NNX's trailing `.value`."""
    parts = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            parts.append(str(k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            parts.append(k.name)
        elif isinstance(k, jax.tree_util.SequenceKey):
            parts.append(str(k.idx))
        elif isinstance(k, jax.tree_util.FlattenedIndexKey):
            parts.append(str(k.key))
        else:
            parts.append(str(k))
    if len(parts) > 1 and parts[-1] == "value":
        parts.pop()
    return "/".join(parts)


def _axis_size(mesh: Mesh, entry) -> int:
    names = entry if isinstance(entry, tuple) else (entry,)
    return math.prod(mesh.shape[n] for n in names if n is not None)


def spec_for(path: str, shape: tuple[int, ...], mesh: Mesh, rules: Rules) -> P:
    """The first matching rule's spec, fitted to `shape`: leading (stacked) axes replicated and
    any axis the mesh does not divide replicated with a warning."""
    for pattern, spec in rules:
        if re.search(pattern, path):
            break
    else:
        raise ValueError(f"no sharding rule matches parameter {path!r} (shape {shape}); add a "
                         f"(regex, PartitionSpec) entry to the rules")
    entries = tuple(spec)
    if len(entries) > len(shape):
        raise ValueError(f"rule {pattern!r} gives {spec} ({len(entries)} axes) for {path!r} of "
                         f"rank {len(shape)} {shape}")
    entries = (None,) * (len(shape) - len(entries)) + entries
    fitted = []
    for dim, entry in zip(shape, entries):
        if entry is not None and dim % _axis_size(mesh, entry):
            logging.warning("sharding: %s dim %d of shape %s not divisible by mesh axis %s (%d); "
                            "replicating that axis", path, dim, shape, entry, _axis_size(mesh, entry))
            entry = None
        fitted.append(entry)
    return P(*fitted)


def tree_shardings(tree: Any, mesh: Mesh, rules: Rules, replicated_limit: int | None = None) -> Any:
    """NamedSharding per leaf of `tree` (arrays or ShapeDtypeStructs) by `rules`. With
    `replicated_limit`, a leaf of that many elements or more that ends fully replicated while the
    mesh splits parameters (fsdp * tensor > 1) raises, naming every such leaf."""
    too_big = []

    def one(path, leaf):
        name = path_str(path)
        spec = spec_for(name, tuple(leaf.shape), mesh, rules)
        if (replicated_limit is not None and mesh.shape["fsdp"] * mesh.shape["tensor"] > 1
                and all(e is None for e in spec) and math.prod(leaf.shape) >= replicated_limit):
            too_big.append(f"{name} {tuple(leaf.shape)}")
        return NamedSharding(mesh, spec)

    out = jax.tree_util.tree_map_with_path(one, tree)
    if too_big:
        raise ValueError(f"{len(too_big)} tensor(s) of >= {replicated_limit} elements would be "
                         f"fully replicated on mesh {dict(mesh.shape)}: {too_big}; fix the rules "
                         f"or the mesh so they divide")
    return out


def param_shardings(state: Any, mesh: Mesh, rules: Rules = RULES,
                    replicated_limit: int = REPLICATED_LIMIT) -> Any:
    """Pytree of NamedShardings matching `state` (an `nnx.State` of arrays or abstract arrays)."""
    return tree_shardings(state, mesh, rules, replicated_limit)


def cache_shardings(cache: Any, mesh: Mesh, rules: Rules = CACHE_RULES) -> Any:
    """NamedShardings for a decode cache: batch over (data, fsdp), heads/channels over tensor."""
    return tree_shardings(cache, mesh, rules)


def opt_state_shardings(opt_state: Any, params: Any, param_shardings_tree: Any, mesh: Mesh) -> Any:
    """Shardings for an optax state: a leaf whose path ends with a parameter's path and has its
    shape (Adam moments, accumulated gradients) follows that parameter; the rest (step counts)
    is replicated."""
    by_path = {}
    for (path, leaf), sharding in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                                      jax.tree_util.tree_leaves(param_shardings_tree)):
        by_path[path_str(path)] = (tuple(leaf.shape), sharding)
    replicated = NamedSharding(mesh, P())

    def one(path, leaf):
        parts = path_str(path).split("/")
        for i in range(len(parts)):
            hit = by_path.get("/".join(parts[i:]))
            if hit is not None and hit[0] == tuple(leaf.shape):
                return hit[1]
        return replicated

    return jax.tree_util.tree_map_with_path(one, opt_state)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Leading (batch) axis over (data, fsdp); the rest replicated."""
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def shard_batch(batch: Any, mesh: Mesh) -> Any:
    """Places this process's slice of a batch (pytree of host arrays, batch first) as global arrays
    split over (data, fsdp). Single-host: the whole batch. Multi-host: each host's rows."""
    n = mesh.shape["data"] * mesh.shape["fsdp"]

    def one(path, x):
        x = np.asarray(x)
        global_rows = x.shape[0] * jax.process_count()
        if x.ndim == 0 or global_rows % n:
            raise ValueError(f"batch leaf {path_str(path)!r} of shape {x.shape}: the global batch "
                             f"({global_rows} rows) must divide data*fsdp = {n}")
        return jax.make_array_from_process_local_data(batch_sharding(mesh, x.ndim), x)

    return jax.tree_util.tree_map_with_path(one, batch)


def to_host(tree: Any) -> Any:
    """NumPy copy of every array leaf, whole on every process. Leaves split across processes are
    gathered (`process_allgather`), a collective: all processes must call this in the same order.
    Replicated and single-process leaves are read locally; non-array leaves pass through."""
    from jax.experimental import multihost_utils

    def one(x):
        if not isinstance(x, jax.Array):
            return x
        if x.is_fully_addressable:
            return np.asarray(jax.device_get(x))
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)


def shard_params(state: Any, mesh: Mesh, rules: Rules = RULES) -> Any:
    """`state` placed on `mesh` by `rules` (host or device arrays in, sharded arrays out)."""
    return jax.device_put(state, param_shardings(state, mesh, rules))


# ---------------------------------------------------------------------------------------------
# Compute layout inside the model. GSPMD left alone keeps activations split on the hidden axis
# (like the weights) and gathers the whole batch, or all-gathers logit gradients; these pins
# give the FSDP layout instead: activations split by batch, each weight all-gathered over `fsdp`
# right before its layer runs (its gradient reduce-scattered back). They apply under an ambient
# mesh (`with jax.set_mesh(mesh):` around tracing) and are the identity without one.


def _ambient_mesh():
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty or not set(AXES) <= set(mesh.axis_names) else mesh


def constrain_batch(x: jax.Array) -> jax.Array:
    """Pins an activation's leading (batch) axis to (data, fsdp) when the mesh divides it."""
    mesh = _ambient_mesh()
    if mesh is None or x.ndim == 0 or x.shape[0] % (mesh.shape["data"] * mesh.shape["fsdp"]):
        return x
    return jax.lax.with_sharding_constraint(x, P(BATCH_AXES, *([None] * (x.ndim - 1))))


def _without_fsdp(entry):
    if isinstance(entry, tuple):
        kept = tuple(a for a in entry if a != "fsdp")
        return kept if len(kept) > 1 else (kept[0] if kept else None)
    return None if entry == "fsdp" else entry


def gather_weight(path: str, x: jax.Array, rules: Rules = RULES) -> jax.Array:
    """`x` (the parameter at `path`, as the rules name it) all-gathered over `fsdp`, its
    `tensor` split kept: call right before use so only one layer is gathered at a time."""
    mesh = _ambient_mesh()
    if mesh is None:
        return x
    spec = spec_for(path, tuple(x.shape), mesh, rules)
    # Pinned to its stored split first, so the gradient (the transpose) is reduce-scattered back
    # to that split inside the layer loop instead of piling up gathered across layers.
    x = jax.lax.with_sharding_constraint(x, spec)
    return jax.lax.with_sharding_constraint(x, P(*(_without_fsdp(e) for e in spec)))


def gather_weights(tree: Any, rules: Rules = RULES) -> Any:
    """`gather_weight` on every leaf of one layer's parameter tree (paths relative to the layer)."""
    if _ambient_mesh() is None:
        return tree
    return jax.tree_util.tree_map_with_path(lambda p, x: gather_weight(path_str(p), x, rules), tree)


def initialize_multihost(enabled: bool) -> tuple[int, int]:
    """`jax.distributed.initialize()` once (one process per host, coordinator from the
    environment: TPU metadata, SLURM or JAX_COORDINATOR_ADDRESS); returns (process, count)."""
    if enabled and not jax.distributed.is_initialized():
        jax.distributed.initialize()
    return jax.process_index(), jax.process_count()

"""Logical-axis sharding: one rules table from parameter/activation axis names to mesh axes.

Model parameters carry logical axis names in their `out_sharding` metadata
(see `aepo_jax.models.layers.logical_param`). Changing how a model is split
over devices means editing `LOGICAL_AXIS_RULES`, nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

MeshAxes = str | tuple[str, ...] | None

LOGICAL_AXIS_RULES: dict[str, MeshAxes] = {
    "batch": ("data", "fsdp"),  # examples split over data- and fully-sharded-data-parallel devices
    "length": None,  # sequence / cache slots
    "vocab": "tensor",
    "embed": "fsdp",  # weights' d_model axis: ZeRO-3 style sharding over fsdp
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    "layers": None,  # leading axis of the scanned decoder's stacked parameters: every device holds all layers
}


def _mesh_axes(name: str | None) -> tuple[str, ...]:
    if name is None:
        return ()
    if name not in LOGICAL_AXIS_RULES:
        raise ValueError(f"logical axis {name!r} has no sharding rule; known axes: {sorted(LOGICAL_AXIS_RULES)}")
    target = LOGICAL_AXIS_RULES[name]
    if target is None:
        return ()
    return (target,) if isinstance(target, str) else tuple(target)


def logical_to_spec(
    names: Sequence[str | None],
    shape: Sequence[int] | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> PartitionSpec:
    """PartitionSpec for an array whose axes have logical `names`.

    With `shape` and `mesh`, a dimension not divisible by its mesh axes' size
    (e.g. 9 heads over tensor=2) and mesh axes already used by an earlier
    dimension are left unsharded, so every result is valid for `device_put`.
    """
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for dim, name in enumerate(names):
        axes = tuple(a for a in _mesh_axes(name) if a not in used)
        if mesh is not None:
            axes = tuple(a for a in axes if a in mesh.shape)
            if shape is not None and shape[dim] % math.prod(mesh.shape[a] for a in axes):
                axes = ()
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*spec)


def require_heads_split(n_heads: int, n_kv_heads: int, mesh_shape: Mapping[str, int], model: str) -> None:
    """A ValueError unless the mesh axes of `heads` and `kv_heads` (`tensor`) divide both head counts.

    `logical_to_spec` leaves an axis it cannot divide unsplit, so with e.g. 4 KV heads over tensor=8
    every attention weight (and the sampler's KV cache) would be replicated over the tensor devices,
    silently. A run checks its mesh against its model with this before it builds or reads the model.
    `mesh_shape`: axis sizes (a `Mesh.shape`; an axis left out is 1); `model` names it in the error.
    """
    common = math.gcd(n_heads, n_kv_heads)
    for name, count, what in (("heads", n_heads, "query heads"), ("kv_heads", n_kv_heads, "key-value heads")):
        axes = " x ".join(_mesh_axes(name))
        size = math.prod(int(mesh_shape.get(axis, 1)) for axis in _mesh_axes(name))
        if count % size:
            fits = [t for t in range(1, common + 1) if common % t == 0]
            raise ValueError(f"{model} has {n_heads} query heads and {n_kv_heads} key-value heads: the mesh's "
                             f"{axes} size {size} does not divide its {count} {what}, so its attention weights "
                             f"would not be split over {axes}; set mesh.shape with {axes} one of {fits}")


def named_sharding(names: Sequence[str | None] | None, shape: Sequence[int], mesh: jax.sharding.Mesh) -> NamedSharding:
    """NamedSharding on `mesh` for an array of `shape` with logical axis `names` (None: replicated)."""
    if names is None:
        return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, logical_to_spec(names, shape, mesh))


def state_shardings(state: Any, mesh: jax.sharding.Mesh) -> Any:
    """The NamedSharding of every variable in an `nnx.State` (same tree), from its logical axes."""

    def sharding_of(variable: Any) -> Any:
        if isinstance(variable, nnx.Variable):
            names = variable.get_metadata().get("out_sharding")
            return variable.replace(named_sharding(names, variable.shape, mesh))
        return named_sharding(None, getattr(variable, "shape", ()), mesh)

    return jax.tree.map(sharding_of, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_state(state: Any, mesh: jax.sharding.Mesh) -> Any:
    """`state` with every variable placed on `mesh` according to `LOGICAL_AXIS_RULES`."""
    return jax.device_put(state, state_shardings(state, mesh))


def batch_sharding(mesh: jax.sharding.Mesh, ndim: int) -> NamedSharding:
    """Sharding for a batch-major array of rank `ndim`: axis 0 over the batch axes, the rest replicated."""
    if ndim < 1:
        raise ValueError(f"a batch array needs at least one axis, got ndim={ndim}")
    return NamedSharding(mesh, logical_to_spec(("batch",) + (None,) * (ndim - 1), mesh=mesh))

"""Logical-axis sharding: one rules table from parameter/activation axis names to mesh axes.

Model parameters carry logical axis names in their `out_sharding` metadata
(see `aepo_jax.models.layers.logical_param`). Changing how a model is split
over devices means editing `LOGICAL_AXIS_RULES`, nothing else.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
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


class UnsplitAxisWarning(UserWarning):
    """Arrays a mesh cannot split as their logical axes say: a mesh axis does not divide a dimension, so
    the array is replicated over that axis's devices instead (more memory per device, and for `fsdp`
    no ZeRO-3 saving at all)."""


# (dimension index, logical name, mesh axes that do not divide it)
Unsplit = tuple[int, str, tuple[str, ...]]


def _spec_and_unsplit(names: Sequence[str | None], shape: Sequence[int] | None,
                      mesh: jax.sharding.Mesh | None) -> tuple[PartitionSpec, list[Unsplit]]:
    """`logical_to_spec`'s spec, and the dimensions it left unsplit because their mesh axes do not divide them."""
    used: set[str] = set()
    spec: list[MeshAxes] = []
    unsplit: list[Unsplit] = []
    for dim, name in enumerate(names):
        axes = tuple(a for a in _mesh_axes(name) if a not in used)
        if mesh is not None:
            axes = tuple(a for a in axes if a in mesh.shape)
            if shape is not None and shape[dim] % math.prod(mesh.shape[a] for a in axes):
                unsplit.append((dim, str(name), axes))
                axes = ()
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*spec), unsplit


def logical_to_spec(
    names: Sequence[str | None],
    shape: Sequence[int] | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> PartitionSpec:
    """PartitionSpec for an array whose axes have logical `names`.

    With `shape` and `mesh`, a dimension not divisible by its mesh axes' size
    (e.g. 9 heads over tensor=2) and mesh axes already used by an earlier
    dimension are left unsharded, so every result is valid for `device_put`.
    `state_shardings` reports the first kind, for a whole model, as an
    `UnsplitAxisWarning`.
    """
    return _spec_and_unsplit(names, shape, mesh)[0]


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
    """The NamedSharding of every variable in an `nnx.State` (same tree), from its logical axes.

    Warns once (`UnsplitAxisWarning`) when the mesh cannot split some variables as their logical axes
    say (e.g. a 64-wide `embed` over fsdp=3, or a vocabulary of 501 over tensor=2): those stay
    replicated over the axis, and the warning names them and the fraction of the state's bytes they hold.
    """
    unsplit: list[tuple[str, tuple[int, ...], int, list[Unsplit]]] = []  # (path, shape, bytes, dimensions)
    total_bytes = 0

    def sharding_of(path: tuple[Any, ...], variable: Any) -> Any:
        nonlocal total_bytes
        shape = tuple(getattr(variable, "shape", ()))
        nbytes = math.prod(shape) * _itemsize(variable)
        total_bytes += nbytes
        names = variable.get_metadata().get("out_sharding") if isinstance(variable, nnx.Variable) else None
        if names is None:
            sharding = NamedSharding(mesh, PartitionSpec())
        else:
            spec, dims = _spec_and_unsplit(names, shape, mesh)
            sharding = NamedSharding(mesh, spec)
            if dims:
                unsplit.append((_path_name(path), shape, nbytes, dims))
        return variable.replace(sharding) if isinstance(variable, nnx.Variable) else sharding

    shardings = jax.tree_util.tree_map_with_path(sharding_of, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    if unsplit:
        warnings.warn(_unsplit_message(unsplit, total_bytes, mesh), UnsplitAxisWarning, stacklevel=2)
    return shardings


def _itemsize(variable: Any) -> int:
    dtype = getattr(variable, "dtype", None)
    try:
        return 1 if dtype is None else np.dtype(dtype).itemsize
    except TypeError:  # an extended dtype (a PRNG key's): count elements
        return 1


def _arrays(count: int) -> str:
    return f"{count} array" + "s" * (count != 1)


def _path_name(path: tuple[Any, ...]) -> str:
    """A tree path as dotted names: `layers.attention.q_proj`."""
    return ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _unsplit_message(unsplit: list[tuple[str, tuple[int, ...], int, list[Unsplit]]], total_bytes: int,
                     mesh: jax.sharding.Mesh, shown: int = 3) -> str:
    """One warning for a whole state: each (logical axis, size, mesh axes) that did not divide, with the
    variables it left unsplit, and the fraction of the state's bytes those variables hold."""
    groups: dict[tuple[str, int, tuple[str, ...]], list[str]] = {}
    for path, shape, _, dims in unsplit:
        for dim, name, axes in dims:
            groups.setdefault((name, shape[dim], axes), []).append(f"{path} {list(shape)}")
    causes = []
    for (name, size, axes), paths in groups.items():
        over = " x ".join(f"{a}={mesh.shape[a]}" for a in axes)
        more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
        causes.append(f"{name!r} dimension {size} is not divisible by {over} "
                      f"({_arrays(len(paths))}: {', '.join(paths[:shown])}{more})")
    unsplit_bytes = sum(nbytes for _, _, nbytes, _ in unsplit)
    return (f"the mesh {dict(mesh.shape)} cannot split {_arrays(len(unsplit))} as their logical axes say, "
            f"holding {unsplit_bytes / max(total_bytes, 1):.1%} of the state's {total_bytes:,} bytes: they are "
            f"replicated over those mesh axes instead. {'; '.join(causes)}. Choose mesh axis sizes that divide "
            "these dimensions (LOGICAL_AXIS_RULES maps logical axes to mesh axes)")


def shard_state(state: Any, mesh: jax.sharding.Mesh) -> Any:
    """`state` with every variable placed on `mesh` according to `LOGICAL_AXIS_RULES`."""
    return jax.device_put(state, state_shardings(state, mesh))


def batch_sharding(mesh: jax.sharding.Mesh, ndim: int) -> NamedSharding:
    """Sharding for a batch-major array of rank `ndim`: axis 0 over the batch axes, the rest replicated."""
    if ndim < 1:
        raise ValueError(f"a batch array needs at least one axis, got ndim={ndim}")
    return NamedSharding(mesh, logical_to_spec(("batch",) + (None,) * (ndim - 1), mesh=mesh))

"""Device mesh construction with the three named axes `data`, `fsdp`, `tensor`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np

MESH_AXES = ("data", "fsdp", "tensor")


def make_mesh(shape: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
    """A mesh over `devices` (default: all) with axes (data, fsdp, tensor) and Auto axis types.

    `shape` gives each axis size; missing axes are 1 and one axis may be -1 to
    take the remaining devices. Auto axes let jit-compiled code propagate
    shardings from its arguments (GSPMD), so model code needs no annotations.
    """
    unknown = sorted(set(shape) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"unknown mesh axes {unknown}; the mesh axes are {list(MESH_AXES)}")
    devices = list(jax.devices() if devices is None else devices)
    sizes = {axis: int(shape.get(axis, 1)) for axis in MESH_AXES}
    free = [axis for axis, size in sizes.items() if size == -1]
    if len(free) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {free} in {dict(shape)}")
    bad = {axis: size for axis, size in sizes.items() if size == 0 or size < -1}
    if bad:
        raise ValueError(f"mesh axis sizes must be positive or -1, got {bad}")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if len(devices) % fixed:
        raise ValueError(f"mesh shape {dict(shape)} (product {fixed}) does not divide the {len(devices)} devices")
    if free:
        sizes[free[0]] = len(devices) // fixed
    elif fixed != len(devices):
        raise ValueError(
            f"mesh shape {dict(shape)} uses {fixed} devices but {len(devices)} are available; "
            "use -1 on one axis to take the rest, or pass devices="
        )
    axis_shapes = tuple(sizes[axis] for axis in MESH_AXES)
    axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    try:
        mesh = jax.make_mesh(axis_shapes, MESH_AXES, axis_types=axis_types, devices=devices)
    except NotImplementedError:
        # A TPU slice whose physical axes the logical ones cannot be assembled from without
        # splitting one (e.g. fsdp 8 on a 4x4x4 v5p slice): split it rather than refuse the mesh.
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh(axis_shapes, devices, allow_split_physical_axes=True)
        mesh = jax.sharding.Mesh(grid, MESH_AXES, axis_types=axis_types)
    if all(len(owners) == 1 for owners in batch_slice_owners(mesh)):
        return mesh
    return _process_major_mesh(devices, axis_shapes, axis_types) or mesh


def batch_slice_owners(mesh: jax.sharding.Mesh) -> list[set[int]]:
    """For each batch slice of `mesh` (each (data, fsdp) index, in order), the processes holding its
    `tensor` devices. Every process feeds the rows of the slices it holds (`place_train_batch`), so a
    slice held by two processes would get two different sets of rows."""
    tensor_last = np.moveaxis(mesh.devices, mesh.axis_names.index("tensor"), -1)
    groups = tensor_last.reshape(-1, mesh.shape["tensor"])
    return [{device.process_index for device in group} for group in groups]


def require_whole_batch_slices(mesh: jax.sharding.Mesh, process_index: int, count: int) -> None:
    """A ValueError unless every batch slice of `mesh` lies on one process and process `process_index`
    holds `count` of them: each process builds the rows of its own slices."""
    owners = batch_slice_owners(mesh)
    shared = [i for i, held in enumerate(owners) if len(held) > 1]
    mine = sum(held == {process_index} for held in owners)
    if shared or mine != count:
        raise ValueError(f"the mesh {dict(mesh.shape)} gives process {process_index} {mine} whole batch slices "
                         f"(expected {count}) and splits slices {shared} between processes (owners: "
                         f"{[sorted(h) for h in owners]}); every (data, fsdp) slice must lie on one process: "
                         "build the mesh with aepo_jax.parallel.make_mesh")


def _process_major_mesh(devices: Sequence[jax.Device], axis_shapes: tuple[int, ...],
                        axis_types: tuple[jax.sharding.AxisType, ...]) -> jax.sharding.Mesh | None:
    """The mesh with each process's devices in a row, so that each holds whole batch slices, its
    `tensor` groups among its own devices; None when `tensor` does not divide a process's devices
    (then a batch slice must span processes).

    jax's own layout follows the physical torus: on a v5p-64 slice (2x4x4 chips, 2x2x1 per host) it
    lays `tensor` = 4 along a line of 4 chips on two hosts, so every batch slice would be split between
    two processes."""
    by_process: dict[int, list[jax.Device]] = {}
    for device in devices:
        by_process.setdefault(device.process_index, []).append(device)
    local = {len(group) for group in by_process.values()}
    if len(local) != 1 or local.pop() % axis_shapes[-1]:
        return None
    ordered = [d for p in sorted(by_process) for d in sorted(by_process[p], key=lambda d: d.id)]
    grid = np.array(ordered, dtype=object).reshape(axis_shapes)
    return jax.sharding.Mesh(grid, MESH_AXES, axis_types=axis_types)


def parse_mesh_shape(spec: str) -> dict[str, int]:
    """A mesh shape from "axis=size" pairs ("fsdp=8,tensor=4"; -1 takes the remaining devices)."""
    shape: dict[str, int] = {}
    for item in spec.split(","):
        name, sep, size = (part.strip() for part in item.partition("="))
        problem = ("expected axis=size pairs such as fsdp=8,tensor=4" if not sep or not size.lstrip("-").isdigit()
                   else f"the axes are {list(MESH_AXES)}" if name not in MESH_AXES
                   else "an axis is named twice" if name in shape else None)
        if problem:
            raise ValueError(f"mesh {spec!r}: {problem}, got {item!r}")
        shape[name] = int(size)
    return shape

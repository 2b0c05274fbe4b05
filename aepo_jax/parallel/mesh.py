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
    Devices follow jax's torus layout, rearranged where needed so that each
    process's batch slices are whole and one contiguous run
    (`process_contiguous_layout`).
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
    grid = process_contiguous_layout(_torus_layout(axis_shapes, devices))
    return jax.sharding.Mesh(grid, MESH_AXES, axis_types=axis_types)


def _torus_layout(axis_shapes: tuple[int, ...], devices: Sequence[jax.Device]) -> np.ndarray:
    """jax's layout of `devices` as a [data, fsdp, tensor] grid: on a TPU slice, each mesh axis along
    whole physical axes of the torus (neighbours over ICI), so collectives over an axis stay local."""
    try:
        return jax.make_mesh(axis_shapes, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES),
                             devices=devices).devices
    except NotImplementedError:
        # A TPU slice whose physical axes the logical ones cannot be assembled from without
        # splitting one (e.g. fsdp 8 on a 4x4x4 v5p slice): split it rather than refuse the mesh.
        from jax.experimental import mesh_utils

        return mesh_utils.create_device_mesh(axis_shapes, devices, allow_split_physical_axes=True)


def process_contiguous_layout(grid: np.ndarray) -> np.ndarray:
    """`grid` ([data, fsdp, tensor] devices) rearranged so that every process holds whole batch slices
    ((data, fsdp) entries) and its slices are one contiguous run of them.

    Each process builds the rows of its own slices and hands them over as one block
    (`place_train_batch`: `jax.make_array_from_process_local_data` and `first_local_index` need one
    contiguous run of the global rows). jax's torus layout gives neither on a multi-host TPU slice:
    on a v5p-64 (2x4x4 chips, 2x2x1 per host) it lays `tensor` = 4 along a line of 4 chips on two
    hosts (every slice split between two processes), and `data` = 32 along the torus with z fastest
    (process 0 holds slices 0, 4, 16 and 20).

    A grid that already has both properties comes back unchanged. When every slice lies on one
    process, only the order of the slices changes (a stable sort by process index): the `tensor`
    groups, the latency-bound ones, keep jax's placement, and each process's slices keep jax's order
    (the `data` and `fsdp` groups stay jax's where contiguity allows, e.g. data 4 x fsdp 8 on a
    v5p-64; where it does not, an fsdp group is whole hosts or part of one). When
    slices span processes, each process's devices are laid out in a row (by device id), its `tensor`
    groups among its own devices; when `tensor` does not divide each process's device count no
    layout can keep slices whole and `grid` comes back unchanged (`require_whole_batch_slices`
    refuses it for training).
    """
    slices = grid.reshape(-1, grid.shape[-1])  # [data * fsdp, tensor]
    owners = _slice_owners(slices)
    if all(len(held) == 1 for held in owners):
        if not _scattered_processes(owners):
            return grid
        order = sorted(range(len(slices)), key=lambda s: min(owners[s]))  # stable: keeps jax's order per process
        return slices[order].reshape(grid.shape)
    by_process: dict[int, list] = {}
    for device in grid.flat:
        by_process.setdefault(device.process_index, []).append(device)
    local = {len(group) for group in by_process.values()}
    if len(local) != 1 or local.pop() % grid.shape[-1]:
        return grid
    ordered = [d for p in sorted(by_process) for d in sorted(by_process[p], key=lambda d: d.id)]
    return np.array(ordered, dtype=object).reshape(grid.shape)


def _slice_owners(slices: np.ndarray) -> list[set[int]]:
    """For each row of `slices` ([batch slices, tensor] devices), the processes holding its devices."""
    return [{device.process_index for device in group} for group in slices]


def _scattered_processes(owners: list[set[int]]) -> dict[int, list[int]]:
    """The processes whose whole batch slices (`owners`, as `batch_slice_owners` gives) are not one
    contiguous run, each with the indices of its slices."""
    held: dict[int, list[int]] = {}
    for index, processes in enumerate(owners):
        if len(processes) == 1:
            held.setdefault(next(iter(processes)), []).append(index)
    return {p: run for p, run in held.items() if run[-1] - run[0] + 1 != len(run)}


def batch_slice_owners(mesh: jax.sharding.Mesh) -> list[set[int]]:
    """For each batch slice of `mesh` (each (data, fsdp) index, in order), the processes holding its
    `tensor` devices. Every process feeds the rows of the slices it holds (`place_train_batch`), so a
    slice held by two processes would get two different sets of rows."""
    tensor_last = np.moveaxis(mesh.devices, mesh.axis_names.index("tensor"), -1)
    return _slice_owners(tensor_last.reshape(-1, mesh.shape["tensor"]))


def require_whole_batch_slices(mesh: jax.sharding.Mesh, process_index: int, count: int) -> None:
    """A ValueError unless every batch slice of `mesh` lies on one process, each process's slices are
    one contiguous run, and process `process_index` holds `count` of them: each process builds the
    rows of its own slices and hands them over as one block."""
    owners = batch_slice_owners(mesh)
    shared = [i for i, held in enumerate(owners) if len(held) > 1]
    scattered = _scattered_processes(owners)
    mine = sum(held == {process_index} for held in owners)
    if shared or scattered or mine != count:
        raise ValueError(f"the mesh {dict(mesh.shape)} gives process {process_index} {mine} whole batch slices "
                         f"(expected {count}), splits slices {shared} between processes and scatters the "
                         f"slices of processes {sorted(scattered)} (owners: {[sorted(h) for h in owners]}); "
                         "every (data, fsdp) slice must lie on one process and each process's slices must be "
                         "one contiguous run: build the mesh with aepo_jax.parallel.make_mesh")


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

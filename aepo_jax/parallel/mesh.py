"""Device mesh construction with the three named axes `data`, `fsdp`, `tensor`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax

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
        return jax.make_mesh(axis_shapes, MESH_AXES, axis_types=axis_types, devices=devices)
    except NotImplementedError:
        # A TPU slice whose physical axes the logical ones cannot be assembled from without
        # splitting one (e.g. fsdp 8 on a 4x4x4 v5p slice): split it rather than refuse the mesh.
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh(axis_shapes, devices, allow_split_physical_axes=True)
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

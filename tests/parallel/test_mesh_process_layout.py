"""make_mesh on a multi-host TPU slice: every process's batch slices whole and one contiguous run.

No TPU here: fake chips carry what make_mesh reads (id, process_index, coords), numbered as libtpu numbers
a v5p slice (ids x-fastest; 2x2x1 chips per host), and `jax.make_mesh` is replaced by the order it gives
on such a slice. The orders were recorded from `jax.experimental.topologies` (libtpu 0.0.42.1, jax 0.10.2,
megacore v5p, "v5:2x4x4" and "v5:4x4x4"); each is a traversal of the torus, slowest axis first. On the
2x4x4 slice, `{"data": -1}` comes back as ids [0, 8, 16, 24, 2, 10, ...] (z fastest): process 0 held
slices 0, 4, 16 and 20, and training failed at its first step.
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import numpy as np
import pytest

from aepo_jax.parallel.mesh import (
    MESH_AXES,
    batch_slice_owners,
    make_mesh,
    require_whole_batch_slices,
)

X, Y, Z = 0, 1, 2  # coordinate indices


@dataclasses.dataclass(frozen=True)
class FakeChip:
    id: int
    process_index: int
    coords: tuple[int, int, int]


def v5p_slice(x: int, y: int, z: int) -> list[FakeChip]:
    """The chips of an x*y*z v5p slice (one device per chip), hosts of 2x2x1 chips numbered x, y, z."""
    hosts_x, hosts_y = x // 2, y // 2
    return [FakeChip(i, cx // 2 + hosts_x * (cy // 2) + hosts_x * hosts_y * cz, (cx, cy, cz))
            for i, (cz, cy, cx) in enumerate(itertools.product(range(z), range(y), range(x)))]


# (slice, mesh shape, jax.make_mesh's traversal of the torus for it: coordinate indices, slowest first)
TORUS_ORDERS = [
    ((2, 4, 4), {"data": -1}, (X, Y, Z)),
    ((2, 4, 4), {"fsdp": -1}, (X, Y, Z)),
    ((2, 4, 4), {"data": 4, "fsdp": 8}, (Z, X, Y)),
    ((2, 4, 4), {"data": 8, "fsdp": 4}, (X, Z, Y)),
    ((2, 4, 4), {"data": 16, "fsdp": 2}, (Y, Z, X)),
    ((2, 4, 4), {"data": 2, "fsdp": 16}, (X, Y, Z)),
    ((2, 4, 4), {"data": 4, "fsdp": 4, "tensor": 2}, (Z, Y, X)),
    ((2, 4, 4), {"fsdp": 8, "tensor": 4}, (X, Z, Y)),  # `tensor` on two hosts: rebuilt per process
    ((4, 4, 4), {"data": -1}, (X, Y, Z)),
    ((4, 4, 4), {"data": 4, "fsdp": 16}, (Z, X, Y)),
    ((4, 4, 4), {"data": 16, "fsdp": 4}, (Y, Z, X)),
    ((4, 4, 4), {"fsdp": 16, "tensor": 4}, (Y, Z, X)),
]


def torus_make_mesh(order: tuple[int, ...]):
    """A stand-in for `jax.make_mesh` that lays the chips out in the recorded traversal `order`."""

    def make(axis_shapes, axis_names, *, axis_types=None, devices=None):
        chips = sorted(devices, key=lambda chip: tuple(chip.coords[axis] for axis in order))
        return jax.sharding.Mesh(np.array(chips, dtype=object).reshape(axis_shapes), axis_names, axis_types=axis_types)

    return make


def groups_along(grid: np.ndarray, axis: str) -> set[frozenset[int]]:
    """The sets of device ids that a collective over mesh axis `axis` runs on."""
    moved = np.moveaxis(grid, MESH_AXES.index(axis), -1)
    return {frozenset(chip.id for chip in group) for group in moved.reshape(-1, moved.shape[-1])}


def case_name(chips: tuple[int, ...], shape: dict[str, int], order: tuple[int, ...]) -> str:
    return "v5:{}x{}x{}-".format(*chips) + ",".join(f"{axis}={size}" for axis, size in shape.items())


@pytest.mark.parametrize(("chips", "shape", "order"), TORUS_ORDERS, ids=[case_name(*case) for case in TORUS_ORDERS])
def test_each_process_holds_one_contiguous_run_of_whole_batch_slices_on_a_tpu_slice(monkeypatch, chips, shape, order):
    devices = v5p_slice(*chips)
    monkeypatch.setattr(jax, "make_mesh", torus_make_mesh(order))
    mesh = make_mesh(shape, devices=devices)

    processes = sorted({chip.process_index for chip in devices})
    per_process = len(devices) // len(processes) // mesh.shape["tensor"]
    assert [sorted(held) for held in batch_slice_owners(mesh)] == [[p] for p in processes for _ in range(per_process)]
    assert sorted(chip.id for chip in mesh.devices.flat) == [chip.id for chip in devices]
    for p in processes:
        require_whole_batch_slices(mesh, p, per_process)


def test_a_torus_layout_that_already_gives_contiguous_runs_is_kept(monkeypatch):
    devices = v5p_slice(2, 4, 4)
    monkeypatch.setattr(jax, "make_mesh", torus_make_mesh((Z, Y, X)))
    torus = jax.make_mesh((4, 4, 2), MESH_AXES, devices=devices).devices
    mesh = make_mesh({"data": 4, "fsdp": 4, "tensor": 2}, devices=devices)
    assert [[c.id for c in row] for row in mesh.devices.reshape(-1, 2)] == [[c.id for c in row] for row in
                                                                           torus.reshape(-1, 2)]


def test_reordering_keeps_the_torus_collective_groups_where_it_can(monkeypatch):
    """data 4 x fsdp 8 on 2x4x4: jax's fsdp groups are z-planes of two hosts each, its slices interleaved
    between the two; only the order inside each group changes."""
    devices = v5p_slice(2, 4, 4)
    monkeypatch.setattr(jax, "make_mesh", torus_make_mesh((Z, X, Y)))
    torus = jax.make_mesh((4, 8, 1), MESH_AXES, devices=devices).devices
    mesh = make_mesh({"data": 4, "fsdp": 8}, devices=devices)
    assert groups_along(mesh.devices, "fsdp") == groups_along(torus, "fsdp")
    assert groups_along(mesh.devices, "data") == groups_along(torus, "data")
    assert not (np.vectorize(lambda c: c.id)(mesh.devices) == np.vectorize(lambda c: c.id)(torus)).all()


def test_a_mesh_that_scatters_a_process_s_slices_is_refused_for_training(monkeypatch):
    devices = v5p_slice(2, 4, 4)
    monkeypatch.setattr(jax, "make_mesh", torus_make_mesh((X, Y, Z)))
    torus = jax.make_mesh((32, 1, 1), MESH_AXES, devices=devices, axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with pytest.raises(ValueError, match=r"scatters the slices of processes \[0, 1, 2, 3, 4, 5, 6, 7\]"):
        require_whole_batch_slices(torus, 0, 4)

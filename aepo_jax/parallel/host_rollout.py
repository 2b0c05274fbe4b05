"""Where rollouts run: on weight replicas, each host on its own devices.

An agent loop's device programs follow its own rows' tool calls and stops, which
differ from host to host. A sampler whose KV cache spanned every process would need
all hosts to launch the same programs in the same order, so each process instead
samples its own share of the prompts on a mesh of its own devices (its *rollout
mesh*: KV heads and weights over `tensor`, as in the run's mesh, rows over `data`).
Once per rollout the trainer's parameters, global arrays on the run's mesh, are
cast to the compute dtype on their shards and copied whole to every host by one
collective program that all processes run at the same point, on the main thread
(`HostRolloutPlacement.__call__`, called by the trainer through the rollout's
`place_params`).

The same replicas serve one process whose mesh splits the weights over `fsdp`:
sampling on those shards would gather every layer's weights again at every decoded
token (inside the decode loop), where a replica reads them from its own memory. A
one-process run can keep sampling on the run's mesh (`replicas=False`), for weights
too large to hold whole on a `tensor` group; with `fsdp == 1` it always does, and
the parameters pass through unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from aepo_jax.parallel.mesh import MESH_AXES, make_mesh
from aepo_jax.parallel.sharding import state_shardings

HOSTS_AXIS = "hosts"  # the leading axis of `hosts_mesh`: one entry per process
# `rollout.sampler_weights` -> `HostRolloutPlacement(replicas=...)`: which weights the rollout sampler reads.
SAMPLER_WEIGHTS = {"auto": None, "replicas": True, "run_mesh": False}


def host_mesh_shape(run_shape: Mapping[str, int], devices_per_host: int) -> dict[str, int]:
    """The rollout mesh of one host: the run's `tensor` size, rows over `data` on the rest."""
    tensor = int(run_shape.get("tensor", 1))
    if devices_per_host % tensor:
        raise ValueError(f"mesh tensor={tensor} does not divide the {devices_per_host} devices of each host: "
                         "each host samples its own rollouts with the weights split over tensor on its own "
                         "devices, so tensor must divide the devices per host")
    return {"data": devices_per_host // tensor, "fsdp": 1, "tensor": tensor}


def _devices_by_process(devices: Sequence[Any]) -> list[list[Any]]:
    groups: dict[int, list[Any]] = {}
    for device in devices:
        groups.setdefault(int(device.process_index), []).append(device)
    counts = {p: len(g) for p, g in groups.items()}
    if len(set(counts.values())) != 1:
        raise ValueError(f"processes hold different numbers of the mesh's devices: {counts}")
    return [sorted(groups[p], key=lambda d: d.id) for p in sorted(groups)]


def hosts_mesh(run_mesh: Mesh) -> Mesh:
    """The run mesh's devices as [hosts, data, fsdp, tensor]: entry p of `hosts` is the
    rollout mesh of the p-th process (in process-index order)."""
    groups = _devices_by_process(list(run_mesh.devices.flat))
    shape = host_mesh_shape(run_mesh.shape, len(groups[0]))
    grid = np.stack([make_mesh(shape, devices=group).devices for group in groups])
    return Mesh(grid, (HOSTS_AXIS, *MESH_AXES), axis_types=(jax.sharding.AxisType.Auto,) * (1 + len(MESH_AXES)))


def host_mesh(hosts: Mesh, process_index: int) -> Mesh:
    """The rollout mesh of process `process_index`: its entry of `hosts`."""
    for grid in hosts.devices:
        if int(grid.flat[0].process_index) == process_index:
            return Mesh(grid, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))
    raise ValueError(f"process {process_index} holds none of the mesh's devices")


def _local_part(x: jax.Array, sharding: NamedSharding) -> jax.Array:
    """This process's shards of `x` (a full copy per host) as one array on its rollout mesh."""
    shards = {shard.device: shard.data for shard in x.addressable_shards}
    devices = sharding.addressable_devices_indices_map(x.shape)
    return jax.make_array_from_single_device_arrays(x.shape, sharding, [shards[d] for d in devices])


def sampler_replicas(cfg: Any) -> bool | None:
    """`HostRolloutPlacement(replicas=...)` from `cfg.rollout.sampler_weights` (None: decide by the mesh)."""
    choice = str(cfg.rollout.get("sampler_weights", "auto"))
    if choice not in SAMPLER_WEIGHTS:
        raise ValueError(f"rollout.sampler_weights={choice!r}; expected one of {sorted(SAMPLER_WEIGHTS)}")
    return SAMPLER_WEIGHTS[choice]


def wants_replicas(run_mesh: Mesh | None, process_count: int) -> bool:
    """Whether rollouts need weight replicas by default: with several processes (they must), or when the
    run's mesh splits the weights over `fsdp` (the decode loop would gather them at every token)."""
    return run_mesh is not None and (process_count > 1 or int(run_mesh.shape.get("fsdp", 1)) > 1)


class HostRolloutPlacement:
    """The rollout sampler's mesh, and the step's parameters placed on it.

    `mesh`: this process's rollout mesh when sampling on replicas (`per_host`), else the
    run's mesh. Calling it with the trainer's parameters returns them on `mesh`; with several
    processes every process must call it at the same point of the run (it is one
    collective program).

    `replicas`: None decides by `wants_replicas`; False keeps one process on the run's
    mesh (refused with several processes); True makes replicas even where the run's mesh
    already holds whole weights per `tensor` group.
    """

    def __init__(self, run_mesh: Mesh | None, process_count: int | None = None,
                 process_index: int | None = None, dtype: Any = None, replicas: bool | None = None):
        process_count = jax.process_count() if process_count is None else int(process_count)
        process_index = jax.process_index() if process_index is None else int(process_index)
        if replicas is None:
            replicas = wants_replicas(run_mesh, process_count)
        if run_mesh is not None and process_count > 1 and not replicas:
            raise ValueError(f"rollouts over {process_count} processes sample on weight replicas, one per host "
                             "(each host's agent loop runs its own programs); sampling on the run's mesh "
                             "(rollout.sampler_weights='run_mesh') needs one process")
        self.run_mesh = run_mesh
        self.process_count = process_count
        # The copies' float dtype (None: the trainer's). The model casts every weight to its compute dtype
        # where it uses it, so a copy stored in that dtype samples exactly as the float32 weights do.
        self.dtype = None if dtype is None else jnp.dtype(dtype)
        self._casts: dict[Any, Any] = {}
        self.per_host = run_mesh is not None and bool(replicas)
        self.hosts = hosts_mesh(run_mesh) if self.per_host else None
        self.mesh = host_mesh(self.hosts, process_index) if self.per_host else run_mesh

    def _needs_cast(self, x: Any) -> bool:
        return self.dtype is not None and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != self.dtype

    def _on_mesh(self, state: Any) -> bool:
        """Whether `state` is already placed: every array on this process's rollout mesh, in `dtype`."""
        return all(isinstance(getattr(x, "sharding", None), NamedSharding) and x.sharding.mesh == self.mesh
                   and not self._needs_cast(x) for x in jax.tree.leaves(state))

    def _on_run_mesh(self, state: Any) -> Any:
        """`state` with every array on the run's mesh (weights loaded on one device, e.g. a GGUF policy:
        with one process moved device to device; with several put there from the host, where every
        process holds the same values)."""
        def place(x: Any, sharding: NamedSharding) -> Any:
            if isinstance(getattr(x, "sharding", None), NamedSharding) and x.sharding.mesh == self.run_mesh:
                return x
            if self.process_count == 1 and isinstance(x, jax.Array):
                return jax.device_put(x, sharding)
            return jax.device_put(np.asarray(x), sharding)

        return jax.tree.map(place, state, state_shardings(state, self.run_mesh))

    def cast_program(self, state: Any) -> Any:
        """The jitted cast of a tree like `state` to `dtype`, each array on its own shards."""
        structure = jax.tree.structure(state)
        if structure not in self._casts:
            def cast(tree: Any) -> Any:
                return jax.tree.map(lambda x: x.astype(self.dtype) if self._needs_cast(x) else x, tree)

            self._casts[structure] = jax.jit(cast)  # an elementwise cast keeps its input's sharding
        return self._casts[structure]

    def host_shardings(self, state: Any) -> Any:
        """Where the copy of a parameter tree like `state` lives: on `hosts_mesh`, whole on every host
        (each variable's spec on the rollout mesh names no `hosts` axis)."""
        if not self.per_host:
            raise ValueError("host_shardings needs a placement on replicas (per_host)")
        return state_shardings(state, self.hosts)

    def __call__(self, state: Any) -> Any:
        if not self.per_host or self._on_mesh(state):
            return state
        if self.process_count > 1 and threading.current_thread() is not threading.main_thread():
            raise RuntimeError("HostRolloutPlacement: the copy to every host is a program over all processes; "
                               "call it on the main thread, at the same point on every process (the trainer's "
                               "place_params), not from a background rollout")
        state = self._on_run_mesh(state)
        if any(self._needs_cast(x) for x in jax.tree.leaves(state)):
            state = self.cast_program(state)(state)  # on the run's shards first: fewer bytes to move
        # The run's mesh and `hosts_mesh` hold the same devices in different orders: device_put relabels the
        # input's shards to the target's device order and gathers in one jitted program on every process.
        copied = jax.device_put(state, self.host_shardings(state))
        return jax.tree.map(_local_part, copied, state_shardings(state, self.mesh))

"""Multi-host data plumbing for the trainer (DESIGN.md, Paper scale: multi-host).

Config sizes are global; every process handles its share (`local_share`),
builds its part of each batch with the shapes all processes agree on
(`global_max`), and reads back only its own rows of
a global result (`host_local`; `first_local_index` says where they start).
Host-side metrics are combined over processes by name (`gather_metrics`),
statistics of the whole batch are summed over the processes' parts
(`process_sum`, `process_sum_fields`), host-side results of any kind are
exchanged whole (`gather_objects`), and host-side randomness that should
differ between processes draws from a per-process stream (`process_rng`). With one process every function is
the identity or a plain numpy conversion, so the single-host path is unchanged.

Every exchange first waits for every process at the coordination service
(`wait_for_every_process`): hosts reach an exchange after rollouts, restores or
start-ups of different lengths, and the first CPU collective of a run would
fail when they arrive more than 30 s apart.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils

from aepo_jax.parallel.distributed import wait_for_every_process

Counts = TypeVar("Counts")


def local_share(global_count: int, process_count: int, what: str) -> int:
    """`global_count / process_count`, or a ValueError naming `what` when it does not divide."""
    if process_count < 1:
        raise ValueError(f"process_count must be >= 1, got {process_count}")
    if global_count % process_count:
        raise ValueError(f"{what}={global_count} is global and must be divisible by the {process_count} "
                         f"processes (each takes an equal share)")
    return global_count // process_count


def global_max(values: tuple[int, ...] | int) -> tuple[int, ...] | int:
    """Element-wise maximum of integers over all processes (the shape every process pads to)."""
    scalar = isinstance(values, (int, np.integer))
    local = np.asarray([values] if scalar else values, np.int64)
    if jax.process_count() > 1:
        wait_for_every_process("multihost.global_max")
        local = np.max(np.asarray(multihost_utils.process_allgather(local)), axis=0)
    out = tuple(int(v) for v in local)
    return out[0] if scalar else out


def host_local(x: jax.Array) -> np.ndarray:
    """This process's part of a global array (the rows it contributed), as numpy."""
    if x.is_fully_addressable:
        return np.asarray(x)
    sharding = x.sharding
    if not isinstance(sharding, jax.sharding.NamedSharding):
        raise TypeError(f"host_local needs a NamedSharding, got {type(sharding).__name__}")
    return np.asarray(multihost_utils.global_array_to_host_local_array(x, sharding.mesh, sharding.spec))


def first_local_index(x: jax.Array, axis: int, local_size: int) -> int:
    """Global index, along `axis`, of the first entry of `x` this process holds (0 with one process).

    `x` was made from this process's `local_size` entries along `axis` (`place_train_batch`); they
    must be one contiguous run of the global axis, which `parallel.make_mesh` meshes give."""
    spans = [(shard.index[axis].start or 0, x.shape[axis] if shard.index[axis].stop is None
              else shard.index[axis].stop) for shard in x.addressable_shards]
    start, stop = min(s for s, _ in spans), max(e for _, e in spans)
    if stop - start != local_size:
        raise ValueError(f"process {jax.process_index()}'s {local_size} entries along axis {axis} of a global "
                         f"{x.shape} array lie in [{start}, {stop}), not one contiguous run: build the mesh "
                         "with aepo_jax.parallel.make_mesh")
    return int(start)


def process_sum(values: Any) -> np.ndarray:
    """Element-wise float64 sum of a small vector over all processes, the same on every process (a
    collective: every process calls it at the same point). One process: `values` as float64.

    The statistics of a batch split over processes (token counts, sums) added up exactly: the
    float64 bytes are exchanged as such, since a device array would be float32 without x64."""
    local = np.ascontiguousarray(values, np.float64)
    if jax.process_count() == 1:
        return local
    wait_for_every_process("multihost.process_sum")
    parts = np.asarray(multihost_utils.process_allgather(local.reshape(-1).view(np.uint8)))  # [P, 8 * n]
    return np.ascontiguousarray(parts).view(np.float64).sum(axis=0).reshape(local.shape)


def gather_metrics(metrics: Mapping[str, float], sum_keys: Collection[str] = (),
                   weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """Combine one process's host-side metrics with every other's, by name (`merge_metrics`): sums for
    `sum_keys` (counts), means for the rest, weighted by `weights` (e.g. this process's token count
    for a token mean). Processes may report different names (e.g. `tool_fail_rate/<tool>` for the
    tools each called). A collective: every process calls it at the same point.

    A mean of per-process figures is the whole batch's only when they weigh alike; figures that are
    ratios of counts (failure rates, packing ratios) or spreads (a std) are not means of anything:
    combine their counts instead (`process_sum`, `process_sum_fields`, `gather_objects`)."""
    if jax.process_count() == 1:
        return dict(metrics)
    return merge_metrics(gather_objects((dict(metrics), dict(weights or {}))), sum_keys)


def merge_metrics(parts: Sequence[tuple[Mapping[str, float], Mapping[str, float]]],
                  sum_keys: Collection[str] = ()) -> dict[str, float]:
    """One dict from every process's `(metrics, weights)`, by name, sorted: the sum for a name in
    `sum_keys` (a process without it adds nothing), else the mean over the processes that report it,
    each weighing its weight for that name (1 where it gives none; equally where all weigh 0)."""
    out = {}
    for key in sorted({k for metrics, _ in parts for k in metrics}):
        values = np.asarray([m[key] for m, _ in parts if key in m], np.float64)  # [reporting processes]
        weight = np.asarray([w.get(key, 1.0) for m, w in parts if key in m], np.float64)
        if key in sum_keys:
            out[key] = float(values.sum())
        elif weight.sum() > 0:
            out[key] = float(np.sum(values * weight) / weight.sum())
        else:
            out[key] = float(values.mean())
    return out


def process_sum_fields(counts: Counts) -> Counts:
    """A dataclass of numbers (e.g. a tally of one step's work) with every field summed over all
    processes (`process_sum`, a collective), each field keeping its type. One process: `counts`."""
    if jax.process_count() == 1:
        return counts
    names = [f.name for f in dataclasses.fields(counts)]
    totals = process_sum([getattr(counts, name) for name in names])
    return dataclasses.replace(counts, **{name: type(getattr(counts, name))(total)
                                          for name, total in zip(names, totals, strict=True)})


def process_rng(*seed_words: int) -> np.random.Generator:
    """A numpy generator of `seed_words` for this process alone: with several processes the process
    index is one more seed word, so every process draws its own numbers (e.g. the rollout's branch
    decisions, which would otherwise be the same on every host). One process: `default_rng(seed_words)`,
    the stream a one-process run always drew."""
    words = [int(w) for w in seed_words]
    if jax.process_count() > 1:
        words.append(jax.process_index())
    return np.random.default_rng(words)


def first_process_value(value: int) -> int:
    """The first process's `value` on every process (a collective), e.g. the checkpoint step all must read."""
    if jax.process_count() == 1:
        return int(value)
    wait_for_every_process("multihost.first_process_value")
    return int(np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(value, np.int64))))


def share_bounds(count: int, part: int, parts: int) -> tuple[int, int]:
    """[start, stop) of part `part` when `count` items are split into `parts` contiguous runs whose
    sizes differ by at most one (the first `count % parts` runs take one more)."""
    if parts < 1 or not 0 <= part < parts:
        raise ValueError(f"part {part} of {parts} parts does not exist")
    size, extra = divmod(int(count), parts)
    start = part * size + min(part, extra)
    return start, start + size + (part < extra)


def gather_objects(obj: Any) -> list[Any]:
    """Every process's `obj` (picklable), in process order: the same list on every process.

    Every process must call it at the same point (it is a collective). With one process: `[obj]`.
    """
    if jax.process_count() == 1:
        return [obj]
    wait_for_every_process("multihost.gather_objects")
    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int64))).ravel()
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    everything = np.asarray(multihost_utils.process_allgather(padded))
    return [pickle.loads(everything[p, :int(size)].tobytes()) for p, size in enumerate(sizes)]

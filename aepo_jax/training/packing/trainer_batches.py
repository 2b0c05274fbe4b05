"""The batch builder: per-trajectory sequences -> one flat or tree-packed batch (`train.pack`).

The trainer keeps one step's trajectories as sequences (`rollout_batch.py`)
and calls `build_train_batch` once per mini-batch, for the scoring pass and
for the update alike; `make_train_step_for_pack` / `make_logprob_fn_for_pack`
give the jitted step and scorer for that layout (the same accumulating step
and `rl_loss_fn`, with the flat or the packed log-prob scorer), and
`per_sequence_values` brings scores back to input order.

- "flat": `[rows, T]` padded rows (`pad_sequences`), split into micro-batches
  of `micro_batch_size` rows inside the step; rows (axis 0) go over the
  data-parallel axes.
- "tree": the same sequences tree-packed with the flat `T` (rows of `row_len`
  slots, default `T`), so every `T`-dependent aggregation (Dr. GRPO's constant
  normaliser) is the flat one; micro-batches of whole groups are fixed here,
  every array has a leading `[M]` axis and its rows (axis 1) go over the
  data-parallel axes.

`place_train_batch` makes global device arrays from each process's part with
`jax.make_array_from_process_local_data` (one process: the whole batch); a
tree batch's `score_row` then indexes the global packed rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding

from aepo_jax.parallel.multihost import first_local_index, global_max
from aepo_jax.parallel.sharding import logical_to_spec
from aepo_jax.training.batch import pad_sequences
from aepo_jax.training.packing.buckets import pad_to_buckets, pad_tree_batch
from aepo_jax.training.packing.packed_batch import (
    PackingStats,
    build_packed_batch,
    unpack_flat,
)
from aepo_jax.training.packing.packed_scorer import packed_logprobs
from aepo_jax.training.train_step import (
    StepConfig,
    make_logprob_fn,
    make_rl_train_step,
    under_mesh,
)

PACK_MODES = ("tree", "flat")
DEFAULT_PACK = "tree"

# Per-token arrays a batch carries per trajectory (the step recomputes entropies itself).
SEQUENCE_KEYS = ("mask", "logp_old", "advantages", "logp_ref")


def check_pack_mode(pack: str) -> None:
    """Raise a ValueError naming the known modes if `pack` is not one of them."""
    if pack not in PACK_MODES:
        raise ValueError(f"unknown train.pack {pack!r}; choose from {PACK_MODES}")


def build_train_batch(
    sequences: Sequence[Mapping[str, Sequence]],
    pack: str = DEFAULT_PACK,
    *,
    group_ids: Sequence[int],
    length: int,
    rows: int | None = None,
    micro_batch_size: int = 1,
    data_parallel: int = 1,
    row_len: int | None = None,
    pad_id: int = 0,
    bucket: bool = True,
) -> tuple[dict[str, np.ndarray], PackingStats | None]:
    """One mini-batch in the `pack` layout (numpy arrays) and, for "tree", its packing statistics.

    Args:
      sequences: per trajectory `tokens`, `mask` and optional per-token `logp_old`,
        `advantages`, `logp_ref`, ... (`pad_sequences`).
      pack: "tree" or "flat".
      group_ids: the prompt group of each sequence (tree sharing stays inside a group).
      length: the flat `T` (every sequence must fit).
      rows: "flat": rows of the batch (all-padding rows fill it up; default: a
        multiple of `lcm(micro_batch_size, data_parallel)`), so every mini-batch
        of a step has one shape.
      micro_batch_size: trajectories per forward, as in `StepConfig`.
      data_parallel: devices the rows are split over.
      row_len: "tree": packed row length (default `length`).
      bucket: "tree": pad `M` and the rows up to `buckets.bucket_size`.
    """
    check_pack_mode(pack)
    if pack == "flat":
        multiple = rows or math.lcm(int(micro_batch_size), int(data_parallel))
        batch = pad_sequences(sequences, max_len=length, pad_id=pad_id, row_multiple=multiple,
                              length_multiple=length)
        if rows is not None and batch["input_ids"].shape[0] != rows:
            raise ValueError(f"mini-batch has {len(sequences)} sequences, more than the fixed {rows} rows")
        return batch, None
    return pack_mini_batch(sequences, group_ids, length, row_len=row_len, micro_batch_size=micro_batch_size,
                           data_parallel=data_parallel, pad_id=pad_id, bucket=bucket)


def pack_mini_batch(
    sequences: Sequence[Mapping[str, Sequence]],
    group_ids: Sequence[int],
    length: int,
    *,
    row_len: int | None = None,
    micro_batch_size: int = 1,
    data_parallel: int = 1,
    pad_id: int = 0,
    bucket: bool = True,
) -> tuple[dict[str, np.ndarray], PackingStats]:
    """Tree batch of one mini-batch: flat `T = length`, packed rows of `row_len` (default `T`).

    Micro-batches are sized like the flat step's: about
    `max(micro_batch_size, data_parallel) x T` packed slots per forward, i.e.
    the flat micro-batch's memory (`micro_batch_size` rows of `T`) and at least
    a row per device. So the count follows the packed slots, not the number
    of trajectories (several small trees share a micro-batch), and rows are
    padded only to a multiple of `data_parallel`: padding every micro-batch
    to `micro_batch_size` rows would add empty rows. A micro-batch holds whole
    groups, but a group whose tree is larger than one micro-batch is cut into
    parts that fit (`groups_that_fit`): whole, one group of 12 paper-length
    trajectories is about 10 rows of T on one device.

    `bucket` (default on): `M`, the packed rows and the flat rows are padded
    up to `buckets.bucket_size` (multiples of `data_parallel`) with empty
    rows and micro-batches that change neither loss nor gradients, so the
    jitted step compiles a few programs per run instead of one per step
    (`stats.bucket_slots` counts the added slots).
    """
    sequences = [{k: v for k, v in s.items() if k == "tokens" or k in SEQUENCE_KEYS} for s in sequences]
    rows_per_micro = max(int(micro_batch_size), int(data_parallel), 1)
    kwargs = {"max_len": length, "pad_id": pad_id, "row_multiple": data_parallel, "length_multiple": length}
    row_len = int(row_len) if row_len else length
    batch, stats = build_packed_batch(sequences, row_len, group_ids, micro_batches=1, **kwargs)
    budget = rows_per_micro * length
    cap = micro_batch_rows_cap(rows_per_micro, length, row_len, data_parallel)
    needed = -(-stats.packed_slots // budget)
    groups = list(group_ids)
    if needed > 1:
        groups = groups_that_fit([s["tokens"] for s in sequences], group_ids, budget)
        batch, stats = build_packed_batch(sequences, row_len, groups, micro_batches=min(needed, len(set(groups))),
                                          **kwargs)
    if np.shape(batch["packed_ids"])[1] > cap:
        batch, stats = _within_row_cap(sequences, row_len, groups, cap, batch, stats, kwargs)
    if bucket:
        batch, stats = pad_to_buckets(batch, stats, row_multiple=data_parallel, pad_id=pad_id)
    return batch, stats


def micro_batch_rows_cap(rows_per_micro: int, length: int, row_len: int, data_parallel: int) -> int:
    """The most packed rows a micro-batch of `pack_mini_batch` holds (before bucketing): the rows of
    `rows_per_micro x length` slots at `row_len` slots a row, rounded up to a multiple of `data_parallel`.
    The step's memory follows the rows per device (each a full forward and backward), so this is the shape
    a memory plan compiles (benchmarks/memory_plan.py). It always holds at one row per device (every cut
    part then fits a row); with more, a tree split over rows can need more (`_within_row_cap`)."""
    rows = max(1, -(-int(rows_per_micro) * int(length) // int(row_len)))
    return -(-rows // int(data_parallel)) * int(data_parallel)


def _within_row_cap(sequences: Sequence[Mapping[str, Sequence]], row_len: int, groups: list[int], cap: int,
                    batch: dict[str, np.ndarray], stats: PackingStats,
                    kwargs: dict) -> tuple[dict[str, np.ndarray], PackingStats]:
    """The tree batch in more micro-batches, so that none needs more than `cap` packed rows where that
    can be had.

    Bin packing whole groups (or cut parts of one) into the micro-batches can put more than a
    micro-batch's slots into one of them (two parts of one row each in a micro-batch of one row per
    device): micro-batches are added until the rows fit. Where even one group per micro-batch needs more
    rows than its distinct tokens fill (a tree laid out in several rows repeats the prefixes where it is
    split), the batch with the fewest rows is kept. With one row per micro-batch per device (the paper
    configs) every part fits one row, so the cap always holds.
    """
    count = len(set(groups))
    parts = np.shape(batch["packed_ids"])[0]
    best = (np.shape(batch["packed_ids"])[1], batch, stats)
    while parts < count:
        parts = min(count, max(parts + 1, -(-parts * best[0] // cap)))
        candidate, candidate_stats = build_packed_batch(sequences, row_len, groups, micro_batches=parts, **kwargs)
        rows = np.shape(candidate["packed_ids"])[1]
        if rows < best[0]:
            best = (rows, candidate, candidate_stats)
        if rows <= cap:
            break
    return best[1], best[2]


def groups_that_fit(tokens: Sequence[Sequence[int]], group_ids: Sequence[int], budget: int) -> list[int]:
    """Group ids under which no group's tree holds more than `budget` distinct tokens: a larger group is
    cut, in the lexicographic order of its sequences (neighbours share the longest prefixes), into
    consecutive parts of at most `budget` (a part repeats the prefix it shares with the part before; a
    sequence longer than `budget` is a part by itself). Smaller groups keep their ids."""
    out = [int(g) for g in group_ids]
    next_id = max(out) + 1
    members: dict[int, list[int]] = {}
    for i, g in enumerate(out):
        members.setdefault(g, []).append(i)
    for g, idx in members.items():
        if sum(len(tokens[i]) for i in idx) <= budget:
            continue
        part, used, previous = g, 0, None
        for i in sorted(idx, key=lambda j: list(tokens[j])):
            ids = np.asarray(tokens[i])
            new = len(ids) - (0 if previous is None else _common_prefix(previous, ids))
            if previous is not None and used + new > budget:
                part, used, new = next_id, 0, len(ids)
                next_id += 1
            out[i], used, previous = part, used + new, ids
    return out


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def agree_batch_shapes(batch: dict[str, np.ndarray], stats: PackingStats | None, pack: str,
                       pad_id: int = 0) -> tuple[dict[str, np.ndarray], PackingStats | None]:
    """Pad this process's tree batch to the largest `[M, R]` / `[M, B]` and row length `L` of any
    process, so the parts form one global array (`pad_tree_batch`: loss and gradients unchanged;
    `L` differs between processes when `train.row_len` exceeds `T`). Flat batches already agree
    (fixed rows, the step's global `T`); one process: unchanged."""
    if pack == "flat" or jax.process_count() == 1:
        return batch, stats
    m, rows, slots = np.shape(batch["packed_ids"])
    flat_rows = np.shape(batch["mask"])[1]
    target = global_max((m, rows, flat_rows, slots))
    if target == (m, rows, flat_rows, slots):
        return batch, stats
    *shape, target_slots = target
    return pad_tree_batch(batch, stats, *shape, pad_id=pad_id, slots=target_slots)


def make_train_step_for_pack(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    cfg: StepConfig,
    pack: str = DEFAULT_PACK,
    schedule: optax.Schedule | None = None,
    state_sharding: Any | None = None,
    batch_sharding: Any | None = None,
) -> Callable:
    """The jitted RL step for `build_train_batch(..., pack)` batches: one step, flat or packed scorer."""
    check_pack_mode(pack)
    return make_rl_train_step(graphdef, tx, cfg, schedule, state_sharding, batch_sharding,
                              logprobs=packed_logprobs if pack == "tree" else None)


def rows_sharding(pack: str, mesh: jax.sharding.Mesh) -> NamedSharding:
    """Rows over the batch (data, fsdp) axes, the rest replicated: axis 0 of flat `[rows, ...]`
    arrays, axis 1 of tree `[M, rows, ...]` ones (a prefix for a whole batch of them)."""
    check_pack_mode(pack)
    names = (None, "batch") if pack == "tree" else ("batch",)
    return NamedSharding(mesh, logical_to_spec(names, mesh=mesh))


def make_logprob_fn_for_pack(graphdef: nnx.GraphDef, cfg: StepConfig, pack: str = DEFAULT_PACK,
                             mesh: jax.sharding.Mesh | None = None) -> Callable:
    """Jitted `(params, batch) -> (logp, entropy)` in the batch's own layout, micro-batch by micro-batch.

    With `mesh` (batches from `place_train_batch(..., mesh)`), the scores come back with their rows
    over the batch axes like the batch's, so each process reads its own rows back (`host_local`);
    without it the compiler picks their sharding, and may replicate them on every process."""
    check_pack_mode(pack)
    scorer = make_logprob_fn(graphdef, cfg, logprobs=packed_logprobs if pack == "tree" else None)
    if mesh is None:
        return scorer
    rows = rows_sharding(pack, mesh)
    return under_mesh(jax.jit(scorer, out_shardings=(rows, rows)), rows)


def per_sequence_values(values: Any, batch: Mapping[str, np.ndarray], pack: str, num_sequences: int) -> np.ndarray:
    """Per-token values in the batch's layout -> `[num_sequences, T]` in input order.

    `values` must hold exactly the batch's rows (this process's, with several processes): a
    ValueError otherwise, rather than scores of another process's rows."""
    check_pack_mode(pack)
    rows = np.shape(batch["input_ids"])[:2 if pack == "tree" else 1]
    if np.shape(values)[:len(rows)] != rows:
        raise ValueError(f"{pack} scores of shape {np.shape(values)} for a batch of {rows} rows: a scorer's "
                         "output must have the batch's rows (make_logprob_fn_for_pack(..., mesh=))")
    if pack == "flat":
        return np.asarray(values)[:num_sequences]
    return unpack_flat(values, batch, num_sequences)


def train_batch_shardings(batch: Mapping[str, np.ndarray], pack: str,
                          mesh: jax.sharding.Mesh) -> dict[str, NamedSharding]:
    """`rows_sharding` for each array: axis 0 of flat arrays, axis 1 of tree `[M, rows, ...]` ones."""
    sharding = rows_sharding(pack, mesh)
    lead = 1 if pack == "tree" else 0
    for key, value in batch.items():
        if np.ndim(value) < lead + 1:
            raise ValueError(f"{pack} batch array {key!r} has shape {np.shape(value)}; "
                             f"expected {'[M, rows, ...]' if lead else '[rows, ...]'}")
    return {key: sharding for key in batch}


def place_train_batch(batch: Mapping[str, np.ndarray], pack: str, mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """This process's part of a batch -> global device arrays (`train_batch_shardings`).

    With several processes each passes its own rows (same shapes on every
    process); the global batch is their concatenation along the rows axis. A
    tree batch's `score_row` indexes this process's packed rows, so it is
    moved by the global index of the first of them: the packed scorer gathers
    from the global rows.
    """
    shardings = train_batch_shardings(batch, pack, mesh)
    placed = {key: jax.make_array_from_process_local_data(shardings[key], np.asarray(value))
              for key, value in batch.items() if key != "score_row"}
    if "score_row" in batch:
        first_row = first_local_index(placed["packed_ids"], axis=1, local_size=np.shape(batch["packed_ids"])[1])
        placed["score_row"] = jax.make_array_from_process_local_data(
            shardings["score_row"], np.asarray(batch["score_row"]) + np.int32(first_row))
    return {key: placed[key] for key in batch}


@dataclass
class PackingTally:
    """Tokens computed by the updates of one RL step versus the flat padded layout.

    `flat_tokens`: real tokens of the trained trajectories; `flat_slots`: the
    `[B, T]` slots the flat step computes; `computed_tokens` / `computed_slots`:
    what this step's layout computed (tree: unique prefix nodes plus ancestor
    copies / all `[M, R, L]` slots, compile-bucket padding included; flat: the
    same as the flat counts); `bucket_slots`: the part of `computed_slots`
    that is compile-bucket padding (`pad_to_buckets`).
    """

    flat_tokens: int = 0
    flat_slots: int = 0
    computed_tokens: int = 0
    computed_slots: int = 0
    unique_tokens: int = 0
    copied_tokens: int = 0
    packed_rows: int = 0
    bucket_slots: int = 0
    micro_batches: int = 0
    tree_batches: int = 0

    def add_flat(self, tokens: int, slots: int) -> None:
        self.flat_tokens += int(tokens)
        self.flat_slots += int(slots)
        self.computed_tokens += int(tokens)
        self.computed_slots += int(slots)

    def add_tree(self, stats: PackingStats, flat_slots: int, micro_batches: int) -> None:
        """One tree mini-batch of `micro_batches` parts; `flat_slots`: what the flat step computes for it."""
        self.flat_tokens += stats.flat_tokens
        self.flat_slots += int(flat_slots)
        self.computed_tokens += stats.packed_tokens
        self.computed_slots += stats.packed_slots
        self.unique_tokens += stats.unique_tokens
        self.copied_tokens += stats.copied_tokens
        self.packed_rows += stats.rows
        self.bucket_slots += stats.bucket_slots
        self.micro_batches += int(micro_batches)
        self.tree_batches += 1

    def metrics(self) -> dict[str, float]:
        """`pack/*` entries of the metrics line; the ratios are the compute saving (flat / computed)."""
        out = {
            "pack/flat_tokens": float(self.flat_tokens),
            "pack/flat_slots": float(self.flat_slots),
            "pack/computed_tokens": float(self.computed_tokens),
            "pack/computed_slots": float(self.computed_slots),
            "pack/token_ratio": self.flat_tokens / max(self.computed_tokens, 1),
            "pack/slot_ratio": self.flat_slots / max(self.computed_slots, 1),
        }
        if self.tree_batches:
            out.update({"pack/unique_tokens": float(self.unique_tokens),
                        "pack/copied_tokens": float(self.copied_tokens),
                        "pack/rows": float(self.packed_rows),
                        "pack/bucket_slots": float(self.bucket_slots),
                        "pack/micro_batches": float(self.micro_batches)})
        return out

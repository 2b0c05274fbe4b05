"""The RL trainer's update batches in the `train.pack` layout, and the packing counts it logs.

The trainer scores rollouts and computes advantages on flat padded rows
(`training/rollout_batch.py`), then updates on mini-batches of whole groups.
For `pack = "tree"` a mini-batch's flat rows become per-trajectory sequences
again (`rows_to_sequences`) and are tree-packed with the flat `T`
(`pack_mini_batch`: rows of `T` slots, `max_len = T`), so every
`T`-dependent aggregation (Dr. GRPO's constant normaliser) is the flat one.
A tree batch has a leading micro-batch axis `[M, ...]`; its rows (axis 1) go
over the data-parallel axes (`place_tree_batch`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import NamedSharding

from aepo_jax.parallel.sharding import logical_to_spec
from aepo_jax.training.packing.buckets import pad_to_buckets
from aepo_jax.training.packing.packed_batch import PackingStats, build_packed_batch

# Per-token arrays a tree batch carries per trajectory (the step recomputes entropies itself).
SEQUENCE_KEYS = ("mask", "logp_old", "advantages", "logp_ref")


def rows_to_sequences(batch: Mapping[str, np.ndarray], rows: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Flat right-padded rows -> one dict per row: `tokens` up to its `valid` length and the
    per-token `SEQUENCE_KEYS` present in `batch`, cut to the same length."""
    keys = [k for k in SEQUENCE_KEYS if k in batch]
    lengths = np.asarray(batch["valid"])[np.asarray(rows)].sum(axis=1)  # [n]
    sequences = []
    for row, n in zip(rows, lengths, strict=True):
        if n < 1:
            raise ValueError(f"row {int(row)} has no valid token; only real trajectories can be packed")
        sequence = {"tokens": np.asarray(batch["input_ids"][row, :n])}
        sequence.update({k: np.asarray(batch[k][row, :n]) for k in keys})
        sequences.append(sequence)
    return sequences


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

    Micro-batches (whole groups each) are sized like the flat step's: about
    `max(micro_batch_size, data_parallel) x T` packed slots per forward, i.e.
    the flat micro-batch's memory (`micro_batch_size` rows of `T`) and at least
    a row per device. So the count follows the packed slots, not the number
    of trajectories (several small trees share a micro-batch), and rows are
    padded only to a multiple of `data_parallel`: padding every micro-batch
    to `micro_batch_size` rows would add empty rows.

    `bucket` (default on): `M`, the packed rows and the flat rows are padded
    up to `buckets.bucket_size` (multiples of `data_parallel`) with empty
    rows and micro-batches that change neither loss nor gradients, so the
    jitted step compiles a few programs per run instead of one per step
    (`stats.bucket_slots` counts the added slots).
    """
    rows_per_micro = max(int(micro_batch_size), int(data_parallel), 1)
    kwargs = {"max_len": length, "pad_id": pad_id, "row_multiple": data_parallel, "length_multiple": length}
    row_len = int(row_len) if row_len else length
    batch, stats = build_packed_batch(sequences, row_len, group_ids, micro_batches=1, **kwargs)
    parts = min(-(-stats.packed_slots // (rows_per_micro * length)), len(set(group_ids)))
    if parts > 1:
        batch, stats = build_packed_batch(sequences, row_len, group_ids, micro_batches=parts, **kwargs)
    if bucket:
        batch, stats = pad_to_buckets(batch, stats, row_multiple=data_parallel, pad_id=pad_id)
    return batch, stats


def tree_batch_shardings(batch: Mapping[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, NamedSharding]:
    """`[M, rows, ...]` arrays: axis 1 over the batch (data, fsdp) axes, the micro-batch axis replicated."""
    out = {}
    for key, value in batch.items():
        if np.ndim(value) < 2:
            raise ValueError(f"tree batch array {key!r} has shape {np.shape(value)}; expected [M, rows, ...]")
        names = (None, "batch") + (None,) * (np.ndim(value) - 2)
        out[key] = NamedSharding(mesh, logical_to_spec(names, mesh=mesh))
    return out


def place_tree_batch(batch: Mapping[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """Host tree batch -> device arrays sharded by `tree_batch_shardings`."""
    return jax.device_put(dict(batch), tree_batch_shardings(batch, mesh))


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

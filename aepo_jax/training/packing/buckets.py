"""Round a tree batch's `[M, R]` and `[M, B]` up to a few compile buckets (docs/packing.md).

A tree batch's micro-batch count `M`, packed rows `R` and flat rows `B`
follow the data (tree shapes, FFD bin packing, group assignment), so an
unbucketed run hands the jitted step a new shape, hence a new compile, at
nearly every RL step. `pad_to_buckets` pads each to `bucket_size(n, multiple)`
with the padding of `empty_tree_batch`: padding slots attend only to
themselves (no empty softmax, no NaN), are never scored, and padding flat
rows and micro-batches have mask 0, so they add exactly 0 to the loss
numerator, the loss denominator (a sequence counts only with a valid token),
the gradient and the token-weighted metrics.

Buckets are `multiple x {1, 2, 3, 4, 6, 8, 12, 16, ...}` (powers of two and
1.5x powers of two): about two programs per doubling, and at most a third
of a batch's slots are padding (pure powers of two would waste up to half).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from aepo_jax.training.packing.packed_batch import PackingStats, empty_tree_batch

# Keys with the flat `[M, B, T]` layout whose dtype and pad value come from the batch itself.
_STRUCTURAL_KEYS = ("packed_ids", "packed_positions", "packed_subtree_end", "packed_next_ids",
                    "sequence_index", "scored", "score_row", "score_col")


def bucket_size(n: int, multiple: int = 1) -> int:
    """Smallest `multiple x b >= n` with `b` in `{1, 2, 3, 4, 6, 8, 12, ...}` (2^k or 3 x 2^k)."""
    if multiple < 1:
        raise ValueError(f"bucket multiple must be >= 1, got {multiple}")
    if n < 1:
        raise ValueError(f"bucket_size needs n >= 1, got {n}")
    units = -(-int(n) // int(multiple))
    power = 1
    while power < units:
        if power >= 2 and 3 * power // 2 >= units:
            return int(multiple) * (3 * power // 2)
        power *= 2
    return int(multiple) * power


def pad_to_buckets(
    batch: Mapping[str, np.ndarray],
    stats: PackingStats,
    row_multiple: int = 1,
    pad_id: int = 0,
) -> tuple[dict[str, np.ndarray], PackingStats]:
    """Pad `M`, `R` (to multiples of `row_multiple`) and `B` (likewise) up to `bucket_size`.

    `batch` is a `build_packed_batch` output; its real micro-batches, rows
    and slot values are copied unchanged into the leading corner of a larger
    `empty_tree_batch`, so loss and gradients are unchanged. `L` and `T` are
    kept (the caller buckets them). The returned stats count the added slots
    in `packed_slots`, `rows` and `bucket_slots`.
    """
    m, rows, _ = np.shape(batch["packed_ids"])
    flat_rows = np.shape(batch["mask"])[1]
    if rows % row_multiple or flat_rows % row_multiple:
        raise ValueError(f"batch rows ({rows} packed, {flat_rows} flat) are not multiples of "
                         f"row_multiple={row_multiple}; build it with the same row_multiple")
    return pad_tree_batch(batch, stats, bucket_size(m), bucket_size(rows, row_multiple),
                          bucket_size(flat_rows, row_multiple), pad_id)


def pad_tree_batch(
    batch: Mapping[str, np.ndarray],
    stats: PackingStats,
    micro_batches: int,
    rows: int,
    flat_rows: int,
    pad_id: int = 0,
    slots: int | None = None,
) -> tuple[dict[str, np.ndarray], PackingStats]:
    """Copy a tree batch into the leading corner of an `empty_tree_batch` of `[M, R]` /
    `[M, B]` = `(micro_batches, rows)` / `(micro_batches, flat_rows)` (each at least the batch's)
    and rows of `slots` (default: the batch's `L`). Added slots past a row's end attend only to
    themselves and are never scored, so the real slots' attention and scores are unchanged."""
    m, have_rows, have_slots = np.shape(batch["packed_ids"])
    have_flat, length = np.shape(batch["mask"])[1:]
    slots = have_slots if slots is None else int(slots)
    if micro_batches < m or rows < have_rows or flat_rows < have_flat or slots < have_slots:
        raise ValueError(f"cannot pad a tree batch of [M, R, B, L] = {[m, have_rows, have_flat, have_slots]} "
                         f"down to {[micro_batches, rows, flat_rows, slots]}")
    flat_dtypes = {k: np.asarray(v).dtype for k, v in batch.items() if k not in _STRUCTURAL_KEYS}
    out = empty_tree_batch(micro_batches, rows, slots, flat_rows, length, flat_dtypes, pad_id)
    for key, value in batch.items():
        value = np.asarray(value)
        out[key][tuple(slice(0, n) for n in value.shape)] = value
    added = micro_batches * rows * slots - m * have_rows * have_slots
    stats = dataclasses.replace(stats, packed_slots=stats.packed_slots + added, rows=micro_batches * rows,
                                row_len=slots, bucket_slots=stats.bucket_slots + added)
    return out, stats

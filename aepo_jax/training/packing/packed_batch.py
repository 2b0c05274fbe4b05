"""Tree-packed training batches: the flat per-token arrays plus packed rows and index maps.

The loss is computed in the flat `[B, T]` layout of `training.batch.pad_sequences`
(same `mask`, `logp_old`, `advantages`, `T`), so every objective and
aggregation is literally the flat one. Only the forward pass runs on packed
rows, where each shared prefix token appears once; `score_row/score_col` tell,
for every flat token, which packed slot's logits score it (its parent node's
slot), so the gather's gradient sums over the trajectories sharing a token.

Micro-batches: groups (never split) are assigned to `micro_batches` parts,
largest first to the lightest part; every array gets a leading `[M]` axis and
parts are padded to common shapes. Arrays (numpy):

- flat, `[M, B, T]`: `input_ids` (the scoring targets), `mask`, `logp_old`,
  `advantages` and, when every sequence has them, `entropy`, `logp_ref`;
  `scored` (1 where the token has a scoring slot: t >= 1 of a real token);
  `score_row`, `score_col` int32.
- packed, `[M, R, L]`: `packed_ids`, `packed_positions` (= depth),
  `packed_subtree_end` (the ancestor-mask intervals, `models.attention_mask.tree_mask`),
  `packed_next_ids` (the first child's token in the row, or 0).
- `sequence_index` int32 `[M, B]`: which input sequence each flat row holds, -1 for padding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from aepo_jax.training.batch import pad_sequences
from aepo_jax.training.packing.layout import layout_forest
from aepo_jax.training.packing.trie import build_prefix_forest


@dataclass(frozen=True)
class PackingStats:
    """Token counts of one packed batch versus its flat padded equivalent.

    `flat_tokens` are the real tokens of all sequences (what an unpadded flat
    forward computes), `flat_slots` the padded `[B, T]` slots, `packed_tokens`
    the occupied packed slots (unique trie nodes plus ancestor copies),
    `packed_slots` all `[R, L]` slots, `pieces` the row segments (trees or
    parts of split trees) that were bin-packed into `rows`. `bucket_slots`:
    the empty slots (`buckets.pad_to_buckets`: whole padding rows and
    micro-batches) added to round `[M, R]` up to a compile bucket; they are
    part of `packed_slots` and `rows`, since the step computes them.
    """

    flat_tokens: int
    flat_slots: int
    unique_tokens: int
    copied_tokens: int
    packed_tokens: int
    packed_slots: int
    rows: int
    row_len: int
    pieces: int
    bucket_slots: int = 0

    def as_dict(self) -> dict[str, float]:
        out = dict(self.__dict__)
        out["token_ratio"] = self.flat_tokens / max(self.packed_tokens, 1)
        out["slot_ratio"] = self.flat_slots / max(self.packed_slots, 1)
        return out


def _assign_groups(group_sizes: Mapping[int, int], parts: int) -> list[list[int]]:
    """Largest group first onto the part with the fewest tokens so far."""
    load = [0] * parts
    out: list[list[int]] = [[] for _ in range(parts)]
    for group in sorted(group_sizes, key=lambda g: -group_sizes[g]):
        part = int(np.argmin(load))
        out[part].append(group)
        load[part] += group_sizes[group]
    return out


def empty_tree_batch(
    micro_batches: int,
    rows: int,
    slots: int,
    flat_rows: int,
    length: int,
    flat_dtypes: Mapping[str, np.dtype],
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """A tree batch of `[M, R, L]` / `[M, B, T]` arrays holding only padding (module doc's keys).

    The one definition of a padding slot and a padding flat row: pad token,
    position 0, `subtree_end = slot + 1` (the slot attends only to itself, so
    its softmax is never empty), no first child; flat rows unscored with mask 0
    and `sequence_index = -1`. `build_packed_batch` fills real parts into it and
    `buckets.pad_to_buckets` copies a batch into a larger one, so both pad alike.
    `flat_dtypes`: dtype of each per-token flat key (`input_ids`, `mask`, ...).
    """
    m = micro_batches
    out: dict[str, np.ndarray] = {
        "packed_ids": np.full((m, rows, slots), pad_id, np.int32),
        "packed_positions": np.zeros((m, rows, slots), np.int32),
        "packed_subtree_end": np.broadcast_to(np.arange(1, slots + 1, dtype=np.int32), (m, rows, slots)).copy(),
        "packed_next_ids": np.zeros((m, rows, slots), np.int32),
        "sequence_index": np.full((m, flat_rows), -1, np.int32),
        "scored": np.zeros((m, flat_rows, length), np.float32),
        "score_row": np.zeros((m, flat_rows, length), np.int32),
        "score_col": np.zeros((m, flat_rows, length), np.int32),
    }
    for key, dtype in flat_dtypes.items():
        out[key] = np.full((m, flat_rows, length), pad_id if key == "input_ids" else 0, dtype)
    return out


def build_packed_batch(
    sequences: Sequence[Mapping[str, Sequence]],
    row_len: int,
    group_ids: Sequence[int] | None = None,
    max_len: int | None = None,
    pad_id: int = 0,
    row_multiple: int = 1,
    length_multiple: int = 8,
    micro_batches: int = 1,
) -> tuple[dict[str, np.ndarray], PackingStats]:
    """Build a tree-packed batch (module doc) from per-sequence token lists.

    Args:
      sequences: as for `pad_sequences`: `tokens`, `mask` and optional per-token
        `logp_old`, `advantages` (or a scalar), `entropy`, `logp_ref`.
      row_len: slots per packed row; every sequence must fit in one row.
      group_ids: sharing is allowed only within a group (one prompt's `k`
        trajectories); `None`: any sequences may share (one group).
      max_len: longest allowed sequence for the flat arrays (default `row_len`).
      pad_id: token id of padding slots.
      row_multiple: packed rows and flat rows of each micro-batch are padded
        to a multiple of this (data-parallel devices).
      length_multiple: `T` and `L` are rounded up to a multiple of this.
      micro_batches: number of micro-batches `M` (whole groups each).

    Returns:
      `(batch, stats)`.
    """
    if not sequences:
        raise ValueError("build_packed_batch needs at least one sequence")
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    groups = [0] * len(sequences) if group_ids is None else [int(g) for g in group_ids]
    if len(groups) != len(sequences):
        raise ValueError(f"group_ids has {len(groups)} entries for {len(sequences)} sequences")
    max_len = row_len if max_len is None else max_len
    token_lists = [[int(t) for t in s["tokens"]] for s in sequences]
    too_long = [i for i, ids in enumerate(token_lists) if len(ids) > row_len]
    if too_long:
        raise ValueError(f"sequences {too_long[:5]} are longer than row_len={row_len}")
    flat = pad_sequences(sequences, max_len=max_len, pad_id=pad_id, length_multiple=length_multiple)
    length = flat["input_ids"].shape[1]

    sizes: dict[int, int] = {}
    for g, ids in zip(groups, token_lists, strict=True):
        sizes[g] = sizes.get(g, 0) + len(ids)
    if micro_batches > len(sizes):
        raise ValueError(f"micro_batches={micro_batches} exceeds the number of groups ({len(sizes)})")
    parts = _assign_groups(sizes, micro_batches)
    members = [[i for i, g in enumerate(groups) if g in chosen] for chosen in map(set, parts)]
    forests = [build_prefix_forest([token_lists[i] for i in idx], [groups[i] for i in idx]) for idx in members]
    layouts = [layout_forest(f, row_len, row_multiple, length_multiple) for f in forests]

    rows = max(layout.num_rows for layout in layouts)
    slots = max(layout.row_len for layout in layouts)
    flat_rows = max(-(-len(idx) // row_multiple) * row_multiple for idx in members)
    m = micro_batches
    flat_keys = [k for k in flat if k not in ("positions", "valid")]
    out = empty_tree_batch(m, rows, slots, flat_rows, length, {k: flat[k].dtype for k in flat_keys}, pad_id)

    unique = copied = occupied = pieces = 0
    for part, (idx, forest, layout) in enumerate(zip(members, forests, layouts, strict=True)):
        r, c = layout.slot_node.shape
        real = layout.slot_node >= 0
        node = np.where(real, layout.slot_node, 0)  # [r, c]
        ids = np.where(real, forest.tokens[node], pad_id)
        out["packed_ids"][part, :r, :c] = ids
        out["packed_positions"][part, :r, :c] = np.where(real, forest.depth[node], 0)
        out["packed_subtree_end"][part, :r, :c] = layout.subtree_end
        # In preorder the slot after a node, if inside its subtree, is its first child.
        first_child = real[:, 1:] & (layout.subtree_end[:, :-1] > np.arange(1, c)[None, :])  # [r, c-1]
        out["packed_next_ids"][part, :r, :c - 1] = np.where(first_child, ids[:, 1:], 0)
        out["sequence_index"][part, :len(idx)] = idx
        for key in flat_keys:
            out[key][part, :len(idx)] = flat[key][idx]
        for b, path in enumerate(forest.paths):
            n = len(path)
            out["score_row"][part, b, 1:n] = layout.score_row[path[1:]]
            out["score_col"][part, b, 1:n] = layout.score_col[path[1:]]
            out["scored"][part, b, 1:n] = 1.0
        unique += forest.num_nodes
        copied += layout.copied_slots
        occupied += int(real.sum())
        pieces += layout.num_pieces
    stats = PackingStats(
        flat_tokens=int(sum(len(t) for t in token_lists)),
        flat_slots=int(flat["input_ids"].size),
        unique_tokens=unique,
        copied_tokens=copied,
        packed_tokens=occupied,
        packed_slots=int(m * rows * slots),
        rows=int(m * rows),
        row_len=int(slots),
        pieces=pieces,
    )
    return out, stats


def unpack_flat(values: np.ndarray, batch: Mapping[str, np.ndarray], num_sequences: int) -> np.ndarray:
    """`[M, B, T]` values in packed-batch order -> `[num_sequences, T]` in input order."""
    index = np.asarray(batch["sequence_index"]).reshape(-1)  # [M * B]
    values = np.asarray(values).reshape((index.shape[0],) + np.asarray(values).shape[2:])
    out = np.zeros((num_sequences,) + values.shape[1:], values.dtype)
    keep = index >= 0
    out[index[keep]] = values[keep]
    return out

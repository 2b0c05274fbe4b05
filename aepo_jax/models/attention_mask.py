"""Structured attention masks: what flash backends need instead of a dense `bool[B, T, S]`.

Every mask the project builds is one rule over key slots (query t sits at slot
`query_offset + t`; keys are slots `0..S-1`, cache slots when decoding):

    allowed(b, t, j) = (key_valid[b, j] and j <= q and q < subtree_end[b, j]) or j == q,
    q = query_offset + t.

- flat training rows (`causal_mask`, built by `training.train_step` from the
  batch's `valid`): causal over the row, padding keys hidden, `query_offset = 0`,
  no subtree ends;
- cached prefill / append / decode (`cached_mask`, built by
  `sampling.programs.forward_block`): `key_valid` = the cache's slot validity,
  `query_offset` = the first written slot;
- tree-packed rows (`tree_mask`, built by `training.packing.packed_scorer`): all
  slots valid and the ancestor rule `j <= i < subtree_end[j]`.

These builders are the only place each mask is made; the decoder carries the
`AttentionMask` through its scanned layers to `masked_attention`.

A query always sees its own slot, so no row is fully masked. `to_dense` gives
the `bool[B, T, S]` the dense path consumes (and the tests' reference); the
splash backend reads `key_valid` as segment ids and the tree kernel reads
`subtree_end` directly, so neither ever builds the `[T, S]` matrix.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class AttentionMask:
    """The mask rule of the module doc, as O(B * S) arrays.

    Attributes:
      key_valid: bool[B, S], True where the key slot holds a real token.
      query_offset: int32 scalar or int32[B] (one per row: the sampler's rows have their own
        write cursors), slot of query 0 (0 without a cache).
      subtree_end: int32[B, S] or None; key j is visible only to queries in
        `[j, subtree_end[j])` (tree-packed rows; padding slots have `j + 1`).
    """

    key_valid: jax.Array
    query_offset: jax.Array
    subtree_end: jax.Array | None = None

    @property
    def is_tree(self) -> bool:
        return self.subtree_end is not None

    def to_dense(self, n_queries: int) -> jax.Array:
        """bool[B, T, S] with T = n_queries, True where query t may attend key s."""
        n_keys = self.key_valid.shape[1]
        slots = jnp.arange(n_keys, dtype=jnp.int32)  # [S]
        offset = jnp.reshape(jnp.asarray(self.query_offset, jnp.int32), (-1, 1))  # [1 or B, 1]
        query_slots = (offset + jnp.arange(n_queries, dtype=jnp.int32))[:, :, None]  # [1 or B, T, 1]
        allowed = self.key_valid[:, None, :] & (slots[None, None, :] <= query_slots)  # [B, T, S]
        if self.subtree_end is not None:
            allowed = allowed & (query_slots < self.subtree_end[:, None, :])
        return allowed | (slots[None, None, :] == query_slots)


def causal_mask(valid: jax.Array) -> AttentionMask:
    """Causal self-attention over rows of `valid` (bool[B, T]: False = padding, anywhere in the row)."""
    valid = jnp.asarray(valid).astype(bool)
    if valid.ndim != 2:
        raise ValueError(f"valid must be bool[B, T], got shape {valid.shape}")
    return AttentionMask(key_valid=valid, query_offset=jnp.zeros((), jnp.int32))


def cached_mask(slot_valid: jax.Array, first_slot: jax.Array | int) -> AttentionMask:
    """Queries at slots `first_slot + t` of a cache whose valid slots are `slot_valid` (bool[B, S]).

    `first_slot` is a scalar (every row's block starts at the same slot) or int32[B]
    (ragged rows, each with its own cursor). `slot_valid` must already include the new
    block's slots (as `forward_block` does); S may be fewer than the cache's slots when
    attention reads only a leading span of them.
    """
    slot_valid = jnp.asarray(slot_valid).astype(bool)
    if slot_valid.ndim != 2:
        raise ValueError(f"slot_valid must be bool[B, S], got shape {slot_valid.shape}")
    return AttentionMask(key_valid=slot_valid, query_offset=jnp.asarray(first_slot, jnp.int32))


def tree_mask(subtree_end: jax.Array) -> AttentionMask:
    """Ancestor rule of tree-packed rows (`training.packing.layout`): int32[R, L] subtree ends."""
    subtree_end = jnp.asarray(subtree_end, jnp.int32)
    if subtree_end.ndim != 2:
        raise ValueError(f"subtree_end must be int32[R, L], got shape {subtree_end.shape}")
    return AttentionMask(key_valid=jnp.ones(subtree_end.shape, bool), query_offset=jnp.zeros((), jnp.int32),
                         subtree_end=subtree_end)

"""Ancestor attention mask of a tree-packed row, from per-slot subtree ends.

Each row segment lists its nodes in depth-first preorder (ancestor copies
first, see `layout.py`), so the slots of any node's subtree within the segment
form the interval `[slot, subtree_end[slot])`. Query slot `i` may attend key
slot `j` iff `j` is an ancestor-or-self of `i`, i.e. `j <= i < subtree_end[j]`.
The mask is built on device from `int32[R, L]`, so a row never ships an
`[L, L]` matrix from the host; a fused kernel can consume the same interval
form directly (docs/packing.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def ancestor_mask(subtree_end: jax.Array | np.ndarray) -> jax.Array | np.ndarray:
    """bool[R, L, L], True where query slot i may attend key slot j (j ancestor-or-self of i).

    Args:
      subtree_end: int32[R, L], one past the last slot of each slot's subtree
        within its segment; padding slots have `slot + 1` (they see only themselves).
        A numpy input gives a numpy result (host-side inspection, tests).
    """
    xp = np if isinstance(subtree_end, np.ndarray) else jnp
    if subtree_end.ndim != 2:
        raise ValueError(f"subtree_end must be [R, L], got shape {subtree_end.shape}")
    length = subtree_end.shape[1]
    query = xp.arange(length, dtype=xp.int32)[:, None]  # [L, 1]
    key = xp.arange(length, dtype=xp.int32)[None, :]  # [1, L]
    return (key <= query)[None] & (query[None] < subtree_end[:, None, :])  # [R, L, L]

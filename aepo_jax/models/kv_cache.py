"""Key/value cache for incremental decoding: `[L, B, S, KVH, Dh]` keys and values, stacked by layer, and a write index."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from aepo_jax.models.config import ModelConfig


@struct.dataclass
class KVCache:
    """Keys and values of every layer for S slots per row.

    The layer axis leads because the decoder scans its layers: the cache is
    the scan's carry, and layer i reads and writes `k[i]`. The decoder writes
    the T new tokens of a call into slots `[index, index + T)` of every row
    with `lax.dynamic_update_slice`, so with buffer donation under `jax.jit`
    the update happens in place. Which slots a query may see is decided by the
    caller's attention mask, not by `index`.
    """

    k: jax.Array  # [L, B, S, KVH, Dh]
    v: jax.Array  # [L, B, S, KVH, Dh]
    index: jax.Array  # int32 scalar: next slot to write

    @classmethod
    def init(cls, config: ModelConfig, batch: int, length: int, dtype: Any = jnp.float32) -> KVCache:
        """An empty (zero) cache of `length` slots for `batch` rows."""
        if batch <= 0 or length <= 0:
            raise ValueError(f"KVCache needs positive batch and length, got batch={batch}, length={length}")
        shape = (config.n_layers, batch, length, config.n_kv_heads, config.head_dim)
        return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), index=jnp.zeros((), jnp.int32))

    @property
    def n_layers(self) -> int:
        return self.k.shape[0]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def length(self) -> int:
        return self.k.shape[2]

    def map_layers(self, fn: Callable[[jax.Array], jax.Array]) -> KVCache:
        """`fn` applied to every layer's `[B, S, KVH, Dh]` keys and values (index kept)."""
        return self.replace(k=jax.vmap(fn)(self.k), v=jax.vmap(fn)(self.v))

    def take_rows(self, rows: jax.Array) -> KVCache:
        """A cache whose row i is a copy of row `rows[i]` (forking a branch); the index is kept."""
        rows = jnp.asarray(rows, jnp.int32)
        return self.replace(k=jnp.take(self.k, rows, axis=1), v=jnp.take(self.v, rows, axis=1))

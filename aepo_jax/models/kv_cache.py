"""Key/value cache for incremental decoding: one `[B, S, KVH, Dh]` buffer per layer and a shared write index."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from aepo_jax.models.config import ModelConfig


@struct.dataclass
class KVCache:
    """Keys and values of every layer for S slots per row.

    The decoder writes the T new tokens of a call into slots
    `[index, index + T)` of every row with `lax.dynamic_update_slice`, so with
    buffer donation under `jax.jit` the update happens in place. Which slots a
    query may see is decided by the caller's attention mask, not by `index`.
    """

    k: tuple[jax.Array, ...]  # per layer [B, S, KVH, Dh]
    v: tuple[jax.Array, ...]  # per layer [B, S, KVH, Dh]
    index: jax.Array  # int32 scalar: next slot to write

    @classmethod
    def init(cls, config: ModelConfig, batch: int, length: int, dtype: Any = jnp.float32) -> KVCache:
        """An empty (zero) cache of `length` slots for `batch` rows."""
        if batch <= 0 or length <= 0:
            raise ValueError(f"KVCache needs positive batch and length, got batch={batch}, length={length}")
        shape = (batch, length, config.n_kv_heads, config.head_dim)
        k = tuple(jnp.zeros(shape, dtype) for _ in range(config.n_layers))
        v = tuple(jnp.zeros(shape, dtype) for _ in range(config.n_layers))
        return cls(k=k, v=v, index=jnp.zeros((), jnp.int32))

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    @property
    def length(self) -> int:
        return self.k[0].shape[1]

    def take_rows(self, rows: jax.Array) -> KVCache:
        """A cache whose row i is a copy of row `rows[i]` (forking a branch); the index is kept."""
        rows = jnp.asarray(rows, jnp.int32)
        return self.replace(
            k=tuple(jnp.take(layer, rows, axis=0) for layer in self.k),
            v=tuple(jnp.take(layer, rows, axis=0) for layer in self.v),
        )

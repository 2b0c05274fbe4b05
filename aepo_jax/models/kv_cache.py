"""Key/value cache for incremental decoding: `[L, B, KVH, S, Dh]` keys and values, stacked by layer, and a write index.

Heads come before slots (head-major) so that attention over a cached row reads
each KV head's slots as one contiguous `[S, Dh]` matrix: a decode step's scores
are `B x KVH` small matmuls straight on the cache, with no transposed copy of it
(on CPU the copy cost more than the attention itself).
"""

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

    k: jax.Array  # [L, B, KVH, S, Dh]
    v: jax.Array  # [L, B, KVH, S, Dh]
    index: jax.Array  # int32 scalar: next slot to write

    @classmethod
    def init(cls, config: ModelConfig, batch: int, length: int, dtype: Any = jnp.float32) -> KVCache:
        """An empty (zero) cache of `length` slots for `batch` rows."""
        if batch <= 0 or length <= 0:
            raise ValueError(f"KVCache needs positive batch and length, got batch={batch}, length={length}")
        return cls.zeros(config.n_layers, batch, length, config.n_kv_heads, config.head_dim, dtype)

    @classmethod
    def zeros(cls, n_layers: int, batch: int, length: int, kv_heads: int, head_dim: int, dtype: Any) -> KVCache:
        """Zero keys and values in the cache's layout (the one place that orders its axes)."""
        shape = (n_layers, batch, kv_heads, length, head_dim)  # [L, B, KVH, S, Dh]
        return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), index=jnp.zeros((), jnp.int32))

    @property
    def n_layers(self) -> int:
        return self.k.shape[0]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def length(self) -> int:
        return self.k.shape[3]

    def map_layers(self, fn: Callable[[jax.Array], jax.Array]) -> KVCache:
        """`fn` applied to every layer's `[B, KVH, S, Dh]` keys and values (index kept)."""
        return self.replace(k=jax.vmap(fn)(self.k), v=jax.vmap(fn)(self.v))

    def take_rows(self, rows: jax.Array) -> KVCache:
        """A cache whose row i is a copy of row `rows[i]` (forking a branch); the index is kept."""
        rows = jnp.asarray(rows, jnp.int32)
        return self.replace(k=jnp.take(self.k, rows, axis=1), v=jnp.take(self.v, rows, axis=1))


@struct.dataclass
class LayerKV:
    """Keys and values as one `[B, KVH, S, Dh]` buffer per layer, not stacked.

    The sampler's decode windows run on it (`Decoder(..., layer_params=...)`,
    layers unrolled): a layer's step writes and reads its own buffer in place,
    where a stacked cache read inside a layer loop copies the layer's slots out
    on backends that cannot read a strided slice in place (XLA:CPU, XLA:GPU).
    """

    k: tuple[jax.Array, ...]  # n_layers x [B, KVH, S, Dh]
    v: tuple[jax.Array, ...]

    @property
    def n_layers(self) -> int:
        return len(self.k)

    @property
    def length(self) -> int:
        return self.k[0].shape[2]

    @property
    def index(self) -> jax.Array:
        return jnp.zeros((), jnp.int32)  # unused: ragged rows write at their own slots

    @classmethod
    def from_stacked(cls, cache: KVCache, span: int) -> LayerKV:
        """Copies of each layer's first `span` slots."""
        return cls(k=tuple(cache.k[i, :, :, :span] for i in range(cache.n_layers)),
                   v=tuple(cache.v[i, :, :, :span] for i in range(cache.n_layers)))

    def into_stacked(self, cache: KVCache) -> KVCache:
        """`cache` with each layer's first `length` slots replaced by this one's."""
        def put(stacked: jax.Array, layers: tuple[jax.Array, ...]) -> jax.Array:
            for i, layer in enumerate(layers):
                stacked = jax.lax.dynamic_update_slice(stacked, layer[None].astype(stacked.dtype), (i, 0, 0, 0, 0))
            return stacked

        return cache.replace(k=put(cache.k, self.k), v=put(cache.v, self.v))

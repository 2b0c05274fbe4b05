"""Where the sampler's decode arrays live on a mesh: rows over the batch axes, KV heads over `tensor`.

The KV cache `[L, B, KVH, S, Dh]` is the sampler's largest buffer (about
2.5 TiB at the 14B config's rollout batch). Its rows are split over the batch
mesh axes (`data` and `fsdp`, whichever the mesh has) and its KV heads over
`tensor`, through the same logical-axis rules as the parameters
(`aepo_jax.parallel.LOGICAL_AXIS_RULES`). The cache is created directly on its
shards (`jax.jit(..., out_shardings=...)`), and every sampler program pins its
output to the same layout, so no program ever holds a whole cache on one device.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from aepo_jax.models import KVCache
from aepo_jax.parallel import batch_sharding, named_sharding
from aepo_jax.sampling.state import DecodeArrays, RowMarks

# Logical axes of each decode array (names from `LOGICAL_AXIS_RULES`).
KV_AXES = ("layers", "batch", "kv_heads", "length", "head_dim")  # cache.k, cache.v: [L, B, KVH, S, Dh]
SLOT_AXES = ("batch", "length")  # slot_valid: [B, S]
ROW_AXES = ("batch",)  # next_position, cursor: [B]
LOGITS_AXES = ("batch", None)  # last_logits: [B, V]; sampling reads a row's whole vocabulary


@dataclasses.dataclass(frozen=True)
class DecodeSharding:
    """The layout of decode arrays on `mesh` (hashable: a static argument of the sampler's programs)."""

    mesh: Mesh

    @property
    def batch_devices(self) -> int:
        """Devices the rows are split over (data x fsdp); batch buckets are multiples of it."""
        return int(self.mesh.shape.get("data", 1) * self.mesh.shape.get("fsdp", 1))

    def of(self, arrays: DecodeArrays) -> DecodeArrays:
        """The NamedSharding of every leaf of `arrays` (arrays or ShapeDtypeStructs), same tree."""
        cache = arrays.cache
        return DecodeArrays(
            cache=cache.replace(k=named_sharding(KV_AXES, cache.k.shape, self.mesh),
                                v=named_sharding(KV_AXES, cache.v.shape, self.mesh),
                                index=named_sharding(None, (), self.mesh)),
            slot_valid=named_sharding(SLOT_AXES, arrays.slot_valid.shape, self.mesh),
            next_position=named_sharding(ROW_AXES, arrays.next_position.shape, self.mesh),
            last_logits=named_sharding(LOGITS_AXES, arrays.last_logits.shape, self.mesh),
            cursor=named_sharding(ROW_AXES, arrays.cursor.shape, self.mesh),
        )

    def of_marks(self, marks: RowMarks) -> RowMarks:
        """The NamedSharding of every leaf of `marks`: rows like the decode arrays' rows."""
        return RowMarks(next_position=named_sharding(ROW_AXES, marks.next_position.shape, self.mesh),
                        last_logits=named_sharding(LOGITS_AXES, marks.last_logits.shape, self.mesh),
                        cursor=named_sharding(ROW_AXES, marks.cursor.shape, self.mesh))

    def rows(self, ndim: int) -> NamedSharding:
        """Sharding of a batch-major program input (tokens, budgets, row keys)."""
        return batch_sharding(self.mesh, ndim)


def constrain(layout: DecodeSharding | None, arrays: DecodeArrays) -> DecodeArrays:
    """Inside a jitted program: pin `arrays` to the layout (no-op without a mesh)."""
    if layout is None:
        return arrays
    return jax.lax.with_sharding_constraint(arrays, layout.of(arrays))


def place_rows(layout: DecodeSharding | None, x: np.ndarray | jax.Array) -> np.ndarray | jax.Array:
    """Puts a batch-major host input on the mesh (rows over the batch axes)."""
    if layout is None:
        return x
    return jax.device_put(x, layout.rows(x.ndim))


def _empty_arrays(n_layers: int, batch: int, length: int, kv_heads: int, head_dim: int, vocab: int,
                  dtype: str) -> DecodeArrays:
    cache = KVCache.zeros(n_layers, batch, length, kv_heads, head_dim, dtype)
    return DecodeArrays(
        cache=cache,
        slot_valid=jnp.zeros((batch, length), bool),
        next_position=jnp.zeros((batch,), jnp.int32),
        last_logits=jnp.zeros((batch, vocab), jnp.float32),
        cursor=jnp.zeros((batch,), jnp.int32),
    )


@functools.lru_cache(maxsize=64)
def empty_program(layout: DecodeSharding | None, n_layers: int, batch: int, length: int, kv_heads: int,
                  head_dim: int, vocab: int, dtype: str):
    """A jitted, argument-free program creating empty decode arrays, born on their shards."""
    make = functools.partial(_empty_arrays, n_layers, batch, length, kv_heads, head_dim, vocab, dtype)
    shardings = None if layout is None else layout.of(jax.eval_shape(make))
    return jax.jit(make, out_shardings=shardings)

"""Reshaping decode arrays: more cache slots, picking rows, placing rows of one state into another.

These move whole rows or slots and never change what a row attends to:
keys are stored already rotated, so a token's slot number does not matter,
only `slot_valid` and the order of slots. A marked row (`mark_rows`) is taken
back as it was by invalidating the slots it wrote since (`take_marked_rows`).
On a mesh the cache's rows move one layer at a time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from aepo_jax.parallel import named_sharding
from aepo_jax.sampling.cache_sharding import KV_AXES, DecodeSharding
from aepo_jax.sampling.state import DecodeArrays, RowMarks


def _map_kv(cache, fn):
    return cache.map_layers(fn)  # fn sees one layer's [B, KVH, S, Dh]


def grow_slots(arrays: DecodeArrays, new_length: int) -> DecodeArrays:
    """Appends invalid slots so the cache has `new_length` slots (cursors unchanged)."""
    extra = new_length - arrays.slot_valid.shape[1]
    if extra < 0:
        raise ValueError(f"grow_slots cannot shrink the cache from {arrays.slot_valid.shape[1]} to {new_length}")

    def pad(x):  # [B, KVH, S, Dh] -> [B, KVH, S + extra, Dh]
        return jnp.pad(x, ((0, 0), (0, 0), (0, extra), (0, 0)))

    slot_valid = jnp.pad(arrays.slot_valid, ((0, 0), (0, extra)))  # [B, S + extra]
    return arrays.replace(cache=_map_kv(arrays.cache, pad), slot_valid=slot_valid)


def _take_layer_by_layer(x: jax.Array, rows: jax.Array, mesh, span: int | None = None) -> jax.Array:
    """[L, B, KVH, S, Dh] -> [L, len(rows), KVH, span, Dh]: the first `span` slots (None: all) of rows
    `rows`, taken one layer at a time (a loop, so only one layer's worth of rows crosses the mesh's
    batch shards at once)."""
    span = x.shape[3] if span is None else span
    shape = (x.shape[0], rows.shape[0], x.shape[2], span, x.shape[4])
    out = jax.lax.with_sharding_constraint(jnp.zeros(shape, x.dtype), named_sharding(KV_AXES, shape, mesh))

    def one_layer(layer, out):
        taken = jnp.take(jax.lax.dynamic_index_in_dim(x, layer, 0, keepdims=False), rows, axis=0)[:, :, :span]
        return jax.lax.dynamic_update_index_in_dim(out, taken, layer, 0)

    return jax.lax.fori_loop(0, x.shape[0], one_layer, out)


def _place_layer_by_layer(x: jax.Array, dst: jax.Array, y: jax.Array, src: jax.Array | None = None) -> jax.Array:
    """x with the first slots of rows dst[i] of every layer set to row src[i] of y (None: row i), as many
    slots as y has, one layer at a time (as above); dst entries past the batch are dropped."""
    span = y.shape[3]

    def one_layer(layer, x):
        rows = jax.lax.dynamic_index_in_dim(y, layer, 0, keepdims=False)
        rows = rows if src is None else jnp.take(rows, src, axis=0)
        placed = jax.lax.dynamic_index_in_dim(x, layer, 0, keepdims=False).at[dst, :, :span].set(rows, mode="drop")
        return jax.lax.dynamic_update_index_in_dim(x, placed, layer, 0)

    return jax.lax.fori_loop(0, x.shape[0], one_layer, x)


def take_rows(arrays: DecodeArrays, rows: jax.Array, layout: DecodeSharding | None = None) -> DecodeArrays:
    """New arrays whose row i is old row rows[i] (fork), each with its own cursor.

    On a mesh (`layout`) the cache's rows are taken one layer at a time: rows move between the batch
    shards, and taken all layers at once the TPU compiler plans temporaries of several whole caches
    (62.5 GiB per device for 128 of the 14B config's 1,024 rows on 32 chips, against 1.1 GiB layer by
    layer; docs/scaling.md)."""

    def take(x):  # [B, ...] -> [len(rows), ...]
        return jnp.take(x, rows, axis=0)

    if layout is None:
        cache = _map_kv(arrays.cache, take)
    else:
        cache = arrays.cache.replace(k=_take_layer_by_layer(arrays.cache.k, rows, layout.mesh),
                                     v=_take_layer_by_layer(arrays.cache.v, rows, layout.mesh))
    return DecodeArrays(
        cache=cache,
        slot_valid=take(arrays.slot_valid),
        next_position=take(arrays.next_position),
        last_logits=take(arrays.last_logits),
        cursor=take(arrays.cursor),
    )


def mark_rows(arrays: DecodeArrays, rows: jax.Array) -> RowMarks:
    """Rows `rows`' cursor, next position and next-token logits (what `take_marked_rows` restores)."""
    return RowMarks(next_position=jnp.take(arrays.next_position, rows, axis=0),
                    last_logits=jnp.take(arrays.last_logits, rows, axis=0), cursor=jnp.take(arrays.cursor, rows, axis=0))


def take_marked_rows(arrays: DecodeArrays, rows: jax.Array, marks: RowMarks, mark_index: jax.Array,
                     layout: DecodeSharding | None = None) -> DecodeArrays:
    """New arrays whose row i is old row rows[i] as it stood at mark mark_index[i]: its slots from the
    marked cursor on are invalid again (they hold what the row wrote since; later writes overwrite
    them), and its cursor, position and logits are the marked ones. The row must only have grown since."""
    taken = take_rows(arrays, rows, layout)
    cursor = jnp.take(marks.cursor, mark_index, axis=0)  # [M]
    slots = jnp.arange(taken.slot_valid.shape[1], dtype=jnp.int32)[None, :]  # [1, S]
    return taken.replace(slot_valid=taken.slot_valid & (slots < cursor[:, None]),
                         next_position=jnp.take(marks.next_position, mark_index, axis=0),
                         last_logits=jnp.take(marks.last_logits, mark_index, axis=0), cursor=cursor)


def place_rows(arrays: DecodeArrays, dst: jax.Array, source: DecodeArrays, src: jax.Array,
               layout: DecodeSharding | None = None) -> DecodeArrays:
    """Row dst[i] of `arrays` becomes a copy of row src[i] of `source` (same slot count), in place
    under donation; dst entries past the batch are dropped (padding). The other rows are untouched.
    (Concatenating states is placing them into an empty state of the bucketed batch: `Sampler.concat`.)
    On a mesh (`layout`) the cache's rows move one layer at a time (`take_rows`)."""

    def place(x, y):  # [B, ...] <- rows of [B', ...]
        return x.at[dst].set(jnp.take(y, src, axis=0), mode="drop")

    per_layer = jax.vmap(place) if layout is None else (  # over the leading layer axis of [L, B, KVH, S, Dh]
        lambda x, y: _place_layer_by_layer(x, dst, y, src))
    cache = arrays.cache.replace(k=per_layer(arrays.cache.k, source.cache.k),
                                 v=per_layer(arrays.cache.v, source.cache.v))
    return DecodeArrays(
        cache=cache,
        slot_valid=place(arrays.slot_valid, source.slot_valid),
        next_position=place(arrays.next_position, source.next_position),
        last_logits=place(arrays.last_logits, source.last_logits),
        cursor=place(arrays.cursor, source.cursor),
    )


def take_leading_rows(arrays: DecodeArrays, rows: jax.Array, span: int | None = None,
                      layout: DecodeSharding | None = None) -> DecodeArrays:
    """New arrays of `span` slots (None: all) whose row i is the first `span` slots of old row rows[i]:
    a block whose receiving rows end within `span` slots reads and writes nothing past them. On a mesh
    (`layout`) the cache moves one layer at a time (`take_rows`)."""
    if span is None or span >= arrays.slot_valid.shape[1]:
        # whole rows: the plain take ran as fast as the slice form on XLA:CPU, or faster
        return take_rows(arrays, rows, layout)
    if layout is None:
        cache = arrays.cache.replace(k=arrays.cache.k[:, rows, :, :span], v=arrays.cache.v[:, rows, :, :span])
    else:
        cache = arrays.cache.replace(k=_take_layer_by_layer(arrays.cache.k, rows, layout.mesh, span),
                                     v=_take_layer_by_layer(arrays.cache.v, rows, layout.mesh, span))
    return DecodeArrays(
        cache=cache,
        slot_valid=arrays.slot_valid[rows, :span],
        next_position=arrays.next_position[rows],
        last_logits=arrays.last_logits[rows],
        cursor=arrays.cursor[rows],
    )


def put_leading_rows(arrays: DecodeArrays, dst: jax.Array, sub: DecodeArrays,
                     layout: DecodeSharding | None = None) -> DecodeArrays:
    """`arrays` with the first slots of row dst[i] replaced by row i of `sub` (as many slots as it has), in
    place under donation; dst entries past the batch are dropped (padding). The inverse of `take_leading_rows`
    (on a mesh, one layer at a time as well)."""
    span = sub.slot_valid.shape[1]
    if span >= arrays.slot_valid.shape[1]:
        return place_rows(arrays, dst, sub, jnp.arange(sub.cursor.shape[0], dtype=jnp.int32), layout)
    if layout is None:
        cache = arrays.cache.replace(k=arrays.cache.k.at[:, dst, :, :span].set(sub.cache.k, mode="drop"),
                                     v=arrays.cache.v.at[:, dst, :, :span].set(sub.cache.v, mode="drop"))
    else:
        cache = arrays.cache.replace(k=_place_layer_by_layer(arrays.cache.k, dst, sub.cache.k),
                                     v=_place_layer_by_layer(arrays.cache.v, dst, sub.cache.v))
    return DecodeArrays(
        cache=cache,
        slot_valid=arrays.slot_valid.at[dst, :span].set(sub.slot_valid, mode="drop"),
        next_position=arrays.next_position.at[dst].set(sub.next_position, mode="drop"),
        last_logits=arrays.last_logits.at[dst].set(sub.last_logits, mode="drop"),
        cursor=arrays.cursor.at[dst].set(sub.cursor, mode="drop"),
    )

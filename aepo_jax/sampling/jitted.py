"""The Sampler's jitted programs: block forward (plain and scored), decode window and cache reshaping.

They are module-level so that every Sampler of the same model (same graphdef)
shares their compiled executables; the graphdef and the layout on the mesh
(`DecodeSharding`, None without a mesh) are static arguments, and every
program pins the decode arrays it returns to that layout. The arithmetic is in
`programs.py` and `layout.py`; `sampler.py` holds the host-side bookkeeping.
"""

from __future__ import annotations

import functools

import jax
from flax import nnx

from aepo_jax.models.decoder import split_layer_params
from aepo_jax.models.kv_cache import LayerKV
from aepo_jax.sampling.cache_sharding import constrain
from aepo_jax.sampling.layout import (
    grow_slots,
    mark_rows,
    put_leading_rows,
    take_leading_rows,
    take_marked_rows,
    take_rows,
)
from aepo_jax.sampling.layout import place_rows as place_source_rows
from aepo_jax.sampling.programs import (
    decode_loop,
    forward_block,
    scored_block,
    start_progress,
)


class HashedGraphDef:
    """A GraphDef as a static argument whose hash is computed once.

    jit hashes (and, on a hit, compares) its static arguments on every call; an nnx
    GraphDef hashes its whole module tree each time (about 80 us for a two-layer model,
    several times per generate). Two wrappers of equal GraphDefs are equal, so
    Samplers of the same model still share compiled programs.
    """

    __slots__ = ("_hash", "graphdef")

    def __init__(self, graphdef: nnx.GraphDef):
        self.graphdef = graphdef
        self._hash = hash(graphdef)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, HashedGraphDef) and self._hash == other._hash
                                 and self.graphdef == other.graphdef)


def _merge(graphdef: nnx.GraphDef | HashedGraphDef, params):
    return nnx.merge(graphdef.graphdef if isinstance(graphdef, HashedGraphDef) else graphdef, params)


def model_forward(graphdef: nnx.GraphDef | HashedGraphDef, params, tokens, positions, mask, cache, write_slots,
                  layer_params=None):
    """The model's cached forward for ragged rows as a pure function of its parameter state.

    Returns logits [B, 1, V] of the block's last position only: blocks are
    right-aligned, so that is every receiving row's last real token, and the
    [B, T, V] projection of the other positions would be thrown away.
    """
    model = _merge(graphdef, params)
    return model(tokens, positions=positions, attention_mask=mask, kv_cache=cache, last_logits_only=True,
                 cache_write_slots=write_slots, layer_params=layer_params)


def model_hidden(graphdef: nnx.GraphDef | HashedGraphDef, params, tokens, positions, mask, cache, write_slots):
    """The cached forward for ragged rows returning final hidden states [B, T, D], the LM head and the cache."""
    model = _merge(graphdef, params)
    hidden, cache = model(tokens, positions=positions, attention_mask=mask, kv_cache=cache, return_hidden=True,
                          cache_write_slots=write_slots)
    return hidden, model.head(), cache


@functools.partial(jax.jit, static_argnums=(0, 5, 6), donate_argnums=(2,))
def block_program(graphdef, params, arrays, tokens, token_valid, layout, span=None):
    arrays = forward_block(functools.partial(model_forward, graphdef), params, arrays, tokens, token_valid, span)
    return constrain(layout, arrays)


@functools.partial(jax.jit, static_argnums=(0, 5, 6, 7), donate_argnums=(2,))
def scored_block_program(graphdef, params, arrays, tokens, token_valid, layout, span, temperature):
    arrays, scores = scored_block(functools.partial(model_hidden, graphdef), params, arrays, tokens, token_valid,
                                  span, temperature)
    return constrain(layout, arrays), (scores.logp, scores.entropy)


def _on_rows(block, arrays, rows, dst, span, layout):
    """`block(sub_arrays) -> (sub_arrays, extra)` run on the first `span` slots (None: all) of rows `rows`
    of `arrays` only (the block reads all of the sub-arrays' slots); row i of the result goes back to row
    dst[i] (entries past the batch are padding, dropped)."""
    sub, extra = block(take_leading_rows(arrays, rows, span, layout))
    return put_leading_rows(arrays, dst, sub, layout), extra


@functools.partial(jax.jit, static_argnums=(0, 7, 8), donate_argnums=(2,))
def rows_block_program(graphdef, params, arrays, rows, dst, tokens, token_valid, layout, span=None):
    """`block_program` over the rows that receive tokens only (an append to a few rows of a large
    batch costs those rows' forward, not the batch's)."""
    forward = functools.partial(model_forward, graphdef)
    arrays, _ = _on_rows(lambda sub: (forward_block(forward, params, sub, tokens, token_valid), None),
                         arrays, rows, dst, span, layout)
    return constrain(layout, arrays)


@functools.partial(jax.jit, static_argnums=(0, 7, 8, 9), donate_argnums=(2,))
def rows_scored_block_program(graphdef, params, arrays, rows, dst, tokens, token_valid, layout, span, temperature):
    """`scored_block_program` over the rows that receive tokens only; scores are `[len(rows), T]`."""
    forward = functools.partial(model_hidden, graphdef)
    arrays, scores = _on_rows(
        lambda sub: scored_block(forward, params, sub, tokens, token_valid, None, temperature), arrays, rows, dst, span,
        layout)
    return constrain(layout, arrays), (scores.logp, scores.entropy)


_DECODE_STATICS = ("max_steps", "sampling", "pad_id", "num_top_logprobs", "layout", "span")


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=_DECODE_STATICS, donate_argnums=(2,))
def decode_program(graphdef, params, arrays, row_keys, budget, stop_table, progress, *, max_steps, sampling,
                   pad_id, num_top_logprobs=0, layout=None, span=None, layer_params=None):
    """One decode window. With `layer_params` (`split_layers_program(params, dtype)`) the window runs on
    those per-layer parameters and on per-layer copies of the cache's first `span` slots (`LayerKV`,
    made before its steps and written back after), the layers unrolled; otherwise every step scans
    the stacked layers and reads the span out of the stacked cache."""
    arrays, out, progress = _decode_window(graphdef, params, arrays, row_keys, budget, stop_table, progress,
                                           max_steps=max_steps, sampling=sampling, pad_id=pad_id,
                                           num_top_logprobs=num_top_logprobs, span=span, layer_params=layer_params)
    return constrain(layout, arrays), out, progress


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=_DECODE_STATICS, donate_argnums=(2,))
def rows_decode_program(graphdef, params, arrays, rows, dst, row_keys, budget, stop_table, progress, *, max_steps,
                        sampling, pad_id, num_top_logprobs=0, layout=None, span=None, layer_params=None):
    """`decode_program` over rows `rows` of `arrays` only (`row_keys`, `budget` and `progress` are theirs):
    their first `span` slots (None: all) are taken, decoded for one window and put back, row i into row
    dst[i] (entries past the batch are padding, dropped). A decode of at most half the batch so costs
    those rows' forward and a copy of their live span, not copies of their whole rows."""
    sub = take_leading_rows(arrays, rows, span, layout)
    sub, out, progress = _decode_window(graphdef, params, sub, row_keys, budget, stop_table, progress,
                                        max_steps=max_steps, sampling=sampling, pad_id=pad_id,
                                        num_top_logprobs=num_top_logprobs, span=None, layer_params=layer_params)
    return constrain(layout, put_leading_rows(arrays, dst, sub, layout)), out, progress


def _decode_window(graphdef, params, arrays, row_keys, budget, stop_table, progress, *, max_steps, sampling, pad_id,
                   num_top_logprobs, span, layer_params):
    """The body of `decode_program`: one window over every row of `arrays`."""
    loop = functools.partial(decode_loop, max_steps=max_steps, sampling=sampling, pad_id=pad_id,
                             num_top_logprobs=num_top_logprobs)
    if layer_params is None:
        return loop(functools.partial(model_forward, graphdef), params, arrays, row_keys, budget, stop_table,
                    progress, span=span)
    span = arrays.slot_valid.shape[1] if span is None else span
    window = arrays.replace(cache=LayerKV.from_stacked(arrays.cache, span), slot_valid=arrays.slot_valid[:, :span])
    forward = functools.partial(model_forward, graphdef, layer_params=layer_params)
    window, out, progress = loop(forward, params, window, row_keys, budget, stop_table, progress)
    arrays = window.replace(cache=window.cache.into_stacked(arrays.cache),
                            slot_valid=jax.lax.dynamic_update_slice(arrays.slot_valid, window.slot_valid, (0, 0)))
    return arrays, out, progress


@functools.partial(jax.jit, static_argnums=(1,))
def split_layers_program(params, dtype: str | None = None):
    return split_layer_params(params, dtype)


@jax.jit
def start_program(budget, stop_table):
    return start_progress(budget, stop_table)


@functools.partial(jax.jit, static_argnums=(1, 2))
def grow_program(arrays, new_length, layout):
    return constrain(layout, grow_slots(arrays, new_length))


@functools.partial(jax.jit, static_argnums=(2,))
def take_program(arrays, rows, layout):
    return constrain(layout, take_rows(arrays, rows, layout))


@functools.partial(jax.jit, static_argnums=(2,))
def mark_program(arrays, rows, layout):
    marks = mark_rows(arrays, rows)
    return marks if layout is None else jax.lax.with_sharding_constraint(marks, layout.of_marks(marks))


@functools.partial(jax.jit, static_argnums=(4,))
def fork_marked_program(arrays, rows, marks, mark_index, layout):
    return constrain(layout, take_marked_rows(arrays, rows, marks, mark_index, layout))


@functools.partial(jax.jit, static_argnums=(4,), donate_argnums=(0,))
def place_program(arrays, dst, source, src, layout):
    return constrain(layout, place_source_rows(arrays, dst, source, src, layout))


PROGRAMS = (split_layers_program, block_program, scored_block_program, rows_block_program,
            rows_scored_block_program, decode_program, rows_decode_program, grow_program, take_program, place_program,
            mark_program, fork_marked_program)


def sampler_programs() -> dict[str, object]:
    """The jitted block forward (prefill / append / repack chunks), decode loop and row copies, for
    ahead-of-time plans (`benchmarks/memory_plan.py`) that lower them on abstract arrays."""
    return {"block": block_program, "decode": decode_program, "rows_decode": rows_decode_program,
            "rows_block": rows_block_program, "place": place_program, "take": take_program}

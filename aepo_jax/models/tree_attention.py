"""Flash attention for tree-packed rows: the ancestor rule `j <= i < subtree_end[j]`, in Pallas.

A tree-packed row lists its nodes in depth-first preorder, so key j is visible
exactly to the queries of its subtree, the slot interval `[j, subtree_end[j])`
(`attention_mask.tree_mask`). Dense masked attention pays for every
`(i, j)` pair; most of them are masked once a row holds several branches or
several trees. This kernel tiles queries and keys into blocks, computes from
`subtree_end` alone which `(query block, key block)` tiles hold at least one
allowed pair (`tree_block_map`), and never loads or multiplies the others.

Algorithm (FlashAttention-2 style, fp32 softmax statistics):
- forward: one program per (row, kv head, group head, query block); it walks the
  key blocks `0 .. last causal block`, skipping unmarked tiles, keeping the
  running max `m`, normaliser `l` and accumulator `acc` of the online softmax;
  it writes the output and the log-sum-exp `lse = m + log l`;
- backward (custom VJP): `delta = rowsum(dO * O)`; one pass over query blocks
  recomputes `P = exp(S - lse)` per visited tile for `dQ`; one pass over key
  blocks works on transposed tiles `[bk, bq]` (so `lse` and `delta` stay
  lane-dense rows) and accumulates `dK`, `dV` in float32 over the visited query
  blocks and the group's query heads (the innermost grid axis). Both passes
  skip the same tiles as the forward.

Every query sees its own slot (`subtree_end[j] > j`), so no row is fully masked.
Rows are padded to a multiple of the block sizes with slots that see only
themselves. Runs compiled on TPU (Mosaic) only in principle: it is checked in
Pallas interpret mode on CPU (docs/attention.md says what was not exercised).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

NEG_INF = float(np.finfo(np.float32).min)  # finite floor: exp(NEG_INF - m) == 0 without inf - inf


def tree_block_map(subtree_end: jax.Array | np.ndarray, block_q: int, block_k: int) -> jax.Array | np.ndarray:
    """int32[B, nq, nk]: 1 where the tile (query block, key block) holds an allowed pair.

    Key j's visible queries are `[j, subtree_end[j])`; the tile of query slots
    `[qs, qe)` meets that interval iff `j < qe` and `subtree_end[j] > qs`.
    A numpy input gives a numpy result (the benchmark's host-side count).
    """
    xp = np if isinstance(subtree_end, np.ndarray) else jnp
    batch, length = subtree_end.shape
    if length % block_q or length % block_k:
        raise ValueError(f"row length {length} must be a multiple of block_q={block_q} and block_k={block_k}")
    nq, nk = length // block_q, length // block_k
    keys = xp.arange(length, dtype=xp.int32).reshape(nk, block_k)  # [nk, bk]
    ends = subtree_end.reshape(batch, nk, block_k)  # [B, nk, bk]
    q_start = (xp.arange(nq, dtype=xp.int32) * block_q)[:, None, None]  # [nq, 1, 1]
    q_end = q_start + block_q
    meets = (keys[None] < q_end) & (ends[:, None] > q_start[None])  # [B, nq, nk, bk]
    return meets.any(axis=-1).astype(xp.int32)


def block_skip_fraction(subtree_end: np.ndarray, block_q: int = 128, block_k: int = 128) -> dict[str, float]:
    """How much of the attention the kernel skips, from the same masks it uses.

    Returns:
      `skipped_of_all`: skipped tiles over all `B * nq * nk` tiles (what dense attention computes);
      `skipped_of_causal`: skipped tiles over the causal (lower-triangular) tiles a causal
      flash kernel would visit; `visited_tiles`, `causal_tiles`, `all_tiles`: the counts.
    """
    subtree_end = np.asarray(subtree_end, np.int32)
    length = subtree_end.shape[1]
    pad = -length % math.lcm(block_q, block_k)
    subtree_end = _pad_ends(subtree_end, pad, np)
    blocks = tree_block_map(subtree_end, block_q, block_k)  # [B, nq, nk]
    batch, nq, nk = blocks.shape
    q_last = np.arange(nq)[:, None] * block_q + block_q - 1
    causal = (np.arange(nk)[None, :] * block_k <= q_last).sum() * batch
    visited = int(blocks.sum())
    return {"skipped_of_all": 1.0 - visited / blocks.size, "skipped_of_causal": 1.0 - visited / causal,
            "visited_tiles": visited, "causal_tiles": int(causal), "all_tiles": int(blocks.size)}


def _pad_ends(subtree_end, pad: int, xp):
    """Appends `pad` slots that see only themselves (end = slot + 1)."""
    if not pad:
        return subtree_end
    batch, length = subtree_end.shape
    tail = xp.broadcast_to(xp.arange(length + 1, length + pad + 1, dtype=xp.int32), (batch, pad))
    return xp.concatenate([subtree_end.astype(xp.int32), tail], axis=1)


def _tile_mask(q_start, k_start, ends, block_q: int, block_k: int) -> jax.Array:
    """bool[bq, bk] ancestor rule inside one tile; `ends` int32[1, bk] are the keys' subtree ends."""
    q_slots = q_start + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
    k_slots = k_start + jax.lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
    return (k_slots <= q_slots) & (q_slots < ends)


def _dot_nt(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b.T in float32: [m, d] x [n, d] -> [m, n]."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


# Kernel refs (Mosaic-friendly: 2-D tiles, statistics as [bq, 1] columns):
#   blocks_ref int32[B, nq, nk] in SMEM (scalar prefetch); ends_ref int32[1, 1, L];
#   q/o/do blocks [1, 1, 1, bq, D]; lse/delta blocks float32[1, 1, 1, bq, 1]; k/v [1, 1, L, D].
# Loops run over every tile with a static trip count and `lax.cond` on the tile map
# (the map already excludes tiles above the diagonal).


def _forward_kernel(blocks_ref, ends_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, block_k: int, scale: float):
    b, qi = pl.program_id(0), pl.program_id(3)
    block_q = q_ref.shape[3]
    q_start = qi * block_q
    q = q_ref[0, 0, 0].astype(jnp.float32) * scale  # [bq, D]

    def visit(kb, carry):
        m, l, acc = carry
        k_start = pl.multiple_of(kb * block_k, block_k)
        k = k_ref[0, 0, pl.ds(k_start, block_k), :].astype(jnp.float32)  # [bk, D]
        v = v_ref[0, 0, pl.ds(k_start, block_k), :].astype(jnp.float32)  # [bk, D]
        allowed = _tile_mask(q_start, k_start, ends_ref[0, :, pl.ds(k_start, block_k)], block_q, block_k)
        s = jnp.where(allowed, _dot_nt(q, k), NEG_INF)  # [bq, bk]
        m_new = jnp.maximum(m, s.max(axis=1, keepdims=True))  # [bq, 1]
        p = jnp.where(allowed, jnp.exp(s - m_new), 0.0)  # [bq, bk]
        correction = jnp.exp(m - m_new)  # [bq, 1]
        return m_new, l * correction + p.sum(axis=1, keepdims=True), acc * correction + _dot(p, v)

    def body(kb, carry):
        return jax.lax.cond(blocks_ref[b, qi, kb] != 0, functools.partial(visit, kb), lambda c: c, carry)

    init = (jnp.full((block_q, 1), NEG_INF, jnp.float32), jnp.zeros((block_q, 1), jnp.float32),
            jnp.zeros(q.shape, jnp.float32))
    m, l, acc = jax.lax.fori_loop(0, blocks_ref.shape[2], body, init)
    l = jnp.where(l > 0, l, 1.0)
    o_ref[0, 0, 0] = (acc / l).astype(o_ref.dtype)
    lse_ref[0, 0, 0] = m + jnp.log(l)


def _dq_kernel(blocks_ref, ends_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *,
               block_k: int, scale: float):
    b, qi = pl.program_id(0), pl.program_id(3)
    block_q = q_ref.shape[3]
    q_start = qi * block_q
    q = q_ref[0, 0, 0].astype(jnp.float32) * scale  # [bq, D]
    do = do_ref[0, 0, 0].astype(jnp.float32)  # [bq, D]
    lse, delta = lse_ref[0, 0, 0], delta_ref[0, 0, 0]  # [bq, 1]

    def visit(kb, dq):
        k_start = pl.multiple_of(kb * block_k, block_k)
        k = k_ref[0, 0, pl.ds(k_start, block_k), :].astype(jnp.float32)
        v = v_ref[0, 0, pl.ds(k_start, block_k), :].astype(jnp.float32)
        allowed = _tile_mask(q_start, k_start, ends_ref[0, :, pl.ds(k_start, block_k)], block_q, block_k)
        p = jnp.where(allowed, jnp.exp(_dot_nt(q, k) - lse), 0.0)  # [bq, bk]
        ds = p * (_dot_nt(do, v) - delta)  # [bq, bk]
        return dq + _dot(ds, k)

    def body(kb, dq):
        return jax.lax.cond(blocks_ref[b, qi, kb] != 0, functools.partial(visit, kb), lambda c: c, dq)

    dq = jax.lax.fori_loop(0, blocks_ref.shape[2], body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[0, 0, 0] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(blocks_ref, ends_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *,
                block_q: int, scale: float):
    # Transposed tiles [bk, bq], so the statistics are lane-dense rows and nothing is transposed:
    # q_ref, do_ref [1, 1, 1, L, D] (one group head); lse_ref, delta_ref [1, 1, 1, 1, L];
    # ends_ref int32[1, bk, 1] (a column); k/v blocks [1, 1, bk, D]; dk/dv float32 [1, 1, bk, D],
    # accumulated over the group heads (the innermost grid axis).
    block_k = k_ref.shape[2]
    b, kb, g = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    k_start = kb * block_k
    k = k_ref[0, 0].astype(jnp.float32)  # [bk, D]
    v = v_ref[0, 0].astype(jnp.float32)  # [bk, D]
    ends = ends_ref[0]  # [bk, 1]

    def visit(qb, carry):
        dk, dv = carry
        q_start = pl.multiple_of(qb * block_q, block_q)
        q = q_ref[0, 0, 0, pl.ds(q_start, block_q), :].astype(jnp.float32) * scale  # [bq, D]
        do = do_ref[0, 0, 0, pl.ds(q_start, block_q), :].astype(jnp.float32)  # [bq, D]
        lse = lse_ref[0, 0, 0, :, pl.ds(q_start, block_q)]  # [1, bq]
        delta = delta_ref[0, 0, 0, :, pl.ds(q_start, block_q)]  # [1, bq]
        k_slots = k_start + jax.lax.broadcasted_iota(jnp.int32, (block_k, block_q), 0)
        q_slots = q_start + jax.lax.broadcasted_iota(jnp.int32, (block_k, block_q), 1)
        allowed = (k_slots <= q_slots) & (q_slots < ends)  # [bk, bq]
        p = jnp.where(allowed, jnp.exp(_dot_nt(k, q) - lse), 0.0)  # P^T [bk, bq]
        ds = p * (_dot_nt(v, do) - delta)  # dS^T [bk, bq]
        return dk + _dot(ds, q), dv + _dot(p, do)

    def body(qb, carry):
        return jax.lax.cond(blocks_ref[b, qb, kb] != 0, functools.partial(visit, qb), lambda c: c, carry)

    @pl.when(g == 0)
    def _():
        dk_ref[...] = jnp.zeros(dk_ref.shape, dk_ref.dtype)
        dv_ref[...] = jnp.zeros(dv_ref.shape, dv_ref.dtype)

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(0, blocks_ref.shape[1], body, (zeros, zeros))
    dk_ref[0, 0] += dk  # q was pre-scaled, so dK = dS^T (scale Q)
    dv_ref[0, 0] += dv


def _grid_spec(grid, in_specs, out_specs):
    """Tile map as scalar prefetch (SMEM on TPU): every index map gets it as a trailing argument."""
    return pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=grid, in_specs=in_specs, out_specs=out_specs)


def _forward(q, k, v, ends, blocks, block_q, block_k, interpret):
    """q [B, KVH, G, L, D], k/v [B, KVH, L, D], ends [B, 1, L] -> out like q, lse float32[B, KVH, G, L, 1]."""
    batch, kv_heads, groups, length, head_dim = q.shape
    kernel = functools.partial(_forward_kernel, block_k=block_k, scale=1.0 / math.sqrt(head_dim))
    row_q = pl.BlockSpec((1, 1, 1, block_q, head_dim), lambda b, h, g, i, _: (b, h, g, i, 0))
    row_stat = pl.BlockSpec((1, 1, 1, block_q, 1), lambda b, h, g, i, _: (b, h, g, i, 0))
    full_kv = pl.BlockSpec((1, 1, length, head_dim), lambda b, h, g, i, _: (b, h, 0, 0))
    row_ends = pl.BlockSpec((1, 1, length), lambda b, h, g, i, _: (b, 0, 0))
    return pl.pallas_call(
        kernel,
        grid_spec=_grid_spec((batch, kv_heads, groups, length // block_q), [row_ends, row_q, full_kv, full_kv],
                             [row_q, row_stat]),
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((*q.shape[:-1], 1), jnp.float32)],
        interpret=interpret,
        name="tree_attention_forward",
    )(blocks, ends, q, k, v)


def _backward(q, k, v, ends, blocks, out, lse, d_out, block_q, block_k, interpret):
    batch, kv_heads, groups, length, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim)
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [B, KVH, G, L]
    row_q = pl.BlockSpec((1, 1, 1, block_q, head_dim), lambda b, h, g, i, _: (b, h, g, i, 0))
    row_stat = pl.BlockSpec((1, 1, 1, block_q, 1), lambda b, h, g, i, _: (b, h, g, i, 0))
    full_kv = pl.BlockSpec((1, 1, length, head_dim), lambda b, h, g, i, _: (b, h, 0, 0))
    row_ends = pl.BlockSpec((1, 1, length), lambda b, h, g, i, _: (b, 0, 0))
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, block_k=block_k, scale=scale),
        grid_spec=_grid_spec((batch, kv_heads, groups, length // block_q),
                             [row_ends, row_q, full_kv, full_kv, row_q, row_stat, row_stat], row_q),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=interpret,
        name="tree_attention_dq",
    )(blocks, ends, q, k, v, d_out, lse[..., None], delta[..., None])  # statistics as [bq, 1] columns
    one_q = pl.BlockSpec((1, 1, 1, length, head_dim), lambda b, h, j, g, _: (b, h, g, 0, 0))
    one_stat = pl.BlockSpec((1, 1, 1, 1, length), lambda b, h, j, g, _: (b, h, g, 0, 0))
    kv_block = pl.BlockSpec((1, 1, block_k, head_dim), lambda b, h, j, g, _: (b, h, j, 0))
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, block_q=block_q, scale=scale),
        grid_spec=_grid_spec((batch, kv_heads, length // block_k, groups),
                             [pl.BlockSpec((1, block_k, 1), lambda b, h, j, g, _: (b, j, 0)),
                              one_q, kv_block, kv_block, one_q, one_stat, one_stat], [kv_block, kv_block]),
        out_shape=[jax.ShapeDtypeStruct(k.shape, jnp.float32), jax.ShapeDtypeStruct(v.shape, jnp.float32)],
        interpret=interpret,
        name="tree_attention_dkv",
    )(blocks, ends.transpose(0, 2, 1), q, k, v, d_out, lse[:, :, :, None, :], delta[:, :, :, None, :])
    return dq, dk.astype(k.dtype), dv.astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _tree_attention_grouped(q, k, v, ends, block_q, block_k, interpret):
    blocks = tree_block_map(ends[:, 0], block_q, block_k)
    return _forward(q, k, v, ends, blocks, block_q, block_k, interpret)[0]


def _tree_attention_fwd(q, k, v, ends, block_q, block_k, interpret):
    blocks = tree_block_map(ends[:, 0], block_q, block_k)
    out, lse = _forward(q, k, v, ends, blocks, block_q, block_k, interpret)
    return out, (q, k, v, ends, blocks, out, lse[..., 0])  # keep lse lane-dense: float32[B, KVH, G, L]


def _tree_attention_bwd(block_q, block_k, interpret, residuals, d_out):
    q, k, v, ends, blocks, out, lse = residuals
    dq, dk, dv = _backward(q, k, v, ends, blocks, out, lse, d_out, block_q, block_k, interpret)
    return dq, dk, dv, None


_tree_attention_grouped.defvjp(_tree_attention_fwd, _tree_attention_bwd)


def tree_attention(q: jax.Array, k: jax.Array, v: jax.Array, subtree_end: jax.Array, *, block_q: int = 128,
                   block_k: int = 128, interpret: bool = False) -> jax.Array:
    """Attention of tree-packed rows under the ancestor rule, skipping fully masked tiles.

    Args:
      q: [B, L, H, Dh] queries; k, v: [B, L, KVH, Dh] keys and values of the same slots.
      subtree_end: int32[B, L], one past the last slot of each slot's subtree.
      block_q, block_k: tile sizes (rows are padded to a multiple of both).
      interpret: run the Pallas kernels in interpret mode (CPU, tests).

    Returns:
      [B, L, H, Dh], equal to `masked_attention(q, k, v, tree_mask(subtree_end))`.
    """
    batch, length, n_heads, head_dim = q.shape
    n_kv_heads = k.shape[2]
    if k.shape[:2] != (batch, length) or v.shape != k.shape or n_heads % n_kv_heads:
        raise ValueError(f"tree attention needs q [B, L, H, Dh] and k, v [B, L, KVH, Dh] with H a multiple of "
                         f"KVH over the same L slots; got q {q.shape}, k {k.shape}, v {v.shape}")
    if subtree_end.shape != (batch, length):
        raise ValueError(f"subtree_end must be int32[B, L] = {(batch, length)}, got {subtree_end.shape}")
    pad = -length % math.lcm(block_q, block_k)
    ends = _pad_ends(jnp.asarray(subtree_end, jnp.int32), pad, jnp)  # [B, Lp]
    widths = ((0, 0), (0, pad), (0, 0), (0, 0))
    q, k, v = (jnp.pad(x, widths) for x in (q, k, v))
    groups = n_heads // n_kv_heads
    qg = q.reshape(batch, length + pad, n_kv_heads, groups, head_dim).transpose(0, 2, 3, 1, 4)  # [B, KVH, G, Lp, Dh]
    kg, vg = (x.transpose(0, 2, 1, 3) for x in (k, v))  # [B, KVH, Lp, Dh]
    out = _tree_attention_grouped(qg, kg, vg, ends[:, None, :], block_q, block_k, interpret)  # [B, KVH, G, Lp, Dh]
    out = out.transpose(0, 3, 1, 2, 4).reshape(batch, length + pad, n_heads, head_dim)  # [B, Lp, H, Dh]
    return out[:, :length]

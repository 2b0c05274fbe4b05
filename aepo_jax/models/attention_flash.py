"""Flash attention backends: TPU splash (Pallas) and GPU cuDNN, plus the platform guard.

Both take the layout of `masked_attention` (q [B, T, H, Dh], k/v [B, S, KVH, Dh])
and return [B, T, H, Dh]. What each accepts (docs/attention.md):
- splash: causal self-attention rows (T == S) with padding keys, given as an
  `AttentionMask`; padding is passed as segment ids (no `[T, S]` matrix is built).
  Tree-packed rows go to the tree kernel (`tree_attention.py`), which `on_platform`
  guards the same way.
- cuDNN: any mask; the dense `bool[B, 1, T, S]` mask is handed to
  `jax.nn.dot_product_attention(implementation="cudnn")`, which fuses it
  (no `[B, H, T, S]` scores in HBM, but no skipping of masked tiles either).

Splash's platform is checked when the program is lowered, not when it is traced
(`lax.platform_dependent`): a CPU process can AOT-compile splash for a simulated
TPU, while running the same function on a CPU raises an error naming the backend.
cuDNN is checked when traced (jax itself needs cuDNN to trace it).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from aepo_jax.models.attention_mask import AttentionMask

SPLASH_MAX_BLOCK = 512  # tile size for long rows (rows are padded to a multiple of the tile)


class UnsupportedPlatformError(RuntimeError):
    """A flash backend ran on a platform it has no kernel for."""


def _raise_unsupported(backend: str, platform: str) -> Callable[..., jax.Array]:
    """A branch that fails at run time with a message naming the backend (see the module doc)."""
    message = (f"attention backend {backend!r} needs a {platform} device but ran elsewhere; "
               f"use model.attention='dense' on this platform")

    def fail(*_):
        raise UnsupportedPlatformError(message)

    @jax.custom_jvp
    def branch(q, k, v):
        out_type = jax.ShapeDtypeStruct(q.shape, q.dtype)
        return jax.pure_callback(fail, out_type, q, vmap_method="broadcast_all")

    @branch.defjvp
    def _jvp(primals, tangents):
        del tangents
        out = branch(*primals)
        return out, jnp.zeros_like(out)

    return branch


def on_platform(platform: str, backend: str, kernel: Callable[..., jax.Array], q, k, v) -> jax.Array:
    """`kernel(q, k, v)` when lowered for `platform` ("tpu", "cuda"); an `UnsupportedPlatformError` elsewhere."""
    return jax.lax.platform_dependent(q, k, v, default=_raise_unsupported(backend, platform), **{platform: kernel})


def _dividing_axes(mesh, axes: str | tuple[str, ...] | None, size: int) -> tuple[str, ...]:
    """The mesh axes among `axes` (in order, size > 1) whose product divides `size`, taken greedily."""
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    chosen: list[str] = []
    for axis in axes:
        n = mesh.shape.get(axis, 1)
        if n > 1 and size % (math.prod(mesh.shape[a] for a in chosen) * n) == 0:
            chosen.append(axis)
    return tuple(chosen)


def batch_shards(batch: int) -> int:
    """How many ways the context mesh (`jax.set_mesh`) splits `batch` rows (1 without a mesh)."""
    from aepo_jax.parallel.sharding import LOGICAL_AXIS_RULES

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1
    return math.prod(mesh.shape[a] for a in _dividing_axes(mesh, LOGICAL_AXIS_RULES["batch"], batch))


def shard_over_mesh(kernel: Callable[..., jax.Array], q: jax.Array, k: jax.Array, v: jax.Array,
                    mask: AttentionMask) -> jax.Array:
    """`kernel(q, k, v, mask)` run per device under the context mesh (`jax.set_mesh`), or directly without one.

    Mosaic (Pallas TPU) kernels cannot be partitioned by the compiler, so on a
    mesh the call goes through `jax.shard_map`: rows split over the logical
    "batch" axes and heads over the "kv_heads" axis (`parallel.LOGICAL_AXIS_RULES`),
    each only where it divides the local shape (else that dimension is replicated).
    Heads split in contiguous blocks keep every query head with its key-value head
    (query head h uses kv head h // G). `q [B, T, H, Dh]`, `k, v [B, T, KVH, Dh]`.
    """
    from jax.sharding import PartitionSpec

    from aepo_jax.parallel.sharding import LOGICAL_AXIS_RULES

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return kernel(q, k, v, mask)
    rows = _dividing_axes(mesh, LOGICAL_AXIS_RULES["batch"], q.shape[0]) or None
    heads = _dividing_axes(mesh, LOGICAL_AXIS_RULES["kv_heads"], k.shape[2]) or None
    per_head = PartitionSpec(rows, None, heads, None)
    per_row = PartitionSpec(rows, None)
    mask_spec = mask.replace(key_valid=per_row, query_offset=PartitionSpec(),
                             subtree_end=None if mask.subtree_end is None else per_row)
    return jax.shard_map(kernel, mesh=mesh, in_specs=(per_head, per_head, per_head, mask_spec),
                         out_specs=per_head, check_vma=False)(q, k, v, mask)


def splash_segment_ids(mask: AttentionMask) -> tuple[jax.Array, jax.Array]:
    """int32[B, T] query and int32[B, S] key segment ids that, with a causal mask, give `mask`.

    Valid slots are segment 0; a padding slot j is its own segment `j + 1`, so it
    sees only itself. That equals `mask.to_dense` on every query whose own slot
    is valid; a padding query sees only itself instead of itself and the valid
    keys before it (its output is never read).
    """
    slots = jnp.arange(mask.key_valid.shape[1], dtype=jnp.int32)  # [S]
    ids = jnp.where(mask.key_valid, 0, slots[None, :] + 1)  # [B, S]
    return ids, ids


def _splash_tile(length: int) -> int:
    """Tile of a row of `length` slots: a multiple of 128 (TPU lanes), at most SPLASH_MAX_BLOCK."""
    return min(SPLASH_MAX_BLOCK, -(-length // 128) * 128)


def _splash_block_sizes(tile: int):
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    return splash.BlockSizes(block_q=tile, block_kv=tile, block_kv_compute=tile, block_q_dkv=tile,
                             block_kv_dkv=tile, block_kv_dkv_compute=tile, block_q_dq=tile, block_kv_dq=tile)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask, *,
                     interpret: bool = False) -> jax.Array:
    """Causal self-attention rows with padding through the TPU splash kernel.

    Splash's static causal mask plus padding as segment ids (`splash_segment_ids`).

    Args:
      q: [B, T, H, Dh]; k, v: [B, T, KVH, Dh] (the same T slots: no cache).
      mask: a causal `AttentionMask` (no subtree ends, `query_offset` 0).
      interpret: run the Pallas kernel in interpret mode (any platform; tests).
    """
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    batch, length, n_heads, head_dim = q.shape
    n_kv_heads = k.shape[2]
    groups = n_heads // n_kv_heads
    if k.shape[1] != length or mask.is_tree:
        raise ValueError("splash_attention takes causal self-attention rows (T == S, no subtree ends); "
                         f"got T={length}, S={k.shape[1]}, tree={mask.is_tree}")
    tile = _splash_tile(length)
    padded = -(-length // tile) * tile  # rows padded with invalid slots (each its own segment)
    key_valid = jnp.pad(mask.key_valid, ((0, 0), (0, padded - length)))
    row_inputs = splash_segment_ids(mask.replace(key_valid=key_valid))  # [B, Tp], [B, Tp]
    causal = splash.MultiHeadMask([splash.CausalMask((padded, padded))] * groups)
    kernel = splash.make_splash_mqa_single_device(causal, block_sizes=_splash_block_sizes(tile), interpret=interpret)

    def attend_row(q_row, k_row, v_row, q_id, kv_id):  # [KVH, G, T, Dh], [KVH, S, Dh], [KVH, S, Dh], [T], [S]
        segments = splash.SegmentIds(q=q_id, kv=kv_id)
        return jax.vmap(lambda qh, kh, vh: kernel(qh, kh, vh, segment_ids=segments))(q_row, k_row, v_row)

    def run(q, k, v):
        widths = ((0, 0), (0, padded - length), (0, 0), (0, 0))
        q, k, v = (jnp.pad(x, widths) for x in (q, k, v))  # [B, Tp, heads, Dh]
        scaled = (q.astype(jnp.float32) / math.sqrt(head_dim)).astype(q.dtype)  # splash does not scale
        qg = scaled.reshape(batch, padded, n_kv_heads, groups, head_dim).transpose(0, 2, 3, 1, 4)  # [B, KVH, G, Tp, Dh]
        kg, vg = (x.transpose(0, 2, 1, 3) for x in (k, v))  # [B, KVH, Tp, Dh]
        out = jax.vmap(attend_row)(qg, kg, vg, *row_inputs)  # [B, KVH, G, Tp, Dh]
        return out.transpose(0, 3, 1, 2, 4).reshape(batch, padded, n_heads, head_dim)[:, :length]

    if interpret:
        return run(q, k, v)
    return on_platform("tpu", "splash", run, q, k, v)


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """`jax.nn.dot_product_attention(implementation="cudnn")` with a dense bool[B, T, S] mask (GPU only).

    jax checks for cuDNN when tracing, so this backend is checked at trace time
    too (no AOT compile for a GPU from a CPU-only process).
    """
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(f"attention backend 'cudnn' needs bfloat16 or float16 activations, got {q.dtype}: "
                         "set model.compute_dtype='bfloat16'")
    if jax.default_backend() != "gpu":
        raise UnsupportedPlatformError(f"attention backend 'cudnn' needs a GPU with cuDNN; this process runs on "
                                       f"{jax.default_backend()!r}: use model.attention='dense' (or 'splash' on TPU)")
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation="cudnn")  # mask [B, 1, T, S]

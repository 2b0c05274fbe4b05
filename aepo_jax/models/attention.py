"""Grouped-query self-attention with rotary positions, optional q/k/v bias and per-head q/k RMSNorm.

Scores and softmax are computed in float32 whatever the activation dtype.
The mask is explicit, so causal, left-padded, cached and tree-packed attention
are all the same code: either a dense `bool[B, T, S]` (True = may attend) or an
`AttentionMask` (`attention_mask.py`), the O(B * S) form flash kernels need.
`masked_attention(..., implementation=...)` picks the backend (`model.attention`):
"dense" (XLA, the reference), "splash" (TPU Pallas), "cudnn" (GPU); see
docs/attention.md for which masks each handles.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from aepo_jax.models.attention_flash import (
    batch_shards,
    cudnn_attention,
    on_platform,
    shard_over_mesh,
    splash_attention,
)
from aepo_jax.models.attention_mask import AttentionMask
from aepo_jax.models.config import ModelConfig
from aepo_jax.models.layers import RMSNorm, apply_rotary, fan_in_normal, logical_param
from aepo_jax.models.tree_attention import tree_attention

# Each backend and the platforms (`jax.default_backend()` names) it runs on: None = any. The kernels are
# one platform's (docs/attention.md); tests still build and AOT-compile splash on a CPU for a simulated TPU.
ATTENTION_PLATFORMS: dict[str, tuple[str, ...] | None] = {"dense": None, "splash": ("tpu",), "cudnn": ("gpu",)}
ATTENTION_BACKENDS = tuple(ATTENTION_PLATFORMS)
# A cached block (prefill / append over a KV cache) materialises its float32 scores [B, KVH, G, T, S]
# for at most this many bytes of rows at a time: groups of rows run one after another, so the scores
# stay in cache on a CPU (2.7x faster at 128 rows x 64 tokens x 512 slots) and the temporaries stay
# bounded on an accelerator. Each group keeps at least one row per batch shard of the mesh.
CACHED_SCORES_CHUNK_BYTES = 4 << 20


def check_backend(implementation: str) -> str:
    """Returns `implementation` if it names a backend, else raises naming the known ones."""
    if implementation not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {implementation!r}; known backends: {list(ATTENTION_BACKENDS)}")
    return implementation


def require_backend_runs_on(implementation: str, platform: str) -> None:
    """A ValueError unless attention backend `implementation` runs on `platform` (`jax.default_backend()`),
    naming the settings that do.

    For the launch path that will run programs, before any model work: the kernels otherwise fail only
    when the first program runs. Not checked at model construction, where a CPU process may build and
    AOT-compile a TPU program (tests, benchmarks/memory_plan.py).
    """
    platforms = ATTENTION_PLATFORMS[check_backend(implementation)]
    if platforms is None or platform in platforms:
        return
    usable = [name for name, runs in ATTENTION_PLATFORMS.items() if runs is not None and platform in runs]
    usable += [name for name, runs in ATTENTION_PLATFORMS.items() if runs is None]  # the kernels first
    hint = {"cudnn": " (with model.compute_dtype='bfloat16')"}
    choices = " or ".join(f"model.attention={name!r}{hint.get(name, '')}" for name in usable)
    raise ValueError(f"model.attention={implementation!r} runs only on {' / '.join(platforms)}, but this process "
                     f"runs on {platform!r}: set {choices} (e.g. --config.model.attention={usable[0]})")


def masked_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | AttentionMask,
    *,
    implementation: str = "dense",
    interpret: bool = False,
    head_major_kv: bool = False,
) -> jax.Array:
    """softmax(q k^T / sqrt(Dh), masked) v with KV heads shared by groups of query heads.

    Args:
      q: [B, T, H, Dh] queries; k, v: [B, S, KVH, Dh] keys and values (H a multiple of KVH),
        or [B, KVH, S, Dh] with `head_major_kv` (the KV cache's layout, read in place).
      mask: bool[B, T, S], True where query t may attend key s, or an `AttentionMask`.
      implementation: "dense", "splash" or "cudnn" (module doc). "splash" needs an
        `AttentionMask`: causal self-attention rows run the splash kernel,
        tree-packed rows the tree kernel (`tree_attention.py`), cached blocks
        (S != T, decode and append) the dense path. "cudnn" takes any mask, densely.
      interpret: run Pallas kernels in interpret mode (tests on CPU).

    Returns:
      [B, T, H, Dh]. With the dense backend a query row whose mask is all False
      returns zeros (not NaN); `AttentionMask` rows always see their own slot.
    """
    check_backend(implementation)
    length, n_keys = q.shape[1], k.shape[2 if head_major_kv else 1]
    if head_major_kv and implementation != "dense" and n_keys == length:
        k, v, head_major_kv = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), False  # the kernels' layout
    if implementation == "splash" and isinstance(mask, AttentionMask) and n_keys == length:
        # Per device under the context mesh: Mosaic kernels are not partitioned by the compiler.
        return shard_over_mesh(functools.partial(_flash_attention, interpret=interpret), q, k, v, mask)
    if implementation == "splash" and not isinstance(mask, AttentionMask):
        raise ValueError("the splash backend needs an AttentionMask (models/attention_mask.py), not a dense "
                         "bool[B, T, S] mask: a dense mask has no structure a TPU kernel can use")
    dense = mask.to_dense(length) if isinstance(mask, AttentionMask) else mask  # bool[B, T, S]
    if dense.shape != (q.shape[0], length, n_keys):
        raise ValueError(f"mask must be bool[B, T, S] = {(q.shape[0], length, n_keys)}, got {dense.shape}")
    if implementation == "cudnn":
        if head_major_kv:
            k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
        return cudnn_attention(q, k, v, dense)
    if head_major_kv and length > 1:
        return _row_chunked(_dense_attention, q, k, v, dense, head_major_kv)
    return _dense_attention(q, k, v, dense, head_major_kv)  # "dense", and splash's cached blocks


def _row_chunked(attend, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, head_major_kv: bool) -> jax.Array:
    """`attend(q, k, v, mask, head_major_kv)` over groups of rows in turn, each group's float32 scores at
    most `CACHED_SCORES_CHUNK_BYTES` (or one row per batch shard). Rows are independent, so the result
    is the same as one call; group j takes rows j, j + n, j + 2n, ... so every group spans every shard."""
    batch, length, n_heads, _ = q.shape
    per_row = 4 * n_heads * length * mask.shape[-1]  # float32 scores of one row
    shards = batch_shards(batch)
    rows = max(shards, CACHED_SCORES_CHUNK_BYTES // per_row // shards * shards)
    while batch % rows:  # the largest multiple of the shard count that divides the batch
        rows -= shards
    groups = batch // rows
    if groups == 1:
        return attend(q, k, v, mask, head_major_kv)

    def split(x):  # [B, ...] -> [groups, rows, ...]: group j holds rows j, j + groups, ...
        return jnp.moveaxis(x.reshape(rows, groups, *x.shape[1:]), 1, 0)

    out = jax.lax.map(lambda xs: attend(*xs, head_major_kv), (split(q), split(k), split(v), split(mask)))
    return jnp.moveaxis(out, 0, 1).reshape(batch, *out.shape[2:])


def _flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask, *, interpret: bool) -> jax.Array:
    """splash's kernels on self-attention rows: the tree kernel for tree masks, the splash kernel otherwise."""
    if mask.is_tree:
        if interpret:
            return tree_attention(q, k, v, mask.subtree_end, interpret=True)
        run = functools.partial(tree_attention, subtree_end=mask.subtree_end)
        return on_platform("tpu", "splash (tree kernel)", run, q, k, v)
    return splash_attention(q, k, v, mask, interpret=interpret)


def _dense_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                     head_major_kv: bool = False) -> jax.Array:
    """The XLA reference: float32 scores [B, KVH, G, T, S] materialised, masked, softmaxed."""
    batch, length, n_heads, head_dim = q.shape
    n_kv_heads = k.shape[1 if head_major_kv else 2]
    kv = "bksd" if head_major_kv else "bskd"
    q = q.reshape(batch, length, n_kv_heads, n_heads // n_kv_heads, head_dim)  # [B, T, KVH, G, Dh]
    scores = jnp.einsum(f"btkgd,{kv}->bkgts", q, k, preferred_element_type=jnp.float32)  # [B, KVH, G, T, S]
    scores = scores.astype(jnp.float32) / math.sqrt(head_dim)
    allowed = mask[:, None, None, :, :]  # [B, 1, 1, T, S]
    # A finite floor (not -inf) keeps fully-masked rows NaN-free; they are zeroed below.
    scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(allowed, probs, 0.0).astype(v.dtype)
    # Batch and head axes lead the product's result, as in its operands: asked for [B, T, KVH, G, Dh]
    # directly, XLA:CPU ran it as a transposed product outside its fast matmul library (3x slower
    # decode attention); the move of T is a bitcast when T = 1.
    out = jnp.moveaxis(jnp.einsum(f"bkgts,{kv}->bkgtd", probs, v), 3, 1)  # [B, T, KVH, G, Dh]
    return out.reshape(batch, length, n_heads, head_dim)


class Attention(nnx.Module):
    """Projections q/k/v/o, rotary on q and k, and masked attention over (optionally cached) keys."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs | None = None):
        d, h, kvh, dh = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim
        pdt = config.param_dtype
        self.dtype: Any = config.dtype
        self.implementation = check_backend(config.attention)
        self.interpret = config.attention_interpret
        self.q_proj = logical_param(rngs, fan_in_normal(d), (d, h, dh), ("embed", "heads", "head_dim"), pdt)
        self.k_proj = logical_param(rngs, fan_in_normal(d), (d, kvh, dh), ("embed", "kv_heads", "head_dim"), pdt)
        self.v_proj = logical_param(rngs, fan_in_normal(d), (d, kvh, dh), ("embed", "kv_heads", "head_dim"), pdt)
        self.o_proj = logical_param(rngs, fan_in_normal(h * dh), (h, dh, d), ("heads", "head_dim", "embed"), pdt)
        if config.qkv_bias:
            zeros = nnx.initializers.zeros
            self.q_bias = logical_param(rngs, zeros, (h, dh), ("heads", "head_dim"), pdt)
            self.k_bias = logical_param(rngs, zeros, (kvh, dh), ("kv_heads", "head_dim"), pdt)
            self.v_bias = logical_param(rngs, zeros, (kvh, dh), ("kv_heads", "head_dim"), pdt)
        else:
            self.q_bias = self.k_bias = self.v_bias = None
        if config.qk_norm:
            self.q_norm = RMSNorm(dh, config.rms_eps, pdt, rngs=rngs)
            self.k_norm = RMSNorm(dh, config.rms_eps, pdt, rngs=rngs)
        else:
            self.q_norm = self.k_norm = None

    def _project(self, x: jax.Array, kernel: nnx.Param, bias: nnx.Param | None) -> jax.Array:
        out = jnp.einsum("btd,dhk->bthk", x, kernel[...].astype(self.dtype))  # [B, T, heads, Dh]
        return out if bias is None else out + bias[...].astype(self.dtype)

    def __call__(
        self,
        x: jax.Array,  # [B, T, D]
        positions: jax.Array,  # int32[B, T]
        mask: jax.Array | AttentionMask,  # bool[B, T, S] or its structured form
        inv_freq: jax.Array,  # float32[Dh/2]
        cache_kv: tuple[jax.Array, jax.Array] | None = None,  # ([B, KVH, S, Dh], same) or stacked [L, ...]
        cache_index: jax.Array | None = None,  # int32 scalar
        cache_layer: jax.Array | None = None,  # int32 scalar: this layer's slice of a stacked cache
        cache_slots: jax.Array | None = None,  # int32[B, T]: each new token's own slot (ragged rows)
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        q = self._project(x, self.q_proj, self.q_bias)  # [B, T, H, Dh]
        k = self._project(x, self.k_proj, self.k_bias)  # [B, T, KVH, Dh]
        v = self._project(x, self.v_proj, self.v_bias)  # [B, T, KVH, Dh]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q, positions, inv_freq)
        k = apply_rotary(k, positions, inv_freq)
        if cache_kv is None:
            out = masked_attention(q, k, v, mask, implementation=self.implementation,
                                   interpret=self.interpret)  # [B, T, H, Dh]
        else:
            cache_kv, k, v = self._write_cache(cache_kv, k, v, cache_index, cache_layer, cache_slots,
                                               _key_count(mask))
            out = masked_attention(q, k, v, mask, implementation=self.implementation, interpret=self.interpret,
                                   head_major_kv=True)  # [B, T, H, Dh]
        return jnp.einsum("bthk,hkd->btd", out, self.o_proj[...].astype(self.dtype)), cache_kv

    def _write_cache(self, cache_kv, k, v, index, layer, slots, span):
        """Writes the block's keys and values into the (head-major) cache; returns the cache and the
        `[B, KVH, span, Dh]` keys and values attention reads (its first `span` slots).

        Without `slots`, the T new tokens go to slots `[index, index + T)` of every row; with
        `slots` (int32[B, T], ragged rows) token t of row b goes to slot `slots[b, t]`, and slots
        >= S are dropped (padding). `layer` picks a stacked `[L, ...]` cache's layer: only its new
        slots are written, in place, and the layer is read back, so the program never holds a
        second copy of a layer (or of the whole cache).

        Without `slots`, a block that does not fit (`index + T > S`) raises when `index` is a
        concrete value; under `jax.jit` it is traced and cannot be checked, so the caller must
        guarantee room (`dynamic_update_slice` would clamp the start and overwrite the last slots).
        """
        cache_k, cache_v = cache_kv
        lead = () if layer is None else (layer,)
        if slots is None:
            _check_cache_room(index, k.shape[1], cache_k.shape[-2])
            start = lead + (0, 0, index, 0)

            def write(cache, new):  # new [B, T, KVH, Dh] -> the cache's [B, KVH, T, Dh] block
                block = jnp.swapaxes(new, 1, 2).astype(cache.dtype)
                return jax.lax.dynamic_update_slice(cache, block[None] if lead else block, start)
        else:
            batch, length = slots.shape
            n_heads = cache_k.shape[-3]
            shape = (batch, length, n_heads)  # one index per (row, token, head): the update's windows are [Dh]
            rows = jnp.broadcast_to(jnp.arange(batch, dtype=jnp.int32)[:, None, None], shape)
            heads = jnp.broadcast_to(jnp.arange(n_heads, dtype=jnp.int32)[None, None, :], shape)
            # Heads are an index, not a window, so the TPU compiler keeps the cache's own [S, Dh] tiling
            # (with [KVH, Dh] windows it relaid out the whole cache for the loop: a second cache in memory).
            where = tuple(jnp.broadcast_to(i, shape) for i in lead) + (rows, heads,
                                                                        jnp.broadcast_to(slots[:, :, None], shape))

            def write(cache, new):
                return cache.at[where].set(new.astype(cache.dtype), mode="drop")

        cache_k, cache_v = write(cache_k, k), write(cache_v, v)
        def read(cache):  # [B, KVH, span, Dh]: only the slots attention reads, of this layer only
            if not lead:
                return cache[:, :, :span].astype(self.dtype)
            batch, heads, _, head_dim = cache.shape[1:]
            block = jax.lax.dynamic_slice(cache, (layer, 0, 0, 0, 0), (1, batch, heads, span, head_dim))
            return block[0].astype(self.dtype)

        return (cache_k, cache_v), read(cache_k), read(cache_v)


def _check_cache_room(index: jax.Array | int, length: int, n_slots: int) -> None:
    """Raises when writing `length` tokens at a concrete `index` would run past the cache's `n_slots`.

    `dynamic_update_slice` clamps an out-of-range start, which would silently overwrite the
    cache's last slots; a traced `index` (under jit) cannot be checked here.
    """
    if isinstance(index, jax.core.Tracer):
        return
    start = int(index)
    if start + length > n_slots:
        raise ValueError(f"KV cache overflow: writing {length} token(s) at slot {start} needs {start + length} "
                         f"slots but the cache has {n_slots}; allocate a longer KVCache")


def _key_count(mask: jax.Array | AttentionMask) -> int:
    """How many key slots `mask` covers (static)."""
    return mask.key_valid.shape[1] if isinstance(mask, AttentionMask) else mask.shape[-1]

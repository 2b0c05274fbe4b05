"""The decoder-only transformer: embed, N x (norm, attention, norm, SwiGLU MLP) with residuals, norm, logits.

One module covers Llama-3, SmolLM2, Qwen2.5 and Qwen3 (see `ModelConfig`).
Contract (docs/interfaces.md): `model(input_ids)` returns float32 logits
`[B, T, V]` under a causal mask; `positions` and `attention_mask` make
left-padded, cached and tree-packed batches the same forward; with
`kv_cache` the call also returns the updated cache. The mask is an
`AttentionMask` (`attention_mask.py`: `causal_mask`, `cached_mask`,
`tree_mask`), the O(B * S) form every attention backend takes, or a dense
`bool[B, T, S]` (the dense and cuDNN backends only); it reaches every layer
unchanged and each backend reads the form it needs (docs/attention.md).

The layers are one `DecoderBlock` whose parameters are stacked along a
leading `layers` axis (`nnx.vmap` at init) and applied with `lax.scan`, so a
program holds one layer's code whatever the depth (compile time does not grow
with `n_layers`) and `ModelConfig.remat` can rematerialise one layer at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from aepo_jax.models.attention import Attention
from aepo_jax.models.attention_mask import AttentionMask, cached_mask, causal_mask
from aepo_jax.models.config import ModelConfig
from aepo_jax.models.kv_cache import KVCache, LayerKV
from aepo_jax.models.layers import (
    RMSNorm,
    SwiGLU,
    logical_param,
    rope_inverse_frequencies,
)
from aepo_jax.models.lm_head import project_to_vocab
from aepo_jax.models.remat import remat_block

LAYER_AXIS = "layers"  # logical name of the stacked parameters' leading axis (unsharded)


class DecoderBlock(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs | None = None):
        self.attention_norm = RMSNorm(config.d_model, config.rms_eps, config.param_dtype, rngs=rngs)
        self.attention = Attention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config.d_model, config.rms_eps, config.param_dtype, rngs=rngs)
        self.mlp = SwiGLU(config.d_model, config.mlp_dim, config.dtype, config.param_dtype, rngs=rngs)

    def __call__(self, x, positions, mask, inv_freq, cache_kv=None, cache_index=None, cache_layer=None,
                 cache_slots=None):
        attended, cache_kv = self.attention(self.attention_norm(x), positions, mask, inv_freq, cache_kv, cache_index,
                                            cache_layer, cache_slots)
        h = x + attended
        return h + self.mlp(self.mlp_norm(h)), cache_kv


def stacked_blocks(config: ModelConfig, rngs: nnx.Rngs) -> DecoderBlock:
    """`n_layers` independently initialised blocks as one block with `[L, ...]` parameters."""

    @nnx.split_rngs(splits=config.n_layers)
    @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: LAYER_AXIS})
    def make(layer_rngs: nnx.Rngs) -> DecoderBlock:
        return DecoderBlock(config, rngs=layer_rngs)

    return make(rngs)


def _check_token_ids(input_ids, vocab_size: int) -> None:
    """Refuses ids outside [0, vocab_size) in a call made outside jit (an eager call, a notebook's). Inside
    jit they cannot be read: an id past the table embeds as NaN (every later position of its row turns
    NaN through attention) and a negative one as a row from the end, which is why the sampler and the
    runs' composition root check ids and vocabulary sizes before any program runs."""
    if isinstance(input_ids, jax.core.Tracer) or not getattr(input_ids, "is_fully_addressable", True):
        return  # (an array spread over other processes' devices cannot be read here either)
    ids = jax.device_get(input_ids)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = sorted({int(t) for t in ids.ravel() if not 0 <= int(t) < vocab_size})
        raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")


def split_layer_params(state: nnx.State, dtype: str | None = None) -> list[nnx.State]:
    """A Decoder state's stacked block parameters as one state per layer (copies), for
    `Decoder(..., layer_params=...)`.

    `dtype` (the model's compute dtype) casts the floating-point copies to it where it is narrower:
    every block casts each of its parameters to the compute dtype before use, so the blocks compute
    with the same values, while float32 training weights make a copy half the size that a decode
    step reads half of. A parameter narrower than `dtype` is copied as it is.
    """
    stacked = state["layers"]
    n_layers = jax.tree.leaves(stacked)[0].shape[0]

    def layer(x: jax.Array, i: int) -> jax.Array:
        x = x[i]
        narrows = (dtype is not None and jnp.issubdtype(x.dtype, jnp.floating)
                   and jnp.finfo(dtype).bits < jnp.finfo(x.dtype).bits)
        return x.astype(dtype) if narrows else x

    return [jax.tree.map(lambda x, i=i: layer(x, i), stacked) for i in range(n_layers)]


def check_mask_shape(mask: AttentionMask | jax.Array, batch: int, length: int, n_keys: int, *, cached: bool) -> None:
    """Raises naming the expected shapes unless `mask` covers `length` queries over `n_keys` keys."""
    keys = "cache slots" if cached else "tokens"
    if isinstance(mask, AttentionMask):
        arrays = {"key_valid": mask.key_valid, "subtree_end": mask.subtree_end}
        for name, array in arrays.items():
            if array is not None and array.shape != (batch, n_keys):
                raise ValueError(f"AttentionMask.{name} must be [B, S] = {(batch, n_keys)} (S = {keys}), "
                                 f"got shape {array.shape}")
    elif mask.ndim != 3 or mask.shape[-2:] != (length, n_keys):
        raise ValueError(f"attention_mask must be bool[B, T, S] with T={length} queries and S={n_keys} keys "
                         f"({keys}), got shape {mask.shape}")


class Decoder(nnx.Module):
    """Token ids to next-token logits (float32), or to final hidden states."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs | None = None):
        self.config = config
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.embed = logical_param(
            rngs, nnx.initializers.normal(stddev=config.d_model**-0.5), (config.vocab_size, config.d_model),
            ("vocab", "embed"),
            config.param_dtype,
        )
        self.layers = stacked_blocks(config, rngs)
        self.final_norm = RMSNorm(config.d_model, config.rms_eps, config.param_dtype, rngs=rngs)
        if config.tie_embeddings:
            self.lm_head = None
        else:
            self.lm_head = logical_param(
                rngs, nnx.initializers.normal(stddev=config.d_model**-0.5), (config.d_model, config.vocab_size),
                ("embed", "vocab"), config.param_dtype,
            )

    def head(self) -> jax.Array:
        """The `[D, V]` output projection (the embedding's transpose when tied), in storage dtype."""
        return self.embed[...].T if self.lm_head is None else self.lm_head[...]

    def __call__(
        self,
        input_ids: jax.Array,  # int32[B, T]
        positions: jax.Array | None = None,  # int32[B, T]
        attention_mask: AttentionMask | jax.Array | None = None,  # over T keys, or S cache slots
        kv_cache: KVCache | None = None,
        *,
        last_logits_only: bool = False,
        return_hidden: bool = False,
        cache_write_slots: jax.Array | None = None,
        layer_params: Sequence[nnx.State] | None = None,
    ) -> jax.Array | tuple[jax.Array, KVCache | LayerKV]:
        """Logits `[B, T, V]` (and the updated cache when `kv_cache` is given).

        `last_logits_only=True` projects only the last position to the
        vocabulary and returns `[B, 1, V]`, equal to the default's `[:, -1:]`:
        prefill and append of a right-aligned block need nothing else, and the
        `[B, T, V]` projection is the largest matmul of a short model's prefill.
        `return_hidden=True` returns the final-normed hidden states `[B, T, D]`
        (compute dtype) instead of logits, for `lm_head.head_token_scores`,
        which projects them to the vocabulary a chunk of positions at a time.

        `cache_write_slots` (int32[B, T], ragged rows: the sampler's rows each have
        their own cursor) gives every new token's slot instead of `[index, index + T)`;
        slots >= S are not written (padding). The mask (required then) may cover only
        the first S' <= S slots: attention reads just that span. `index` is left as is.

        `layer_params` (`split_layer_params(state)`, with a `LayerKV` cache and
        `cache_write_slots`) runs the layers unrolled on parameters already split
        per layer, instead of scanning the stacked ones: the sampler splits them once
        per parameter update and its decode windows copy the cache's live slots per
        layer, so no step copies a layer's weights or slots out of a stack (XLA:CPU
        copies every dynamic slice of the scan).
        """
        config = self.config
        batch, length = input_ids.shape
        offset = jnp.zeros((), jnp.int32) if kv_cache is None else kv_cache.index
        if positions is None:
            positions = jnp.broadcast_to(offset + jnp.arange(length, dtype=jnp.int32), (batch, length))
        n_keys = length if kv_cache is None else kv_cache.length
        if cache_write_slots is not None:
            if kv_cache is None or attention_mask is None:
                raise ValueError("cache_write_slots needs a kv_cache and an explicit attention_mask")
            if cache_write_slots.shape != (batch, length):
                raise ValueError(f"cache_write_slots must be int32[B, T] = {(batch, length)}, "
                                 f"got shape {cache_write_slots.shape}")
            n_keys = attention_mask.key_valid.shape[1] if isinstance(attention_mask, AttentionMask) \
                else attention_mask.shape[-1]
            if n_keys > kv_cache.length:
                raise ValueError(f"the mask covers {n_keys} slots but the cache has {kv_cache.length}")
        if attention_mask is None:
            # Causal: query t (at slot offset + t) sees keys in slots <= offset + t.
            every_key = jnp.ones((batch, n_keys), bool)
            attention_mask = causal_mask(every_key) if kv_cache is None else cached_mask(every_key, offset)
        check_mask_shape(attention_mask, batch, length, n_keys, cached=kv_cache is not None)
        if positions.shape != (batch, length):
            raise ValueError(f"positions must be int32[B, T] = {(batch, length)}, got shape {positions.shape}")
        inv_freq = jnp.asarray(rope_inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling))

        _check_token_ids(input_ids, config.vocab_size)
        x = jnp.take(self.embed[...], input_ids, axis=0).astype(config.dtype)  # [B, T, D]
        if layer_params is not None:
            x, kv_cache = self._unrolled_layers(x, positions, attention_mask, inv_freq, kv_cache, layer_params,
                                                cache_write_slots)
        else:
            x, kv_cache = self._scan_layers(x, positions, attention_mask, inv_freq, kv_cache, offset,
                                            cache_write_slots)
        if last_logits_only:
            x = x[:, -1:]  # [B, 1, D]
        x = self.final_norm(x)
        if return_hidden:
            out = x  # [B, T, D]
        else:
            out = project_to_vocab(x, self.head(), config.dtype)  # [B, T, V] ([B, 1, V] with last_logits_only)
        if kv_cache is None:
            return out
        return out, kv_cache if cache_write_slots is not None else kv_cache.replace(index=offset + length)

    def _unrolled_layers(self, x, positions, mask, inv_freq, kv_cache: LayerKV, layer_params, write_slots):
        """Runs the blocks one after another on per-layer parameters and per-layer cache buffers."""
        if not isinstance(kv_cache, LayerKV) or write_slots is None:
            raise ValueError("layer_params needs a LayerKV cache and cache_write_slots")
        if len(layer_params) != self.config.n_layers or kv_cache.n_layers != self.config.n_layers:
            raise ValueError(f"layer_params ({len(layer_params)}) and the LayerKV cache ({kv_cache.n_layers}) "
                             f"need one entry per layer ({self.config.n_layers})")
        graphdef = nnx.graphdef(self.layers)
        keys, values = [], []
        for params, k, v in zip(layer_params, kv_cache.k, kv_cache.v, strict=True):
            block = nnx.merge(graphdef, params)
            x, (k, v) = block(x, positions, mask, inv_freq, (k, v), None, cache_slots=write_slots)
            keys.append(k)
            values.append(v)
        return x, LayerKV(k=tuple(keys), v=tuple(values))

    def _scan_layers(self, x, positions, mask, inv_freq, kv_cache: KVCache | None, offset, write_slots=None):
        """Runs the stacked blocks in order under `lax.scan` (rematerialised as `config.remat` says).

        Without a cache the carry is the residual stream `[B, T, D]`; with one,
        it also holds the stacked `[L, B, KVH, S, Dh]` keys and values: layer i
        writes its new slots into slice i in place and reads slice i back (no
        copy of a layer's slice is written back, so no second copy of the cache).
        """
        graphdef, layer_params = nnx.split(self.layers)
        layer_ids = jnp.arange(self.config.n_layers, dtype=jnp.int32)

        def body(carry, layer):
            params, i = layer
            block = nnx.merge(graphdef, params)
            if kv_cache is None:
                out, _ = block(carry, positions, mask, inv_freq)
                return out, None
            h, cache_k, cache_v = carry
            h, (cache_k, cache_v) = block(h, positions, mask, inv_freq, (cache_k, cache_v), offset, cache_layer=i,
                                          cache_slots=write_slots)
            return (h, cache_k, cache_v), None

        body = remat_block(body, self.config.remat)
        if kv_cache is None:
            x, _ = jax.lax.scan(body, x, (layer_params, layer_ids))
            return x, None
        (x, cache_k, cache_v), _ = jax.lax.scan(body, (x, kv_cache.k, kv_cache.v), (layer_params, layer_ids))
        return x, kv_cache.replace(k=cache_k, v=cache_v)

"""The decoder-only transformer: embed, N x (norm, attention, norm, SwiGLU MLP) with residuals, norm, logits.

One module covers Llama-3, SmolLM2, Qwen2.5 and Qwen3 (see `ModelConfig`).
Contract (docs/interfaces.md): `model(input_ids)` returns float32 logits
`[B, T, V]` under a causal mask; `positions` and `attention_mask` make
left-padded, cached and tree-packed batches the same forward; with
`kv_cache` the call also returns the updated cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from aepo_jax.models.attention import Attention
from aepo_jax.models.config import ModelConfig
from aepo_jax.models.kv_cache import KVCache
from aepo_jax.models.layers import (
    RMSNorm,
    SwiGLU,
    logical_param,
    rope_inverse_frequencies,
)


class DecoderBlock(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs | None = None):
        self.attention_norm = RMSNorm(config.d_model, config.rms_eps, config.param_dtype, rngs=rngs)
        self.attention = Attention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config.d_model, config.rms_eps, config.param_dtype, rngs=rngs)
        self.mlp = SwiGLU(config.d_model, config.mlp_dim, config.dtype, config.param_dtype, rngs=rngs)

    def __call__(self, x, positions, mask, inv_freq, cache_kv=None, cache_index=None):
        attended, cache_kv = self.attention(self.attention_norm(x), positions, mask, inv_freq, cache_kv, cache_index)
        h = x + attended
        return h + self.mlp(self.mlp_norm(h)), cache_kv


class Decoder(nnx.Module):
    """Token ids to next-token logits (float32)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs | None = None):
        self.config = config
        self.embed = logical_param(
            rngs, nnx.initializers.normal(stddev=config.d_model**-0.5), (config.vocab_size, config.d_model),
            ("vocab", "embed"),
            config.param_dtype,
        )
        self.layers = nnx.List([DecoderBlock(config, rngs=rngs) for _ in range(config.n_layers)])
        self.final_norm = RMSNorm(config.d_model, config.rms_eps, config.param_dtype, rngs=rngs)
        if config.tie_embeddings:
            self.lm_head = None
        else:
            self.lm_head = logical_param(
                rngs, nnx.initializers.normal(stddev=config.d_model**-0.5), (config.d_model, config.vocab_size),
                ("embed", "vocab"), config.param_dtype,
            )

    def __call__(
        self,
        input_ids: jax.Array,  # int32[B, T]
        positions: jax.Array | None = None,  # int32[B, T]
        attention_mask: jax.Array | None = None,  # bool[B, T, T], or bool[B, T, S] with a cache
        kv_cache: KVCache | None = None,
        *,
        last_logits_only: bool = False,
    ) -> jax.Array | tuple[jax.Array, KVCache]:
        """Logits `[B, T, V]` (and the updated cache when `kv_cache` is given).

        `last_logits_only=True` projects only the last position to the
        vocabulary and returns `[B, 1, V]`, equal to the default's `[:, -1:]`:
        prefill and append of a right-aligned block need nothing else, and the
        `[B, T, V]` projection is the largest matmul of a short model's prefill.
        """
        config = self.config
        batch, length = input_ids.shape
        offset = jnp.zeros((), jnp.int32) if kv_cache is None else kv_cache.index
        if positions is None:
            positions = jnp.broadcast_to(offset + jnp.arange(length, dtype=jnp.int32), (batch, length))
        n_keys = length if kv_cache is None else kv_cache.length
        if attention_mask is None:
            # Causal: query t (at slot offset + t) sees keys in slots <= offset + t.
            causal = jnp.arange(n_keys)[None, :] <= (offset + jnp.arange(length))[:, None]  # [T, S]
            attention_mask = jnp.broadcast_to(causal, (batch, length, n_keys))
        elif attention_mask.ndim != 3 or attention_mask.shape[-2:] != (length, n_keys):
            raise ValueError(
                f"attention_mask must be bool[B, T, S] with T={length} queries and S={n_keys} keys "
                f"({'cache slots' if kv_cache is not None else 'tokens'}), got shape {attention_mask.shape}"
            )
        if positions.shape != (batch, length):
            raise ValueError(f"positions must be int32[B, T] = {(batch, length)}, got shape {positions.shape}")
        inv_freq = jnp.asarray(rope_inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling))

        x = jnp.take(self.embed[...], input_ids, axis=0).astype(config.dtype)  # [B, T, D]
        new_k, new_v = [], []
        for i, block in enumerate(self.layers):
            cache_kv = None if kv_cache is None else (kv_cache.k[i], kv_cache.v[i])
            x, cache_kv = block(x, positions, attention_mask, inv_freq, cache_kv, offset)
            if cache_kv is not None:
                new_k.append(cache_kv[0])
                new_v.append(cache_kv[1])
        if last_logits_only:
            x = x[:, -1:]  # [B, 1, D]
        x = self.final_norm(x)
        head = self.embed[...].T if self.lm_head is None else self.lm_head[...]  # [D, V]
        logits = jnp.einsum("btd,dv->btv", x, head.astype(config.dtype), preferred_element_type=jnp.float32)
        logits = logits.astype(jnp.float32)  # [B, T, V] ([B, 1, V] with last_logits_only)
        if kv_cache is None:
            return logits
        return logits, KVCache(k=tuple(new_k), v=tuple(new_v), index=offset + length)

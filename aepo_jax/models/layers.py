"""Building blocks of the decoder: parameters with logical axes, RMSNorm, rotary embeddings, SwiGLU MLP.

Every weight is an `nnx.Param` whose `out_sharding` metadata holds *logical*
axis names (`vocab`, `embed`, `heads`, `kv_heads`, `head_dim`, `mlp`, `norm`);
`aepo_jax.parallel.sharding` maps them to mesh axes with one rules table.
Eager sharding is off, so a model is built unsharded on one device and is
placed on a mesh afterwards (`shard_state`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def logical_param(
    rngs: nnx.Rngs | None,
    init: Any,
    shape: Sequence[int],
    axes: Sequence[str],
    param_dtype: Any,
) -> nnx.Param:
    """An `nnx.Param` of `shape` initialised by `init(key, shape, dtype)`, tagged with logical `axes`."""
    if len(shape) != len(axes):
        raise ValueError(f"parameter shape {tuple(shape)} and logical axes {tuple(axes)} differ in rank")
    key = rngs.params() if rngs is not None else jax.random.key(0)
    value = init(key, tuple(shape), jnp.dtype(param_dtype))
    return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


def fan_in_normal(fan_in: int) -> Any:
    """Normal initialiser with std 1/sqrt(fan_in) (the shape's fan-in is given explicitly for 3-D kernels)."""
    return nnx.initializers.normal(stddev=1.0 / math.sqrt(fan_in))


class RMSNorm(nnx.Module):
    """y = x / sqrt(mean(x^2) + eps) * scale, normalised in float32 over the last axis."""

    def __init__(self, dim: int, eps: float, param_dtype: Any, *, rngs: nnx.Rngs | None = None):
        self.eps = eps
        self.scale = logical_param(rngs, nnx.initializers.ones, (dim,), ("norm",), param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        # Cast back before scaling, as the Hugging Face reference does.
        return self.scale[...].astype(x.dtype) * normed.astype(x.dtype)


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: Mapping[str, Any] | None) -> np.ndarray:
    """Rotary inverse frequencies theta^(-2i/d), i < d/2, with optional Llama-3.1 frequency scaling.

    Llama-3 scaling divides low frequencies (wavelength above
    original_max_position_embeddings / low_freq_factor) by `factor`, keeps high
    frequencies (wavelength below .../high_freq_factor), and interpolates
    linearly in 1/wavelength between the two bands.
    """
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # [Dh/2]
    if scaling is None:
        return inv_freq.astype(np.float32)
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    original = float(scaling["original_max_position_embeddings"])
    wavelength = 2.0 * math.pi / inv_freq
    smooth = (original / wavelength - low) / (high - low)  # 0 at the low band edge, 1 at the high one
    interpolated = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = np.where(wavelength > original / low, inv_freq / factor, interpolated)
    scaled = np.where(wavelength < original / high, inv_freq, scaled)
    return scaled.astype(np.float32)


def apply_rotary(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotates the two halves of each head by angle position * inv_freq (non-interleaved, HF layout).

    x: [B, T, H, Dh]; positions: int32[B, T]; inv_freq: float32[Dh/2].
    """
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2]
    cos = jnp.cos(angles)[:, :, None, :].astype(x.dtype)  # [B, T, 1, Dh/2]
    sin = jnp.sin(angles)[:, :, None, :].astype(x.dtype)
    first, second = jnp.split(x, 2, axis=-1)  # [B, T, H, Dh/2] each
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


class SwiGLU(nnx.Module):
    """MLP down(silu(gate(x)) * up(x)) (Shazeer 2020), as in Llama and Qwen."""

    def __init__(self, d_model: int, mlp_dim: int, dtype: Any, param_dtype: Any, *, rngs: nnx.Rngs | None = None):
        self.dtype = dtype
        self.gate = logical_param(rngs, fan_in_normal(d_model), (d_model, mlp_dim), ("embed", "mlp"), param_dtype)
        self.up = logical_param(rngs, fan_in_normal(d_model), (d_model, mlp_dim), ("embed", "mlp"), param_dtype)
        self.down = logical_param(rngs, fan_in_normal(mlp_dim), (mlp_dim, d_model), ("mlp", "embed"), param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:  # [B, T, D] -> [B, T, D]
        gate = x @ self.gate[...].astype(self.dtype)  # [B, T, F]
        up = x @ self.up[...].astype(self.dtype)  # [B, T, F]
        return (jax.nn.silu(gate) * up) @ self.down[...].astype(self.dtype)

"""Loss aggregation modes of spec §3 with exact micro-batch accumulation.

Every mode is written as `loss = numerator / denominator` where the numerator
is a *sum over sequences* (so it adds up across micro-batches split along the
batch axis) and the denominator depends only on the mask:

| mode                      | numerator                                   | denominator            |
|---------------------------|---------------------------------------------|------------------------|
| `token_mean`              | sum of `l * mask` over all tokens           | number of valid tokens |
| `seq_mean_token_mean`     | sum over sequences of their token mean      | number of sequences    |
| `seq_mean_token_sum_norm` | sum over sequences of token sum / `max_len` | number of sequences    |

"Sequences" are rows with at least one valid token (all-padding rows count
for nothing). `max_len` is the Dr. GRPO constant; it defaults to `T`.

Exact gradient accumulation: before splitting a batch into micro-batches the
trainer computes `D = loss_denominator(full_mask, mode)` once, then calls the
loss on each micro-batch with `global_denominator=D`. Each micro-batch loss is
then `numerator_mb / D`, so the sum of the micro-batch losses (and of their
gradients) equals the full-batch loss (and gradient) exactly.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

LOSS_AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


class Aggregated(NamedTuple):
    """`loss = numerator / denominator` (denominator clamped to at least 1)."""

    loss: jax.Array
    numerator: jax.Array
    denominator: jax.Array


def check_loss_agg(mode: str) -> None:
    """Raise a ValueError naming the known modes if `mode` is not one of them."""
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg {mode!r}; known: {list(LOSS_AGG_MODES)}")


def loss_denominator(mask: jax.Array, mode: str) -> jax.Array:
    """The denominator of `mode` for this mask (float32 scalar); see the module doc."""
    check_loss_agg(mode)
    mask = jnp.asarray(mask, jnp.float32)
    if mode == "token_mean":
        return jnp.sum(mask)
    return jnp.sum(jnp.any(mask > 0, axis=-1).astype(jnp.float32))


def _numerator(token_values: jax.Array, mask: jax.Array, mode: str, max_len: int | None) -> jax.Array:
    per_seq_sum = jnp.sum(jnp.where(mask > 0, token_values, 0.0), axis=-1)  # [B]; NaN * 0 would be NaN
    if mode == "token_mean":
        return jnp.sum(per_seq_sum)
    if mode == "seq_mean_token_mean":
        per_seq_count = jnp.maximum(jnp.sum(mask, axis=-1), 1.0)  # [B]
        return jnp.sum(per_seq_sum / per_seq_count)
    norm = mask.shape[-1] if max_len is None else max_len
    if norm <= 0:
        raise ValueError(f"max_len must be positive for seq_mean_token_sum_norm, got {norm}")
    return jnp.sum(per_seq_sum) / norm


def aggregate(
    token_values: jax.Array,
    mask: jax.Array,
    mode: str = "token_mean",
    *,
    max_len: int | None = None,
    global_denominator: jax.Array | float | None = None,
) -> Aggregated:
    """Aggregate a per-token loss `[B, T]` into a scalar.

    Args:
      token_values: `[B, T]` per-token loss.
      mask: `[B, T]` 0/1 policy-token mask.
      mode: one of `LOSS_AGG_MODES`.
      max_len: Dr. GRPO constant for `seq_mean_token_sum_norm` (default `T`).
      global_denominator: the full batch's `loss_denominator` when this call
        sees one micro-batch; `None` uses this batch's own denominator.

    Returns:
      `Aggregated(loss, numerator, denominator)`.
    """
    check_loss_agg(mode)
    mask = mask.astype(token_values.dtype)
    numerator = _numerator(token_values, mask, mode, max_len)
    if global_denominator is None:
        denominator = loss_denominator(mask, mode).astype(token_values.dtype)
    else:
        denominator = jnp.asarray(global_denominator, token_values.dtype)
    return Aggregated(numerator / jnp.maximum(denominator, 1.0), numerator, denominator)


def token_mean(token_values: jax.Array, mask: jax.Array, **kwargs) -> Aggregated:
    """Sum over valid tokens / number of valid tokens in the batch (spec §3 default)."""
    return aggregate(token_values, mask, "token_mean", **kwargs)


def seq_mean_token_mean(token_values: jax.Array, mask: jax.Array, **kwargs) -> Aggregated:
    """Mean over sequences of each sequence's token mean (GRPO paper)."""
    return aggregate(token_values, mask, "seq_mean_token_mean", **kwargs)


def seq_mean_token_sum_norm(token_values: jax.Array, mask: jax.Array, **kwargs) -> Aggregated:
    """Mean over sequences of token sum / `max_len` (Dr. GRPO)."""
    return aggregate(token_values, mask, "seq_mean_token_sum_norm", **kwargs)


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of `values` over `mask == 1` (0 when the mask is empty); for metrics."""
    mask = mask.astype(values.dtype)
    return jnp.sum(jnp.where(mask > 0, values, 0.0)) / jnp.maximum(jnp.sum(mask), 1.0)

"""The pure functions the Sampler jits: block forward (prefill/append), decode loop, cache reshaping.

`forward(params, tokens, positions, mask, cache) -> (logits, cache)` is the
model's cached forward (docs/interfaces.md): the T new tokens are written at
slots [cache.index, cache.index + T) of every row and mask is their
`AttentionMask` over the cache's S slots (`models.attention_mask.cached_mask`).
Only the last position's logits are read, so `logits` may be [B, T, V] or
just [B, 1, V] (the model's `last_logits_only`).
"""

from __future__ import annotations

from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp

from aepo_jax.models.attention_mask import cached_mask
from aepo_jax.sampling.params import SamplingParams
from aepo_jax.sampling.state import DecodeArrays
from aepo_jax.sampling.stopping import (
    NOT_STOPPED,
    STOP_LENGTH,
    StopTable,
    empty_window,
    push_window,
    stop_reason_after,
)
from aepo_jax.sampling.token_distribution import draw_tokens, top_logprobs

Forward = Callable[..., tuple[jax.Array, object]]


def forward_block(
    forward: Forward, params: object, arrays: DecodeArrays, tokens: jax.Array, token_valid: jax.Array
) -> DecodeArrays:
    """Writes a right-aligned block of tokens into every row's cache (prefill, append, one decode step).

    Args:
      forward: the model's cached forward.
      params: model parameters (nnx state).
      arrays: the decode arrays; the block goes to slots [index, index + T).
      tokens: int32[B, T] ids; rows with fewer real tokens are padded on the left.
      token_valid: bool[B, T] which block entries are real tokens.

    Returns:
      Updated arrays; a row's last_logits changes only if it received a token.
    """
    cache = arrays.cache
    first_slot = cache.index
    slot_valid = jax.lax.dynamic_update_slice(arrays.slot_valid, token_valid, (jnp.int32(0), first_slot))  # [B, S]
    offsets = jnp.cumsum(token_valid.astype(jnp.int32), axis=1) - 1  # [B, T]
    positions = arrays.next_position[:, None] + jnp.maximum(offsets, 0)  # [B, T]
    # Query t (slot first_slot + t) sees the valid slots up to its own, and always its own slot,
    # so a padding query (which no real query ever attends to) keeps a finite softmax.
    mask = cached_mask(slot_valid, first_slot)
    logits, cache = forward(params, tokens, positions, mask, cache)  # [B, T or 1, V]
    received = jnp.any(token_valid, axis=1)  # [B]
    last_logits = jnp.where(received[:, None], logits[:, -1].astype(jnp.float32), arrays.last_logits)  # [B, V]
    next_position = arrays.next_position + jnp.sum(token_valid, axis=1, dtype=jnp.int32)  # [B]
    return DecodeArrays(cache, slot_valid, next_position, last_logits)


@flax.struct.dataclass
class DecodeOutputs:
    """Per-row outputs of the decode loop, on device."""

    tokens: jax.Array  # int32[B, N]
    logp: jax.Array  # float32[B, N]
    logp_truncated: jax.Array  # float32[B, N]
    entropy: jax.Array  # float32[B, N]
    num_tokens: jax.Array  # int32[B]
    stop_reason: jax.Array  # int32[B]
    stop_sequence_index: jax.Array  # int32[B]
    top_logprobs: jax.Array | None = None  # float32[B, N, k] when asked for (k > 0), else None
    top_ids: jax.Array | None = None  # int32[B, N, k] their token ids


def decode_loop(
    forward: Forward,
    params: object,
    arrays: DecodeArrays,
    row_keys: jax.Array,
    budget: jax.Array,
    stop_table: StopTable,
    *,
    max_steps: int,
    sampling: SamplingParams,
    pad_id: int,
    num_top_logprobs: int = 0,
) -> tuple[DecodeArrays, DecodeOutputs]:
    """Generates up to `max_steps` tokens per row in one `lax.while_loop`.

    Each iteration samples every active row's next token from its
    last_logits, records log-prob and entropy (spec section 1), checks EOS,
    stop sequences and the row's budget, then feeds the token through the
    model, so every returned token is in the cache when the loop exits.
    Finished rows write an invalid slot in lockstep and keep their position
    and last_logits. The loop exits when every row has stopped.

    Args:
      row_keys: one PRNG key per row ([B] typed keys).
      budget: int32[B] tokens allowed per row (0 for padding rows).
      max_steps: static output length N >= max(budget).
      num_top_logprobs: static k; when > 0 each token also gets the k largest
        log-probs of the distribution it was drawn from, and their ids
        (`top_logprobs`). 0 (default) adds nothing to the program.
    """
    batch = budget.shape[0]
    window = empty_window(batch, stop_table)
    reason = jnp.where(budget <= 0, STOP_LENGTH, NOT_STOPPED).astype(jnp.int32)  # [B]
    zeros_f = jnp.zeros((batch, max_steps), jnp.float32)
    outputs = DecodeOutputs(
        tokens=jnp.full((batch, max_steps), pad_id, jnp.int32),
        logp=zeros_f,
        logp_truncated=zeros_f,
        entropy=zeros_f,
        num_tokens=jnp.zeros((batch,), jnp.int32),
        stop_reason=reason,
        stop_sequence_index=jnp.full((batch,), -1, jnp.int32),
    )
    k = num_top_logprobs
    if k > 0:
        outputs = outputs.replace(top_logprobs=jnp.zeros((batch, max_steps, k), jnp.float32),
                                  top_ids=jnp.zeros((batch, max_steps, k), jnp.int32))

    def write_column(table: jax.Array, column: jax.Array, step: jax.Array) -> jax.Array:
        return jax.lax.dynamic_update_slice(table, column[:, None], (jnp.int32(0), step))

    def keep_going(carry):
        step, _, _, out = carry
        return (step < max_steps) & jnp.any(out.stop_reason == NOT_STOPPED)

    def one_step(carry):
        step, arrays, window, out = carry
        active = out.stop_reason == NOT_STOPPED  # [B]
        step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, step)
        tokens, logp, logp_trunc, entropy = draw_tokens(arrays.last_logits, step_keys, sampling)
        tokens = jnp.where(active, tokens, pad_id)  # [B]
        num_tokens = out.num_tokens + active.astype(jnp.int32)
        window = jnp.where(active[:, None], push_window(window, tokens), window)  # [B, L]
        new_reason, new_seq = stop_reason_after(tokens, window, num_tokens, budget, stop_table)
        out = DecodeOutputs(
            tokens=write_column(out.tokens, tokens, step),
            logp=write_column(out.logp, jnp.where(active, logp, 0.0), step),
            logp_truncated=write_column(out.logp_truncated, jnp.where(active, logp_trunc, 0.0), step),
            entropy=write_column(out.entropy, jnp.where(active, entropy, 0.0), step),
            num_tokens=num_tokens,
            stop_reason=jnp.where(active, new_reason, out.stop_reason),
            stop_sequence_index=jnp.where(active, new_seq, out.stop_sequence_index),
            top_logprobs=out.top_logprobs,
            top_ids=out.top_ids,
        )
        if k > 0:
            zero = jnp.int32(0)
            values, ids = top_logprobs(arrays.last_logits, sampling.temperature, k)  # [B, k] each
            out = out.replace(
                top_logprobs=jax.lax.dynamic_update_slice(
                    out.top_logprobs, jnp.where(active[:, None], values, 0.0)[:, None], (zero, step, zero)),
                top_ids=jax.lax.dynamic_update_slice(
                    out.top_ids, jnp.where(active[:, None], ids, 0)[:, None], (zero, step, zero)),
            )
        arrays = forward_block(forward, params, arrays, tokens[:, None], active[:, None])
        return step + 1, arrays, window, out

    _, arrays, _, outputs = jax.lax.while_loop(keep_going, one_step, (jnp.int32(0), arrays, window, outputs))
    return arrays, outputs


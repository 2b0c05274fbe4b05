"""The pure functions the Sampler jits: block forward (prefill/append), decode loop, cache reshaping.

`forward(params, tokens, positions, mask, cache, write_slots) -> (logits, cache)`
is the model's cached forward for ragged rows (docs/interfaces.md): token t of
row b is written at slot `write_slots[b, t]` (slots past the cache are padding,
not written) and `mask` is the block's `AttentionMask` over the first `span`
slots (`models.attention_mask.cached_mask`), all that attention reads. Only
the last position's logits are read, so `logits` may be [B, T, V] or just
[B, 1, V] (the model's `last_logits_only`).
"""

from __future__ import annotations

from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp

from aepo_jax.models.attention_mask import cached_mask
from aepo_jax.models.lm_head import (
    TokenScores,
    head_token_scores,
    project_to_vocab,
    scores_from_logits,
)
from aepo_jax.sampling.params import SamplingParams
from aepo_jax.sampling.state import DecodeArrays
from aepo_jax.sampling.stopping import (
    NOT_STOPPED,
    STOP_LENGTH,
    StopTable,
    empty_text_window,
    empty_window,
    push_text_window,
    push_window,
    stop_reason_after,
)
from aepo_jax.sampling.token_distribution import (
    draw_tokens_with,
    row_uniforms,
    top_logprobs,
)

Forward = Callable[..., tuple[jax.Array, object]]


def forward_block(
    forward: Forward, params: object, arrays: DecodeArrays, tokens: jax.Array, token_valid: jax.Array,
    span: int | None = None,
) -> DecodeArrays:
    """Writes a right-aligned block of tokens into each row's cache at the row's own cursor (prefill,
    append, one decode step).

    Args:
      forward: the model's cached forward (module docstring).
      params: model parameters (nnx state).
      arrays: the decode arrays; row b's n_b real tokens go to slots [cursor[b], cursor[b] + n_b).
      tokens: int32[B, T] ids; rows with fewer real tokens are padded on the left.
      token_valid: bool[B, T] which block entries are real tokens.
      span: static number of leading slots attention reads (default: all); every receiving row's
        cursor + n_b must be <= span, which the Sampler guarantees (a row that receives nothing may
        be longer: it writes nothing and keeps its last_logits).

    Returns:
      Updated arrays; a row's last_logits, position and cursor change only if it received a token.
    """
    count, write_slots, slot_valid, positions, mask = _block_inputs(arrays, tokens, token_valid, span)
    logits, cache = forward(params, tokens, positions, mask, arrays.cache, write_slots)  # [B, T or 1, V]
    return _after_block(arrays, cache, slot_valid, count, logits[:, -1])


def scored_block(
    forward_hidden: Callable[..., tuple[jax.Array, jax.Array, object]], params: object, arrays: DecodeArrays,
    tokens: jax.Array, token_valid: jax.Array, span: int | None, temperature: float,
) -> tuple[DecodeArrays, TokenScores]:
    """`forward_block` that also scores every real block token under the distribution the row would
    have sampled it from at `temperature` (teacher forcing: forced or appended tokens get the
    log-prob and entropy a sampled token would have had).

    `forward_hidden` is the cached forward returning final hidden states `[B, T, D]`, the LM
    head `[D, V]` and the cache. Returns the arrays and `TokenScores` of `[B, T]` (zero at padding).
    """
    count, write_slots, slot_valid, positions, mask = _block_inputs(arrays, tokens, token_valid, span)
    hidden, head, cache = forward_hidden(params, tokens, positions, mask, arrays.cache, write_slots)  # [B, T, D]
    block = tokens.shape[1]
    # Token t is predicted at position t - 1, except a row's first real token (position T - n_b),
    # which the logits the row ended its previous call with predict.
    after = head_token_scores(hidden[:, :-1], head, tokens[:, 1:], dtype=hidden.dtype,
                              temperature=temperature)  # [B, T-1] each
    first_index = (block - count)[:, None]  # [B, 1]
    first_token = jnp.take_along_axis(tokens, jnp.minimum(first_index, block - 1), axis=1)  # [B, 1]
    first = scores_from_logits(arrays.last_logits[:, None], first_token, temperature)  # [B, 1] each
    column = jnp.arange(block, dtype=jnp.int32)[None, :]  # [1, T]

    def assemble(first_score: jax.Array, later: jax.Array) -> jax.Array:
        shifted = jnp.concatenate([jnp.zeros_like(later[:, :1]), later], axis=1)  # [B, T]: position t scores token t
        score = jnp.where(column == first_index, first_score, shifted)
        return jnp.where(token_valid, score, jnp.zeros_like(score))

    scores = TokenScores(*(assemble(f, a) for f, a in zip(first, after, strict=True)))
    last = project_to_vocab(hidden[:, -1:], head, hidden.dtype)[:, 0]  # [B, V]
    return _after_block(arrays, cache, slot_valid, count, last), scores


def _block_inputs(arrays: DecodeArrays, tokens: jax.Array, token_valid: jax.Array, span: int | None):
    """Per row: real-token count, each entry's slot, the new slot_valid, positions and the block's mask."""
    n_slots = arrays.slot_valid.shape[1]
    span = n_slots if span is None else span
    block = tokens.shape[1]
    count = jnp.sum(token_valid, axis=1, dtype=jnp.int32)  # [B]
    offsets = jnp.cumsum(token_valid.astype(jnp.int32), axis=1) - 1  # [B, T]
    # Padding entries get slot n_slots: out of range, so neither the cache nor slot_valid is written.
    write_slots = jnp.where(token_valid, arrays.cursor[:, None] + offsets, n_slots)  # [B, T]
    rows = jnp.broadcast_to(jnp.arange(tokens.shape[0], dtype=jnp.int32)[:, None], write_slots.shape)
    slot_valid = arrays.slot_valid.at[rows, write_slots].set(True, mode="drop")  # [B, S]
    positions = arrays.next_position[:, None] + jnp.maximum(offsets, 0)  # [B, T]
    # Real query t of row b sits at slot cursor[b] + t - (T - n_b) and sees the valid slots up to its own;
    # a padding query (which no real query ever attends to) sees only earlier slots, so its softmax stays finite.
    mask = cached_mask(slot_valid[:, :span], arrays.cursor - (block - count))
    return count, write_slots, slot_valid, positions, mask


def _after_block(arrays: DecodeArrays, cache: object, slot_valid: jax.Array, count: jax.Array,
                 logits: jax.Array) -> DecodeArrays:
    """The arrays after a block: rows that received tokens take the block's last logits `[B, V]`."""
    received = count > 0  # [B]
    last_logits = jnp.where(received[:, None], logits.astype(jnp.float32), arrays.last_logits)  # [B, V]
    return DecodeArrays(cache, slot_valid, arrays.next_position + count, last_logits, arrays.cursor + count)


@flax.struct.dataclass
class DecodeProgress:
    """Per-row state of a generate call that carries from one decode window to the next."""

    step: jax.Array  # int32[]: steps taken so far (the PRNG stream of step s is fold_in(row key, s))
    window: jax.Array  # int32[B, L]: last tokens, for stop sequences
    text_window: jax.Array  # int32[B, W]: last generated bytes, for stop strings (W = 0 without them)
    num_tokens: jax.Array  # int32[B]
    stop_reason: jax.Array  # int32[B]
    stop_sequence_index: jax.Array  # int32[B]


def start_progress(budget: jax.Array, stop_table: StopTable) -> DecodeProgress:
    """The progress of a generate call before its first step (rows with no budget already stopped)."""
    batch = budget.shape[0]
    return DecodeProgress(
        step=jnp.zeros((), jnp.int32),
        window=empty_window(batch, stop_table),
        text_window=empty_text_window(batch, stop_table),
        num_tokens=jnp.zeros((batch,), jnp.int32),
        stop_reason=jnp.where(budget <= 0, STOP_LENGTH, NOT_STOPPED).astype(jnp.int32),
        stop_sequence_index=jnp.full((batch,), -1, jnp.int32),
    )


@flax.struct.dataclass
class DecodeOutputs:
    """Per-row outputs of one decode window, on device (column j = step `progress.step + j`)."""

    tokens: jax.Array  # int32[B, W]
    logp: jax.Array  # float32[B, W]
    logp_truncated: jax.Array  # float32[B, W]
    entropy: jax.Array  # float32[B, W]
    top_logprobs: jax.Array | None = None  # float32[B, W, k] when asked for (k > 0), else None
    top_ids: jax.Array | None = None  # int32[B, W, k] their token ids


def decode_loop(
    forward: Forward,
    params: object,
    arrays: DecodeArrays,
    row_keys: jax.Array,
    budget: jax.Array,
    stop_table: StopTable,
    progress: DecodeProgress,
    *,
    max_steps: int,
    sampling: SamplingParams,
    pad_id: int,
    num_top_logprobs: int = 0,
    span: int | None = None,
) -> tuple[DecodeArrays, DecodeOutputs, DecodeProgress]:
    """Generates up to `max_steps` more tokens per row (one window) in one `lax.while_loop`.

    Each iteration samples every active row's next token from its
    last_logits, records log-prob and entropy (spec section 1), checks EOS,
    stop sequences and the row's budget, then feeds the token through the
    model, so every returned token is in the cache when the loop exits.
    Stopped rows write nothing and keep their cursor, position and
    last_logits. The loop exits when every row has stopped or the window is full;
    `progress` carries what the next window needs.

    Args:
      row_keys: one PRNG key per row ([B] typed keys).
      budget: int32[B] tokens allowed per row in the whole generate call (0 for padding rows).
      progress: where the call stands (`start_progress` for its first window).
      max_steps: static window length W.
      num_top_logprobs: static k; when > 0 each token also gets the k largest
        full-vocabulary log-probs at the sampling temperature (before top-k / top-p
        truncation, like `logp`), and their ids (`top_logprobs`). 0 (default) adds
        nothing to the program.
      span: static number of leading cache slots attention reads; it must hold every
        row's cursor plus W, except for rows with no budget (they write nothing).
    """
    batch = budget.shape[0]
    zeros_f = jnp.zeros((batch, max_steps), jnp.float32)
    outputs = DecodeOutputs(
        tokens=jnp.full((batch, max_steps), pad_id, jnp.int32),
        logp=zeros_f,
        logp_truncated=zeros_f,
        entropy=zeros_f,
    )
    k = num_top_logprobs
    if k > 0:
        outputs = outputs.replace(top_logprobs=jnp.zeros((batch, max_steps, k), jnp.float32),
                                  top_ids=jnp.zeros((batch, max_steps, k), jnp.int32))
    first_step = progress.step
    # Every step's uniforms in one vectorised draw before the loop ([W, B]; step s of row b uses
    # fold_in(row key, s), as a per-step draw would), so the PRNG's rounds do not run every step.
    window_uniforms = None if sampling.greedy else jax.vmap(
        lambda s: row_uniforms(jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, s))
    )(first_step + jnp.arange(max_steps, dtype=jnp.int32))

    def write_column(table: jax.Array, column: jax.Array, step: jax.Array) -> jax.Array:
        return jax.lax.dynamic_update_slice(table, column[:, None], (jnp.int32(0), step))

    def keep_going(carry):
        step, _, prog, _ = carry
        return (step < max_steps) & jnp.any(prog.stop_reason == NOT_STOPPED)

    def one_step(carry):
        step, arrays, prog, out = carry
        active = prog.stop_reason == NOT_STOPPED  # [B]
        uniforms = None if window_uniforms is None else window_uniforms[step]  # [B]
        tokens, logp, logp_trunc, entropy = draw_tokens_with(arrays.last_logits, uniforms, sampling)
        tokens = jnp.where(active, tokens, pad_id)  # [B]
        num_tokens = prog.num_tokens + active.astype(jnp.int32)
        window = jnp.where(active[:, None], push_window(prog.window, tokens), prog.window)  # [B, L]
        text_window = jnp.where(active[:, None], push_text_window(prog.text_window, tokens, stop_table),
                                prog.text_window)  # [B, W]
        new_reason, new_seq = stop_reason_after(tokens, window, num_tokens, budget, stop_table, text_window)
        prog = DecodeProgress(
            step=prog.step + 1,
            window=window,
            text_window=text_window,
            num_tokens=num_tokens,
            stop_reason=jnp.where(active, new_reason, prog.stop_reason),
            stop_sequence_index=jnp.where(active, new_seq, prog.stop_sequence_index),
        )
        out = out.replace(
            tokens=write_column(out.tokens, tokens, step),
            logp=write_column(out.logp, jnp.where(active, logp, 0.0), step),
            logp_truncated=write_column(out.logp_truncated, jnp.where(active, logp_trunc, 0.0), step),
            entropy=write_column(out.entropy, jnp.where(active, entropy, 0.0), step),
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
        arrays = forward_block(forward, params, arrays, tokens[:, None], active[:, None], span)
        return step + 1, arrays, prog, out

    _, arrays, progress, outputs = jax.lax.while_loop(
        keep_going, one_step, (jnp.int32(0), arrays, progress, outputs))
    return arrays, outputs, progress

"""The LM head: hidden states to logits, and per-token log-probs and entropy without `[B, T, V]` logits.

`head_token_scores` projects final hidden states `[B, T, D]` to the
vocabulary `chunk_size` positions at a time inside a `lax.map` whose body is
`jax.checkpoint`-ed: the forward pass keeps only `[B, chunk, V]` float32
logits alive, and the backward pass recomputes each chunk's logits from the
hidden states instead of storing them. At Qwen3-14B's vocabulary (151,936)
and T = 8192 this is the difference between ~4.6 GiB and ~37 MiB of float32
logits per sequence. The numbers are the same as projecting all of T at once
(spec §1: log-probs and entropies in float32 over the full vocabulary).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from aepo_jax.models.attention_mask import AttentionMask


def project_to_vocab(hidden: jax.Array, head: jax.Array, dtype: Any) -> jax.Array:
    """Float32 logits `[B, t, V]` of hidden states `[B, t, D]` through `head` `[D, V]` (matmul in `dtype`)."""
    logits = jnp.einsum("btd,dv->btv", hidden.astype(dtype), head.astype(dtype), preferred_element_type=jnp.float32)
    return logits.astype(jnp.float32)


class TokenScores(NamedTuple):
    """Float32 `[B, T]` scores of target tokens under softmax(logits / temperature)."""

    logp: jax.Array  # log p(target)
    entropy: jax.Array  # full-vocabulary entropy of the distribution
    log_norm: jax.Array  # logsumexp(logits / temperature)
    is_argmax: jax.Array  # bool: the target is the distribution's argmax (first maximum)


def scores_from_logits(logits: jax.Array, targets: jax.Array, temperature: float) -> TokenScores:
    """`[B, t, V]` float32 logits and `[B, t]` targets -> `TokenScores` of `[B, t]` (at `temperature`)."""
    scaled = logits / temperature  # [B, t, V]
    log_norm = jax.nn.logsumexp(scaled, axis=-1)  # [B, t]
    target_logit = jnp.take_along_axis(scaled, targets[..., None], axis=-1)[..., 0]  # [B, t]
    probs = jnp.exp(scaled - log_norm[..., None])  # [B, t, V]
    entropy = log_norm - jnp.sum(probs * scaled, axis=-1)  # [B, t]
    is_argmax = jnp.argmax(logits, axis=-1) == targets
    return TokenScores(target_logit - log_norm, entropy, log_norm, jax.lax.stop_gradient(is_argmax))


def head_token_scores(
    hidden: jax.Array,
    head: jax.Array,
    targets: jax.Array,
    *,
    dtype: Any,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> TokenScores:
    """Scores of `targets` under the logits `hidden @ head`, computed `chunk_size` positions at a time.

    Args:
      hidden: `[B, T, D]` final-normed hidden states (`Decoder(..., return_hidden=True)`).
      head: `[D, V]` output projection (`Decoder.head()`).
      targets: int `[B, T]`; position t scores `targets[:, t]` (shift before calling
        for next-token prediction).
      dtype: matmul dtype of the projection (the model's compute dtype).
      temperature: sampling temperature, > 0.
      chunk_size: positions per chunk; None projects all of T at once. T is
        padded up to a multiple of the chunk (padded positions are dropped).

    Returns:
      `TokenScores`, each `[B, T]`; gradients flow to `hidden` and `head`.
    """
    if hidden.ndim != 3 or head.ndim != 2 or head.shape[0] != hidden.shape[-1]:
        raise ValueError(f"hidden must be [B, T, D] and head [D, V], got {hidden.shape} and {head.shape}")
    if targets.shape != hidden.shape[:2]:
        raise ValueError(f"targets must be [B, T] = {hidden.shape[:2]}, got {targets.shape}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size <= 0):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    targets = targets.astype(jnp.int32)
    batch, length = targets.shape
    if chunk_size is None or chunk_size >= length:
        return scores_from_logits(project_to_vocab(hidden, head, dtype), targets, temperature)

    n_chunks = -(-length // chunk_size)
    pad = n_chunks * chunk_size - length
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))  # [B, n*c, D]
    targets = jnp.pad(targets, ((0, 0), (0, pad)))  # [B, n*c]

    @jax.checkpoint
    def one_chunk(start: jax.Array) -> TokenScores:
        chunk_hidden = jax.lax.dynamic_slice_in_dim(hidden, start, chunk_size, axis=1)  # [B, c, D]
        chunk_targets = jax.lax.dynamic_slice_in_dim(targets, start, chunk_size, axis=1)  # [B, c]
        return scores_from_logits(project_to_vocab(chunk_hidden, head, dtype), chunk_targets, temperature)

    starts = jnp.arange(n_chunks, dtype=jnp.int32) * chunk_size
    scores = jax.lax.map(one_chunk, starts)  # each [n, B, c]
    return TokenScores(*(jnp.moveaxis(s, 0, 1).reshape(batch, -1)[:, :length] for s in scores))


def shift_right(x: jax.Array) -> jax.Array:
    """[B, T-1] values of tokens 1..T-1 -> [B, T] with 0 (False) for token 0."""
    return jnp.concatenate([jnp.zeros((x.shape[0], 1), x.dtype), x], axis=1)


def next_token_scores(
    model: Any,
    input_ids: jax.Array,
    positions: jax.Array,
    attention_mask: AttentionMask | jax.Array,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> TokenScores:
    """Scores of every token of `input_ids` `[B, T]` given the tokens before it (column 0 is 0).

    Token t is scored by the model's distribution at position t - 1; the
    `[B, T, V]` logits exist only chunk by chunk (`head_token_scores`).
    """
    hidden = model(input_ids, positions=positions, attention_mask=attention_mask, return_hidden=True)  # [B, T, D]
    scores = head_token_scores(hidden[:, :-1], model.head(), input_ids[:, 1:], dtype=model.config.dtype,
                               temperature=temperature, chunk_size=chunk_size)  # [B, T-1] each
    return TokenScores(*(shift_right(s) for s in scores))

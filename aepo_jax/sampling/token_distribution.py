"""Drawing one token per row and scoring it: log-prob and entropy (spec section 1).

Everything is computed from the same float32 logits the token is drawn from:
`logp` and `entropy` under the full-vocabulary softmax at temperature T, and
`logp_truncated` under the top-k / top-p distribution that was actually
sampled. No sort or top_k runs unless top-k or top-p is active.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from aepo_jax.sampling.params import SamplingParams


def truncate_logits(scaled: jax.Array, params: SamplingParams) -> jax.Array:
    """Sets logits outside the top-k / top-p set to -inf.

    Top-k runs first, then top-p on the distribution renormalised over the
    top-k set (the usual order). Ties at the threshold are all kept.

    Args:
      scaled: float32[B, V] logits already divided by the temperature.
      params: which truncations are active.

    Returns:
      float32[B, V] logits with removed tokens at -inf.
    """
    neg_inf = jnp.array(-jnp.inf, scaled.dtype)
    vocab = scaled.shape[-1]
    if params.top_k > 0 and params.top_k < vocab:
        kth = jax.lax.top_k(scaled, params.top_k)[0][:, -1:]  # [B, 1]
        scaled = jnp.where(scaled < kth, neg_inf, scaled)
    if params.top_p < 1.0:
        sorted_desc = -jnp.sort(-scaled, axis=-1)  # [B, V]
        probs = jax.nn.softmax(sorted_desc, axis=-1)  # [B, V]
        mass_before = jnp.cumsum(probs, axis=-1) - probs  # [B, V]
        # keep token i while the mass of strictly more likely tokens is below p
        keep = mass_before < params.top_p  # [B, V], always keeps the first
        threshold = jnp.min(jnp.where(keep, sorted_desc, jnp.inf), axis=-1, keepdims=True)  # [B, 1]
        scaled = jnp.where(scaled < threshold, neg_inf, scaled)
    return scaled


def full_logp_and_entropy(scaled: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Log-softmax and entropy over the full vocabulary.

    Args:
      scaled: float32[B, V] logits divided by the temperature.

    Returns:
      (log_probs float32[B, V], entropy float32[B]) with natural log.
    """
    log_probs = jax.nn.log_softmax(scaled, axis=-1)  # [B, V]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)  # [B]
    return log_probs, entropy


def draw_tokens(
    logits: jax.Array, row_keys: jax.Array, params: SamplingParams
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Draws one token per row and returns it with its scores.

    Args:
      logits: float[B, V] next-token logits (cast to float32 here).
      row_keys: one PRNG key per row, [B] (typed keys) or uint32[B, 2]; unused when greedy.
      params: temperature, top-k, top-p, greedy.

    Returns:
      tokens int32[B]; logp float32[B] (full vocabulary at temperature T, the
      one the trainer recomputes and should use as `logp_old`); logp_truncated
      float32[B] (under the top-k / top-p distribution actually sampled, equal
      to logp when no truncation is active); entropy float32[B] (full
      vocabulary at temperature T).
    """
    scaled = logits.astype(jnp.float32) / jnp.float32(params.temperature)  # [B, V]
    log_probs, entropy = full_logp_and_entropy(scaled)
    truncated = truncate_logits(scaled, params) if params.truncates else scaled  # [B, V]
    if params.greedy:
        tokens = jnp.argmax(scaled, axis=-1).astype(jnp.int32)  # [B]
    else:
        tokens = jax.vmap(lambda key, row: jax.random.categorical(key, row))(row_keys, truncated)
        tokens = tokens.astype(jnp.int32)  # [B]
    logp = jnp.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0]  # [B]
    if params.truncates:
        trunc_log_probs = jax.nn.log_softmax(truncated, axis=-1)  # [B, V]
        logp_truncated = jnp.take_along_axis(trunc_log_probs, tokens[:, None], axis=-1)[:, 0]
    else:
        logp_truncated = logp
    return tokens, logp, logp_truncated, entropy

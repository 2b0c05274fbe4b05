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


CDF_BLOCK = 64  # vocabulary entries per block of the two-level inverse CDF


def row_uniforms(row_keys: jax.Array) -> jax.Array:
    """float32[B] in [0, 1): the one uniform per row that a token draw consumes, from each row's key."""
    return jax.vmap(lambda key: jax.random.uniform(key, dtype=jnp.float32))(row_keys)


def _inverse_cdf_sample(weights: jax.Array, uniform: jax.Array) -> jax.Array:
    """Draws index i with probability weights[i] / sum(weights), one uniform per row.

    Inverse-CDF sampling needs B random numbers instead of the B x V of
    Gumbel-max, which on CPU costs more than the model's lm head. The CDF is
    searched in two levels (blocks of `CDF_BLOCK` entries, then within the chosen
    block), because a cumulative sum over the whole vocabulary runs as a slow
    windowed reduction on CPU (0.6 ms for 32 x 4096, as long as the lm head).
    With t = (1 - u) * total in (0, total], the chosen block j and entry i satisfy
    cdf[j - 1] < t <= cdf[j] and inner[i - 1] < t - cdf[j - 1] <= inner[i], so a
    zero-weight (truncated) token is never drawn; if rounding puts the remainder
    past the block's own sum, its last positive entry is taken.

    Args:
      weights: float32[B, V] non-negative, at least one positive per row.
      uniform: float32[B] in [0, 1) (`row_uniforms`).

    Returns:
      int32[B].
    """
    batch, vocab = weights.shape
    n_blocks = -(-vocab // CDF_BLOCK)
    blocks = jnp.pad(weights, ((0, 0), (0, n_blocks * CDF_BLOCK - vocab))).reshape(batch, n_blocks, CDF_BLOCK)
    block_cdf = jnp.cumsum(jnp.sum(blocks, axis=-1), axis=-1)  # [B, nb]
    target = (1.0 - uniform) * block_cdf[:, -1]  # [B] in (0, total]
    block = jnp.minimum(jnp.sum(block_cdf < target[:, None], axis=-1, dtype=jnp.int32), n_blocks - 1)  # [B]
    before = jnp.where(block > 0, jnp.take_along_axis(block_cdf, jnp.maximum(block - 1, 0)[:, None], axis=-1)[:, 0],
                       0.0)  # [B]
    chosen = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]  # [B, CDF_BLOCK]
    inner = jnp.cumsum(chosen, axis=-1)  # [B, CDF_BLOCK]
    entry = jnp.sum(inner < (target - before)[:, None], axis=-1, dtype=jnp.int32)  # [B]
    last_positive = CDF_BLOCK - 1 - jnp.argmax((chosen > 0)[:, ::-1], axis=-1).astype(jnp.int32)  # [B]
    return block * CDF_BLOCK + jnp.minimum(entry, last_positive)


def draw_tokens(
    logits: jax.Array, row_keys: jax.Array, params: SamplingParams
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """`draw_tokens_with` the rows' uniforms drawn from `row_keys` ([B] PRNG keys; unused when greedy)."""
    uniforms = None if params.greedy else row_uniforms(row_keys)
    return draw_tokens_with(logits, uniforms, params)


def draw_tokens_with(
    logits: jax.Array, uniforms: jax.Array | None, params: SamplingParams
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Draws one token per row from its uniform and returns it with its scores.

    Taking uniforms rather than keys lets a decode window draw all its steps' uniforms in one
    vectorised call before its loop, instead of running the PRNG's rounds every step.

    One exp pass over the vocabulary gives the softmax normaliser, the
    entropy H = log Z - sum(e * (s - m)) / Z, and the weights sampled from.

    Args:
      logits: float[B, V] next-token logits (cast to float32 here).
      uniforms: float32[B] in [0, 1), one per row (`row_uniforms`); unused (may be None) when greedy.
      params: temperature, top-k, top-p, greedy.

    Returns:
      tokens int32[B]; logp float32[B] (full vocabulary at temperature T, the
      one the trainer recomputes and should use as `logp_old`); logp_truncated
      float32[B] (under the distribution actually sampled: the top-k / top-p
      one, equal to logp when no truncation is active, and 0 when greedy);
      entropy float32[B] (full
      vocabulary at temperature T, natural log).
    """
    scaled = logits.astype(jnp.float32) / jnp.float32(params.temperature)  # [B, V]
    row_max = jnp.max(scaled, axis=-1, keepdims=True)  # [B, 1]
    shifted = scaled - row_max  # [B, V], <= 0
    weights = jnp.exp(shifted)  # [B, V]
    normaliser = jnp.sum(weights, axis=-1)  # [B]
    log_normaliser = jnp.log(normaliser)  # [B]
    entropy = log_normaliser - jnp.sum(weights * shifted, axis=-1) / normaliser  # [B]
    if params.truncates:
        truncated = truncate_logits(scaled, params)  # [B, V], -inf outside the kept set
        sample_weights = jnp.exp(truncated - row_max)  # [B, V], 0 outside; the max is always kept
    else:
        sample_weights = weights
    if params.greedy:
        tokens = jnp.argmax(scaled, axis=-1).astype(jnp.int32)  # [B]
    else:
        tokens = _inverse_cdf_sample(sample_weights, uniforms)  # [B]
    picked = jnp.take_along_axis(shifted, tokens[:, None], axis=-1)[:, 0]  # [B]
    logp = picked - log_normaliser
    if params.greedy:  # drawn from a point mass on the argmax, whatever the truncation
        logp_truncated = jnp.zeros_like(logp)
    elif params.truncates:
        logp_truncated = picked - jnp.log(jnp.sum(sample_weights, axis=-1))
    else:
        logp_truncated = logp
    return tokens, logp, logp_truncated, entropy


def top_logprobs(logits: jax.Array, temperature: float, k: int) -> tuple[jax.Array, jax.Array]:
    """The k largest full-vocabulary log-probs at temperature T, and their token ids.

    What vLLM's `logprobs=k` reports per generated token, which the released
    AEPO code's `top10_sum` entropy reads (spec section 1). Only run when a
    caller asks for it (`Sampler.generate(..., top_logprobs=k)`).

    Args:
      logits: float[B, V] the logits the token was drawn from (cast to float32 here).
      temperature: the sampling temperature T.
      k: static number of log-probs per row, 1 <= k <= V.

    Returns:
      (log-probs float32[B, k] in descending order, ids int32[B, k]).
    """
    scaled = logits.astype(jnp.float32) / jnp.float32(temperature)  # [B, V]
    values, ids = jax.lax.top_k(scaled, k)  # [B, k], [B, k]
    return values - jax.nn.logsumexp(scaled, axis=-1, keepdims=True), ids.astype(jnp.int32)

"""Per-token policy-gradient surrogates, one function per row of spec §3.1.

Each function returns the surrogate `s` to *maximise* (the loss is `-s`) and
boolean region indicators for metrics. The surrogate is written so that
`d s / d logp = F * A` with `F` exactly the spec's table:

| algorithm | F when r > 1+eh, A > 0 | F when r < 1-el, A < 0 | F otherwise |
|-----------|------------------------|------------------------|-------------|
| ppo       | 0                      | 0                      | r           |
| gppo      | 1+eh                   | 1-el                   | r           |
| aepo      | 1+eh                   | 0                      | r           |
| cispo     | 1+eh                   | 1-el                   | r           |

plus the dual clip (all but CISPO): `F = 0` where `r > c` and `A < 0`.
`r / sg(r)` is written as `exp(log_r - sg(log_r))`: value exactly 1,
derivative exactly `d log_r`, and no inf/inf when `r` overflows.

The ratio itself is `bounded_ratio(log_r) = exp(min(log_r, LOG_RATIO_MAX))`
(`LOG_RATIO_MAX = 20`, verl's bound). Where `log_r <= 20` the `min` is the
identity with derivative exactly 1, so value and gradient are unchanged; that
covers every clip region of the table, whose bounds (`1 +- e`, `c`; checked in
`LossConfig`) lie below `e^20 ~ 4.9e8`. Above it the ratio is held at `e^20`
with zero derivative: a branch that a clip or dual clip selects there keeps
its table weight (0, or `1+eh` through `r / sg(r)`, which is built from the
unbounded `log_r`), and an unselected `r A` branch contributes `0 * A`
instead of `0 * inf = NaN` (a float32 `r` overflows once `log_r > 88`). The
one weight that changes is that of an unclipped branch with `r > e^20` (PPO,
GPPO and AEPO with `A < 0` and no dual clip: 0 instead of `r`; GSPO's
`s_i`: `e^20` instead of `s_i`). The lower side needs no bound: `r`
underflows to 0, never to NaN, and CISPO's clip region reaches down to 0.

All inputs are `[B, T]` arrays already cast to a float type of at least 32
bits; `mask` is the float 0/1 policy-token mask. Tokens with `mask == 0` get
log-ratio 0 and surrogate 0 through `jnp.where`, so garbage there cannot leak NaN values or
gradients.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

sg = jax.lax.stop_gradient
LOG_RATIO_MAX = 20.0  # exp(20) ~ 4.9e8: far above every clip bound, far below float32 overflow (exp(88))


class SurrogateOutput(NamedTuple):
    """Per-token surrogate and the region indicators used for metrics.

    Attributes:
      surrogate: `[B, T]` value `s` to maximise (loss is `-s`), zero where masked.
      ratio: `[B, T]` importance ratio (token ratio, or the sequence ratio for GSPO).
      clipped_upper: `[B, T]` bool, ratio above `1 + eh` where PPO zeroes the
        gradient (A > 0; any sign for CISPO, whose weight ignores A).
      clipped_lower: `[B, T]` bool, ratio below `1 - el` (A < 0; any sign for CISPO).
      clipped_dual: `[B, T]` bool, dual clip active (`r > c`, `A < 0`).
      preserved: `[B, T]` bool, tokens whose gradient PPO would zero but this
        surrogate keeps (AEPO's preserved-gradient set).
    """

    surrogate: jax.Array
    ratio: jax.Array
    clipped_upper: jax.Array
    clipped_lower: jax.Array
    clipped_dual: jax.Array
    preserved: jax.Array


def masked(values: jax.Array, mask: jax.Array) -> jax.Array:
    """`values` on policy tokens, exactly 0 elsewhere even where they are NaN or inf (`NaN * 0` is NaN)."""
    return jnp.where(mask > 0, values, jnp.zeros((), values.dtype))


def masked_log_ratio(logp: jax.Array, logp_old: jax.Array, mask: jax.Array) -> jax.Array:
    """`logp - logp_old` on policy tokens, exactly 0 elsewhere. `[B, T]`."""
    return jnp.where(mask > 0, logp - logp_old, 0.0)


def bounded_ratio(log_ratio: jax.Array) -> jax.Array:
    """`exp(min(log_ratio, LOG_RATIO_MAX))`: the importance ratio, finite for any finite log-ratio.

    Value and gradient equal `exp(log_ratio)` wherever `log_ratio <= LOG_RATIO_MAX` (module doc).
    """
    return jnp.exp(jnp.minimum(log_ratio, LOG_RATIO_MAX))


def _apply_dual_clip(
    surrogate: jax.Array, advantages: jax.Array, dual_clip_c: float | None
) -> jax.Array:
    """Spec §3.1 dual clip: for A < 0 bound the surrogate below by `c * A`."""
    if dual_clip_c is None:
        return surrogate
    return jnp.where(advantages < 0, jnp.maximum(surrogate, dual_clip_c * advantages), surrogate)


def _regions(
    ratio: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    clip_low: float,
    clip_high: float,
    dual_clip_c: float | None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """PPO's zero-gradient regions: (upper & A>0, lower & A<0, dual)."""
    valid = mask > 0
    upper = valid & (ratio > 1.0 + clip_high) & (advantages > 0)
    lower = valid & (ratio < 1.0 - clip_low) & (advantages < 0)
    if dual_clip_c is None:
        dual = jnp.zeros_like(valid)
    else:
        dual = valid & (ratio > dual_clip_c) & (advantages < 0)
    return upper, lower, dual


def _check_dual_clip(dual_clip_c: float | None) -> None:
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1 or None, got {dual_clip_c}")


def ppo_surrogate(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    clip_low: float,
    clip_high: float,
    dual_clip_c: float | None,
) -> SurrogateOutput:
    """PPO / GRPO / DAPO / ARPO: `min(r A, clip(r, 1-el, 1+eh) A)` (spec §3.1 row 1)."""
    _check_dual_clip(dual_clip_c)
    ratio = bounded_ratio(masked_log_ratio(logp, logp_old, mask))  # [B, T]
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    s = jnp.minimum(ratio * advantages, clipped * advantages)
    s = _apply_dual_clip(s, advantages, dual_clip_c)
    upper, lower, dual = _regions(ratio, advantages, mask, clip_low, clip_high, dual_clip_c)
    return SurrogateOutput(masked(s, mask), ratio, upper, lower & ~dual, dual, jnp.zeros_like(upper))


def gppo_surrogate(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    clip_low: float,
    clip_high: float,
    dual_clip_c: float | None,
) -> SurrogateOutput:
    """GPPO: `min(r A, clip(r, (1-el) r/sg(r), (1+eh) r/sg(r)) A)` (spec §3.1 row 2).

    Same forward value as PPO; the clipped branches keep a gradient of
    `(1+eh) A` and `(1-el) A` instead of zero.
    """
    _check_dual_clip(dual_clip_c)
    log_ratio = masked_log_ratio(logp, logp_old, mask)  # [B, T]
    ratio = bounded_ratio(log_ratio)
    unit = jnp.exp(log_ratio - sg(log_ratio))  # r / sg(r): value 1, gradient d log r
    clipped = jnp.clip(ratio, (1.0 - clip_low) * unit, (1.0 + clip_high) * unit)
    s = jnp.minimum(ratio * advantages, clipped * advantages)
    s = _apply_dual_clip(s, advantages, dual_clip_c)
    upper, lower, dual = _regions(ratio, advantages, mask, clip_low, clip_high, dual_clip_c)
    lower = lower & ~dual
    return SurrogateOutput(masked(s, mask), ratio, upper, lower, dual, upper | lower)


def aepo_surrogate(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    clip_low: float,
    clip_high: float,
    dual_clip_c: float | None,
) -> SurrogateOutput:
    """AEPO entropy-balanced clip: `min(r A, clip(r, 1-el, (1+eh) r/sg(r)) A)` (spec §3.1 row 3).

    Same forward value as PPO; high-ratio tokens with positive advantage (the
    high-entropy exploratory tokens PPO would silence) keep gradient `(1+eh) A`.
    """
    _check_dual_clip(dual_clip_c)
    log_ratio = masked_log_ratio(logp, logp_old, mask)  # [B, T]
    ratio = bounded_ratio(log_ratio)
    unit = jnp.exp(log_ratio - sg(log_ratio))  # r / sg(r)
    clipped = jnp.clip(ratio, 1.0 - clip_low, (1.0 + clip_high) * unit)
    s = jnp.minimum(ratio * advantages, clipped * advantages)
    s = _apply_dual_clip(s, advantages, dual_clip_c)
    upper, lower, dual = _regions(ratio, advantages, mask, clip_low, clip_high, dual_clip_c)
    return SurrogateOutput(masked(s, mask), ratio, upper, lower & ~dual, dual, upper)


def cispo_surrogate(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    clip_low: float,
    clip_high: float,
    dual_clip_c: float | None,
) -> SurrogateOutput:
    """CISPO: `sg(clip(r, 1-el, 1+eh)) * A * logp` (spec §3.1 row 4).

    The weight `F = clip(r, 1-el, 1+eh)` never depends on the sign of `A`; no
    dual clip. CISPO's `clip_low = 1` (`presets.SURROGATE_CLIPS`) puts the lower bound at 0, which a
    ratio never crosses ("el large" in the spec).
    """
    if dual_clip_c is not None:
        raise ValueError("CISPO takes no dual clip (spec §3.1): pass dual_clip_c=None")
    ratio = bounded_ratio(masked_log_ratio(logp, logp_old, mask))  # [B, T]
    weight = sg(jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high))
    logp_valid = jnp.where(mask > 0, logp, 0.0)
    s = weight * advantages * logp_valid
    valid = mask > 0
    upper = valid & (ratio > 1.0 + clip_high)
    lower = valid & (ratio < 1.0 - clip_low)
    preserved = (upper & (advantages > 0)) | (lower & (advantages < 0))
    return SurrogateOutput(masked(s, mask), ratio, upper, lower, jnp.zeros_like(valid), preserved)


def sequence_log_ratio(logp: jax.Array, logp_old: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO's `log s_i = mean_t (logp - logp_old)` over valid tokens. `[B]`."""
    log_ratio = masked_log_ratio(logp, logp_old, mask)
    count = jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
    return jnp.sum(log_ratio * mask, axis=-1) / count


def gspo_surrogate(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    clip_low: float,
    clip_high: float,
    dual_clip_c: float | None,
) -> SurrogateOutput:
    """GSPO-token (spec §3.1): `min(s_it A, clip(s_it, 1-el, 1+eh) A)`.

    `s_it = sg(s_i) * exp(logp - sg(logp))` with `s_i = exp(mean_t(logp -
    logp_old))`: the value of `s_it` is the sequence ratio `s_i`, and each
    token's gradient flows only through its own `logp`, with weight
    `F = s_i` inside the clip range and `F = 0` where the clip is active.
    """
    _check_dual_clip(dual_clip_c)
    seq_ratio = bounded_ratio(sequence_log_ratio(logp, logp_old, mask))[:, None]  # [B, 1]
    logp_valid = jnp.where(mask > 0, logp, 0.0)
    token_ratio = sg(seq_ratio) * jnp.exp(logp_valid - sg(logp_valid))  # [B, T], value s_i
    clipped = jnp.clip(token_ratio, 1.0 - clip_low, 1.0 + clip_high)
    s = jnp.minimum(token_ratio * advantages, clipped * advantages)
    s = _apply_dual_clip(s, advantages, dual_clip_c)
    ratio = jnp.broadcast_to(seq_ratio, mask.shape)
    upper, lower, dual = _regions(ratio, advantages, mask, clip_low, clip_high, dual_clip_c)
    return SurrogateOutput(masked(s, mask), ratio, upper, lower & ~dual, dual, jnp.zeros_like(upper))


SURROGATES = {
    "ppo": ppo_surrogate,
    "gppo": gppo_surrogate,
    "aepo": aepo_surrogate,
    "cispo": cispo_surrogate,
    "gspo": gspo_surrogate,
}


def get_surrogate(name: str):
    """Look up a surrogate by name; unknown names raise a ValueError listing the known ones."""
    try:
        return SURROGATES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy-loss algorithm {name!r}; known: {sorted(SURROGATES)}"
        ) from None

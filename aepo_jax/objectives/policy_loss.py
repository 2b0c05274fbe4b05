"""The policy-loss entry point: surrogate + aggregation + optional KL and entropy terms.

Spec §3: a pure function of `[B, T]` arrays returning `(loss, metrics)`. The
loss to minimise is `-s` aggregated with `loss_agg`, plus `kl_coef * KL` and
minus `entropy_coef * H` aggregated the same way, so one `(numerator,
denominator)` pair covers the whole loss and micro-batch accumulation stays
exact (see `aggregation`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from aepo_jax.objectives.aggregation import aggregate, check_loss_agg, masked_mean
from aepo_jax.objectives.kl import entropy_bonus, kl_penalty
from aepo_jax.objectives.surrogates import (
    GSPO_DEFAULT_CLIP_HIGH,
    GSPO_DEFAULT_CLIP_LOW,
    get_surrogate,
)


class LossParts(NamedTuple):
    """`loss == numerator / max(denominator, 1)`; numerators add across micro-batches."""

    numerator: jax.Array
    denominator: jax.Array


_ALGORITHM_DEFAULT = "algorithm default"


def _as_float(x: jax.Array, name: str) -> jax.Array:
    """Cast to float32 whatever the input dtype (float64 stays float64, for x64 tests)."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise ValueError(f"{name} must be a real array, got dtype {x.dtype}")
    if jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return x.astype(jnp.float32)


def _check_shapes(arrays: dict[str, jax.Array]) -> None:
    shapes = {name: tuple(a.shape) for name, a in arrays.items() if a is not None}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"policy_loss inputs must all have the same [B, T] shape, got {shapes}")
    for name, shape in shapes.items():
        if len(shape) != 2:
            raise ValueError(f"{name} must be [B, T], got shape {shape}")


def policy_loss(
    algorithm: str,
    *,
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    clip_low: float | None = None,
    clip_high: float | None = None,
    dual_clip_c: float | None | str = _ALGORITHM_DEFAULT,
    loss_agg: str = "token_mean",
    max_len: int | None = None,
    global_denominator: jax.Array | float | None = None,
    return_parts: bool = False,
    logp_ref: jax.Array | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy: jax.Array | None = None,
    entropy_coef: float = 0.0,
):
    """Policy loss of spec §3.1 for one (micro-)batch.

    Args:
      algorithm: surrogate name: "ppo", "gppo", "aepo", "cispo" or "gspo".
      logp: `[B, T]` current-policy log-probs (the only input that carries gradient).
      logp_old: `[B, T]` log-probs under the sampling policy.
      advantages: `[B, T]` per-token advantages.
      mask: `[B, T]` 1 on policy tokens, 0 on prompt / tool-result / padding.
      clip_low, clip_high: `el`, `eh`. `None` takes 0.2 / 0.2, except GSPO
        (3e-4 / 4e-4) and CISPO (lower bound off: 1.0 / 0.28).
      dual_clip_c: dual-clip constant `c`; None disables it. Left out: 3.0,
        except CISPO, which takes none (passing a value for CISPO raises).
      loss_agg: "token_mean", "seq_mean_token_mean" or "seq_mean_token_sum_norm".
      max_len: Dr. GRPO constant for "seq_mean_token_sum_norm" (default `T`).
      global_denominator: full-batch `loss_denominator(mask, loss_agg)` when
        this call sees one micro-batch, for exact gradient accumulation.
      return_parts: also return `LossParts(numerator, denominator)`.
      logp_ref: `[B, T]` reference log-probs; needed when `kl_coef > 0`, and
        logged as `kl_ref` whenever given.
      kl_coef, kl_estimator: KL-to-reference term (spec §3.3).
      entropy: `[B, T]` differentiable current-policy entropy; needed when
        `entropy_coef > 0`, logged as `entropy_mean` whenever given.
      entropy_coef: entropy-bonus coefficient.

    Returns:
      `(loss, metrics)` or, with `return_parts`, `(loss, metrics, parts)`.
      Metrics (scalars, means over valid tokens): `pg_loss`, `clip_frac_upper`,
      `clip_frac_lower`, `clip_frac_dual`, `preserved_grad_frac`,
      `approx_kl_old` (k1 of old to new), `approx_kl_old_k3`, `ratio_mean`,
      and `kl_ref`, `entropy_mean` when those inputs are given.
    """
    surrogate_fn = get_surrogate(algorithm)
    check_loss_agg(loss_agg)
    if kl_coef and logp_ref is None:
        raise ValueError("kl_coef > 0 needs logp_ref")
    if entropy_coef and entropy is None:
        raise ValueError("entropy_coef > 0 needs entropy")
    _check_shapes({"logp": logp, "logp_old": logp_old, "advantages": advantages, "mask": mask,
                   "logp_ref": logp_ref, "entropy": entropy})
    logp = _as_float(logp, "logp")
    logp_old = jax.lax.stop_gradient(_as_float(logp_old, "logp_old"))
    advantages = jax.lax.stop_gradient(_as_float(advantages, "advantages"))
    mask = (_as_float(mask, "mask") > 0).astype(logp.dtype)

    if algorithm == "gspo":
        default_low, default_high = GSPO_DEFAULT_CLIP_LOW, GSPO_DEFAULT_CLIP_HIGH
    elif algorithm == "cispo":
        default_low, default_high = 1.0, 0.28
    else:
        default_low, default_high = 0.2, 0.2
    if dual_clip_c == _ALGORITHM_DEFAULT:
        dual_clip_c = None if algorithm == "cispo" else 3.0
    clip_low = default_low if clip_low is None else clip_low
    clip_high = default_high if clip_high is None else clip_high
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")

    out = surrogate_fn(logp, logp_old, advantages, mask, clip_low, clip_high, dual_clip_c)
    token_loss = -out.surrogate  # [B, T]
    metrics: dict[str, jax.Array] = {}
    metrics["pg_loss"] = aggregate(token_loss, mask, loss_agg, max_len=max_len).loss

    log_ratio = jnp.where(mask > 0, logp - logp_old, 0.0)
    if logp_ref is not None:
        logp_ref = jax.lax.stop_gradient(_as_float(logp_ref, "logp_ref"))
        kl = kl_penalty(jnp.where(mask > 0, logp, 0.0), jnp.where(mask > 0, logp_ref, 0.0),
                        kl_estimator)
        metrics["kl_ref"] = masked_mean(jax.lax.stop_gradient(kl), mask)
        if kl_coef:
            token_loss = token_loss + kl_coef * kl
    if entropy is not None:
        entropy = _as_float(entropy, "entropy")
        metrics["entropy_mean"] = masked_mean(jax.lax.stop_gradient(entropy), mask)
        if entropy_coef:
            token_loss = token_loss + entropy_bonus(jnp.where(mask > 0, entropy, 0.0), entropy_coef)

    agg = aggregate(token_loss, mask, loss_agg, max_len=max_len,
                    global_denominator=global_denominator)

    stopped_ratio = jax.lax.stop_gradient(out.ratio)
    stopped_log_ratio = jax.lax.stop_gradient(log_ratio)
    metrics.update(
        clip_frac_upper=masked_mean(out.clipped_upper.astype(logp.dtype), mask),
        clip_frac_lower=masked_mean(out.clipped_lower.astype(logp.dtype), mask),
        clip_frac_dual=masked_mean(out.clipped_dual.astype(logp.dtype), mask),
        preserved_grad_frac=masked_mean(out.preserved.astype(logp.dtype), mask),
        approx_kl_old=masked_mean(-stopped_log_ratio, mask),
        approx_kl_old_k3=masked_mean(kl_penalty(-stopped_log_ratio, 0.0 * stopped_log_ratio), mask),
        ratio_mean=masked_mean(stopped_ratio, mask),
    )
    metrics = {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}
    if return_parts:
        return agg.loss, metrics, LossParts(agg.numerator, agg.denominator)
    return agg.loss, metrics

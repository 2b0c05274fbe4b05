"""The policy-loss entry point: surrogate + aggregation + optional KL and entropy terms.

Spec §3: a pure function of `[B, T]` arrays returning `(loss, metrics)`. The
loss to minimise is `-s` aggregated with `loss_agg`, plus `kl_coef * KL` and
minus `entropy_coef * H` aggregated the same way, so one `(numerator,
denominator)` pair covers the whole loss and micro-batch accumulation stays
exact (see `aggregation`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from aepo_jax.objectives.aggregation import aggregate, check_loss_agg, masked_mean
from aepo_jax.objectives.kl import KL_ESTIMATORS, entropy_bonus, kl_penalty
from aepo_jax.objectives.surrogates import LOG_RATIO_MAX, get_surrogate


class LossParts(NamedTuple):
    """`loss == numerator / max(denominator, 1)`; numerators add across micro-batches."""

    numerator: jax.Array
    denominator: jax.Array


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """The static settings of `policy_loss` (hashable: a jit static argument).

    Every field is required: the defaults of each algorithm live in one place,
    `aepo_jax.objectives.presets` (`AlgorithmPreset.loss_config()`, or
    `loss_config(surrogate, **overrides)` for a bare surrogate).

    Attributes:
      surrogate: "ppo", "gppo", "aepo", "cispo" or "gspo" (spec §3.1).
      clip_low, clip_high: `el`, `eh` (>= 0).
      dual_clip_c: dual-clip constant `c`; None disables it (CISPO takes none).
      loss_agg: "token_mean", "seq_mean_token_mean" or "seq_mean_token_sum_norm".
      kl_coef, kl_estimator: KL-to-reference term (spec §3.3); 0 = off.
      entropy_coef: entropy-bonus coefficient; 0 = off.
    """

    surrogate: str
    clip_low: float
    clip_high: float
    dual_clip_c: float | None
    loss_agg: str
    kl_coef: float
    kl_estimator: str
    entropy_coef: float

    def __post_init__(self) -> None:
        get_surrogate(self.surrogate)  # unknown names raise, listing the known ones
        check_loss_agg(self.loss_agg)
        if self.clip_low is None or self.clip_high is None or self.clip_low < 0 or self.clip_high < 0:
            raise ValueError(f"clip_low and clip_high must be >= 0, got {self.clip_low}, {self.clip_high}")
        # The ratio is bounded at exp(LOG_RATIO_MAX) (surrogates.bounded_ratio); every clip bound stays below it.
        for name, bound in (("1 + clip_high", 1.0 + self.clip_high), ("dual_clip_c", self.dual_clip_c)):
            if bound is not None and bound >= math.exp(LOG_RATIO_MAX):
                raise ValueError(f"{name} = {bound} must be below exp({LOG_RATIO_MAX:g}), where ratios are bounded")
        if self.surrogate == "cispo" and self.dual_clip_c is not None:
            raise ValueError(f"CISPO takes no dual clip, got dual_clip_c={self.dual_clip_c}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown kl_estimator {self.kl_estimator!r}; known: {list(KL_ESTIMATORS)}")


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
    config: LossConfig,
    *,
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    max_len: int | None = None,
    global_denominator: jax.Array | float | None = None,
    return_parts: bool = False,
    logp_ref: jax.Array | None = None,
    entropy: jax.Array | None = None,
):
    """Policy loss of spec §3.1 for one (micro-)batch.

    Args:
      config: surrogate, clip bounds, dual clip, aggregation, KL and entropy
        weights (`LossConfig`; from `AlgorithmPreset.loss_config()`).
      logp: `[B, T]` current-policy log-probs (the only input that carries gradient).
      logp_old: `[B, T]` log-probs under the sampling policy.
      advantages: `[B, T]` per-token advantages.
      mask: `[B, T]` 1 on policy tokens, 0 on prompt / tool-result / padding.
      max_len: Dr. GRPO constant for "seq_mean_token_sum_norm" (default `T`).
      global_denominator: full-batch `loss_denominator(mask, loss_agg)` when
        this call sees one micro-batch, for exact gradient accumulation.
      return_parts: also return `LossParts(numerator, denominator)`.
      logp_ref: `[B, T]` reference log-probs; needed when `kl_coef > 0`, and
        logged as `kl_ref` whenever given.
      entropy: `[B, T]` differentiable current-policy entropy; needed when
        `entropy_coef > 0`, logged as `entropy_mean` whenever given.

    Returns:
      `(loss, metrics)` or, with `return_parts`, `(loss, metrics, parts)`.
      Metrics (scalars, means over valid tokens): `pg_loss`, `clip_frac_upper`,
      `clip_frac_lower`, `clip_frac_dual`, `preserved_grad_frac`,
      `approx_kl_old` (k1 of old to new), `approx_kl_old_k3`, `ratio_mean`,
      and `kl_ref`, `entropy_mean` when those inputs are given.
    """
    if not isinstance(config, LossConfig):
        raise TypeError(f"policy_loss takes a LossConfig (see objectives.presets.loss_config), got {config!r}")
    surrogate_fn = get_surrogate(config.surrogate)
    loss_agg, kl_coef, entropy_coef = config.loss_agg, config.kl_coef, config.entropy_coef
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

    out = surrogate_fn(logp, logp_old, advantages, mask, config.clip_low, config.clip_high, config.dual_clip_c)
    token_loss = -out.surrogate  # [B, T]
    metrics: dict[str, jax.Array] = {}
    metrics["pg_loss"] = aggregate(token_loss, mask, loss_agg, max_len=max_len).loss

    log_ratio = jnp.where(mask > 0, logp - logp_old, 0.0)
    if logp_ref is not None:
        logp_ref = jax.lax.stop_gradient(_as_float(logp_ref, "logp_ref"))
        kl = kl_penalty(jnp.where(mask > 0, logp, 0.0), jnp.where(mask > 0, logp_ref, 0.0),
                        config.kl_estimator)
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

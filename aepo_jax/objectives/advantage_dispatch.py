"""`compute_advantages`: the advantage pipeline a preset asks for (spec §3.2).

Order: DAPO overlong shaping of the rewards -> the preset's estimator (looked
up by name in `ADVANTAGES`, like `SURROGATES` for the policy loss) -> AEPO
entropy-aware reshape. ARPO hard attribution is part of the group-relative
estimators. Everything but GiGPO (host-side grouping of hashable anchor
states) is jit-compatible.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from aepo_jax.objectives.advantages import (
    broadcast_to_tokens,
    entropy_aware_advantages,
    group_relative_advantages,
    overlong_penalty,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
)
from aepo_jax.objectives.tree_advantages import (
    gigpo_advantages,
    hard_attribution_advantages,
)

if TYPE_CHECKING:
    from aepo_jax.objectives.presets import AlgorithmPreset


def _need(value, what: str, preset: AlgorithmPreset):
    if value is None:
        raise ValueError(f"preset {preset.name!r} needs {what}")
    return value


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read; see `compute_advantages` for shapes. Optional fields are None
    when the caller did not provide them (an estimator that needs one says so)."""

    rewards: jax.Array  # [B], after overlong shaping
    group_ids: jax.Array  # int[B]
    mask: jax.Array  # [B, T]
    kl: jax.Array | None = None
    shared_prefix_len: jax.Array | None = None
    tokens: np.ndarray | None = None
    step_starts: Sequence[Sequence[int]] | None = None


Estimator = Callable[["AlgorithmPreset", AdvantageInputs], tuple[jax.Array, dict[str, Any]]]


def _group_relative(preset: AlgorithmPreset, x: AdvantageInputs) -> tuple[jax.Array, dict[str, Any]]:
    """GRPO (std-normalised) / Dr. GRPO (not) group advantages, per token; ARPO hard attribution if asked."""
    per_row = group_relative_advantages(x.rewards, x.group_ids, normalize_std=preset.advantage == "grpo")  # [B]
    if preset.hard_attribution:
        shared = _need(x.shared_prefix_len, "shared_prefix_len for hard attribution", preset)
        return hard_attribution_advantages(per_row, shared, x.group_ids, x.mask), {}
    return broadcast_to_tokens(per_row, x.mask), {}


def _reinforce_pp(preset: AlgorithmPreset, x: AdvantageInputs) -> tuple[jax.Array, dict[str, Any]]:
    if preset.kl_in_reward and preset.kl_coef:
        _need(x.kl, "kl ([B, T] KL to the reference) for kl_in_reward", preset)
    return reinforce_pp_advantages(x.rewards, x.mask, x.kl if preset.kl_in_reward else None, preset.kl_coef), {}


def _reinforce_pp_baseline(preset: AlgorithmPreset, x: AdvantageInputs) -> tuple[jax.Array, dict[str, Any]]:
    return reinforce_pp_baseline_advantages(x.rewards, x.group_ids, x.mask), {}


def _gigpo(preset: AlgorithmPreset, x: AdvantageInputs) -> tuple[jax.Array, dict[str, Any]]:
    gigpo, metrics = gigpo_advantages(
        np.asarray(x.rewards), np.asarray(x.group_ids), np.asarray(x.mask),
        _need(x.tokens, "tokens for GiGPO anchor states", preset),
        _need(x.step_starts, "step_starts for GiGPO steps", preset),
        preset.gigpo_gamma, preset.gigpo_omega, preset.gigpo_norm)
    return jnp.asarray(gigpo), {k: jnp.asarray(v) for k, v in metrics.items()}


# Advantage estimators by preset name (`AlgorithmPreset.advantage`).
ADVANTAGES: dict[str, Estimator] = {
    "grpo": _group_relative,
    "dr_grpo": _group_relative,
    "reinforce_pp": _reinforce_pp,
    "reinforce_pp_baseline": _reinforce_pp_baseline,
    "gigpo": _gigpo,
}


def compute_advantages(
    preset: AlgorithmPreset,
    rewards: jax.Array,
    group_ids: jax.Array,
    mask: jax.Array,
    *,
    entropy: jax.Array | None = None,
    response_lengths: jax.Array | None = None,
    max_response_len: int | None = None,
    kl: jax.Array | None = None,
    shared_prefix_len: jax.Array | None = None,
    tokens: np.ndarray | None = None,
    step_starts: Sequence[Sequence[int]] | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token advantages `[B, T]` (zero where masked) and metrics for one batch.

    Args:
      preset: the algorithm (`get_preset(name)`).
      rewards: `[B]` outcome rewards, one per trajectory.
      group_ids: `int[B]` prompt group of each trajectory (branches included).
      mask: `[B, T]` policy-token mask.
      entropy: `[B, T]` current-policy token entropy; needed by `entropy_advantage`.
      response_lengths: `int[B]` generated lengths; needed by `overlong_shaping`.
      max_response_len: DAPO's `Lmax`; needed by `overlong_shaping`.
      kl: `[B, T]` per-token KL to the reference; needed by `kl_in_reward` when
        `kl_coef > 0`.
      shared_prefix_len: `int[B, B]` (see `shared_prefix_lengths`); needed by
        `hard_attribution`.
      tokens, step_starts: trainer-layout token ids and per-row step starts;
        needed by GiGPO (see `gigpo_advantages`).
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    mask = jnp.asarray(mask, jnp.float32)
    if rewards.ndim != 1 or mask.ndim != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"compute_advantages needs rewards [B] and mask [B, T], got {rewards.shape} and {mask.shape}")
    for name, value in (("entropy", entropy), ("kl", kl)):
        if value is not None and jnp.shape(value) != mask.shape:
            raise ValueError(f"{name} must be [B, T] like mask {mask.shape}, got {jnp.shape(value)}")
    metrics: dict[str, jax.Array] = {}
    if preset.overlong_shaping:
        penalty = overlong_penalty(
            _need(response_lengths, "response_lengths for overlong shaping", preset),
            _need(max_response_len, "max_response_len for overlong shaping", preset),
            min(preset.overlong_buffer_len, max_response_len),
            preset.overlong_penalty_factor,
        )
        metrics["overlong_penalty_mean"] = jnp.mean(penalty)
        rewards = rewards + penalty

    inputs = AdvantageInputs(rewards, group_ids, mask, kl, shared_prefix_len, tokens, step_starts)
    advantages, estimator_metrics = ADVANTAGES[preset.advantage](preset, inputs)
    metrics.update(estimator_metrics)

    if preset.entropy_advantage:
        advantages, entropy_metrics = entropy_aware_advantages(
            advantages, _need(entropy, "entropy for the entropy-aware advantage", preset), mask,
            preset.entropy_advantage_coef, preset.entropy_advantage_scope, group_ids)
        metrics.update(entropy_metrics)
    count = jnp.maximum(jnp.sum(mask), 1.0)
    metrics["advantage_mean"] = jnp.sum(advantages * mask) / count
    # Padding rows (no valid token) must not dilute the logged mean reward.
    real_rows = (jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)  # [B]
    metrics["reward_mean"] = jnp.sum(rewards * real_rows) / jnp.maximum(jnp.sum(real_rows), 1.0)
    return advantages, metrics

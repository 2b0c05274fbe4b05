"""`compute_advantages`: the advantage pipeline a preset asks for (spec §3.2).

Order: DAPO overlong shaping of the rewards -> the preset's estimator ->
ARPO hard attribution -> AEPO entropy-aware reshape. Everything but GiGPO
(host-side grouping of hashable anchor states) is jit-compatible.
"""

from __future__ import annotations

from collections.abc import Sequence

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
from aepo_jax.objectives.presets import AlgorithmPreset
from aepo_jax.objectives.tree_advantages import (
    gigpo_advantages,
    hard_attribution_advantages,
)


def _need(value, what: str, preset: AlgorithmPreset):
    if value is None:
        raise ValueError(f"preset {preset.name!r} needs {what}")
    return value


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

    if preset.advantage in ("grpo", "dr_grpo"):
        per_row = group_relative_advantages(rewards, group_ids,
                                            normalize_std=preset.advantage == "grpo")  # [B]
        if preset.hard_attribution:
            advantages = hard_attribution_advantages(
                per_row, _need(shared_prefix_len, "shared_prefix_len for hard attribution", preset),
                group_ids, mask)
        else:
            advantages = broadcast_to_tokens(per_row, mask)
    elif preset.advantage == "reinforce_pp":
        if preset.kl_in_reward and preset.kl_coef:
            _need(kl, "kl ([B, T] KL to the reference) for kl_in_reward", preset)
        advantages = reinforce_pp_advantages(
            rewards, mask, kl if preset.kl_in_reward else None, preset.kl_coef)
    elif preset.advantage == "reinforce_pp_baseline":
        advantages = reinforce_pp_baseline_advantages(rewards, group_ids, mask)
    else:  # gigpo
        gigpo, gigpo_metrics = gigpo_advantages(
            np.asarray(rewards), np.asarray(group_ids), np.asarray(mask),
            _need(tokens, "tokens for GiGPO anchor states", preset),
            _need(step_starts, "step_starts for GiGPO steps", preset),
            preset.gigpo_gamma, preset.gigpo_omega, preset.gigpo_norm)
        advantages = jnp.asarray(gigpo)
        metrics.update({k: jnp.asarray(v) for k, v in gigpo_metrics.items()})

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

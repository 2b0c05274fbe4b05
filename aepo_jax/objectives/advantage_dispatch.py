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
    BatchTotal,
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


# DAPO's overlong buffer as a share of the response budget: the paper's Lc = 4096 of Lmax = 20480.
OVERLONG_BUFFER_FRACTION = 4096 / 20480


def overlong_buffer_len(buffer_len: float | None, max_response_len: int) -> int:
    """DAPO's `Lc` for the response budget `Lmax` (spec §3.2 overlong shaping).

    `buffer_len` None: `OVERLONG_BUFFER_FRACTION * Lmax` (rounded, at least 1), the paper's ratio
    at any budget. An explicit `Lc` must satisfy `0 < Lc < Lmax`: at `Lc >= Lmax` the penalty-free
    range `|y| <= Lmax - Lc` is empty and every response would be penalised in proportion to its
    length, so it raises instead of being clamped.

    `|y|` (the lengths `overlong_penalty` is given) counts every response token, tool results
    included. The spec does not say which tokens count; this is the count `Lmax` caps (the agent
    loop ends a trajectory when `len(response_ids)`, tool results included, reaches
    `rollout.max_response_len`), so `|y| = Lmax` is reachable and means "cut at the budget", as in
    verl's DAPO reward manager, whose `valid_response_length` covers the whole response.
    """
    if max_response_len < 2:
        raise ValueError(f"overlong shaping needs max_response_len >= 2, got {max_response_len}")
    if buffer_len is None:
        return max(1, round(OVERLONG_BUFFER_FRACTION * max_response_len))
    if buffer_len != int(buffer_len) or not 0 < buffer_len < max_response_len:
        raise ValueError(f"overlong_buffer_len (DAPO's Lc) must be a whole number with 0 < Lc < max_response_len "
                         f"(Lmax) = {max_response_len}, got {buffer_len}; leave it None for "
                         f"{OVERLONG_BUFFER_FRACTION:g} x Lmax")
    return int(buffer_len)


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
    batch_total: BatchTotal | None = None  # the whole batch's sums when this is a part (advantages.py doc)


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
    return reinforce_pp_advantages(x.rewards, x.mask, x.kl if preset.kl_in_reward else None, preset.kl_coef,
                                   x.batch_total), {}


def _reinforce_pp_baseline(preset: AlgorithmPreset, x: AdvantageInputs) -> tuple[jax.Array, dict[str, Any]]:
    return reinforce_pp_baseline_advantages(x.rewards, x.group_ids, x.mask, x.batch_total), {}


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
    batch_total: BatchTotal | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token advantages `[B, T]` (zero where masked) and metrics for one batch.

    Args:
      preset: the algorithm (`get_preset(name)`).
      rewards: `[B]` outcome rewards, one per trajectory.
      group_ids: `int[B]` prompt group of each trajectory (branches included).
      mask: `[B, T]` policy-token mask.
      entropy: `[B, T]` current-policy token entropy; needed by `entropy_advantage`.
      response_lengths: `int[B]` DAPO's `|y|`, needed by `overlong_shaping`: every response token,
        tool results included (`len(response_ids)`), the same count `rollout.max_response_len` caps
        in the agent loop and verl's `valid_response_length` (see `overlong_buffer_len`).
      max_response_len: DAPO's `Lmax` (`rollout.max_response_len`); needed by `overlong_shaping`.
      kl: `[B, T]` per-token KL to the reference; needed by `kl_in_reward` when
        `kl_coef > 0`.
      shared_prefix_len: `int[B, B]` (see `shared_prefix_lengths`); needed by
        `hard_attribution`.
      tokens, step_starts: trainer-layout token ids and per-row step starts;
        needed by GiGPO (see `gigpo_advantages`).
      batch_total: when these rows are one process's part of the update batch, sums a
        vector of this part's sums over every part, so batch statistics (REINFORCE++
        whitening, AEPO's batch entropy z-score) are the whole batch's
        (`parallel.multihost.process_sum`). Group statistics need none: a group stays
        on one process.
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
        lengths = _need(response_lengths, "response_lengths for overlong shaping", preset)
        max_response_len = _need(max_response_len, "max_response_len for overlong shaping", preset)
        buffer_len = overlong_buffer_len(preset.overlong_buffer_len, max_response_len)
        penalty = overlong_penalty(lengths, max_response_len, buffer_len, preset.overlong_penalty_factor)
        metrics["overlong_penalty_mean"] = jnp.mean(penalty)
        rewards = rewards + penalty

    inputs = AdvantageInputs(rewards, group_ids, mask, kl, shared_prefix_len, tokens, step_starts, batch_total)
    advantages, estimator_metrics = ADVANTAGES[preset.advantage](preset, inputs)
    metrics.update(estimator_metrics)

    if preset.entropy_advantage:
        advantages, entropy_metrics = entropy_aware_advantages(
            advantages, _need(entropy, "entropy for the entropy-aware advantage", preset), mask,
            preset.entropy_advantage_coef, preset.entropy_advantage_scope, group_ids, batch_total)
        metrics.update(entropy_metrics)
    count = jnp.maximum(jnp.sum(mask), 1.0)
    metrics["advantage_mean"] = jnp.sum(jnp.where(mask > 0, advantages, 0.0)) / count
    # Padding rows (no valid token) must not dilute the logged mean reward.
    real_rows = (jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)  # [B]
    metrics["reward_mean"] = jnp.sum(rewards * real_rows) / jnp.maximum(jnp.sum(real_rows), 1.0)
    return advantages, metrics

"""Advantages that look at shared prefixes: GiGPO anchor-state steps and ARPO hard attribution.

Spec §3.2. Both take the trainer's `[B, T]` layout (`training.rollout_batch`): each row is its
prompt followed by its response from column 0, right-padded, so rows of one prompt group (same
prompt) are column-aligned and "the same prefix" means "the same tokens in columns `[0, n)`",
prompt included. Prompt and tool-result tokens sit in these rows with `mask == 0`; a row's first
policy token is at column `len(prompt)`, and its own prefix length (the diagonal of
`shared_prefix_len`) is prompt plus response length.

Identical prefixes are identical states whether they come from a fork (a
tree branch point) or arise by chance in independent samples; both estimators
treat them the same way.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from aepo_jax.objectives.advantages import (
    GROUP_STD_EPS,
    group_relative_advantages,
    same_group_matrix,
)

GIGPO_NORMS = ("mean_norm", "mean_std_norm")


def shared_prefix_lengths(tokens: np.ndarray, group_ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Host-side: `int32[B, B]`, the number of leading columns rows i and j share.

    Args:
      tokens: `int[B, T]` token ids in the trainer layout (prompt, then response, from column 0).
      group_ids: `int[B]` prompt group of each row.
      lengths: `int[B]` real length of each row, prompt included (columns beyond are padding).

    Returns:
      `shared[i, j]` = length of the common prefix of rows i and j within
      `min(lengths[i], lengths[j])` when they are in the same group, else 0;
      `shared[i, i] = lengths[i]`.
    """
    tokens, group_ids, lengths = np.asarray(tokens), np.asarray(group_ids), np.asarray(lengths)
    batch, width = tokens.shape
    if group_ids.shape != (batch,) or lengths.shape != (batch,):
        raise ValueError(f"group_ids and lengths must be [B={batch}], got {group_ids.shape}, "
                         f"{lengths.shape}")
    shared = np.zeros((batch, batch), np.int32)
    for i in range(batch):
        for j in range(batch):
            if group_ids[i] != group_ids[j]:
                continue
            limit = int(min(lengths[i], lengths[j], width))
            differ = np.nonzero(tokens[i, :limit] != tokens[j, :limit])[0]
            shared[i, j] = differ[0] if differ.size else limit
    return shared


def check_prefix_layout(shared_prefix_len: jax.Array, mask: jax.Array) -> None:
    """Raise a ValueError if a row's own prefix length ends before its last policy token.

    `shared_prefix_len[b, b]` is row b's length in the mask's layout (prompt plus response), so it
    is at least the row's last `mask == 1` column + 1. A matrix counted from the first response
    token (response only) fails this and would silently shift every attribution by the prompt
    length. Skipped under `jax.jit` (traced values have no value to check).
    """
    if isinstance(shared_prefix_len, jax.core.Tracer) or isinstance(mask, jax.core.Tracer):
        return
    own = np.diagonal(np.asarray(shared_prefix_len))
    mask = np.asarray(mask)
    last_end = np.where(mask > 0, np.arange(mask.shape[-1]) + 1, 0).max(axis=-1)  # [B]
    short = np.flatnonzero(own < last_end)
    if short.size:
        raise ValueError(
            f"shared_prefix_len does not match the mask's layout: rows {short[:5].tolist()} have own prefix "
            f"length (diagonal) {own[short[:5]].tolist()} but policy tokens up to column "
            f"{(last_end[short[:5]] - 1).tolist()}. Rows are prompt-first (column 0 is the first prompt "
            f"token), so the diagonal must be prompt + response length; a response-only count "
            f"(e.g. `agent.trajectory.tree_shared_prefixes` without the prompt) is off by the prompt length")


def hard_attribution_advantages(
    sequence_advantages: jax.Array,
    shared_prefix_len: jax.Array,
    group_ids: jax.Array,
    mask: jax.Array,
) -> jax.Array:
    """ARPO hard attribution: a token shared by several trajectories gets their mean advantage.

    Token `t` of row `i` is shared by the rows `j` of its group with
    `shared_prefix_len[i, j] > t` (row i itself when `t < shared_prefix_len[i, i]`);
    it gets the mean of their `sequence_advantages`. A row's own tokens beyond
    every shared prefix keep its own advantage. Jit-compatible; memory `[B, T]`
    per row step (`lax.map` over rows). A `shared_prefix_len` whose diagonal ends before a row's
    last policy token raises (`check_prefix_layout`; eager calls only).

    Args:
      sequence_advantages: `[B]` per-trajectory advantages (e.g. GRPO's).
      shared_prefix_len: `int[B, B]` from `shared_prefix_lengths` or the rollout tree, counted in
        the columns of `mask` (prompt-first rows: prompt included).
      group_ids: `int[B]`.
      mask: `[B, T]` policy-token mask.

    Returns:
      `[B, T]` token advantages, zero where masked.
    """
    mask = jnp.asarray(mask, jnp.float32)
    adv = jnp.asarray(sequence_advantages, jnp.float32)  # [B]
    shared = jnp.asarray(shared_prefix_len, jnp.int32)  # [B, B]
    batch, width = mask.shape
    if shared.shape != (batch, batch) or adv.shape != (batch,):
        raise ValueError(f"need sequence_advantages [B={batch}] and shared_prefix_len [B, B], got "
                         f"{adv.shape} and {shared.shape}")
    check_prefix_layout(shared_prefix_len, mask)
    same = same_group_matrix(group_ids) > 0  # [B, B]
    positions = jnp.arange(width)

    def one_row(row: jax.Array) -> jax.Array:
        i_shared, i_same = row
        sharers = i_same[:, None] & (positions[None, :] < i_shared[:, None])  # [B(j), T]
        sharers = sharers.astype(jnp.float32)
        count = jnp.sum(sharers, axis=0)  # [T]
        return jnp.sum(sharers * adv[:, None], axis=0) / jnp.maximum(count, 1.0)

    token_adv = jax.lax.map(one_row, (shared, same))  # [B, T]
    inside_own_prefix = positions[None, :] < jnp.diagonal(shared)[:, None]  # [B, T]
    return jnp.where(inside_own_prefix, token_adv, adv[:, None]) * mask


def step_returns(reward: float, num_steps: int, gamma: float) -> np.ndarray:
    """Discounted return of each step under a sparse outcome reward: `gamma**(n-1-s) * R`."""
    return (gamma ** np.arange(num_steps - 1, -1, -1, dtype=np.float64)) * reward


def gigpo_advantages(
    rewards: np.ndarray,
    group_ids: np.ndarray,
    mask: np.ndarray,
    tokens: np.ndarray,
    step_starts: Sequence[Sequence[int]],
    gamma: float = 0.95,
    omega: float = 1.0,
    norm: str = "mean_norm",
) -> tuple[np.ndarray, dict[str, float]]:
    """Host-side GiGPO: `A = A_episode + omega * A_step` (spec §3.2).

    A trajectory is a sequence of steps: step `s` of row `i` spans columns
    `[step_starts[i][s], step_starts[i][s+1])` (the last to `T`): the text
    the policy generated after the previous tool result, then its own tool
    result (masked). Its *anchor state* is the prefix `tokens[i, :start]` of
    the same prompt group; steps with identical anchor states form one step
    group (every step 0 of a group shares the bare prompt; a branch point is
    such a shared state). The step return is `gamma**(n_i-1-s) * R_i`.

    `A_episode` is GRPO's group advantage; `A_step` normalises the step
    returns within each step group. `norm="mean_norm"` (default) only
    subtracts the mean; `"mean_std_norm"` also divides by `std + 1e-6`
    (unbiased; 0 for a group of one), for both terms.

    Args:
      rewards: `[B]` outcome rewards.
      group_ids: `int[B]` prompt group of each row.
      mask: `[B, T]` policy-token mask.
      tokens: `int[B, T]` token ids, same layout as `mask`.
      step_starts: per row, increasing column indices where each step starts.
      gamma, omega, norm: GiGPO constants.

    Returns:
      `(float32 [B, T] advantages, metrics)`.
    """
    if norm not in GIGPO_NORMS:
        raise ValueError(f"unknown GiGPO norm {norm!r}; known: {list(GIGPO_NORMS)}")
    rewards = np.asarray(rewards, np.float64)
    group_ids, mask, tokens = np.asarray(group_ids), np.asarray(mask), np.asarray(tokens)
    batch, width = mask.shape
    if len(step_starts) != batch or tokens.shape != mask.shape:
        raise ValueError(f"need step_starts for each of the B={batch} rows and tokens shaped like "
                         f"mask {mask.shape}, got {len(step_starts)} rows and {tokens.shape}")

    episode = np.asarray(group_relative_advantages(rewards, group_ids,
                                                   normalize_std=norm == "mean_std_norm"))

    step_groups: dict[tuple, list[tuple[int, int, float]]] = defaultdict(list)
    for i, starts in enumerate(step_starts):
        starts = [int(s) for s in starts]
        if not starts or any(b <= a for a, b in itertools.pairwise(starts)) or not (
                0 <= starts[0] and starts[-1] < width):
            raise ValueError(f"step_starts[{i}] must be increasing columns in [0, {width}), "
                             f"got {starts}")
        if mask[i, :starts[0]].any():
            raise ValueError(f"row {i} has policy tokens before its first step start {starts[0]}")
        for s, ret in enumerate(step_returns(rewards[i], len(starts), gamma)):
            key = (group_ids[i].item(), tuple(tokens[i, :starts[s]].tolist()))
            step_groups[key].append((i, s, ret))

    step_adv = [np.zeros(len(starts)) for starts in step_starts]
    for members in step_groups.values():
        returns = np.array([ret for _, _, ret in members])
        # all-equal returns: exactly 0 (np.mean of seven 1.1s is 1 ulp off)
        centered = returns - returns.mean() if returns.max() > returns.min() else np.zeros_like(returns)
        if norm == "mean_std_norm":
            spread = returns.std(ddof=1) if len(returns) > 1 else 0.0
            centered = centered / (spread + GROUP_STD_EPS)
        for (i, s, _), value in zip(members, centered):
            step_adv[i][s] = value

    advantages = np.zeros((batch, width), np.float64)
    for i, starts in enumerate(step_starts):
        bounds = list(starts) + [width]
        for s in range(len(starts)):
            advantages[i, bounds[s]:bounds[s + 1]] = episode[i] + omega * step_adv[i][s]
    sizes = [len(m) for m in step_groups.values()]
    metrics = {"gigpo_step_groups": float(len(sizes)),
               "gigpo_mean_step_group_size": float(np.mean(sizes))}
    return (advantages * mask).astype(np.float32), metrics

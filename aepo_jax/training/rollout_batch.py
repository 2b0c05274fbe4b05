"""Rollout groups -> the flat per-row data the RL step and the advantage code need.

A trajectory (`aepo_jax.agent.trajectory.Trajectory` or anything with the same
attributes: `prompt_ids`, `response_ids`, `mask`, `logp_old`, `entropy`,
`tool_steps`, `stop_reason`) becomes one row `prompt + response` with `mask`
0 on the prompt. Rows of one prompt share a `group_id`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aepo_jax.agent.trajectory import tree_shared_prefixes
from aepo_jax.training.batch import pad_sequences


@dataclass
class RolloutRows:
    """Everything per row, in group order.

    Attributes:
      batch: padded numpy arrays (`input_ids, positions, valid, mask, logp_old, entropy`).
      group_ids: int32[B] prompt index of each row; each padding row gets a group
        of its own (a group of one has advantage 0).
      rewards: float32[B] outcome reward (0 on padding rows).
      response_lengths: int32[B] response tokens (generated + tool results).
      step_starts: per row, the columns where each GiGPO step starts.
      num_rows: real (non-padding) rows.
      shared_prefix_len: int32[B, B] leading columns rows i and j share through
        the rollout tree (prompt plus shared response; 0 across groups and on
        padding rows), for ARPO hard attribution.
    """

    batch: dict[str, np.ndarray]
    group_ids: np.ndarray
    rewards: np.ndarray
    response_lengths: np.ndarray
    step_starts: list[list[int]]
    num_rows: int
    shared_prefix_len: np.ndarray | None = None


def trajectory_row(traj: Any) -> dict[str, np.ndarray]:
    """One trajectory as a token row with prompt-aligned per-token arrays."""
    prompt = len(traj.prompt_ids)
    zeros = np.zeros(prompt, np.float32)
    return {
        "tokens": list(traj.prompt_ids) + list(traj.response_ids),
        "mask": np.concatenate([zeros, np.asarray(traj.mask, np.float32)]),
        "logp_old": np.concatenate([zeros, np.asarray(traj.logp_old, np.float32)]),
        "entropy": np.concatenate([zeros, np.asarray(traj.entropy, np.float32)]),
    }


def gigpo_step_starts(traj: Any) -> list[int]:
    """Row columns where each step begins: the first generated token, then each tool-result end."""
    prompt = len(traj.prompt_ids)
    return [prompt] + [prompt + int(step.result_end) for step in traj.tool_steps if step.result_end < len(traj.response_ids)]


def build_rollout_rows(
    groups: Sequence[Sequence[Any]],
    rewards: Sequence[Sequence[float]],
    max_len: int,
    pad_id: int = 0,
    row_multiple: int = 1,
    length_bucket: int = 8,
) -> RolloutRows:
    """Pad every trajectory of every group into one batch (see module docstring)."""
    if len(groups) != len(rewards):
        raise ValueError(f"{len(groups)} groups but {len(rewards)} reward lists")
    rows, group_ids, flat_rewards, lengths, starts = [], [], [], [], []
    for g, (group, group_rewards) in enumerate(zip(groups, rewards)):
        if len(group) != len(group_rewards):
            raise ValueError(f"group {g}: {len(group)} trajectories but {len(group_rewards)} rewards")
        for traj, reward in zip(group, group_rewards):
            rows.append(trajectory_row(traj))
            group_ids.append(g)
            flat_rewards.append(float(reward))
            lengths.append(len(traj.response_ids))
            starts.append(gigpo_step_starts(traj))
    batch = pad_sequences(rows, max_len=max_len, pad_id=pad_id, row_multiple=row_multiple,
                          length_multiple=length_bucket)
    total = batch["input_ids"].shape[0]
    extra = total - len(rows)
    shared = np.zeros((total, total), np.int32)  # [B, B], block-diagonal over groups
    start = 0
    for group in groups:
        block = slice(start, start + len(group))
        shared[block, block] = tree_shared_prefixes(list(group)) + (len(group[0].prompt_ids) if group else 0)
        start += len(group)
    return RolloutRows(
        batch=batch,
        group_ids=np.asarray(group_ids + list(range(len(groups), len(groups) + extra)), np.int32),
        rewards=np.asarray(flat_rewards + [0.0] * extra, np.float32),
        response_lengths=np.asarray(lengths + [0] * extra, np.int32),
        step_starts=starts + [[0]] * extra,
        num_rows=len(rows),
        shared_prefix_len=shared,
    )


def rollout_metrics(groups: Sequence[Sequence[Any]], rewards: Sequence[Sequence[float]]) -> dict[str, float]:
    """Reward, accuracy (reward >= 1), response length and tool-call means over all trajectories."""
    flat = [t for g in groups for t in g]
    r = np.asarray([x for g in rewards for x in g], np.float64)
    return {
        "reward_mean": float(r.mean()),
        "reward_std": float(r.std()),
        "accuracy": float(np.mean(r >= 1.0)),
        "response_length_mean": float(np.mean([len(t.response_ids) for t in flat])),
        "generated_tokens_mean": float(np.mean([float(np.sum(t.mask)) for t in flat])),
        "tool_calls_mean": float(np.mean([len(t.tool_steps) for t in flat])),
        "trajectories": float(len(flat)),
    }

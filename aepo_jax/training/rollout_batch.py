"""Rollout groups -> per-trajectory sequences, the trainer's unit from rollout to update.

A trajectory (`aepo_jax.agent.trajectory.Trajectory` or anything with the same
attributes: `prompt_ids`, `response_ids`, `mask`, `logp_old`, `entropy`,
`tool_steps`, `stop_reason`; the metrics also read `branch_point` and
`unappended_tool_calls`) becomes one sequence `prompt + response` with
per-token arrays aligned to its tokens (`mask` 0 on the prompt). Sequences of
one prompt share a `group_id`. The batch builder (`packing.build_train_batch`)
turns a selection of them into a flat or tree-packed batch; `padded` gives the
`[N, T]` view the advantage estimators read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aepo_jax.agent.trajectory import tree_shared_prefixes
from aepo_jax.rollout.critical_path import NO_CALL_TAG, own_calls
from aepo_jax.training.batch import pad_sequences, round_up
from aepo_jax.training.metric_keys import (
    ACCURACY,
    TOOL_CALLS_MADE,
    TOOL_CALLS_MALFORMED,
    TOOL_CALLS_MEAN,
    TOOL_FAIL_RATE,
)


@dataclass
class RolloutSequences:
    """One step's trajectories, in group order.

    Attributes:
      sequences: per trajectory `tokens` (int32[n]) and float32[n] `mask`, `logp_old`,
        `entropy` (later also `advantages`, `logp_ref`), aligned with `tokens`.
      group_ids: int32[N] prompt index of each sequence.
      rewards: float32[N] outcome reward.
      response_lengths: int32[N] response tokens (generated + tool results).
      step_starts: per sequence, the columns where each GiGPO step starts.
      length: `T`, the longest sequence rounded up to the length bucket (capped at
        `train.max_seq_len`): every flat batch of the step, and the row length of
        its tree batches, use it, so `T`-dependent aggregations agree.
      shared_prefix_len: int32[N, N] leading tokens sequences i and j share through
        the rollout tree (prompt plus shared response; 0 across groups), for ARPO
        hard attribution.
    """

    sequences: list[dict[str, np.ndarray]]
    group_ids: np.ndarray
    rewards: np.ndarray
    response_lengths: np.ndarray
    step_starts: list[list[int]]
    length: int
    shared_prefix_len: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.sequences)

    def padded(self, pad_id: int = 0) -> dict[str, np.ndarray]:
        """`[N, T]` arrays of every sequence (`pad_sequences` layout), e.g. for the advantages."""
        return pad_sequences(self.sequences, max_len=self.length, pad_id=pad_id, length_multiple=self.length)

    def set_per_token(self, key: str, values: np.ndarray) -> None:
        """Store `[N, T]` values (input order) as each sequence's `key`, cut to its length."""
        values = np.asarray(values, np.float32)
        for seq, row in zip(self.sequences, values, strict=True):
            seq[key] = row[: len(seq["tokens"])]


def trajectory_sequence(traj: Any) -> dict[str, np.ndarray]:
    """One trajectory as a token sequence with prompt-aligned per-token arrays."""
    prompt = len(traj.prompt_ids)
    zeros = np.zeros(prompt, np.float32)
    return {
        "tokens": np.asarray(list(traj.prompt_ids) + list(traj.response_ids), np.int32),
        "mask": np.concatenate([zeros, np.asarray(traj.mask, np.float32)]),
        "logp_old": np.concatenate([zeros, np.asarray(traj.logp_old, np.float32)]),
        "entropy": np.concatenate([zeros, np.asarray(traj.entropy, np.float32)]),
    }


def gigpo_step_starts(traj: Any) -> list[int]:
    """Row columns where each step begins: the first generated token, then each tool-result end."""
    prompt = len(traj.prompt_ids)
    return [prompt] + [prompt + int(step.result_end) for step in traj.tool_steps if step.result_end < len(traj.response_ids)]


def rollout_sequences(
    groups: Sequence[Sequence[Any]],
    rewards: Sequence[Sequence[float]],
    max_len: int,
    length_bucket: int = 8,
) -> RolloutSequences:
    """Every trajectory of every group as a sequence (see module docstring)."""
    if len(groups) != len(rewards):
        raise ValueError(f"{len(groups)} groups but {len(rewards)} reward lists")
    sequences, group_ids, flat_rewards, lengths, starts = [], [], [], [], []
    for g, (group, group_rewards) in enumerate(zip(groups, rewards)):
        if len(group) != len(group_rewards):
            raise ValueError(f"group {g}: {len(group)} trajectories but {len(group_rewards)} rewards")
        for traj, reward in zip(group, group_rewards):
            sequences.append(trajectory_sequence(traj))
            group_ids.append(g)
            flat_rewards.append(float(reward))
            lengths.append(len(traj.response_ids))
            starts.append(gigpo_step_starts(traj))
    if not sequences:
        raise ValueError("rollout_sequences needs at least one trajectory")
    longest = max(len(s["tokens"]) for s in sequences)
    if longest > max_len:
        too_long = [i for i, s in enumerate(sequences) if len(s["tokens"]) > max_len]
        raise ValueError(f"sequences {too_long[:5]} are longer than max_len={max_len} (longest {longest} tokens)")
    return RolloutSequences(
        sequences=sequences,
        group_ids=np.asarray(group_ids, np.int32),
        rewards=np.asarray(flat_rewards, np.float32),
        response_lengths=np.asarray(lengths, np.int32),
        step_starts=starts,
        length=min(round_up(longest, length_bucket), max_len),
        shared_prefix_len=_shared_prefix_matrix(groups),
    )


def _shared_prefix_matrix(groups: Sequence[Sequence[Any]]) -> np.ndarray:
    """int32[N, N], block-diagonal over groups: `tree_shared_prefixes` plus the prompt."""
    total = sum(len(g) for g in groups)
    shared = np.zeros((total, total), np.int32)
    start = 0
    for group in groups:
        if group:
            block = slice(start, start + len(group))
            shared[block, block] = tree_shared_prefixes(list(group)) + len(group[0].prompt_ids)
            start += len(group)
    return shared


def rollout_metrics(groups: Sequence[Sequence[Any]], rewards: Sequence[Sequence[float]]) -> dict[str, float]:
    """Reward, accuracy, response length and tool-call means over all trajectories, and the share of the
    tool calls made that failed (all, and per tool), so a search server that died mid-run shows on the
    console line instead of silently failing every call. `metric_keys` says what each key counts."""
    flat = [t for g in groups for t in g]
    r = np.asarray([x for g in rewards for x in g], np.float64)
    return {
        **tool_call_metrics(flat),
        "reward_mean": float(r.mean()),
        "reward_std": float(r.std()),
        ACCURACY: accuracy(flat, r),
        "response_length_mean": float(np.mean([len(t.response_ids) for t in flat])),
        "generated_tokens_mean": float(np.mean([float(np.sum(t.mask)) for t in flat])),
        "trajectories": float(len(flat)),
    }


def accuracy(trajectories: Sequence[Any], rewards: np.ndarray) -> float:
    """Share of correct trajectories: `correct` as the reward recorded it (`Environment.reward_fn`:
    evaluation's correctness), else, for a reward function that records none, reward >= 1."""
    correct = [getattr(t, "correct", None) for t in trajectories]
    return float(np.mean([bool(c) if c is not None else x >= 1.0 for c, x in zip(correct, rewards, strict=True)]))


def own_tool_steps(traj: Any) -> list[Any]:
    """The tool steps `traj` made itself: after its branch point (inherited ones were its ancestors')."""
    point = traj.branch_point or 0
    return [s for s in traj.tool_steps if s.result_start >= point]


def tool_call_metrics(trajectories: Sequence[Any]) -> dict[str, float]:
    """Tool steps and tool calls made per trajectory, malformed closings per trajectory, and the failure
    share of the calls made (a malformed closing, `NO_CALL_TAG`, ran no tool: not a failed call)."""
    n = len(trajectories)
    own = [s for t in trajectories for s in own_tool_steps(t)]
    made = [s for s in own if s.tag != NO_CALL_TAG]
    failed = {f"{TOOL_FAIL_RATE}/{tag}": float(np.mean([not s.ok for s in made if s.tag == tag]))
              for tag in sorted({s.tag for s in made})}
    return {
        TOOL_FAIL_RATE: float(np.mean([not s.ok for s in made])) if made else 0.0,
        **failed,
        TOOL_CALLS_MEAN: float(np.mean([len(t.tool_steps) for t in trajectories])),
        TOOL_CALLS_MADE: sum(own_calls(t) for t in trajectories) / n,  # `rollout.critical_path`'s count
        TOOL_CALLS_MALFORMED: (len(own) - len(made)) / n,
    }

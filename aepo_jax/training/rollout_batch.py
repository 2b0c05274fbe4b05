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

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
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
        for index, (traj, reward) in enumerate(zip(group, group_rewards)):
            if not math.isfinite(float(reward)):  # the step goes on: its non-finite updates are skipped, counted
                warnings.warn(f"group {g}, trajectory {index}: reward {reward} is not a finite number; its group's "
                              "advantages are NaN, so this step's updates are skipped (skipped_updates)",
                              stacklevel=2)
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


@dataclass(frozen=True)
class RolloutMetricSums:
    """One process's part of `rollout_metrics`: counts and sums that add up over processes, so the step's
    figures are those of every process's trajectories together, never a mean of per-process rates
    (`combine_rollout_metrics`).

    Attributes:
      trajectories: the trajectories counted.
      reward_sum: their outcome rewards added up.
      reward_sq_dev: sum of squared deviations of the rewards from this part's own mean
        (`reward_sum / trajectories`); parts combine exactly (Chan, Golub and LeVeque 1979).
      correct: trajectories counted correct (`is_correct`).
      response_tokens: `len(response_ids)` added up.
      generated_tokens: policy tokens (`mask`) added up.
      tool_steps: tool-result blocks, inherited ones again in every branch (`TOOL_CALLS_MEAN`).
      calls_made: tool calls each trajectory made itself (`rollout.critical_path.own_calls`).
      malformed: malformed closings (`NO_CALL_TAG`) each trajectory wrote itself.
      tool_calls: per tool tag, the calls made that ran it (the denominator of its fail rate); a tool
        this process never called is absent, which counts as zero calls.
      tool_failures: per tool tag, those of `tool_calls` whose tool reported a failure.
    """

    trajectories: int = 0
    reward_sum: float = 0.0
    reward_sq_dev: float = 0.0
    correct: int = 0
    response_tokens: int = 0
    generated_tokens: float = 0.0
    tool_steps: int = 0
    calls_made: int = 0
    malformed: int = 0
    tool_calls: dict[str, int] = field(default_factory=dict)
    tool_failures: dict[str, int] = field(default_factory=dict)


def rollout_metric_sums(groups: Sequence[Sequence[Any]], rewards: Sequence[Sequence[float]]) -> RolloutMetricSums:
    """The counts and sums of `groups` (with their `rewards`) that `rollout_metrics` reports from."""
    flat = [t for g in groups for t in g]
    r = np.asarray([x for g in rewards for x in g], np.float64)  # [N]
    if len(flat) != len(r):
        raise ValueError(f"{len(flat)} trajectories but {len(r)} rewards")
    if not flat:
        return RolloutMetricSums()
    reward_sum = float(np.sum(r))
    own = [s for t in flat for s in own_tool_steps(t)]
    made = [s for s in own if s.tag != NO_CALL_TAG]
    tags = sorted({s.tag for s in made})
    return RolloutMetricSums(
        trajectories=len(flat),
        reward_sum=reward_sum,
        reward_sq_dev=float(np.sum(np.square(r - reward_sum / len(flat)))),
        correct=int(sum(is_correct(t, x) for t, x in zip(flat, r, strict=True))),
        response_tokens=sum(len(t.response_ids) for t in flat),
        generated_tokens=float(np.sum([float(np.sum(t.mask)) for t in flat])),
        tool_steps=sum(len(t.tool_steps) for t in flat),
        calls_made=sum(own_calls(t) for t in flat),  # `rollout.critical_path`'s count
        malformed=len(own) - len(made),
        tool_calls={tag: sum(s.tag == tag for s in made) for tag in tags},
        tool_failures={tag: sum(s.tag == tag and not s.ok for s in made) for tag in tags},
    )


def combine_rollout_metrics(parts: Sequence[RolloutMetricSums]) -> dict[str, float]:
    """`rollout_metrics` of every part's trajectories together (see `rollout_metrics`): rates are total
    failures over total calls, means totals over the total count, the reward std the whole batch's.
    Empty when no part has a trajectory."""
    n = sum(p.trajectories for p in parts)
    if n == 0:
        return {}
    mean = sum(p.reward_sum for p in parts) / n
    sq_dev = sum(p.reward_sq_dev + p.trajectories * (p.reward_sum / p.trajectories - mean) ** 2
                 for p in parts if p.trajectories)
    tags = sorted({tag for p in parts for tag in p.tool_calls})
    calls = {tag: sum(p.tool_calls.get(tag, 0) for p in parts) for tag in tags}
    failures = {tag: sum(p.tool_failures.get(tag, 0) for p in parts) for tag in tags}
    all_calls = sum(calls.values())
    return {
        TOOL_FAIL_RATE: sum(failures.values()) / all_calls if all_calls else 0.0,
        **{f"{TOOL_FAIL_RATE}/{tag}": failures[tag] / calls[tag] for tag in tags},
        TOOL_CALLS_MEAN: sum(p.tool_steps for p in parts) / n,
        TOOL_CALLS_MADE: sum(p.calls_made for p in parts) / n,
        TOOL_CALLS_MALFORMED: sum(p.malformed for p in parts) / n,
        "reward_mean": mean,
        "reward_std": math.sqrt(sq_dev / n),
        ACCURACY: sum(p.correct for p in parts) / n,
        "response_length_mean": sum(p.response_tokens for p in parts) / n,
        "generated_tokens_mean": sum(p.generated_tokens for p in parts) / n,
        "trajectories": float(n),
    }


def rollout_metrics(groups: Sequence[Sequence[Any]], rewards: Sequence[Sequence[float]]) -> dict[str, float]:
    """Reward, accuracy, response length and tool-call means over all trajectories, and the share of the
    tool calls made that failed (all, and per tool), so a search server that died mid-run shows on the
    console line instead of silently failing every call. `metric_keys` says what each key counts: tool
    steps and tool calls made per trajectory, malformed closings per trajectory, and the failure share of
    the calls made (a malformed closing, `NO_CALL_TAG`, ran no tool: not a failed call). With several
    processes the trainer combines every process's `rollout_metric_sums` instead (the same figures)."""
    return combine_rollout_metrics([rollout_metric_sums(groups, rewards)])


def is_correct(trajectory: Any, reward: float) -> bool:
    """Whether `trajectory` counts as correct: `correct` as the reward recorded it (`Environment.reward_fn`:
    evaluation's correctness), else, for a reward function that records none, reward >= 1."""
    correct = getattr(trajectory, "correct", None)
    return bool(correct) if correct is not None else reward >= 1.0


def own_tool_steps(traj: Any) -> list[Any]:
    """The tool steps `traj` made itself: after its branch point (inherited ones were its ancestors')."""
    point = traj.branch_point or 0
    return [s for s in traj.tool_steps if s.result_start >= point]

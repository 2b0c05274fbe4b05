"""The rollout metrics of a step split over processes (`rollout_batch.rollout_metric_sums`, combined by
`combine_rollout_metrics`) are those of all its trajectories together: failure rates from total
failures and calls (a process that never called a tool adds zero calls), the reward std of every
reward; and with one process they are the figures `rollout_metrics` always gave, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from aepo_jax.agent.trajectory import ToolStep, Trajectory
from aepo_jax.training.metric_keys import TOOL_FAIL_RATE
from aepo_jax.training.rollout_batch import (
    combine_rollout_metrics,
    rollout_metric_sums,
    rollout_metrics,
)


def trajectory(tid: int, steps: list[tuple[str, bool]], generated: int = 2) -> Trajectory:
    traj = Trajectory(traj_id=tid, prompt_index=0, prompt_ids=[1, 2], root_id=tid)
    traj.add_generated([5] * generated, [-1.0] * generated, [0.5] * generated)
    for tag, ok in steps:
        start = len(traj.response_ids)
        traj.add_tool_result([7])
        traj.tool_steps.append(ToolStep(tag, "q", "text", ok, start, start + 1))
        traj.add_generated([5, 6], [-1.0, -1.0], [0.5, 0.5])
    return traj


def two_processes():
    """(groups, rewards) of two processes whose trajectories called different tools."""
    first = ([[trajectory(0, [("search", True), ("python", True)]), trajectory(1, [("search", False)], 5)]],
             [[0.1, 1.0]])
    second = ([[trajectory(2, [("python", False), ("python", False)], 3), trajectory(3, [("invalid", False)])],
               [trajectory(4, [], 7), trajectory(5, [("python", True)])]],
              [[0.7, 0.3], [1.0091, 0.25]])
    return first, second


def test_combined_parts_are_the_metrics_of_all_trajectories_together():
    first, second = two_processes()
    combined = combine_rollout_metrics([rollout_metric_sums(*first), rollout_metric_sums(*second)])
    together = rollout_metrics(first[0] + second[0], first[1] + second[1])
    assert combined == pytest.approx(together)
    assert combined.keys() == together.keys()
    assert combined[f"{TOOL_FAIL_RATE}/python"] == pytest.approx(2 / 4)  # 2 failed of 4: not (0/1 + 2/3) / 2
    assert combined[f"{TOOL_FAIL_RATE}/search"] == pytest.approx(1 / 2)  # the second process called none
    assert combined[TOOL_FAIL_RATE] == pytest.approx(3 / 6)  # the malformed closing is no call
    rewards = np.asarray([0.1, 1.0, 0.7, 0.3, 1.0091, 0.25])
    assert combined["reward_std"] == pytest.approx(rewards.std(), rel=1e-12)  # not a mean of per-process stds
    assert combined["trajectories"] == 6.0


def test_a_process_without_trajectories_changes_nothing():
    first, _ = two_processes()
    assert combine_rollout_metrics([rollout_metric_sums([], []), rollout_metric_sums(*first)]) == \
        rollout_metrics(*first)
    assert combine_rollout_metrics([rollout_metric_sums([], [])]) == {}


def test_one_process_gives_the_figures_numpy_gives_bit_for_bit():
    """A one-process run logs what it logged before the metrics were made from sums."""
    first, second = two_processes()
    groups, rewards = first[0] + second[0], first[1] + second[1]
    r = np.asarray([x for g in rewards for x in g], np.float64)
    flat = [t for g in groups for t in g]
    metrics = rollout_metrics(groups, rewards)
    assert metrics["reward_mean"] == float(r.mean())
    assert metrics["reward_std"] == float(r.std())
    assert metrics["generated_tokens_mean"] == float(np.mean([float(np.sum(t.mask)) for t in flat]))
    assert metrics["response_length_mean"] == float(np.mean([len(t.response_ids) for t in flat]))

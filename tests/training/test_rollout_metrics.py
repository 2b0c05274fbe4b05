"""The rollout's logged tool-failure rates: a dead search server shows on the console line."""

from __future__ import annotations

import pytest

from aepo_jax.agent.trajectory import ToolStep, Trajectory
from aepo_jax.training.metric_keys import CONSOLE_KEYS, TOOL_FAIL_RATE
from aepo_jax.training.rollout_batch import rollout_metrics


def trajectory(tid: int, steps: list[tuple[str, bool]]) -> Trajectory:
    traj = Trajectory(traj_id=tid, prompt_index=0, prompt_ids=[1, 2], root_id=tid)
    for tag, ok in steps:
        start = len(traj.response_ids)
        traj.add_generated([5, 6], [-1.0, -1.0], [0.5, 0.5])
        traj.add_tool_result([7])
        traj.tool_steps.append(ToolStep(tag, "q", "text", ok, start + 2, start + 3))
    return traj


def test_tool_fail_rates_count_failed_calls_overall_and_per_tag():
    groups = [[trajectory(0, [("search", False), ("search", True), ("python", True)]),
               trajectory(1, [("search", False), ("invalid", False)])]]
    metrics = rollout_metrics(groups, [[1.0, 0.0]])
    assert metrics[TOOL_FAIL_RATE] == pytest.approx(3 / 5)
    assert metrics[f"{TOOL_FAIL_RATE}/search"] == pytest.approx(2 / 3)
    assert metrics[f"{TOOL_FAIL_RATE}/python"] == 0.0 and metrics[f"{TOOL_FAIL_RATE}/invalid"] == 1.0
    assert TOOL_FAIL_RATE in CONSOLE_KEYS


def test_a_rollout_without_tool_calls_has_no_failures():
    metrics = rollout_metrics([[trajectory(0, [])]], [[0.0]])
    assert metrics[TOOL_FAIL_RATE] == 0.0 and not any(k.startswith(TOOL_FAIL_RATE + "/") for k in metrics)

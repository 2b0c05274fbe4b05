"""The rollout's logged metrics: tool calls made vs tool steps, tool-failure rates (a dead search server shows
on the console line) and accuracy."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import numpy as np
import pytest

from aepo_jax.agent.loop import AgentLoop, LoopConfig
from aepo_jax.agent.scripted import (
    ByteTokenizer,
    ScriptedGenerator,
    ScriptedSegment,
    tool_use_script,
)
from aepo_jax.agent.trajectory import ToolStep, Trajectory
from aepo_jax.rollout.strategies import RolloutConfig, rollout
from aepo_jax.training.metric_keys import (
    ACCURACY,
    CONSOLE_KEYS,
    PLOT_PANELS,
    TOOL_CALLS_MADE,
    TOOL_CALLS_MALFORMED,
    TOOL_CALLS_MEAN,
    TOOL_FAIL_RATE,
)
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
    assert metrics[TOOL_FAIL_RATE] == pytest.approx(2 / 4)  # the malformed closing ran no tool: not a call
    assert metrics[f"{TOOL_FAIL_RATE}/search"] == pytest.approx(2 / 3)
    assert metrics[f"{TOOL_FAIL_RATE}/python"] == 0.0 and f"{TOOL_FAIL_RATE}/invalid" not in metrics
    assert metrics[TOOL_CALLS_MALFORMED] == pytest.approx(1 / 2)
    assert TOOL_FAIL_RATE in CONSOLE_KEYS


def test_tool_calls_made_count_each_call_once_and_steps_count_every_block():
    """A branch forked after its parent's first call inherits that call: made once, a step in both."""
    parent = trajectory(0, [("search", False), ("python", True)])
    child = parent.branch(1, parent.tool_steps[0].result_end)
    child.add_generated([5, 6], [-1.0, -1.0], [0.5, 0.5])
    start = len(child.response_ids)
    child.add_tool_result([7])
    child.tool_steps.append(ToolStep("invalid", "", "error", False, start, start + 1))
    child.unappended_tool_calls = 1  # a last call that ran but whose result did not fit
    metrics = rollout_metrics([[parent, child]], [[0.0, 0.0]])
    assert metrics[TOOL_CALLS_MEAN] == pytest.approx((2 + 2) / 2)  # tool-result blocks, as before
    assert metrics[TOOL_CALLS_MADE] == pytest.approx((2 + 1) / 2)  # parent's two, the child's unappended one
    assert metrics[TOOL_CALLS_MALFORMED] == pytest.approx(1 / 2)
    assert metrics[TOOL_FAIL_RATE] == pytest.approx(1 / 2)  # the inherited failed search counts once
    assert TOOL_CALLS_MADE in CONSOLE_KEYS


def test_tool_calls_made_agree_with_the_rollouts_own_count():
    """/tmp/review_stats/tool_calls_meaning.py: branches and malformed closings; rollout/tool_calls is
    the calls the runs made, and no AEPO sample is dropped here, so per trajectory they agree."""
    groups, stats = malformed_arpo_rollout()
    metrics = rollout_metrics(groups, [[0.0] * len(g) for g in groups])
    trajectories = sum(len(g) for g in groups)
    assert stats.num_branch > 0 and metrics[TOOL_CALLS_MALFORMED] > 0
    assert metrics[TOOL_CALLS_MADE] == pytest.approx(stats.tool_calls / trajectories)
    assert metrics[TOOL_CALLS_MADE] < metrics[TOOL_CALLS_MEAN] == pytest.approx(stats.tool_calls_per_trajectory)


def malformed_arpo_rollout():
    """An ARPO rollout whose segments sometimes end at a closing tag without a complete call."""
    tok = ByteTokenizer()
    base = tool_use_script(tok, 0.9, max_calls=4)

    def script(ids, rng):
        seg = base(ids, rng)
        if "</search>" in tok.decode(seg.tokens) and rng.uniform() < 0.35:
            tokens = tok.encode("<think>r</think>oops</search>")
            return ScriptedSegment(tokens, [1.0] * len(tokens), "stop")
        return seg

    tools = SimpleNamespace(run_many=lambda calls: [SimpleNamespace(text=f"{c.tag}:{c.content}", ok=True)
                                                     for c in calls])
    loop = AgentLoop(ScriptedGenerator(script, seed=0), tok, tools,
                     LoopConfig(max_tool_calls=4, max_response_tokens=3000, max_context_len=5000))
    return rollout([tok.encode(f"q{i}") for i in range(4)], 8, loop=loop,
                   config=RolloutConfig(strategy="arpo", branch_threshold=0.3), rng=np.random.default_rng(0),
                   key=jax.random.key(0))


def test_accuracy_reads_recorded_correctness_else_reward_reaching_one():
    recorded, plain = trajectory(0, []), trajectory(1, [])
    recorded.correct = False  # F1 0.91 + the multi-tool bonus: reward 1.0091, no exact match
    assert rollout_metrics([[recorded, plain]], [[1.0091, 1.0]])[ACCURACY] == 0.5


def test_a_rollout_without_tool_calls_has_no_failures():
    metrics = rollout_metrics([[trajectory(0, [])]], [[0.0]])
    assert metrics[TOOL_FAIL_RATE] == 0.0 and not any(k.startswith(TOOL_FAIL_RATE + "/") for k in metrics)


def test_tool_calls_panel_draws_calls_made_and_falls_back_to_steps_for_older_runs():
    from launch.plot_metrics import curve

    assert dict(PLOT_PANELS)["tool calls per trajectory"] == (TOOL_CALLS_MADE,)
    new = [{"step": 1, TOOL_CALLS_MEAN: 3.0, TOOL_CALLS_MADE: 1.5}, {"step": 2, TOOL_CALLS_MEAN: 2.0, TOOL_CALLS_MADE: 1.0}]
    old = [{"step": 1, TOOL_CALLS_MEAN: 3.0}, {"step": 2, TOOL_CALLS_MEAN: 2.0}]
    assert curve(new, TOOL_CALLS_MADE) == (TOOL_CALLS_MADE, [(1, 1.5), (2, 1.0)])
    assert curve(old, TOOL_CALLS_MADE) == (TOOL_CALLS_MEAN, [(1, 3.0), (2, 2.0)])
    assert curve(old, "branch_top3_fraction") == ("branch_top3_fraction", [])

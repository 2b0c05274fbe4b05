"""Serial and total tool calls of a rollout's trees: hand-built trees with known answers, and a scripted
loop run checked against what its tool runner actually received."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from aepo_jax.agent.loop import AgentLoop, LoopConfig, LoopResult, RolloutEvent
from aepo_jax.agent.scripted import ByteTokenizer, ScriptedGenerator, ScriptedSegment
from aepo_jax.agent.trajectory import ToolStep, Trajectory
from aepo_jax.rollout.critical_path import (
    ToolCallPath,
    rollout_tool_path,
    run_tool_path,
)

TOK = ByteTokenizer()


def global_with_calls(traj_id: int, prompt: int, calls: int, tag: str = "search") -> Trajectory:
    """A finished global trajectory with `calls` tool steps (4 response tokens each: 2 generated, 2 result)."""
    t = Trajectory(traj_id=traj_id, prompt_index=prompt, prompt_ids=[5], root_id=traj_id)
    for _ in range(calls):
        start = len(t.response_ids)
        t.add_generated([1, 2], [-0.1, -0.1], [0.5, 0.5])
        t.add_tool_result([7, 7])
        t.tool_steps.append(ToolStep(tag, "q", "r", True, start + 2, start + 4))
    t.stop_reason = "answer"
    return t


def branch_with_calls(traj_id: int, parent: Trajectory, after_result: int, calls: int) -> Trajectory:
    """A branch forked at the end of `parent`'s `after_result`-th tool result, making `calls` more calls."""
    point = parent.tool_steps[after_result - 1].result_end
    t = parent.branch(traj_id, point)
    for _ in range(calls):
        start = len(t.response_ids)
        t.add_generated([3], [-0.1], [0.5])
        t.add_tool_result([8])
        t.tool_steps.append(ToolStep("python", "p", "r", True, start + 1, start + 2))
    t.stop_reason = "answer"
    return t


def test_hand_built_trees():
    """Prompt 0: global A (3 calls); B branches after A's 1st result and makes 2 calls (chain 1 + 2 = 3);
    C branches from B after B's 1st own result and makes 2 (chain 1 + 1 + 2 = 4); top-up D (2 calls)
    starts when all of them are done (chain 4 + 2 = 6). Prompt 1: one global of 5 calls, and a reused
    trajectory from an earlier run (not in this run's events: its 4 calls are not counted). A malformed
    call (tag "invalid") runs no tool."""
    a = global_with_calls(0, 0, 3)
    b = branch_with_calls(1, a, 1, 2)
    c = branch_with_calls(2, b, 2, 2)  # b's 2nd result overall is its 1st own one
    d = global_with_calls(3, 0, 2)
    old = global_with_calls(10, 1, 4)
    e = global_with_calls(11, 1, 5)
    e.tool_steps[-1].tag = "invalid"
    events = [RolloutEvent(1, 0, 0, "initial", 0), RolloutEvent(2, 0, 1, "branch", 1),
              RolloutEvent(3, 0, 2, "branch", 2), RolloutEvent(5, 0, 3, "topup", 0),
              RolloutEvent(1, 1, 11, "initial", 1)]
    result = LoopResult([[a, b, c, d], [old, e]], events)
    assert run_tool_path(result) == ToolCallPath(serial=6, total=3 + 2 + 2 + 2 + 4)
    pre = LoopResult([[global_with_calls(0, 0, 2)]], [RolloutEvent(1, 0, 0, "initial", 0)])
    assert rollout_tool_path([pre, result]) == ToolCallPath(serial=2 + 6, total=2 + 13)


class LoggingTools:
    """Answers after `latency` s; records every call and how many were in flight together."""

    def __init__(self, latency):
        self.latency, self.calls, self.batches, self.lock = latency, 0, 0, threading.Lock()

    def run_many(self, calls):
        with self.lock:
            self.calls += len(calls)
            self.batches += 1
        time.sleep(self.latency)
        return [SimpleNamespace(text=f"{c.tag}:{c.content}", ok=True) for c in calls]


def three_calls_script(ids, rng):
    """Each row searches three times, then answers."""
    n = ids.count(TOK.token_to_id("<result>"))
    body = "<search>s</search>" if n < 3 else "<answer>\\boxed{1}</answer>"
    tokens = TOK.encode("<think>x</think>" + body)
    return ScriptedSegment(tokens, [1.0] * len(tokens), "stop")


@pytest.mark.parametrize("schedule", ["rounds", "continuous"])
@pytest.mark.parametrize(("initial", "serial"), [(2, 3), (1, 6)])
def test_loop_run_counts_match_the_tool_runner(schedule, initial, serial):
    """Three prompts, k = 2, three calls per trajectory and no branching: 18 calls. With both trajectories
    started at once, 3 calls in a chain; with one, the second is a top-up after the first: 6. Under rounds
    (lockstep, every row alike) each chained call is one round's batch of calls."""
    tools = LoggingTools(latency=0.05)
    config = LoopConfig(max_tool_calls=6, max_response_tokens=500, max_context_len=1000, schedule=schedule)
    start = time.perf_counter()
    result = AgentLoop(ScriptedGenerator(three_calls_script), TOK, tools, config).run(
        [TOK.encode(f"q{i}") for i in range(3)], 2, initial, rng=np.random.default_rng(0), key=jax.random.key(0))
    seconds = time.perf_counter() - start
    path = run_tool_path(result)
    assert path.total == tools.calls == 18
    assert path.serial == serial
    assert seconds >= path.serial * tools.latency
    if schedule == "rounds":
        assert tools.batches == serial



def short_short_long_script(ids, rng):
    """Two searches for "short", a third for "long", then an answer."""
    n = ids.count(TOK.token_to_id("<result>"))
    body = "<search>short</search>" if n < 2 else "<search>long</search>" if n == 2 else "<answer>\\boxed{1}</answer>"
    tokens = TOK.encode("<think>x</think>" + body)
    return ScriptedSegment(tokens, [1.0] * len(tokens), "stop")


class LongResultTools(LoggingTools):
    """`LoggingTools` whose result to a "long" search is 300 characters more."""

    def run_many(self, calls):
        return [SimpleNamespace(text=r.text + "Z" * 300 * (c.content == "long"), ok=True)
                for r, c in zip(super().run_many(calls), calls, strict=True)]


@pytest.mark.parametrize("schedule", ["rounds", "continuous"])
def test_a_call_whose_result_does_not_fit_counts_as_made(schedule):
    """Each row's third call runs, but its result would pass max_response_tokens: the row ends by length
    with two tool steps, and the call still counts as made, the last of its chain (regression: uncounted)."""
    tools = LongResultTools(latency=0.0)
    config = LoopConfig(max_tool_calls=6, max_response_tokens=300, max_context_len=1000, schedule=schedule)
    result = AgentLoop(ScriptedGenerator(short_short_long_script), TOK, tools, config).run(
        [TOK.encode(f"q{i}") for i in range(3)], 1, 1, rng=np.random.default_rng(0), key=jax.random.key(0))
    trajs = [t for g in result.groups for t in g]
    assert [(t.stop_reason, t.num_tool_calls, t.unappended_tool_calls) for t in trajs] == [("length", 2, 1)] * 3
    assert run_tool_path(result) == ToolCallPath(serial=3, total=tools.calls) and tools.calls == 9

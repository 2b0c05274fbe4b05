"""The tool calls a rollout makes, and how many of them its trees force one after another.

A call can start only once the segment before it is decoded, so the calls
along a trajectory run one after another; a branch continues its parent's
chain from the tool result it was forked at; a top-up starts only when every
earlier trajectory of its prompt has finished (spec 2.2 step 4); and AEPO's
main run starts after the pre-monitoring run (in-run pre-monitoring: a prompt's
initial globals, and the branches of its pre-monitoring sample, start once
that sample has finished). With every call taking L seconds
and at most N in flight, no schedule of the agent loop finishes a rollout
sooner than max(serial * L, total * L / N): what hiding tool latency could
gain at best (`benchmarks/rollout_bench.py`). The count is optimistic where
the loop is stricter (a reused trajectory's branches are taken to start at
once), so the bound stays a lower bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aepo_jax.agent.loop_config import LoopResult
from aepo_jax.agent.trajectory import Trajectory

NO_CALL_TAG = "invalid"  # a tool step the loop answered itself (malformed call): no tool ran


@dataclass(frozen=True)
class ToolCallPath:
    serial: int  # calls on the longest chain of calls that must follow one another
    total: int  # calls made (a branch does not make its parent's calls again)


def own_calls(traj: Trajectory) -> int:
    """Tool calls `traj` made itself: after its branch point, each one a real call, and a last call
    whose result did not fit."""
    point = traj.branch_point or 0
    appended = sum(1 for s in traj.tool_steps if s.tag != NO_CALL_TAG and s.result_start >= point)
    return appended + traj.unappended_tool_calls


def _calls_before(traj: Trajectory, point: int) -> int:
    """Of `traj`'s own calls, those whose result ends by response index `point`."""
    start = traj.branch_point or 0
    return sum(1 for s in traj.tool_steps if s.tag != NO_CALL_TAG and start <= s.result_start and s.result_end <= point)


def run_tool_path(result: LoopResult) -> ToolCallPath:
    """Serial and total tool calls of one `AgentLoop.run` (trajectories it did not create made none in it)."""
    created = {e.traj_id: e for e in result.events}
    trajs = sorted((t for g in result.groups for t in g), key=lambda t: t.traj_id)  # ids follow creation order
    by_id = {t.traj_id: t for t in trajs}
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    prompt_end: dict[int, int] = {}  # latest chain end among each prompt's trajectories so far
    sampled: dict[int, int] = {}  # in-run pre-monitoring: chain end of each prompt's sample
    total = 0
    for traj in trajs:
        event = created.get(traj.traj_id)
        if event is None:  # finished before this run (AEPO's reused pre-monitoring sample)
            start[traj.traj_id] = end[traj.traj_id] = 0
            continue
        if event.kind == "branch":
            parent = by_id[traj.parent_id]
            if getattr(created.get(parent.traj_id), "kind", None) == "premonitor":
                start[traj.traj_id] = end[parent.traj_id]  # decided once the whole sample had finished
            else:
                made_by_parent = _calls_before(parent, traj.branch_point) if parent.traj_id in created else 0
                start[traj.traj_id] = start[parent.traj_id] + made_by_parent
        elif event.kind == "topup":  # every earlier trajectory of the prompt has finished
            start[traj.traj_id] = prompt_end.get(traj.prompt_index, 0)
        else:  # "initial" (after the prompt's sample, with in-run pre-monitoring) or "premonitor"
            start[traj.traj_id] = sampled.get(traj.prompt_index, 0)
        calls = own_calls(traj)
        total += calls
        end[traj.traj_id] = start[traj.traj_id] + calls
        prompt_end[traj.prompt_index] = max(prompt_end.get(traj.prompt_index, 0), end[traj.traj_id])
        if event.kind == "premonitor":
            sampled[traj.prompt_index] = end[traj.traj_id]
    return ToolCallPath(serial=max(end.values(), default=0), total=total)


def rollout_tool_path(runs: Sequence[LoopResult]) -> ToolCallPath:
    """The runs of one rollout, one after another (AEPO: pre-monitoring, then the main run)."""
    paths = [run_tool_path(r) for r in runs]
    return ToolCallPath(serial=sum(p.serial for p in paths), total=sum(p.total for p in paths))

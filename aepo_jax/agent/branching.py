"""Branch decisions of the agent loop (spec 2.2 step 3), shared by both schedules.

A row's segment after a tool result is measured by the entropy of its first K
tokens; once it is, the branch policy says how many branches start from the
decode state *as it was right after the tool result* (a snapshot the loop took
then: the generator's marks of those rows, which copy no cache, or a fork),
or, for `branch_by="prefill"` and reused finished globals (AEPO's
pre-monitoring samples), from a prefill of the shared prefix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from aepo_jax.agent.loop_config import RolloutEvent
from aepo_jax.agent.trajectory import Trajectory

PREFILL = "prefill"  # a `_decide_branches` source: prefill the children's prompts and responses when adding them


@dataclasses.dataclass(frozen=True)
class MarkedRows:
    """Children to fork from rows of the loop's decode state as `marks` marked them: child j from the row
    now in slot parent_slots[j] (the rows stay in their slots until the children are added)."""

    marks: Any
    parent_slots: list[int]


class Replays:
    """Reused finished globals (AEPO's pre-monitoring samples) that still draw their branch decisions,
    one tool result per round of their prompt (`PromptRounds`): decision j in round start + 1 + j, when
    the globals that start in round `start` draw theirs. Where a prompt's rows reach their tool results
    at different times (`continuous`), decision j also comes as soon as another trajectory of the prompt
    has its result j appended: before any row can draw its own decision j, as in a lockstep round."""

    def __init__(self, trajs: list[Trajectory]) -> None:
        self.trajs: list[Trajectory] = []
        self._start: dict[int, int] = {}
        self._next: dict[int, int] = {}  # the tool step whose decision comes next
        for traj in trajs:
            self.add(traj, 1)

    def add(self, traj: Trajectory, start: int) -> None:
        """`traj` replays from its prompt's round `start + 1` on."""
        self.trajs.append(traj)
        self._start[traj.traj_id], self._next[traj.traj_id] = start, 0

    def left(self, traj: Trajectory) -> bool:
        """True while `traj` has a tool result whose decision is still to come."""
        return self._next[traj.traj_id] < len(traj.tool_steps)

    def any_left(self) -> bool:
        return any(self.left(t) for t in self.trajs)

    def due(self, prompt_round: Callable[[int], int], depth: Callable[[int], int]) -> list[Trajectory]:
        """Replays whose next decision j is due now: in their prompt's round (`prompt_round(prompt)`)
        start + 1 + j, or once another trajectory of the prompt has its tool result j (`depth(prompt)`
        results or more)."""
        return [t for t in self.trajs if self.left(t) and (
            self._next[t.traj_id] <= prompt_round(t.prompt_index) - 1 - self._start[t.traj_id]
            or depth(t.prompt_index) > self._next[t.traj_id])]

    def take(self, traj: Trajectory) -> int:
        """The tool step `traj` decides now; from here on it counts as decided (also for `left`)."""
        step = self._next[traj.traj_id]
        self._next[traj.traj_id] = step + 1
        return step


class NewBranches:
    """The branches one call of `_decide_branches` draws, grouped by where they start."""

    def __init__(self) -> None:
        self.by_snapshot: dict[int, tuple[Any, list[int], list[Trajectory], list[int]]] = {}
        self.prefilled: list[Trajectory] = []

    def states(self, by_marks: bool) -> list[tuple[Any, list[Trajectory], list[int] | None]]:
        """(source, children, rows) per snapshot, then the prefilled ones. Marks: the children are forked from
        their parents' rows (their slots now) as marked, when they are added (`_add_children`): no row moves
        before then, and a finished parent's row stays intact."""
        states = [(MarkedRows(snapshot, parents) if by_marks else snapshot, kids, rows)
                  for snapshot, rows, kids, parents in self.by_snapshot.values()]
        if self.prefilled:
            states.append((PREFILL, self.prefilled, None))
        return states


class BranchDecisions:
    """The branch-decision methods of the loop's per-run state (`loop._Run`), which provides rows,
    pending, snapshots_by_marks, replays, policy, ks, groups, rng, ids, events, round, cfg, gen, slots,
    _pauses, _active, _prompt_round and _depth."""

    def _decide_branches(self, outputs: list[tuple[list[int], str] | None]
                         ) -> list[tuple[Any, list[Trajectory], list[int] | None]]:
        """Branch decisions for rows whose segment after a tool result is measured (spec 2.2 step 3).
        Returns (state, children, rows): child j starts as row rows[j] of state (None: row j).

        A decision waits while that segment is paused with fewer than K tokens,
        so it always reads the entropy of K tokens (or of the whole, shorter
        segment). None is drawn once the prompt has no budget left. Under
        `continuous` the decisions are drawn in their prompt's rounds
        (`aepo_jax.agent.decision_rounds`).
        """
        if self.policy is None:
            self.pending = {}
            return []
        if self.cfg.schedule == "continuous":
            return self._decide_in_rounds(outputs)
        drawn = NewBranches()
        for traj in self.replays.due(self._prompt_round, self._depth):
            drawn.prefilled += self._decide(traj, self.replays.take(traj))
        waiting: dict[int, tuple[Any, int]] = {}
        for row, traj in enumerate(self.rows):
            if traj.traj_id not in self.pending:
                continue
            segment = self._measured_segment(traj, self.pending[traj.traj_id][2])
            if segment is None:
                continue  # nothing was generated after the tool result: no entropy to judge
            if self.cfg.decision_entropy == "after_result" and segment.end - segment.start < self.cfg.entropy_tokens \
                    and self._pauses(row, outputs[row][1]):
                waiting[traj.traj_id] = self.pending[traj.traj_id]  # fewer than K tokens so far: decide next round
                continue
            self._draw_pending(traj, row, drawn)
        self.pending = waiting
        return drawn.states(self.snapshots_by_marks)

    def _segment_after_result(self, traj: Trajectory, step: int = -1) -> Any:
        """The segment that starts right after `traj`'s tool result `step` (default its latest), or None while
        there is none."""
        point = traj.tool_steps[step].result_end
        return next((s for s in reversed(traj.segments) if s.start == point), None)

    def _measured_segment(self, traj: Trajectory, step: int) -> Any:
        """The segment whose entropy decides at `traj`'s tool result `step` (`decision_entropy`): the one after
        the result (None while there is none), or the one that ended with the call."""
        if self.cfg.decision_entropy == "after_result":
            return self._segment_after_result(traj, step)
        call_end = traj.tool_steps[step].result_start
        return next((s for s in reversed(traj.segments) if s.end == call_end), None)

    def _draw_pending(self, traj: Trajectory, row: int, drawn: NewBranches) -> None:
        """Draw the decision `traj` (row `row` of the loop) awaits (`pending`: on its tool result `step`)
        into `drawn`."""
        snapshot, slot, step = self.pending[traj.traj_id]
        new = self._decide(traj, step)
        if not new:
            return
        if self.cfg.branch_by == "prefill":
            drawn.prefilled += new
            return
        _, rows, kids, parents = drawn.by_snapshot.setdefault(id(snapshot), (snapshot, [], [], []))
        rows += [slot] * len(new)
        kids += new
        parents += [self.slots[row]] * len(new)

    def branch_budget(self, prompt: int) -> int:
        """Trajectories `prompt` may still get (spec 2.2 budget); groups only grow, so once 0 it stays 0."""
        return self.ks[prompt] - len(self.groups[prompt])

    def _decide(self, traj: Trajectory, step: int) -> list[Trajectory]:
        """Ask the policy at `traj`'s tool result `step` (the branches start right after it); returns the new
        branches."""
        prompt = traj.prompt_index
        budget = self.branch_budget(prompt)
        branch_point = traj.tool_steps[step].result_end
        segment = self._measured_segment(traj, step)
        if budget <= 0 or segment is None:
            return []  # no budget (or nothing generated after the result): no decision to draw
        wanted = self.policy.branch_count(traj, segment.entropy, self.rng)
        count = max(0, min(wanted, budget))
        traj.decisions.append((branch_point, count > 0))
        children = []
        for _ in range(count):
            tid = next(self.ids)
            self.events.append(RolloutEvent(self.round, prompt, tid, "branch", self._active(prompt)))
            child = traj.branch(tid, branch_point)
            self.groups[prompt].append(child)
            children.append(child)
        return children

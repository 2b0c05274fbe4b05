"""Branch decisions of the continuous schedule, drawn in the lockstep rounds they would fall in.

Under `rounds` each row of a prompt takes one tool step per round, and a round's decisions are drawn
together, in row order: the prompt's branch budget goes out round by round (spec 2.2 step 3). Under
`continuous` a prompt's rows reach their tool results at different times. Drawing each decision as soon as
its row had K tokens after the result would hand the budget to the rows whose tools answer first (a row
with a slow tool could get no branch at all) and would freeze the prompt-scope counter while one row waits.

So each prompt counts its own rounds here. A row that first decodes in round s draws the decision on its
i-th tool result in round s + i; round v is drawn once every row of the prompt that can still take part in
it has its decision measured (K tokens after the result, or a finished shorter segment) or has finished
without reaching it, and then in row order, reused samples first, as `rounds` draws them. A row goes on
meanwhile: the decisions on its later tool results queue behind (each with its own snapshot, taken right
after its result), and a finished row keeps its row (its snapshot) until its last decision is drawn. Branches join the round after the last one drawn, a new
global (a top-up) the round after the one its prompt's last row finished in; the prompt-scope
consecutive-branch counter and reused samples count these rounds, a round ending just before the next is
drawn, with its branches and the top-ups its finished rows made room for.
"""

from __future__ import annotations

from typing import Any

from aepo_jax.agent.branching import NewBranches
from aepo_jax.agent.trajectory import Trajectory


class DecisionRounds:
    """Each prompt's rounds of branch decisions under `continuous` (module docstring)."""

    def __init__(self, num_prompts: int) -> None:
        self.drawn = [0] * num_prompts  # the last round of each prompt whose decisions are drawn
        self.members: list[list[Trajectory]] = [[] for _ in range(num_prompts)]  # in the order they joined
        self.ended = [0] * num_prompts  # the last round of each prompt ended for the prompt-scope counter
        # prompt -> {round: trajectories it got}: a round's branches, and a new global in the round before its
        # start (the round its prompt's last row finished in, as `rounds` counts a top-up)
        self.new: list[dict[int, int]] = [{} for _ in range(num_prompts)]
        self._start: dict[int, int] = {}  # traj_id -> the round it first decodes in
        self._results: dict[int, int] = {}  # traj_id -> tool results appended since then
        self._steps_before: dict[int, int] = {}  # traj_id -> tool steps it had when it joined (a branch's)

    def join(self, traj: Trajectory, new_global: bool = False) -> None:
        """`traj` starts decoding in the round after its prompt's last drawn one; a new global (a top-up, the
        globals after a pre-monitoring sample) no sooner than the round after the one its prompt's last row
        finished in, where `rounds` makes it (that row's round may not be drawn yet)."""
        prompt = traj.prompt_index
        start = self.drawn[prompt] + 1
        if new_global:
            start = max([start, *(self._start[t.traj_id] + self._results[t.traj_id] + 1
                                  for t in self.members[prompt] if t.finished)])
            self.new[prompt][start - 1] = self.new[prompt].get(start - 1, 0) + 1
        self.members[prompt].append(traj)
        self._start[traj.traj_id] = start
        self._results[traj.traj_id] = 0
        self._steps_before[traj.traj_id] = len(traj.tool_steps)

    def step_in_round(self, traj: Trajectory, round_index: int) -> int:
        """The tool step (index into `traj.tool_steps`) whose decision falls in its prompt's round `round_index`."""
        return self._steps_before[traj.traj_id] + round_index - self._start[traj.traj_id] - 1

    def appended(self, traj: Trajectory) -> None:
        self._results[traj.traj_id] += 1

    def start(self, traj: Trajectory) -> int:
        return self._start[traj.traj_id]

    def due(self, traj: Trajectory) -> int:
        """The tool result (counted from the row's start) whose decision falls in its prompt's next round."""
        return self.drawn[traj.prompt_index] + 1 - self._start[traj.traj_id]

    def results(self, traj: Trajectory) -> int:
        return self._results[traj.traj_id]


class RoundDecisions:
    """`_decide_branches` under `continuous`: a method of the loop's per-run state (`loop._Run`), which
    provides rows, pending, later, measured, rounds_drawn, decision_rounds, replays, policy, cfg, prompts, events,
    _pauses, _segment_after_result, _draw_pending, _decide and snapshots_by_marks."""

    def _decide_in_rounds(self, outputs: list[tuple[list[int], str] | None]
                          ) -> list[tuple[Any, list[Trajectory], list[int] | None]]:
        """Notes which pending decisions this tick measured, then draws each prompt's next round if it is
        complete (module docstring); returns the new branches as `_decide_branches` does."""
        for row, traj in enumerate(self.rows):
            if traj.traj_id not in self.pending or outputs[row] is None:
                continue
            segment = self._segment_after_result(traj)  # after its latest result
            if segment is not None and (segment.end - segment.start >= self.cfg.entropy_tokens
                                        or not self._pauses(row, outputs[row][1])):
                self.measured.add(traj.traj_id)
        drawn = NewBranches()
        row_of = {t.traj_id: i for i, t in enumerate(self.rows)}
        rounds = self.decision_rounds
        self.rounds_drawn = [prompt for prompt in range(len(self.prompts)) if self._round_complete(prompt)]
        self._end_rounds_before({prompt: rounds.drawn[prompt] + 1 for prompt in self.rounds_drawn})
        for prompt in self.rounds_drawn:
            rounds.drawn[prompt] += 1
            now = rounds.drawn[prompt]
            branches_before = len(self.events)
            for traj in self.replays.due(lambda _, now=now: now, lambda _: 0):
                if traj.prompt_index == prompt:
                    drawn.prefilled += self._decide(traj, self.replays.take(traj))
            for traj in rounds.members[prompt]:
                tid = traj.traj_id
                if tid not in self.pending or self.pending[tid][2] != rounds.step_in_round(traj, now):
                    continue
                if self._segment_after_result(traj, self.pending[tid][2]) is not None:
                    self._draw_pending(traj, row_of[tid], drawn)
                self._next_pending(tid)
            branches = sum(1 for e in self.events[branches_before:] if e.kind == "branch")
            rounds.new[prompt][now] = rounds.new[prompt].get(now, 0) + branches
        return drawn.states(self.snapshots_by_marks)

    def _next_pending(self, traj_id: int) -> None:
        """The drawn decision leaves `pending`; the first one queued behind it (`later`) takes its place."""
        del self.pending[traj_id]
        queued = self.later.get(traj_id)
        if queued:
            self.pending[traj_id] = queued.pop(0)
            if not queued:
                del self.later[traj_id]

    def _round_complete(self, prompt: int) -> bool:
        """True when `prompt`'s next round can be drawn: something of the prompt is still going (a live row,
        a finished row awaiting its decision, a reused sample with decisions left), and every row that can
        take part in the round has reached it with its decision measured, or has finished without it."""
        rounds = self.decision_rounds
        members = rounds.members[prompt]
        going = any(not t.finished or t.traj_id in self.pending for t in members) or any(
            self.replays.left(t) for t in self.replays.trajs if t.prompt_index == prompt)
        if not going:
            return False
        for traj in members:
            result = rounds.due(traj)
            if result <= 0:
                continue  # started in this round: its first decision comes in a later one
            reached = rounds.results(traj)
            if reached < result:
                if not traj.finished:
                    return False  # still on its way to that tool result
                continue
            if reached == result and traj.traj_id in self.pending and not traj.finished \
                    and traj.traj_id not in self.measured:
                return False  # its latest result: fewer than K tokens after it so far
        return True

    def _end_rounds_before(self, drawing: dict[int, int]) -> None:
        """Ends each drawing prompt's rounds before the one it draws now (`drawing`: prompt -> that round) for
        the prompt-scope counter, each with the trajectories it got; one `end_round` call per layer, so the
        policy counts one round per tick as before. A round ends only here, just before the next is drawn: by
        then the rows that finished in it have finished (they blocked the next round), so its top-ups count."""
        rounds = self.decision_rounds
        todo = {prompt: list(range(rounds.ended[prompt] + 1, now)) for prompt, now in drawing.items()}
        while any(todo.values()):
            ended: list[int | None] = [None] * len(self.prompts)
            for prompt, left in todo.items():
                if left:
                    ending = left.pop(0)
                    ended[prompt] = rounds.new[prompt].pop(ending, 0)
                    rounds.ended[prompt] = ending
            if self.policy is not None:
                self.policy.end_round(ended)

"""The continuous schedule of the agent loop: tool calls run while the other rows decode.

Each tick decodes the generating rows for at most `LoopConfig.chunk_tokens`
tokens, while at least `LoopConfig.min_generating_fraction` of the live rows
are generating or the tool runner has idle workers (fewer rows, and every worker
busy: it waits for tool results first, and once one arrives it
keeps collecting those that follow within `LoopConfig.arrival_window_ms` of
each other, so calls started together resume together). A row that stops at a
tool call has the call submitted to a thread pool at once and stays where it is in the decode state: rows are ragged (each
has its own cache cursor), so a waiting row decodes nothing and writes no slots,
and no cache row is copied out or back. Each tick starts by appending every result
that has arrived (after any wait), in place, in one `append`. Branch decisions,
compaction and top-ups run at every tick exactly as at the end of a lockstep
round (`aepo_jax.agent.loop`), except that branch decisions are drawn in the
lockstep rounds they would fall in (`aepo_jax.agent.decision_rounds`); only when every row is waiting
does the loop block, on the first result. What counts per round (a reused sample's
decisions, the prompt-scope consecutive-branch counter) counts those rounds, not ticks.
docs/rollout_engine.md says what this does and does not do yet.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from aepo_jax.agent.protocol import ToolCall
from aepo_jax.agent.trajectory import Trajectory
from aepo_jax.parallel.device_turns import off_device_turn

TOOL_THREADS = 32  # the continuous schedule's tool threads when the runner does not say its own limit


def resolved(value: Any) -> Future:
    """A future that is already done (a malformed call's error text needs no tool)."""
    future: Future = Future()
    future.set_result(value)
    return future


class ContinuousSchedule:
    """The continuous schedule's methods of the loop's per-run state (`loop._Run`), which provides
    rows, state, waiting, pending, pool, replays, rounds_drawn and the round steps (_decode,
    _decide_branches, _classify, _append_results, _compact, _add_children, _shrink, _top_up."""

    def _run_continuous(self) -> None:
        """Ticks of one decode chunk; tool calls run on `self.pool` meanwhile (module docstring)."""
        while self.rows or self.replays.any_left():
            self.round += 1
            # Results are appended once a tick, just before it decodes: those that arrived while the last
            # tick decoded, and, when too few rows could decode, those waited for (module docstring), all
            # in one append.
            while self._unfinished_calls() and self._too_few_generating():
                self._wait_for_results()
            folded = self._fold_in_arrived()
            if folded:
                self._compact()
                self._top_up()
            generating = any(self._decodes(t) for t in self.rows)
            outputs = self._decode() if generating else [None] * len(self.rows)
            children = self._decide_branches(outputs)
            if not (folded or generating or self.rounds_drawn or self._unfinished_calls()):
                raise RuntimeError(
                    f"the continuous schedule is stuck at tick {self.round}: no row can decode, no tool call "
                    f"is running and no branch decision can be drawn ({len(self.rows)} rows, "
                    f"{len(self.pending)} decisions pending)")
            calls, malformed = self._classify(outputs)
            for i, call in calls:
                self.waiting[self.rows[i].traj_id] = self.pool.submit(self._call_tool, call)
            for i, message in malformed.items():
                self.waiting[self.rows[i].traj_id] = resolved((None, message, False))
            self._compact(shrink=False)  # the children first: the marked parents stay in their rows until then
            self._add_children(children)
            self._shrink()
            self._top_up()

    def _decodes(self, traj: Trajectory) -> bool:
        """True for a row that decodes this tick: not finished and not waiting on a tool result."""
        return not traj.finished and traj.traj_id not in self.waiting

    def _unfinished_calls(self) -> bool:
        return any(not future.done() for future in self.waiting.values())

    def _wait_for_results(self) -> None:
        """Blocks until a tool result arrives, then while more keep arriving within the arrival window."""
        pending = [future for future in self.waiting.values() if not future.done()]
        with off_device_turn():  # a rollout ahead of training: the trainer's programs run meanwhile
            wait(pending, return_when=FIRST_COMPLETED)
            window = self.cfg.arrival_window_ms / 1000.0
            while window > 0:
                pending = [f for f in pending if not f.done()]
                if not pending or not wait(pending, timeout=window, return_when=FIRST_COMPLETED).done:
                    return

    def _too_few_generating(self) -> bool:
        """No row can decode, or few can while the tool runner is busy: wait for results first. A row whose
        result has arrived counts as decoding: the tick appends it first."""
        generating = sum(1 for t in self.rows if self._decodes(t) or (not t.finished and self.waiting[t.traj_id].done()))
        if generating == 0:
            return True
        unfinished = sum(1 for future in self.waiting.values() if not future.done())
        return generating < self.cfg.min_generating_fraction * len(self.rows) and unfinished >= self.tool_threads

    def _call_tool(self, call: ToolCall) -> tuple[ToolCall, str, bool]:
        (result,) = self.loop.tools.run_many([call])
        return call, str(result.text), bool(result.ok)

    def _fold_in_arrived(self) -> bool:
        """Append the tool results that have arrived to their rows, in place (one append); False when none had."""
        arrived = [tid for tid, future in self.waiting.items() if future.done()]
        if not arrived:
            return False
        row_of = {t.traj_id: i for i, t in enumerate(self.rows)}
        self._append_results({row_of[tid]: self.waiting.pop(tid).result() for tid in arrived})
        return True

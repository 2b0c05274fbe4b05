"""The continuous schedule of the agent loop: tool calls run while the other rows decode.

Each tick decodes the generating rows for at most `LoopConfig.chunk_tokens`
tokens. A row that stops at a tool call has the call submitted to a thread
pool at once and is parked outside the decode state (its cache rows forked
out), so later chunks compute only generating rows. At every tick boundary the
parked rows whose results have arrived are concatenated back and their results
appended in one `append`. Branch decisions, compaction and top-ups run at every
tick exactly as at the end of a lockstep round (`aepo_jax.agent.loop`); only
when every row is parked does the loop block, on the first result.
docs/rollout_engine.md says what this does and does not do yet.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from aepo_jax.agent.protocol import ToolCall

TOOL_THREADS = 32  # concurrent tool calls of the continuous schedule


def resolved(value: Any) -> Future:
    """A future that is already done (a malformed call's error text needs no tool)."""
    future: Future = Future()
    future.set_result(value)
    return future


class ContinuousSchedule:
    """The continuous schedule's methods of the loop's per-run state (`loop._Run`), which provides
    rows, state, waiting, parked, pool and the round steps (_decode, _decide_branches, _classify,
    _append_results, _compact, _add_rows, _top_up)."""

    def _run_continuous(self) -> None:
        """Ticks of one decode chunk; tool calls run on `self.pool` meanwhile (module docstring)."""
        while self.rows or self.parked or any(self._replay_left(t) for t in self.replays):
            self.round += 1
            if not self.rows and self.parked:
                # Nothing to decode: the device waits for the first result (the only idle time left).
                wait(list(self.waiting.values()), return_when=FIRST_COMPLETED)
                self._fold_in_arrived()
                self._compact()
                self._top_up()
            outputs = self._decode() if self.rows else []
            children = self._decide_branches(outputs)
            calls, malformed = self._classify(outputs)
            for i, call in calls:
                self.waiting[self.rows[i].traj_id] = self.pool.submit(self._call_tool, call)
            for i, message in malformed.items():
                self.waiting[self.rows[i].traj_id] = resolved((None, message, False))
            self._park(sorted([i for i, _ in calls] + list(malformed)))
            self._fold_in_arrived()
            self._compact()
            for child_state, child_trajs in children:
                self._add_rows(child_state, child_trajs)
            self._top_up()
            if self.policy is not None:
                new_per_prompt = [0] * len(self.prompts)
                for e in self.events:
                    if e.round == self.round:
                        new_per_prompt[e.prompt_index] += 1
                self.policy.end_round(new_per_prompt)

    def _call_tool(self, call: ToolCall) -> tuple[ToolCall, str, bool]:
        (result,) = self.loop.tools.run_many([call])
        return call, str(result.text), bool(result.ok)

    def _park(self, launched: list[int]) -> None:
        """Move the rows whose tool calls were just launched out of the decode state (into
        `self.parked`, with their cache rows), so the next chunks compute only generating rows;
        finished rows are dropped on the way."""
        if not launched:
            return
        out = set(launched)
        self.parked.append((self.gen.fork(self.state, launched), [self.rows[i] for i in launched]))
        keep = [i for i, t in enumerate(self.rows) if i not in out and not t.finished]
        self.state = self.gen.fork(self.state, keep) if keep else None
        self.rows = [self.rows[i] for i in keep]

    def _fold_in_arrived(self) -> None:
        """Bring the parked rows whose tool results have arrived back into the decode state and
        append their results (one concat, one append)."""
        arrived = {tid for tid, future in self.waiting.items() if future.done()}
        if not arrived:
            return
        states, trajs, still = [], [], []
        for state, parked in self.parked:
            back = [j for j, t in enumerate(parked) if t.traj_id in arrived]
            rest = [j for j, t in enumerate(parked) if t.traj_id not in arrived]
            if back:
                states.append(self.gen.fork(state, back) if rest else state)
                trajs += [parked[j] for j in back]
            if rest:
                still.append((self.gen.fork(state, rest) if back else state, [parked[j] for j in rest]))
        self.parked = still
        first = len(self.rows)
        self.state = self.gen.concat(([self.state] if self.state is not None else []) + states)
        self.rows += trajs
        self._append_results({first + j: self.waiting.pop(t.traj_id).result() for j, t in enumerate(trajs)})

"""Tool steps of the agent loop, shared by both schedules: classify each row's stop, run the calls
(lockstep rounds), append the results (mask 0) and snapshot the rows that will ask for a branch."""

from __future__ import annotations

from aepo_jax.agent import tags
from aepo_jax.agent.loop_config import next_power_of_two
from aepo_jax.agent.protocol import ToolCall, format_tool_result, parse_last_tool_call
from aepo_jax.agent.trajectory import (
    END_ANSWER,
    END_CONTEXT,
    END_EOS,
    END_LENGTH,
    END_TOOL_LIMIT,
    ToolStep,
)
from aepo_jax.parallel.device_turns import off_device_turn


class ToolSteps:
    """The tool-step methods of the loop's per-run state (`loop._Run`), which provides rows, slots,
    state, gen, loop, cfg, policy, pending, later, measured, paused, premonitoring, decision_rounds, branch_budget,
    _pauses, _by_slot and _repack_if_needed."""

    def _run_tools(self, outputs: list[tuple[list[int], str]]) -> None:
        """Classify each row's stop, run the tool calls concurrently, append their results."""
        calls, malformed = self._classify(outputs)
        results = []
        if calls:
            with off_device_turn():  # a rollout ahead of training: the trainer's programs run meanwhile
                results = self.loop.tools.run_many([c for _, c in calls])
        done: dict[int, tuple[ToolCall | None, str, bool]] = {i: (None, msg, False) for i, msg in malformed.items()}
        for (i, call), res in zip(calls, results, strict=True):
            done[i] = (call, str(res.text), bool(res.ok))
        self._append_results(done)

    def _classify(self, outputs: list[tuple[list[int], str] | None]
                  ) -> tuple[list[tuple[int, ToolCall]], dict[int, str]]:
        """Ends, pauses or finds the tool call of each row that decoded (None: a row that did not);
        returns (row, call) pairs and the error text of rows that stopped at a closing tag without a
        complete call."""
        calls: list[tuple[int, ToolCall]] = []
        malformed: dict[int, str] = {}
        for i, output in enumerate(outputs):
            if output is None:
                continue
            ids, stop = output
            traj = self.rows[i]
            text = self.loop.tokenizer.decode(ids)
            if stop == "eos":
                traj.stop_reason = END_ANSWER if tags.ANSWER_CLOSE in text else END_EOS
            elif stop == "length":
                if self._pauses(i, stop):  # paused before a stop (segment chunk, cache room): continues next round
                    self.paused.add(traj.traj_id)
                else:
                    # No budget left, or no cache room even after a repack: a row that cannot
                    # make progress ends here instead of pausing forever.
                    traj.stop_reason = END_LENGTH if len(traj.response_ids) >= self.cfg.max_response_tokens else END_CONTEXT
            elif stop != "stop":
                raise ValueError(f"generator returned unknown stop_reason {stop!r}")
            elif _ends_with_answer(text):
                traj.stop_reason = END_ANSWER
            elif traj.num_tool_calls >= self.cfg.max_tool_calls:
                traj.stop_reason = END_TOOL_LIMIT
            else:
                call = parse_last_tool_call(text)
                if call is None:
                    malformed[i] = "error: the segment ended at a tool closing tag without a complete tool call"
                else:
                    calls.append((i, call))
        return calls, malformed

    def _append_results(self, done: dict[int, tuple[ToolCall | None, str, bool]]) -> None:
        """Append each row's tool result (mask 0) in one `append`, or end the row when it does not fit;
        under a policy, snapshot the appended rows for their branch decisions."""
        to_append: list[list[int]] = [[] for _ in self.rows]
        appended: list[int] = []
        for i in sorted(done):
            call, result_text, ok = done[i]
            traj = self.rows[i]
            result_ids = list(self.loop.tokenizer.encode(format_tool_result(result_text)))
            too_long = len(traj.response_ids) + len(result_ids) >= self.cfg.max_response_tokens
            if too_long or traj.total_length + len(result_ids) >= self.cfg.max_context_len:
                traj.stop_reason = END_LENGTH if too_long else END_CONTEXT
                traj.unappended_tool_calls += int(call is not None)
                continue
            start = len(traj.response_ids)
            traj.add_tool_result(result_ids)
            tag = call.tag if call is not None else "invalid"
            content = call.content if call is not None else ""
            traj.tool_steps.append(ToolStep(tag, content, result_text, ok, start, start + len(result_ids)))
            self.decision_rounds.appended(traj)
            self.measured.discard(traj.traj_id)  # (`continuous`: its segment after this result is not yet)
            to_append[i] = result_ids
            appended.append(i)
        if appended:
            # A shared cursor advances by the whole (power-of-two) block; ragged rows by their own tokens.
            ragged = getattr(self.state, "cursors", None) is not None
            block = next_power_of_two(max(len(to_append[i]) for i in appended))
            self._repack_if_needed([len(t) if ragged else block for t in to_append])
            self.state = self.gen.append(self.state, self._by_slot(to_append, []))
            # A pre-monitoring sample makes no branch decision, nor does a row whose prompt has no budget
            # left: no snapshot for them.
            sampling = {t.traj_id for t in self.premonitoring.values()}
            deciding = [i for i in appended if self.rows[i].traj_id not in sampling
                        and self.branch_budget(self.rows[i].prompt_index) > 0]
            if self.policy is not None and deciding:
                snapshot = None
                if self.cfg.branch_by == "fork":  # marks when the generator has them: no copy of the rows
                    snap = self.gen.mark if self.snapshots_by_marks else self.gen.fork
                    snapshot = snap(self.state, [self.slots[i] for i in deciding])
                for slot, i in enumerate(deciding):
                    traj = self.rows[i]
                    decision = (snapshot, slot, len(traj.tool_steps) - 1)
                    if traj.traj_id in self.pending:  # `continuous`: behind a decision not drawn yet
                        self.later.setdefault(traj.traj_id, []).append(decision)
                    else:
                        self.pending[traj.traj_id] = decision


def _ends_with_answer(text: str) -> bool:
    """True when the last closing tag of the segment closes an answer (a stop at `</answer>`; a stop
    string may end inside the segment's last token, as `</answer>` does in a token `>.`)."""
    answer = text.rfind(tags.ANSWER_CLOSE)
    return answer >= 0 and all(text.rfind(close) < answer for close in tags.TOOL_CLOSE_TAGS)

"""Tool registry: tag name -> tool; runs calls one at a time or concurrently (DESIGN "Agent loop")."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from aepo_jax.agent.protocol import ToolCall
from aepo_jax.tools.base import Tool, ToolResult, encodable_text, inert_tags

DEFAULT_MAX_WORKERS = 16  # tool calls in flight at once (`rollout.tool_concurrency`)
# Seconds a call may run past the tools' own limit (`rollout.tool_timeout_s`) before the registry gives up on it.
DEADLINE_GRACE_S = 30.0


class ToolRegistry:
    """Maps tag names (`search`, `python`, `browse`) to tools. `run` and `run_many` never raise.

    Args:
      tools: tag -> tool.
      max_workers: threads for `run_many`: the most calls in flight at once. With slow tools
        this caps tool throughput (max_workers / latency calls per second) under every schedule.
      inert_tokens: the policy tokenizer's added-token strings (`text_control_tokens`), made inert in
        every result as the agent tags are (`inert_tags`): a tool's text must not become a control id.
    """

    def __init__(self, tools: Mapping[str, Tool], max_workers: int = DEFAULT_MAX_WORKERS,
                 deadline_s: float | None = None, inert_tokens: Sequence[str] = ()):
        if int(max_workers) < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0 seconds (or None for no deadline), got {deadline_s}")
        self.tools = dict(tools)
        self.max_workers = max_workers
        self.deadline_s = deadline_s
        self.inert_tokens = tuple(inert_tokens)
        self.abandoned_calls = 0  # calls past `deadline_s`, left running on their own thread
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tool")

    def run(self, call: ToolCall | None) -> ToolResult:
        """Run one call; a malformed call, unknown tag, crashing tool, bad return value or (with
        `deadline_s`) a call that does not return in time becomes result text.

        The text is made safe here, for every tool at once: encodable (a lone surrogate, see
        `encodable_text`, would make the tokenizer raise when the loop appends it) and with its
        agent tags and the tokenizer's added tokens inert (`inert_tags`).
        """
        if self.deadline_s is None:
            return self._checked(call)
        done: list[ToolResult] = []
        worker = threading.Thread(target=lambda: done.append(self._checked(call)), name="tool-call", daemon=True)
        worker.start()
        worker.join(self.deadline_s)
        if done:
            return done[0]
        self.abandoned_calls += 1  # a thread cannot be killed: it finishes (or not) on its own, unread
        tag = getattr(call, "tag", "?")
        text = f"Tool {tag!r} timed out: no result within {self.deadline_s:g} s."
        return ToolResult(inert_tags(text, self.inert_tokens), False, self.deadline_s, "timeout")

    def _checked(self, call: ToolCall | None) -> ToolResult:
        """`_dispatch`'s result with safe text, or a failed result when the tool returned something else."""
        start = time.monotonic()
        result = self._dispatch(call)
        if not isinstance(result, ToolResult) or not isinstance(result.text, str):
            text = getattr(result, "text", result)
            return ToolResult(inert_tags(f"Tool {call.tag!r} failed: it returned {type(result).__name__} with "
                                         f"{type(text).__name__} text, not a ToolResult with str text.", self.inert_tokens), False,
                              time.monotonic() - start, "failed")
        return dataclasses.replace(result, text=inert_tags(encodable_text(result.text), self.inert_tokens))

    def _dispatch(self, call: ToolCall | None) -> ToolResult:
        """The tool's own result, or one saying why there is none."""
        start = time.monotonic()
        if not isinstance(call, ToolCall):
            return ToolResult("Tool call failed: no complete tool call was found.", False, 0.0, "bad_call")
        tool = self.tools.get(call.tag)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(f"Tool call failed: unknown tool {call.tag!r} (available: {known}).", False, 0.0,
                              "bad_call")
        try:
            return tool.run(call.content)
        except Exception as error:  # noqa: BLE001 - a tool bug must not take the rollout down (spec §4)
            return ToolResult(f"Tool {call.tag!r} failed: {error.__class__.__name__}: {error}", False,
                              time.monotonic() - start, "failed")

    def run_many(self, calls: Sequence[ToolCall | None]) -> list[ToolResult]:
        """Run calls concurrently on the registry's thread pool; results in the order of `calls`."""
        return list(self._pool.map(self.run, calls))

    def close(self) -> None:
        """Stop the thread pool (tools own their own resources)."""
        self._pool.shutdown(wait=True)

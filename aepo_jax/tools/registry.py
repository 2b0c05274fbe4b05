"""Tool registry: tag name -> tool; runs calls one at a time or concurrently (DESIGN "Agent loop")."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from aepo_jax.agent.protocol import ToolCall
from aepo_jax.tools.base import Tool, ToolResult, encodable_text

DEFAULT_MAX_WORKERS = 16  # tool calls in flight at once (`rollout.tool_concurrency`)


class ToolRegistry:
    """Maps tag names (`search`, `python`, `browse`) to tools. `run` and `run_many` never raise.

    Args:
      tools: tag -> tool.
      max_workers: threads for `run_many`: the most calls in flight at once. With slow tools
        this caps tool throughput (max_workers / latency calls per second) under every schedule.
    """

    def __init__(self, tools: Mapping[str, Tool], max_workers: int = DEFAULT_MAX_WORKERS):
        if int(max_workers) < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.tools = dict(tools)
        self.max_workers = max_workers
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tool")

    def run(self, call: ToolCall | None) -> ToolResult:
        """Run one call; a malformed call, unknown tag or crashing tool becomes result text.

        The text is made encodable here, for every tool at once: a lone surrogate in it
        (see `encodable_text`) would make the tokenizer raise when the loop appends it.
        """
        result = self._dispatch(call)
        return dataclasses.replace(result, text=encodable_text(result.text))

    def _dispatch(self, call: ToolCall | None) -> ToolResult:
        """The tool's own result, or one saying why there is none."""
        start = time.monotonic()
        if not isinstance(call, ToolCall):
            return ToolResult("Tool call failed: no complete tool call was found.", False, 0.0, "bad_call")
        tool = self.tools.get(call.tag)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(f"Tool call failed: unknown tool <{call.tag}> (available: {known}).", False, 0.0,
                              "bad_call")
        try:
            return tool.run(call.content)
        except Exception as error:  # noqa: BLE001 - a tool bug must not take the rollout down (spec §4)
            return ToolResult(f"Tool <{call.tag}> failed: {error.__class__.__name__}: {error}", False,
                              time.monotonic() - start, "failed")

    def run_many(self, calls: Sequence[ToolCall | None]) -> list[ToolResult]:
        """Run calls concurrently on the registry's thread pool; results in the order of `calls`."""
        return list(self._pool.map(self.run, calls))

    def close(self) -> None:
        """Stop the thread pool (tools own their own resources)."""
        self._pool.shutdown(wait=True)

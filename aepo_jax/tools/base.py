"""What every tool returns, and the shape of a tool (DESIGN "Tools", spec §4)."""

from __future__ import annotations

import dataclasses
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """Result text for the model, whether the tool succeeded, wall time, and a short status word.

    status: "ok", or what went wrong: "error", "timeout", "killed",
    "unavailable" (server down), "bad_call" (malformed or unknown call), "failed".
    """

    text: str
    ok: bool
    seconds: float
    status: str


class Tool(Protocol):
    """A tool takes the content of its tag and returns a result; it must not raise."""

    def run(self, content: str) -> ToolResult: ...


def truncate(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` characters, marked when cut."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"... [truncated, {len(text) - max_chars} more characters]"

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


def encodable_text(text: str) -> str:
    """`text` with every lone surrogate code point replaced by "?", so it encodes as UTF-8.

    Lone surrogates reach tool output through `surrogateescape`-decoded bytes (a
    traceback quoting them) or half an escaped emoji in a corpus line; a tokenizer
    cannot encode them, and the rollout would crash on the result.
    """
    return text.encode("utf-8", "replace").decode("utf-8")


def truncate(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` characters, marked when cut."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"... [truncated, {len(text) - max_chars} more characters]"

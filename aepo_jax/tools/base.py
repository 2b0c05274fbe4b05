"""What every tool returns, and the shape of a tool (DESIGN "Tools", spec §4)."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from typing import Protocol

from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS


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


# `<|`: how Qwen's and Llama-3's control tokens open (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`).
CONTROL_TOKEN_OPENING = "<|"
_AGENT_TAG = re.compile("|".join(re.escape(tag) for tag in (*AGENT_SPECIAL_TOKENS, CONTROL_TOKEN_OPENING)))


@functools.lru_cache(maxsize=16)
def _inert_pattern(tokens: tuple[str, ...]) -> re.Pattern:
    """The agent tags, `<|` and those of `tokens` that open with `<`, longest first."""
    extra = sorted({token for token in tokens if token.startswith("<") and len(token) > 1}, key=len, reverse=True)
    if not extra:
        return _AGENT_TAG
    return re.compile("|".join([*(re.escape(token) for token in extra), _AGENT_TAG.pattern]))


def inert_tags(text: str, tokens: Sequence[str] = ()) -> str:
    """`text` with every agent tag (`</result>`, `<answer>`, ...) written `&lt;/result>`, `&lt;answer>`,
    every control-token opening `<|` written `&lt;|`, and each of `tokens` that opens with `<` (the
    tokenizer's own added tokens, `text_control_tokens`: SmolLM2's `<filename>`, Qwen's `<tool_response>`)
    written `&lt;...` too.

    A tool's text sits inside the loop's `<result>` block: a `</result>` in a web page or in
    printed output would end the block early, and what followed would read as the model's
    own text: a correct trajectory fails the format check, and an `<answer>` the tool printed
    is graded as the model's answer. A Hugging Face tokenizer encodes a control token's string
    (`<|im_end|>`, `<|endoftext|>`) as its control id wherever it stands, which would put an
    end of turn, or the pad id, in the middle of the context; so does any other added token's string.
    """
    return _inert_pattern(tuple(tokens)).sub(lambda match: "&lt;" + match.group(0)[1:], text)


def truncate(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` characters, marked when cut."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"... [truncated, {len(text) - max_chars} more characters]"


def truncate_within(text: str, max_chars: int) -> str:
    """`text` cut so that it and its cut marker together are at most `max_chars` characters
    (`truncate` keeps `max_chars` of the text and adds the marker beyond: a per-passage size, not a cap)."""
    if len(text) <= max_chars:
        return text
    keep = max_chars
    while keep > 0:  # the marker's number shrinks as `keep` grows; a few steps settle it
        marker = f"... [truncated, {len(text) - keep} more characters]"
        if keep + len(marker) <= max_chars:
            return text[:keep] + marker
        keep = max_chars - len(marker)
    return text[:max_chars]

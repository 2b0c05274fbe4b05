"""The agent tag protocol of spec section 4 and the format rule of spec section 5.

Pure string functions: find the tool call a segment of generation ends with,
format a tool result for appending, pull the boxed final answer out of
`<answer>`, and check that a whole trajectory is well formed. None of them
raise on any input text, because they run on raw model output.
"""

from __future__ import annotations

import dataclasses
import re

from aepo_jax.agent.tags import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    RESULT_CLOSE,
    RESULT_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_TAGS,
    close_tag,
    open_tag,
)

_BOXED = "\\boxed{"
_TOOL_CLOSE_PATTERN = re.compile("|".join(re.escape(close_tag(t)) for t in TOOL_TAGS))


def model_text(trajectory_text: str) -> str:
    """`trajectory_text` without its tool result blocks (each `<result>` to the nearest `</result>` after it):
    what the model itself wrote. One left-to-right scan: a lazy regex restarted at every unclosed `<result>`
    of a repetition loop and took quadratic time."""
    kept, position = [], 0
    while (start := trajectory_text.find(RESULT_OPEN, position)) >= 0:
        end = trajectory_text.find(RESULT_CLOSE, start + len(RESULT_OPEN))
        if end < 0:
            break
        kept.append(trajectory_text[position:start])
        position = end + len(RESULT_CLOSE)
    kept.append(trajectory_text[position:])
    return "".join(kept)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One complete tool call: the tag name (`search`, `python`, `browse`) and its content."""

    tag: str
    content: str


def parse_last_tool_call(text: str) -> ToolCall | None:
    """The last complete `<tag>content</tag>` tool call in `text`, or None (spec §4).

    The call is the last closing tool tag together with the nearest opening tag
    of the same name before it (the last complete tool tag); its content is
    stripped of surrounding whitespace. Text after that closing tag is ignored.

    Nearest, not first: a model that names the tag before it calls the tool
    (`<think>I will use <python></think><python>code</python>`, or an abandoned
    `<python>` it started again) gets the code it closed run. The price: code that
    holds its own opening tag as text (`<python>print("<python>")</python>`) runs
    from after that text. The two cannot be told apart from the string, and the
    tests' round-trip property (any prefix + a formatted call gives the call back)
    is this rule.
    """
    if not isinstance(text, str):
        return None
    last_close = None
    for match in _TOOL_CLOSE_PATTERN.finditer(text):
        last_close = match
    while last_close is not None:
        tag = last_close.group(0)[2:-1]
        start = text.rfind(open_tag(tag), 0, last_close.start())
        if start >= 0:
            content = text[start + len(open_tag(tag)) : last_close.start()]
            return ToolCall(tag=tag, content=content.strip())
        # A closing tag without an opening one: look at earlier closings.
        earlier = None
        for match in _TOOL_CLOSE_PATTERN.finditer(text, 0, last_close.start()):
            earlier = match
        last_close = earlier
    return None


def format_tool_call(call: ToolCall) -> str:
    """`<tag>content</tag>`: the inverse of `parse_last_tool_call` for one call."""
    return open_tag(call.tag) + call.content + close_tag(call.tag)


def format_tool_result(text: str) -> str:
    """The text appended after a tool call (spec §4): `" <result>\\n" + text + "\\n</result>"`."""
    return " " + RESULT_OPEN + "\n" + text + "\n" + RESULT_CLOSE


def brace_pairs(text: str) -> dict[int, int]:
    """Index of each `{` of `text` that closes -> index of its `}` (where its depth returns to zero), in one
    pass; a `}` with nothing open is ignored."""
    closing: dict[int, int] = {}
    opened: list[int] = []
    for i, ch in enumerate(text):
        if ch == "{":
            opened.append(i)
        elif ch == "}" and opened:
            closing[opened.pop()] = i
    return closing


def _boxed_content(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text`, matching nested braces; None if absent or unclosed.

    The braces are paired in one pass (a box's `{` closes where its depth returns to zero), so a text of
    many unclosed boxes (a repetition loop) costs linear time, not a scan to the end per box."""
    boxes = [m.end() - 1 for m in re.finditer(re.escape(_BOXED), text)]  # index of each box's "{"
    if not boxes:
        return None
    closing = brace_pairs(text)
    for brace in reversed(boxes):
        if brace in closing:
            return text[brace + 1 : closing[brace]]
    return None


def extract_boxed_answer(text: str) -> str | None:
    """The `\\boxed{...}` content of the last `<answer>` block, or None (spec §4, §5).

    The block runs to its `</answer>`, or to the end of the text if unclosed.
    Nested braces (`\\boxed{\\frac{1}{2}}`) are matched.
    """
    if not isinstance(text, str):
        return None
    start = text.rfind(ANSWER_OPEN)
    if start < 0:
        return None
    body = text[start + len(ANSWER_OPEN) :]
    end = body.find(ANSWER_CLOSE)
    if end >= 0:
        body = body[:end]
    return _boxed_content(body)


def _check_results(text: str) -> str:
    """Reason why some `<result>` is not preceded by a tool call, or ''."""
    position = 0
    while True:
        start = text.find(RESULT_OPEN, position)
        if start < 0:
            break
        if parse_last_tool_call(text[position:start]) is None:
            return "a <result> is not preceded by a tool call"
        end = text.find(RESULT_CLOSE, start)
        if end < 0:
            return "a <result> is not closed"
        position = end + len(RESULT_CLOSE)
    if RESULT_CLOSE in text[position:]:
        return "a </result> has no opening <result>"
    return ""


def _check_think(text: str) -> str:
    """Reason why `<think>` tags are unbalanced (nested, unopened or unclosed), or ''."""
    tags = re.findall(re.escape(THINK_OPEN) + "|" + re.escape(THINK_CLOSE), text)
    depth = 0
    for tag in tags:
        depth += 1 if tag == THINK_OPEN else -1
        if depth not in (0, 1):
            return "unbalanced <think> tags"
    return "" if depth == 0 else "unbalanced <think> tags"


def validate_format(trajectory_text: str) -> tuple[bool, str]:
    """Check the format rule of spec §5; returns `(ok, reason)` with reason '' when ok.

    Invalid when: a `<result>` is not preceded by a tool call, `<think>` tags
    are unbalanced, there is not exactly one `<answer>...</answer>`, or the
    answer has no `\\boxed{}`. Text inside tool results is the tool's, not the
    model's, so it is ignored for the think/answer checks.
    """
    if not isinstance(trajectory_text, str):
        return False, "trajectory is not a string"
    reason = _check_results(trajectory_text)
    if reason:
        return False, reason
    own = model_text(trajectory_text)
    reason = _check_think(own)
    if reason:
        return False, reason
    opens, closes = own.count(ANSWER_OPEN), own.count(ANSWER_CLOSE)
    if opens != 1 or closes != 1:
        return False, f"expected exactly one <answer>...</answer>, found {opens} open and {closes} close tags"
    if own.find(ANSWER_OPEN) > own.find(ANSWER_CLOSE):
        return False, "</answer> comes before <answer>"
    if extract_boxed_answer(own) is None:
        return False, "no \\boxed{} in the answer"
    return True, ""

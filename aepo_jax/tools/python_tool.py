"""Python tool: `<python>code</python>` run in the sandbox, result formatted for the model (spec §4)."""

from __future__ import annotations

import time

from aepo_jax.tools.base import ToolResult, truncate_within
from aepo_jax.tools.python_exec import PythonSandbox, SandboxResult

_EARLIER_LINES_CUT = "[earlier lines cut]"


def _last_lines(text: str, max_chars: int) -> str:
    """The last whole lines of `text` that fit, with a line saying earlier ones were cut, in `max_chars`
    (the exception is on the last line); the line naming the exception stays too when a message of many
    lines follows it; if even the last line does not fit, its beginning (the exception's name). At most
    `max_chars` characters in all."""
    if len(text) <= max_chars:
        return text
    lines = text.splitlines()
    # The line naming the exception (the first after the last indented frame line) stays, cut to a third.
    named = max((i for i, line in enumerate(lines) if line.startswith(" ")), default=-1) + 1
    head = [truncate_within(lines[named], max_chars // 3)] if named < len(lines) - 1 else []
    kept, size = [], len(_EARLIER_LINES_CUT) + sum(len(line) + 1 for line in head)
    for line in reversed(lines[named + 1:] if head else lines):
        if size + len(line) + 1 > max_chars:
            break
        kept.append(line)
        size += len(line) + 1
    if not kept:
        return truncate_within(lines[-1], max_chars) if lines else ""
    return "\n".join([_EARLIER_LINES_CUT, *head, *reversed(kept)])


def format_sandbox_result(result: SandboxResult, max_result_chars: int) -> str:
    """Stdout (and stderr when the call succeeded), then the traceback tail and a line saying what went wrong.

    What went wrong is never what gets cut: the traceback tail (at most half of
    `max_result_chars`) and the `[execution ...]` line are placed first, and stdout
    is cut to the room left, marked when cut: the whole text is at most `max_result_chars` characters.
    """
    failure = []
    if result.status != "ok":
        status_line = f"[execution {result.status}]" if result.status in ("timeout", "killed", "failed") else ""
        trace = result.traceback or f"status: {result.status}"
        failure.append(_last_lines(trace, max(0, max_result_chars // 2 - len(status_line) - 1)))
        if status_line:
            failure.append(status_line)
    output = []
    if result.stdout:
        output.append(result.stdout.rstrip("\n") + ("\n[stdout truncated]" if result.stdout_truncated else ""))
    if result.stderr and result.status == "ok":
        output.append("stderr:\n" + result.stderr.rstrip("\n"))
    failure_text = "\n".join(failure)
    room = max(0, max_result_chars - len(failure_text) - (1 if failure_text else 0))
    parts = ([truncate_within("\n".join(output), room)] if output else []) + ([failure_text] if failure_text else [])
    return "\n".join(parts) or "[no output]"


class PythonTool:
    """Runs the content of `<python>` in a `PythonSandbox`; the sandbox's own failures become text too."""

    def __init__(self, sandbox: PythonSandbox, max_result_chars: int = 2000):
        self.sandbox, self.max_result_chars = sandbox, max_result_chars

    def run(self, content: str) -> ToolResult:
        start = time.monotonic()
        code = content.strip("\n")
        if not code.strip():
            return ToolResult("Python failed: no code given.", False, time.monotonic() - start, "bad_call")
        try:
            result = self.sandbox.run(code)
        except Exception as error:  # noqa: BLE001 - a closed or broken sandbox becomes result text
            return ToolResult(f"Python failed: {error}", False, time.monotonic() - start, "failed")
        text = format_sandbox_result(result, self.max_result_chars)
        return ToolResult(text, result.status == "ok", time.monotonic() - start, result.status)

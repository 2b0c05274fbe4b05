"""Python tool: `<python>code</python>` run in the sandbox, result formatted for the model (spec §4)."""

from __future__ import annotations

import time

from aepo_jax.tools.base import ToolResult, truncate
from aepo_jax.tools.python_exec import PythonSandbox, SandboxResult


def format_sandbox_result(result: SandboxResult, max_result_chars: int) -> str:
    """Stdout, then stderr and the traceback tail, then a line saying what went wrong if anything did."""
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n") + ("\n[stdout truncated]" if result.stdout_truncated else ""))
    if result.stderr and result.status == "ok":
        parts.append("stderr:\n" + result.stderr.rstrip("\n"))
    if result.status != "ok":
        parts.append(result.traceback or f"status: {result.status}")
        if result.status in ("timeout", "killed", "failed"):
            parts.append(f"[execution {result.status}]")
    if not parts:
        parts.append("[no output]")
    return truncate("\n".join(parts), max_result_chars)


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

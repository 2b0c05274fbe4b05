"""`format_sandbox_result`: what the model reads of a python call, never longer than `max_result_chars`."""

import dataclasses

import pytest

from aepo_jax.tools.python_exec import SandboxResult
from aepo_jax.tools.python_tool import format_sandbox_result

BASE = SandboxResult(status="ok", stdout="", stderr="", traceback="", exit_code=0, seconds=0.1,
                     stdout_truncated=False, stderr_truncated=False, network_isolated=True,
                     filesystem_isolated=True, isolation="test")
TRACEBACK = "\n".join(["Traceback (most recent call last):"]
                      + [f'  File "<code>", line {n}, in f\n    return f(n - 1)' for n in range(50)]
                      + ["KeyError: '" + "k" * 300 + "'"])


@pytest.mark.parametrize("fields", [
    {"stdout": "a" * 5000},
    {"stdout": "a" * 8192, "stdout_truncated": True},
    {"stdout": "a" * 5000, "status": "error", "traceback": "ValueError: " + "v" * 5000},
    {"stdout": "x" * 3000, "status": "error", "traceback": TRACEBACK},
    {"stderr": "e" * 5000},
    {"stdout": "a" * 5000, "status": "timeout", "traceback": "wall-clock limit of 3 s exceeded"},
], ids=["long-stdout", "stdout-cap", "long-error", "many-traceback-lines", "long-stderr", "timeout"])
@pytest.mark.parametrize("max_chars", [1000, 333, 100])
def test_the_result_text_is_at_most_max_result_chars(fields, max_chars):
    """The cut markers ("... [truncated, N more characters]", "[earlier lines cut]") were added past the
    limit: a 1000-character result came back as 1042 characters."""
    result = dataclasses.replace(BASE, **fields)
    text = format_sandbox_result(result, max_chars)
    assert len(text) <= max_chars, (len(text), text[-200:])
    if result.status != "ok":
        assert text.splitlines()[-1].startswith(("KeyError", "ValueError", "[execution timeout]"))
    if len(text) > 60:
        assert "[truncated," in text or "[earlier lines cut]" in text

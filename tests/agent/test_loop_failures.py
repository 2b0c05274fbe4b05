"""The continuous schedule fails at once when the loop raises: queued tool calls are cancelled, not run."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

from aepo_jax.agent.loop import AgentLoop, LoopConfig
from aepo_jax.agent.scripted import ByteTokenizer, ScriptedGenerator, ScriptedSegment
from aepo_jax.tools.base import ToolResult
from aepo_jax.tools.registry import ToolRegistry

TOK = ByteTokenizer()
RESULT = TOK.token_to_id("<result>")


class HeldSearch:
    """Counts the calls that started; each waits until the test releases it."""

    def __init__(self) -> None:
        self.started = 0
        self.release = threading.Event()
        self._lock = threading.Lock()

    def run(self, content: str) -> ToolResult:
        with self._lock:
            self.started += 1
        self.release.wait(30)
        return ToolResult("late", True, 0.0, "ok")


def _script(ids, rng):
    """Rows of odd length call search (their calls queue on two threads); the others think at length, so
    the loop goes on generating (and fails) while calls wait."""
    if RESULT in ids:
        text = "<answer>\\boxed{1}</answer>"
    elif len(ids) % 2:
        text = "<search>q</search>"
    else:
        text = "<think>" + "z" * 200
    tokens = TOK.encode(text)
    return ScriptedSegment(tokens, [1.0] * len(tokens), "stop")


class FailsOnThirdGenerate(ScriptedGenerator):
    def __init__(self, script) -> None:
        super().__init__(script)
        self.calls = 0

    def generate(self, state, budgets, rng=None, **kwargs):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("device error in generate")
        return super().generate(state, budgets, rng)


def test_an_error_in_the_loop_cancels_the_queued_tool_calls():
    """Leaving the pool's `with` block waited for every queued call to start and finish before the error
    surfaced: at paper scale (hundreds of rows, 16 calls at once, python calls of up to 120 s) that was
    tens of minutes. Now only the calls already in flight have started."""
    search = HeldSearch()
    registry = ToolRegistry({"search": search}, max_workers=2)
    config = LoopConfig(schedule="continuous", chunk_tokens=20, entropy_tokens=4, min_generating_fraction=0.0,
                        max_response_tokens=200, max_context_len=400)
    loop = AgentLoop(FailsOnThirdGenerate(_script), TOK, registry, config)
    prompts = [TOK.encode("q" * (1 + i % 3)) for i in range(12)]
    try:
        with pytest.raises(RuntimeError, match="device error in generate"):
            loop.run(prompts, 1, 1, rng=np.random.default_rng(0), key=jax.random.key(0))
        assert search.started <= registry.max_workers, search.started
    finally:
        search.release.set()
        registry.close()

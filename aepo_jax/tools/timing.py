"""Wall time a rollout spends in its tools, as two figures that differ once calls overlap.

Under the continuous schedule several `run_many` calls are in flight at once (and overlap
decoding), so the sum of their durations can exceed the rollout's own wall time. A
researcher reading the metrics needs both: how long some tool call was running (the most
the tools can have cost the rollout) and how much tool time was spent in all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple


class ToolTime(NamedTuple):
    """Seconds since the last `take`: busy = wall time with at least one call in flight;
    summed = the calls' durations added up (equal to busy when calls never overlap)."""

    busy: float
    summed: float


class TimedTools:
    """Forwards `run_many` to a tool registry and times it (`ToolTime`), thread-safe.

    Args:
      tools: anything with `run_many(calls)` (a `ToolRegistry`).
      clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, tools: Any, clock: Callable[[], float] = time.perf_counter):
        self.tools, self._clock, self._lock = tools, clock, threading.Lock()
        self._in_flight, self._busy_since = 0, 0.0
        self._busy, self._summed = 0.0, 0.0

    @property
    def max_workers(self) -> int | None:
        """The registry's limit on calls in flight (the continuous schedule sizes its threads by it)."""
        return getattr(self.tools, "max_workers", None)

    def run_many(self, calls):
        start = self._enter()
        try:
            return self.tools.run_many(calls)
        finally:
            self._leave(start)

    def _enter(self) -> float:
        with self._lock:
            now = self._clock()
            if self._in_flight == 0:
                self._busy_since = now
            self._in_flight += 1
            return now

    def _leave(self, start: float) -> None:
        with self._lock:
            now = self._clock()
            self._summed += now - start
            self._in_flight -= 1
            if self._in_flight == 0:
                self._busy += now - self._busy_since

    def take(self) -> ToolTime:
        """The time since the last `take`, and a fresh count. A call still in flight counts up to now
        in `busy` (its whole duration goes to `summed` when it ends)."""
        with self._lock:
            now = self._clock()
            busy = self._busy + (now - self._busy_since if self._in_flight else 0.0)
            if self._in_flight:
                self._busy_since = now
            taken = ToolTime(busy, self._summed)
            self._busy, self._summed = 0.0, 0.0
        return taken

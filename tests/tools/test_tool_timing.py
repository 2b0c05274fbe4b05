"""TimedTools: busy wall time vs summed call time, with overlapping calls sequenced by events."""

import threading

from aepo_jax.tools.timing import TimedTools, ToolTime


class StepClock:
    """A clock the test sets by hand, so that the figures are exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class GatedTools:
    """`run_many` returns the calls once the test opens the call's gate (calls are names)."""

    def __init__(self) -> None:
        self.started = {name: threading.Event() for name in "ab"}
        self.gates = {name: threading.Event() for name in "ab"}

    def run_many(self, calls):
        (name,) = calls
        self.started[name].set()
        assert self.gates[name].wait(10), f"call {name} was never released"
        return [name.upper()]


def _start(timed: TimedTools, name: str, results: dict) -> threading.Thread:
    thread = threading.Thread(target=lambda: results.__setitem__(name, timed.run_many([name])))
    thread.start()
    assert timed.tools.started[name].wait(10)
    return thread


def _finish(clock: StepClock, tools: GatedTools, name: str, thread: threading.Thread, at: float) -> None:
    """Call `name` returns at clock time `at`."""
    clock.now = at
    tools.gates[name].set()
    thread.join(10)


def test_overlapping_calls_count_once_in_busy_and_fully_in_summed():
    clock, tools, results = StepClock(), GatedTools(), {}
    timed = TimedTools(tools, clock=clock)
    first = _start(timed, "a", results)  # a runs over [0, 3]
    clock.now = 1.0
    second = _start(timed, "b", results)  # b runs over [1, 4]
    _finish(clock, tools, "a", first, at=3.0)
    _finish(clock, tools, "b", second, at=4.0)
    assert results == {"a": ["A"], "b": ["B"]}
    assert timed.take() == ToolTime(busy=4.0, summed=6.0)
    assert timed.take() == ToolTime(busy=0.0, summed=0.0)  # take starts a fresh count


def test_gaps_between_calls_are_not_busy_and_a_call_in_flight_counts_up_to_the_take():
    clock, tools, results = StepClock(), GatedTools(), {}
    timed = TimedTools(tools, clock=clock)
    clock.now = 2.0
    first = _start(timed, "a", results)  # a runs over [2, 3]
    _finish(clock, tools, "a", first, at=3.0)
    clock.now = 10.0
    second = _start(timed, "b", results)  # b starts at 10, still running at the take at 12
    clock.now = 12.0
    assert timed.take() == ToolTime(busy=3.0, summed=1.0)
    _finish(clock, tools, "b", second, at=15.0)
    assert timed.take() == ToolTime(busy=3.0, summed=5.0)  # busy from the last take; summed whole


def test_max_workers_is_the_registrys():
    class Limited:
        max_workers = 7

    assert TimedTools(Limited()).max_workers == 7
    assert TimedTools(GatedTools()).max_workers is None

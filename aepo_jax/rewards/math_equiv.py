"""Math answer equivalence: normalisation first, then sympy in a killable worker (spec §5).

Cheap checks run in-process (normalised string equality, exact rational
comparison, element-wise comparison of tuples and intervals in order, and of
sets and bare lists of solutions as multisets). Only what they
cannot decide goes to sympy, which runs in a separate worker process
(`sympy_worker.py`) with a hard wall-clock limit: a request that runs past
`timeout_s` gets its worker killed and counts as "not equal", so an
expression such as `10**10**10**10` cannot hang the trainer. Such a verdict is
a guess, so it is counted: per pool (`SympyWorkerPool.timeouts`, with a warning
at the first one) and per block of work (`count_timeouts`, which the evaluation
reports).
"""

from __future__ import annotations

import json
import os
import queue
import re
import selectors
import signal
import subprocess
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from aepo_jax.rewards.math_normalize import (
    as_exact_number,
    latex_to_sympy_source,
    normalize_math_answer,
    split_top_level,
)

_WORKER_SCRIPT = Path(__file__).with_name("sympy_worker.py")


def _kill_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    proc.wait()


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str | None:
    """One line from the worker's stdout, or None if it does not arrive within `timeout_s`."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            return None
    line = proc.stdout.readline()
    return line or None


class _Worker:
    """One sympy worker process; killed and replaced when a request times out."""

    def __init__(self, startup_timeout_s: float):
        self.proc = subprocess.Popen(
            [sys.executable, str(_WORKER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its own process group, so a kill takes any children too
        )
        self._finalizer = weakref.finalize(self, _kill_process, self.proc)
        if _read_line(self.proc, startup_timeout_s) is None:
            self.close()
            raise RuntimeError(
                f"sympy worker did not start within {startup_timeout_s} s"
            )

    def ask(self, a_source: str, b_source: str, timeout_s: float) -> dict | None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"a": a_source, "b": b_source}) + "\n")
        self.proc.stdin.flush()
        line = _read_line(self.proc, timeout_s)
        return None if line is None else json.loads(line)

    def close(self) -> None:
        self._finalizer()


@dataclass(eq=False)  # open tallies are told apart by identity (nested blocks may hold equal counts)
class TimeoutTally:
    """Sympy requests that ran past their time limit inside a `count_timeouts` block."""

    count: int = 0


_open_tallies = threading.local()  # .stack: the tallies of the enclosing `count_timeouts` blocks of this thread


@contextmanager
def count_timeouts() -> Iterator[TimeoutTally]:
    """Count the sympy requests of this thread (any pool) that time out inside the block.

    Per thread, so work other threads do on a shared pool at the same time is not counted.
    """
    stack = _open_tallies.__dict__.setdefault("stack", [])
    tally = TimeoutTally()
    stack.append(tally)
    try:
        yield tally
    finally:
        stack.remove(tally)


@dataclass
class SympyWorkerPool:
    """A fixed number of sympy worker processes shared by threads (blocking checkout).

    Attributes:
      size: worker processes (requests beyond this wait for a free worker).
      timeout_s: wall-clock limit per equivalence request.
      startup_timeout_s: limit for a worker to import sympy and report ready.
      timeouts: requests so far that ran past their limit (each answered "not equal").
    """

    size: int = 2
    timeout_s: float = 5.0
    startup_timeout_s: float = 60.0
    timeouts: int = field(default=0, init=False)
    _slots: queue.Queue = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"SympyWorkerPool size must be >= 1, got {self.size}")
        self._slots = queue.Queue()
        for _ in range(self.size):
            self._slots.put(None)  # workers start lazily on first use

    def equal(
        self, a_source: str, b_source: str, timeout_s: float | None = None
    ) -> bool:
        """Whether sympy shows `a - b == 0`; False on error or after the time limit."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        worker: _Worker | None = self._slots.get()
        try:
            if worker is None or worker.proc.poll() is not None:
                worker = _Worker(self.startup_timeout_s)
            reply = worker.ask(a_source, b_source, limit)
            if reply is None:
                self._record_timeout(limit, a_source, b_source)
                worker.close()
                worker = None
                return False
            return bool(reply["equal"])
        except (BrokenPipeError, json.JSONDecodeError):
            if worker is not None:
                worker.close()
            worker = None
            return False
        finally:
            self._slots.put(worker)

    def _record_timeout(self, limit: float, a_source: str, b_source: str) -> None:
        """Count a timed-out request here and in this thread's open tallies; warn at the pool's first."""
        with self._lock:
            self.timeouts += 1
            first = self.timeouts == 1
        for tally in getattr(_open_tallies, "stack", ()):
            tally.count += 1
        if first:
            warnings.warn(f"a sympy equivalence check ran past its {limit} s limit and counted as 'not equal' "
                          f"({a_source[:80]!r} vs {b_source[:80]!r}); later timeouts of this pool are counted in "
                          "SympyWorkerPool.timeouts without a warning", stacklevel=4)

    def close(self) -> None:
        """Kill every worker process."""
        for _ in range(self.size):
            worker = self._slots.get()
            if worker is not None:
                worker.close()
        for _ in range(self.size):
            self._slots.put(None)

    def __enter__(self) -> SympyWorkerPool:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@lru_cache(maxsize=1)
def default_sympy_pool() -> SympyWorkerPool:
    """The process-wide pool used when a caller passes none (workers start on first use)."""
    return SympyWorkerPool()


def math_equal(
    prediction: str,
    gold: str,
    *,
    pool: SympyWorkerPool | None = None,
    timeout_s: float | None = None,
) -> bool:
    """Whether two math answers are equivalent (normalisation, exact numbers, then sympy)."""
    a, b = normalize_math_answer(prediction), normalize_math_answer(gold)
    if a == b:
        return True
    if not a or not b:
        return False
    a_number, b_number = as_exact_number(a), as_exact_number(b)
    if a_number is not None and b_number is not None:
        if a_number == b_number:
            return True
        # `50\%` is also 0.5 (normalising dropped the sign), when only one side wrote a percentage.
        a_percent, b_percent = _is_percentage(prediction), _is_percentage(gold)
        if a_percent != b_percent:
            return (a_number / 100 if a_percent else a_number) == (b_number / 100 if b_percent else b_number)
        return False
    a_items, b_items = split_top_level(a), split_top_level(b)
    if a_items is not None or b_items is not None:
        if a_items is None or b_items is None:
            return False
        (a_open, a_list, a_close), (b_open, b_list, b_close) = a_items, b_items
        if len(a_list) != len(b_list):
            return False

        def item_equal(x: str, y: str) -> bool:
            return math_equal(x, y, pool=pool, timeout_s=timeout_s)

        if _is_unordered(a_open) and _is_unordered(b_open):
            return _pairs_up(a_list, b_list, item_equal)
        if (a_open, a_close) != (b_open, b_close):
            return False
        return all(item_equal(x, y) for x, y in zip(a_list, b_list))
    a_source, b_source = latex_to_sympy_source(a), latex_to_sympy_source(b)
    if a_source is None or b_source is None:
        return False
    pool = default_sympy_pool() if pool is None else pool
    return pool.equal(a_source, b_source, timeout_s)


def _is_percentage(text: str) -> bool:
    """Whether an answer is written as a percentage (`50\\%`, `12.5%`, `50 percent`)."""
    return "%" in text or re.search(r"\bpercent\b", text) is not None


def _is_unordered(opening: str) -> bool:
    """A set `\\{a,b\\}` or a bare list `a,b` (a list of solutions, `(1,2),(3,4)` among them) has no
    order; a tuple `(a,b)`, a closed `[a,b]` or a half-open interval `(a,b]` has one."""
    return opening in ("\\{", "")


def _pairs_up(a_items: list[str], b_items: list[str], equal: Callable[[str, str], bool]) -> bool:
    """Whether the two lists are equal as multisets: each item paired with its own equivalent item.

    A perfect matching by augmenting paths (Kuhn), so a greedy first pairing cannot hide one that
    exists. Each item tries the item at its own position first, so lists in the same order cost
    `n` comparisons; each pair is compared at most once (sympy may be behind `equal`).
    """
    n = len(a_items)
    if n != len(b_items):
        return False
    verdicts: dict[tuple[int, int], bool] = {}
    owner: list[int | None] = [None] * n  # owner[j]: the item of `a_items` paired with b_items[j]

    def pairs(i: int, j: int) -> bool:
        if (i, j) not in verdicts:
            verdicts[(i, j)] = equal(a_items[i], b_items[j])
        return verdicts[(i, j)]

    def augment(i: int, visited: set[int]) -> bool:
        for j in [i, *(k for k in range(n) if k != i)]:
            if j in visited or not pairs(i, j):
                continue
            visited.add(j)
            if owner[j] is None or augment(owner[j], visited):
                owner[j] = i
                return True
        return False

    return all(augment(i, set()) for i in range(n))


def math_equal_any(
    prediction: str,
    answers: list[str],
    *,
    pool: SympyWorkerPool | None = None,
    timeout_s: float | None = None,
) -> bool:
    """Whether the prediction is equivalent to any of the gold answers."""
    return any(
        math_equal(prediction, gold, pool=pool, timeout_s=timeout_s) for gold in answers
    )

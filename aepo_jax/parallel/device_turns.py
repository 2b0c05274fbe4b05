"""Turns at this process's devices for two threads: the trainer's and a background rollout's.

`train.rollout_ahead` rolls out step s + 1 on a background thread while step s
trains. Two threads launching multi-device programs at the same time can hang a
process, on every backend:
- GPU and TPU devices run programs in the order each device received them. Two
  threads launching at once can hand device 0 program A before B and device 1 B
  before A; a collective of A on device 0 then waits for device 1, which waits in
  B's collective for device 0.
- XLA:CPU launches a collective program's parts on a pool of about as many threads
  as devices and gives each device a bounded number of queued programs. A
  collective launched by one thread while the other has queued many small programs
  on a device can leave that device's part waiting for a queue slot and every pool
  thread blocked in the collective's other parts, with the queued programs waiting
  for a pool thread (seen in a two-process test: the rollout thread's prefill held
  three of four threads, the trainer's advantage arithmetic filled device 0's queue).

So only one of the two threads launches device programs at a time: the one holding
the turn. The rollout thread holds it for its whole rollout, lets it go while it
waits for tool results or rewards (`off_device_turn`), which is what rolling out
ahead gains: tool latency hidden behind training, and offers it before each decode
(`offer_device_turn`). The trainer holds it while a rollout is in flight and offers
it before each mini-batch (`DeviceTurns.offer`). Turns go in arrival order; there
is one per process (`process_device_turns`). On CPU, a thread letting go first
waits for the programs launched so far (`drain_local_devices`): what it launched
then no longer competes with the next holder's for queue slots and launch threads.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator

import jax

_HELD = threading.local()  # .turns: the DeviceTurns this thread holds, if any (read by `off_device_turn`)


def drain_local_devices() -> None:
    """Wait for the programs launched so far whose results are alive (each live array ready), so that none
    of them still holds a device queue slot or a launch thread. A program whose results were all dropped
    before this call is not waited for: nothing reads it, and it runs without waiting for anything."""
    jax.block_until_ready(jax.live_arrays())


def _drain_needed() -> bool:
    return jax.default_backend() == "cpu"


class DeviceTurns:
    """A first-come, first-served turn at the devices; see the module docstring.

    `drain`: called by a thread before it lets the turn go (default: `drain_local_devices` on CPU,
    nothing elsewhere, where devices run their programs in arrival order)."""

    def __init__(self, drain: Callable[[], None] | None = None):
        self._cond = threading.Condition()
        self._owner: int | None = None
        self._queue: collections.deque[int] = collections.deque()
        self._drain = drain if drain is not None else (drain_local_devices if _drain_needed() else None)

    def holds(self) -> bool:
        """Whether the calling thread holds the turn."""
        with self._cond:
            return self._owner == threading.get_ident()

    def waiting(self) -> int:
        """How many threads are waiting for the turn."""
        with self._cond:
            return len(self._queue)

    def acquire(self) -> None:
        """Wait for the turn (after every thread that asked before)."""
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                raise RuntimeError("this thread already holds the device turn")
            self._queue.append(me)
            self._cond.notify_all()  # wakes `hand_over_when`
            try:
                self._cond.wait_for(lambda: self._owner is None and self._queue[0] == me)
            except BaseException:  # e.g. KeyboardInterrupt: a thread left in the queue would block the others
                self._queue.remove(me)
                self._cond.notify_all()
                raise
            self._queue.popleft()
            self._owner = me
        _HELD.turns = self

    def release(self) -> None:
        """Let the turn go (after draining, see `drain`)."""
        if not self.holds():
            raise RuntimeError("this thread does not hold the device turn it releases")
        try:
            if self._drain is not None:
                self._drain()
        finally:  # a drain that raised still lets the turn go: the error is this thread's, not a hang
            with self._cond:
                self._owner = None
                self._cond.notify_all()
            if getattr(_HELD, "turns", None) is self:
                _HELD.turns = None

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the turn for the block."""
        self.acquire()
        try:
            yield
        finally:
            if self.holds():  # not when letting go inside failed (that error is the one to see)
                self.release()

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """Let the turn go for the block (e.g. a wait on other threads), then wait for it again; nothing
        when the calling thread does not hold it."""
        if not self.holds():
            yield
            return
        self.release()
        try:
            yield
        finally:
            self.acquire()

    def offer(self) -> None:
        """Let a waiting thread take its turn now, then wait for the turn again; nothing when the calling
        thread does not hold it or no thread waits."""
        if self.holds() and self.waiting():
            self.release()
            self.acquire()

    def hand_over_when(self, ready: Callable[[], bool]) -> None:
        """Wait until another thread waits for the turn or `ready()` is true, then `offer` it: a thread
        just started gets the first turn, not the next `offer`'s."""
        with self._cond:
            while not self._queue and not ready():
                self._cond.wait(timeout=0.01)  # `ready` (e.g. a future done) does not notify
        self.offer()


_PROCESS_TURNS: list[DeviceTurns] = []  # the devices are the process's: one turn for all its threads
_PROCESS_TURNS_LOCK = threading.Lock()


def process_device_turns() -> DeviceTurns:
    """This process's turn at its devices (every `RolloutAhead` and trainer in the process share it)."""
    with _PROCESS_TURNS_LOCK:
        if not _PROCESS_TURNS:
            _PROCESS_TURNS.append(DeviceTurns())
        return _PROCESS_TURNS[0]


def offer_device_turn() -> None:
    """`DeviceTurns.offer` of the turn the calling thread holds (between a rollout's device calls: the
    trainer waits at most one of them); nothing when it holds none."""
    turns = getattr(_HELD, "turns", None)
    if turns is not None:
        turns.offer()


@contextlib.contextmanager
def off_device_turn() -> Iterator[None]:
    """The calling thread's device turn let go for the block (a wait for tool results that launches no
    device program); nothing when the thread holds none."""
    turns = getattr(_HELD, "turns", None)
    if turns is None:
        yield
        return
    with turns.released():
        yield

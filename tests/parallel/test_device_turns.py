"""`parallel.device_turns`: one thread at a time holds the turn at the devices, turns go in arrival order,
a holder offers the turn to waiting threads and lets it go for waits outside the devices, and it drains
its device queues before it lets go (the two-process rollout-ahead hang it prevents is described in the
module docstring; `tests/training/test_multihost_agent_rollout.py` runs that case)."""

import threading
import time

import jax
import pytest

from aepo_jax.parallel.device_turns import (
    DeviceTurns,
    drain_local_devices,
    off_device_turn,
    offer_device_turn,
    process_device_turns,
)

TIMEOUT_S = 30  # a thread that never gets its turn fails here instead of hanging the suite


def _wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.001)


def _taker(turns: DeviceTurns, name: str, order: list[str]) -> threading.Thread:
    def run():
        with turns.turn():
            order.append(name)
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def test_turns_go_in_arrival_order_one_thread_at_a_time():
    turns, order = DeviceTurns(drain=lambda: None), []
    turns.acquire()
    first = _taker(turns, "first", order)
    _wait_until(lambda: turns.waiting() == 1, "the first thread never waited")
    second = _taker(turns, "second", order)
    _wait_until(lambda: turns.waiting() == 2, "the second thread never waited")
    assert order == []  # neither runs while this thread holds the turn
    turns.release()
    first.join(TIMEOUT_S)
    second.join(TIMEOUT_S)
    assert order == ["first", "second"]
    assert not turns.holds() and turns.waiting() == 0


def test_offer_hands_the_turn_to_a_waiting_thread_and_takes_it_back():
    drains, turns, order = [], None, []
    turns = DeviceTurns(drain=lambda: drains.append(turns.holds()))
    turns.acquire()
    turns.offer()  # nobody waits: keeps the turn, drains nothing
    assert turns.holds() and drains == []
    waiter = _taker(turns, "rollout", order)
    _wait_until(lambda: turns.waiting() == 1, "the waiter never waited")
    turns.offer()
    assert turns.holds() and order == ["rollout"]  # the waiter ran, then the turn came back
    assert drains == [True, True]  # each thread drained while it still held the turn
    waiter.join(TIMEOUT_S)
    turns.release()


def test_hand_over_when_gives_a_thread_started_just_now_the_first_turn():
    turns, order = DeviceTurns(drain=lambda: None), []
    turns.acquire()
    started = _taker(turns, "rollout", order)  # may not be waiting yet: hand_over_when waits for it
    turns.hand_over_when(lambda: False)
    assert order == ["rollout"] and turns.holds()
    started.join(TIMEOUT_S)
    turns.hand_over_when(lambda: True)  # nobody will come: returns at once, keeping the turn
    assert turns.holds()
    turns.release()


def test_off_device_turn_lets_the_holders_turn_go_for_the_block_and_nothing_for_others():
    turns, order = DeviceTurns(drain=lambda: None), []
    with off_device_turn():  # holds none: nothing to let go
        pass
    turns.acquire()
    waiter = _taker(turns, "trainer", order)
    _wait_until(lambda: turns.waiting() == 1, "the waiter never waited")
    with off_device_turn():
        _wait_until(lambda: order == ["trainer"], "the waiter never got the turn let go")
        assert not turns.holds()
    assert turns.holds()
    waiter.join(TIMEOUT_S)
    turns.release()
    with off_device_turn():  # released: holds none again
        assert not turns.holds()


def test_one_turn_per_process_and_a_rollout_offers_the_turn_it_holds():
    assert process_device_turns() is process_device_turns()
    turns, order = DeviceTurns(drain=lambda: None), []
    offer_device_turn()  # holds none: nothing
    turns.acquire()
    waiter = _taker(turns, "trainer", order)
    _wait_until(lambda: turns.waiting() == 1, "the waiter never waited")
    offer_device_turn()
    assert order == ["trainer"] and turns.holds()
    waiter.join(TIMEOUT_S)
    turns.release()


def test_a_failed_drain_or_an_interrupted_wait_leaves_no_thread_blocked():
    def failing_drain():
        raise OSError("drain failed")

    turns = DeviceTurns(drain=failing_drain)
    turns.acquire()
    with pytest.raises(OSError, match="drain failed"):
        turns.release()
    assert not turns.holds()
    turns.acquire()  # the turn was let go all the same
    turns._drain = lambda: None

    interrupted = []

    def interrupted_wait():  # a wait for the turn that raises (as KeyboardInterrupt would) is dequeued
        original = turns._cond.wait_for

        def raising(*args, **kwargs):
            raise KeyboardInterrupt

        turns._cond.wait_for = raising
        try:
            turns.acquire()
        except KeyboardInterrupt:
            interrupted.append(True)
        finally:
            turns._cond.wait_for = original

    thread = threading.Thread(target=interrupted_wait, daemon=True)
    thread.start()
    thread.join(TIMEOUT_S)
    assert interrupted == [True] and turns.waiting() == 0
    order = []
    later = _taker(turns, "later", order)
    _wait_until(lambda: turns.waiting() == 1, "the later thread never waited")
    turns.release()
    later.join(TIMEOUT_S)
    assert order == ["later"]


def test_misuse_is_refused():
    turns = DeviceTurns(drain=lambda: None)
    with pytest.raises(RuntimeError, match="does not hold"):
        turns.release()
    turns.acquire()
    with pytest.raises(RuntimeError, match="already holds"):
        turns.acquire()
    turns.release()


def _gated_program(gate: threading.Event):
    """A jitted program that cannot finish before `gate` is set (a host callback waits for it)."""
    def wait_for_gate(x):
        if not gate.wait(TIMEOUT_S):
            raise TimeoutError("the test never opened the gate")
        return x

    return jax.jit(lambda x: jax.pure_callback(wait_for_gate, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                                               vmap_method="sequential") + 1)


@pytest.mark.parametrize("devices", [2, 8])
def test_drain_waits_for_a_launched_program_over_some_devices_or_all(devices):
    """The drain returns only once a program launched before it has run (a one-device program this small
    runs inline, on the launching thread, so it is never pending)."""
    from jax.sharding import NamedSharding, PartitionSpec

    gate = threading.Event()
    mesh = jax.make_mesh((devices,), ("d",), devices=jax.local_devices()[:devices])
    x = jax.device_put(jax.numpy.arange(16.0), NamedSharding(mesh, PartitionSpec("d")))
    result = _gated_program(gate)(x)  # launched; waits for the gate
    drain = threading.Thread(target=drain_local_devices, daemon=True)
    drain.start()
    drain.join(0.5)
    still_draining = drain.is_alive()
    gate.set()
    drain.join(TIMEOUT_S)
    assert still_draining, "the drain returned while a launched program was still running"
    assert not drain.is_alive() and result.is_ready()


def test_a_collective_beside_a_flood_of_small_programs_finishes_in_turns():
    """The hang the turns prevent, in one process: one thread loops over a collective program on 4 CPU
    devices while another floods device 0 with chained small programs (`device_turns_flood.py`). Without
    turns (`... 300 10 free`, the suite's compile flags) 10 of 10 runs did not finish on this 2-core
    machine (5 stopped by the watchdog, 5 killed after 60 s); in turns 10 of 10 finished in about 6.5 s
    each (thirty-first session)."""
    import subprocess
    import sys

    from tests.child_process import child_env
    from tests.training.local_cluster import REPO

    out = subprocess.run([sys.executable, "-m", "tests.parallel.device_turns_flood", "150", "20", "turns"],
                         check=False, env=child_env(4), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("done"), (out.returncode, out.stdout, out.stderr[-2000:])

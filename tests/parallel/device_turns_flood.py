"""Child process of `test_device_turns.py`: one thread runs a collective program over this process's 4 CPU
devices in a loop while the other floods device 0 with chained small programs, as the trainer's advantage
arithmetic did beside a rollout's prefill when a two-process rollout-ahead run hung. Prints `done` when the
collective thread finished, or `HANG` and exits 3 when it made no progress for `stall_s` seconds.

    python -m tests.parallel.device_turns_flood ITERATIONS STALL_S {turns,free}

`free` runs the two threads without turns, to show the hang the turns prevent: on this 2-core machine 10
of 10 runs did not finish with the suite's XLA flags (`tests/child_process.py`; 5 stopped by the watchdog,
5 killed after 60 s), 1 of 10 hung with XLA's defaults."""

from __future__ import annotations

import os
import sys
import threading
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from aepo_jax.parallel.device_turns import DeviceTurns

CHAIN = 64  # chained small programs per round: more than a device's queue slots (32)


def main(iterations: int, stall_s: float, mode: str) -> None:
    turns = DeviceTurns() if mode == "turns" else None
    mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    spread = NamedSharding(mesh, PartitionSpec("d"))
    x = jax.device_put(jnp.ones((4, 256, 8)), spread)
    collective = jax.jit(lambda v: jax.lax.with_sharding_constraint(v.sum(axis=0, keepdims=True) + v, spread))
    square = jax.jit(lambda a: a @ a / a.shape[0])
    increment = jax.jit(lambda a: a + 1.0)
    seed = jax.device_put(jnp.ones((384, 384)), jax.devices()[0])
    done, progress = threading.Event(), [time.monotonic()]

    def in_turn(fn):
        if turns is None:
            return fn()
        with turns.turn():
            return fn()

    def collectives():
        for _ in range(iterations):
            progress[0] = time.monotonic()
            in_turn(lambda: jax.block_until_ready(collective(x)))
        done.set()

    def flood():
        y = square(seed)
        for _ in range(CHAIN):
            y = increment(y)
        return y

    def watchdog():  # its own thread: in a hang the flooding thread is stuck too
        while not done.wait(0.2):
            if time.monotonic() - progress[0] > stall_s:
                print("HANG: the collective thread made no progress", flush=True)
                os._exit(3)

    threading.Thread(target=collectives, daemon=True).start()
    threading.Thread(target=watchdog, daemon=True).start()
    while not done.is_set():
        in_turn(flood)
    print("done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3])

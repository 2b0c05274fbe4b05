"""Rolling out the next RL step while this one trains (`train.rollout_ahead`, docs/rollout_engine.md).

With tools that take hundreds of milliseconds, a rollout leaves the device idle
most of its wall time; training leaves the tools idle. Rolling out step s + 1
on a background thread while step s scores and updates fills both. The price
is one update round of staleness: step s + 1's rollout samples with the
parameters step s started from (a copy: the train step donates its state), so
from the second step on every rollout is one step off-policy. It needs
`train.recompute_logp_old=False` (`check_rl_config` refuses it on): the
importance ratio's denominator is the behaviour policy's log-probs, as the
sampler reported them, and the clip bounds the lag.

One rollout runs at a time (the sampler and agent loop are not shared between
threads). With several processes the background rollout must launch no program
over other processes' devices (two threads launching multi-host programs in
different orders on different hosts can deadlock): the trainer places the
parameters and draws the key on its own thread, and only rollout functions that
then sample on their own process's devices (`samples_on_own_devices`, the
composition root's `AgentRollout`) are accepted. Within a process the two threads
take turns at the devices (`parallel.device_turns`): the rollout holds the turn
except while it waits for tools, the trainer from a launch to the next `take`,
offering it between its programs (`offer_devices`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from aepo_jax.parallel.device_turns import DeviceTurns, process_device_turns

THREAD_NAME = "rollout-ahead"


@dataclasses.dataclass
class Collected:
    """One step's rollout: what `RLTrainer._collect` returns, the numpy generator it drew from (the
    step's mini-batch plan draws on from it), how long it ran, and whether its parameters were stale."""

    groups: list
    rewards: list
    stats: Any
    info: dict
    rng: np.random.Generator
    seconds: float
    stale_params: bool


@dataclasses.dataclass
class _Pending:
    step: int
    key_data: np.ndarray
    future: Future


class RolloutAhead:
    """At most one rollout in flight on a background thread, for a given step and key."""

    def __init__(self, turns: DeviceTurns | None = None):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        self._pending: _Pending | None = None
        self.turns = turns if turns is not None else process_device_turns()

    @property
    def pending_step(self) -> int | None:
        """The step whose rollout is in flight (or finished and not taken yet), if any."""
        return None if self._pending is None else self._pending.step

    def launch(self, step: int, key: jax.Array, collect: Callable[[], Collected]) -> None:
        """Start `collect()` (step `step`'s rollout, drawn with `key`) on the background thread."""
        if self._pending is not None:
            raise RuntimeError(f"rollout_ahead: step {step}'s rollout launched while step "
                               f"{self._pending.step}'s is still pending")
        if not self.turns.holds():  # the caller (the trainer) holds the turn until it takes this rollout
            self.turns.acquire()
        future = self._pool.submit(self._collect_in_turn, collect)
        self._pending = _Pending(step, _key_data(key), future)
        # The rollout's first turn now: its first decode runs before the trainer's programs, and its first
        # tool calls then overlap them.
        self.turns.hand_over_when(future.done)

    def _collect_in_turn(self, collect: Callable[[], Collected]) -> Collected:
        with self.turns.turn():
            return collect()

    def offer_devices(self) -> None:
        """Let the rollout in flight launch its waiting programs now (the trainer calls it between its own)."""
        self.turns.offer()

    def take(self, step: int, key: jax.Array) -> tuple[Collected, float] | None:
        """(step `step`'s rollout, seconds waited for it), or None when none was launched. Raises
        what the rollout raised, and refuses a rollout launched for another step or key."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        start = time.perf_counter()
        if self.turns.holds():
            self.turns.release()
        collected = pending.future.result()
        waited = time.perf_counter() - start
        if pending.step != step or not np.array_equal(pending.key_data, _key_data(key)):
            raise RuntimeError(f"rollout_ahead: the pending rollout was launched for step {pending.step} with "
                               f"another key than step {step} draws; the trainer's RNG or step moved under it")
        return collected, waited

    def close(self) -> None:
        """Wait for a rollout in flight (its result is dropped) and stop the thread."""
        pending, self._pending = self._pending, None
        if self.turns.holds():
            self.turns.release()
        if pending is not None:
            pending.future.exception()  # waits; what it raised no longer matters to anyone
        self._pool.shutdown(wait=True)


def _key_data(key: jax.Array) -> np.ndarray:
    return np.asarray(jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key)

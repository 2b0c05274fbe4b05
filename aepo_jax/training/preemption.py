"""The cluster's notice that a run is about to be stopped (SIGTERM: a preempted TPU VM or GPU node, a
scheduler's cancel), so the trainer saves the step it has reached and exits instead of losing the steps
since its last regular checkpoint.

With several processes every host must save the same step: jax's preemption service (started with
`jax.distributed`, it takes SIGTERM on any host) agrees on one and `reached` says True there on all of
them. With one process a SIGTERM handler sets a flag that the next finished step reads.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


class Preempted(Exception):
    """A trainer stopped at `step` on a preemption notice, after saving it: relaunch with --resume.
    Raised (not returned) so that no caller goes on as if training had finished."""

    def __init__(self, step: int, directory: str):
        super().__init__(f"preempted: saved step {step} in {directory}; relaunch the same command with --resume "
                         "to continue")
        self.step = step


class PreemptionWatch:
    """`reached(step)`: True at the step where the run should save and stop after a SIGTERM."""

    def __init__(self) -> None:
        from jax._src import distributed

        self._distributed = distributed.global_state.client is not None
        self._notice = threading.Event()
        self._previous: Any = None
        # One process: our own handler (signals go to the main thread only). With jax.distributed the
        # preemption service has its own, which must not be replaced.
        if not self._distributed and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._notice.set()

    def reached(self, step: int) -> bool:
        """Whether to save `step` and stop (call after every step, on every process)."""
        if self._distributed:
            from jax.experimental import multihost_utils

            return bool(multihost_utils.reached_preemption_sync_point(int(step)))
        return self._notice.is_set()

    def close(self) -> None:
        """Put the previous SIGTERM handler back."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

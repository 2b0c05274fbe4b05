"""One process's failure ends every process of a run, within seconds and with its reason.

Without this, a process that fails (a tool or rollout error on one host, a path only that host
lacks) leaves the others blocked in their next collective or barrier; it then waits in jax's
shutdown barrier (up to 300 s) and the coordination service finally aborts every process, with
no word on the healthy hosts of why.

Here a failing process writes its error to the coordination service's key-value store
(`announce_failure`) before it cleans up, and every process watches that store from a daemon
thread (`peer_failure_watch`). A healthy process prints a peer's failure (`process N failed: ...`)
at once and exits 1 `GRACE_S` later (`os._exit`: its main thread may be blocked in a collective that
will never complete; the grace lets a checkpoint commit of its own finish in the background). A
process that has announced a failure of its own ignores its peers' (several hosts often fail
together): it finishes its clean-up and exits with its own error, at most `exit_after_s` after
announcing and without jax's shutdown barrier (which would wait for peers that have already
gone). Process 0, which hosts the coordination service, leaves last: a process whose service
disappears aborts without a word.

A preemption (every process agreed on the step and saves it together) is no failure: the caller
names such exceptions `quiet` (`training.preemption.Preempted`), and they are not announced, so no
process is cut short while the collective checkpoint finishes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import jax

KEY_PREFIX = "aepo_jax/failed/"
LEAVING_PREFIX = "aepo_jax/leaving/"  # a process about to exit after a failure
POLL_S = 1.0  # how often a process looks for a peer's failure
EXIT_AFTER_S = 30.0  # how long a failing process may take to clean up after announcing
# How long a healthy process waits between learning of a peer's failure and exiting: its main thread is
# blocked in a collective, but a checkpoint commit of its own may still be finishing in the background.
GRACE_S = 5.0
# How long process 0 waits for the others to leave before it does (a failing one may clean up EXIT_AFTER_S).
LEADER_WAIT_S = EXIT_AFTER_S + GRACE_S
_ANNOUNCED = "_aepo_jax_announced"  # set on an exception once announced
# Set once this process has announced a failure of its own: its watcher then leaves it to finish its
# clean-up and exit with its own error (a peer failing at the same moment must not cut that short).
_FAILED_HERE = threading.Event()


def _client():
    """The coordination service's client, or None without `jax.distributed` (one process)."""
    if jax.process_count() == 1:
        return None
    from jax._src import (
        distributed as jax_distributed,  # no public handle to the client
    )

    return jax_distributed.global_state.client


def failure_text(err: BaseException) -> str:
    """One line naming `err` (its first line, at most 1,000 characters)."""
    first = (str(err).splitlines() or [""])[0]
    return f"{type(err).__name__}: {first}"[:1000]


def announce_failure(err: BaseException, quiet: tuple[type[BaseException], ...] = (),
                     exit_after_s: float = EXIT_AFTER_S) -> None:
    """Tell every other process that this one failed with `err` (once per exception), and make sure this
    process exits within `exit_after_s` from now. Not for an exception of a `quiet` type, or one raised
    while handling one (`raise SystemExit(...) from None` keeps it as the context). No-op with one process."""
    client = _client()
    if client is None or getattr(err, _ANNOUNCED, False) or _is_quiet(err, quiet):
        return
    try:
        setattr(err, _ANNOUNCED, True)
    except AttributeError:
        pass
    # The runtime raises its own error type; the service itself may be gone (the others then learn of it
    # from the service).
    _FAILED_HERE.set()
    with contextlib.suppress(Exception):
        client.key_value_set(f"{KEY_PREFIX}{jax.process_index()}", failure_text(err))
    late = f"process {jax.process_index()} failed and did not exit within {exit_after_s:g} s of it"
    timer = threading.Timer(exit_after_s, _exit_now, args=(late,))
    timer.daemon = True
    timer.start()


def _exit_now(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    _leave(1)


def _leave(status: int) -> None:
    """Exit now with `status`. Process 0 hosts the coordination service, and a process whose service goes
    away aborts: it leaves last, once every other process has said it is leaving (at most
    `LEADER_WAIT_S`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    client = _client()
    if client is not None:
        me = jax.process_index()
        with contextlib.suppress(Exception):  # the runtime's own error type: the service may be gone
            client.key_value_set(f"{LEAVING_PREFIX}{me}", "1")
        if me == 0:
            deadline = time.monotonic() + LEADER_WAIT_S
            while time.monotonic() < deadline:
                try:
                    if len(client.key_value_dir_get(LEAVING_PREFIX)) >= jax.process_count():
                        break
                except Exception:  # noqa: BLE001 - the runtime's own error type: the service is gone
                    break
                time.sleep(0.1)
            time.sleep(0.5)  # the last to say so exits right after it
    os._exit(status)


def peer_failures(entries: list[tuple[str, str]], me: int) -> list[tuple[int, str]]:
    """(process, message) of the failures other processes announced, from the store's `entries`."""
    found = []
    for key, value in entries:
        name = key.rsplit("/", 1)[-1]
        if name.isdigit() and int(name) != me:
            found.append((int(name), value))
    return sorted(found)


def _watch(client, me: int, stop: threading.Event, poll_s: float) -> None:
    while not stop.wait(poll_s):
        try:
            failures = peer_failures(client.key_value_dir_get(KEY_PREFIX), me)
        except Exception:  # noqa: BLE001 - the runtime's own error type: the service is gone, jax reports it
            return
        if failures and not stop.is_set() and not _FAILED_HERE.is_set():
            reasons = "; ".join(f"process {process} failed: {message}" for process, message in failures)
            print(f"error: {reasons} (process {me} stops too)", file=sys.stderr, flush=True)
            if stop.wait(GRACE_S) or _FAILED_HERE.is_set():  # this process ended, or failed, meanwhile
                return
            _leave(1)


@contextmanager
def peer_failure_watch(quiet: tuple[type[BaseException], ...] = (), poll_s: float = POLL_S,
                       exit_after_s: float = EXIT_AFTER_S) -> Iterator[None]:
    """Within: a peer's announced failure ends this process at once, and an exception raised here is
    announced to the peers (`announce_failure`, which spares `quiet` ones). No-op with one process."""
    client = _client()
    if client is None:
        yield
        return
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(client, jax.process_index(), stop, poll_s),
                               name="peer-failure-watch", daemon=True)
    watcher.start()
    try:
        yield
    except BaseException as err:
        stop.set()
        announce_failure(err, quiet, exit_after_s)
        if getattr(err, _ANNOUNCED, False):  # its clean-up is done: not jax's shutdown barrier, which waits
            _report_and_exit(err)            # up to 300 s for peers that have already gone
        raise
    finally:
        stop.set()


def _report_and_exit(err: BaseException) -> None:
    """Print `err` as Python would at exit (a SystemExit's message, else the traceback) and exit now."""
    if isinstance(err, SystemExit):
        code = err.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
        status = code if isinstance(code, int) else 1
    else:
        traceback.print_exception(err)
        status = 1
    _leave(status or 1)


def _is_quiet(err: BaseException, quiet: tuple[type[BaseException], ...]) -> bool:
    return bool(quiet) and (isinstance(err, quiet) or isinstance(err.__context__, quiet))

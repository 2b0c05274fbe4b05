"""Real `jax.distributed` clusters on loopback for tests: N Python processes, fake CPU devices each."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys

from tests.child_process import child_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_processes(args: list[str], processes: int, devices_each: int) -> list[subprocess.Popen]:
    """`python *args` once per process, with the coordinator on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for pid in range(processes):
        # PYTHONFAULTHANDLER: a process that hangs prints every thread's stack when `outputs` aborts it.
        env = child_env(devices_each, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(processes),
                        JAX_PROCESS_ID=str(pid), PYTHONFAULTHANDLER="1")
        procs.append(subprocess.Popen([sys.executable, *args], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def result_lines(procs: list[subprocess.Popen], timeout_s: float) -> list[str]:
    """The `RESULT ...` line of each process (which must exit 0 within `timeout_s`); kills stragglers."""
    return [next(line for line in out.splitlines() if line.startswith("RESULT")) for out in outputs(procs, timeout_s)]


def outputs(procs: list[subprocess.Popen], timeout_s: float) -> list[str]:
    """Each process's stdout (each must exit 0 within `timeout_s`); kills stragglers.

    A failure or a hang shows the end of every process's stderr: the first process's error is
    often only the consequence (a collective or barrier timing out) of another's."""
    texts, errors, hung = [], [], None
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout_s)  # a hang fails here instead of blocking the suite
            texts.append(out)
            errors.append(err)
    except subprocess.TimeoutExpired:
        hung = len(texts)
        _abort_with_stacks(procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if hung is not None:  # read what every process wrote before it was killed
        errors += [proc.communicate()[1] for proc in procs[len(errors):]]
    tail = 12000 if hung is not None else 3000  # a hang's stacks: every thread of the process
    failed = [f"process {i} exited {proc.returncode}:\n{err[-tail:]}"
              for i, (proc, err) in enumerate(zip(procs, errors)) if proc.returncode != 0]
    if hung is not None:
        raise AssertionError(f"process {hung} did not exit within {timeout_s:g} s\n" + "\n".join(failed))
    assert not failed, "\n".join(failed)
    return texts


def _abort_with_stacks(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGABRT to each process still running: with PYTHONFAULTHANDLER set it writes every thread's Python
    stack to its stderr before it dies, which shows where a hang waits."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(OSError):  # no core file for an abort on purpose (a multi-GB jax process)
                resource.prlimit(proc.pid, resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
            proc.send_signal(signal.SIGABRT)
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass


def stderr_of(procs: list[subprocess.Popen], timeout_s: float) -> list[tuple[int, str]]:
    """(exit status, stderr) of each process, whatever the status, once it has exited; kills stragglers
    after `timeout_s` (a hang fails here instead of blocking the suite)."""
    try:
        return [(proc.wait(timeout=timeout_s), proc.communicate()[1]) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

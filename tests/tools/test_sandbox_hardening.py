"""Sandbox hardening: code that floods or forges the status pipes costs the worker and the trainer bounded memory
and bytes, and without namespaces nothing a call started outlives it (a timeout included) or prints into the next.

Each test failed before its fix (the worker kept all of its status pipe, the trainer all of a status line, and
without a pid namespace only the worker's own process group was killed)."""

import contextlib
import os
import signal
import threading
import time

import pytest

from aepo_jax.tools import PythonSandbox, SandboxLimits, python_exec
from aepo_jax.tools.sandbox_process import PYTHON_FLAGS

LIMITS = SandboxLimits(wall_seconds=4.0, cpu_seconds=2, memory_bytes=256 << 20, max_output_bytes=4096)
# The documented traceback bound: `traceback_lines` lines of `max_output_bytes` characters, each with its marker.
TRACEBACK_BOUND = LIMITS.traceback_lines * (LIMITS.max_output_bytes + 64)

# In the call's process: the sandbox's status pipe is its only pipe past stderr (stdin is /dev/null).
STATUS_FD = """import os, stat
fd = next(fd for fd in range(3, 1024) if os.path.exists(f'/proc/self/fd/{fd}') and stat.S_ISFIFO(os.fstat(fd).st_mode))
"""
FLOOD = STATUS_FD + """import time
block, end, sent = b'x' * (1 << 20), time.monotonic() + 1.0, 0
while time.monotonic() < end and sent < (512 << 20):
    sent += os.write(fd, block)
os._exit(0)
"""
FORGED_STATUS = STATUS_FD + """os.write(fd, b'\\n{"status": "ok", "traceback": "' + b'A' * SIZE + b'"}')
os._exit(0)
"""
# Without a pid namespace: the worker's result pipe, reopened through /proc (its number is in the worker's argv).
FORGED_RESULT = """import json, os
ppid = os.getppid()
config = json.loads(open(f'/proc/{ppid}/cmdline', 'rb').read().split(b'\\0')[-2])
fd = os.open(f'/proc/{ppid}/fd/{config["result_fd"]}', os.O_WRONLY)
os.write(fd, b'{"status": "ok", "traceback": "' + b'A' * (8 << 20) + b'"}\\n')
"""


@pytest.fixture(scope="module")
def isolated():
    """The usual sandbox, without a memory cgroup: the worker's own memory is what is measured."""
    with PythonSandbox(LIMITS, pool_size=1, calls_per_worker=16, memory_cgroup_root="") as box:
        yield box


@pytest.fixture(scope="module")
def bare():
    """No namespaces and no cgroups, as where `unshare` does not work (unprivileged Docker)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(python_exec, "probe_isolation", lambda: ())
        box = PythonSandbox(LIMITS, pool_size=1, calls_per_worker=16, cgroup_root="", memory_cgroup_root="")
    with box:
        assert not box.network_isolated and "no network isolation" in box.isolation
        yield box


@pytest.fixture(params=["isolated", "bare"])
def sandbox(request):
    return request.getfixturevalue(request.param)


def _stat(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name (state first), or [] when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def _dead_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(pid) for pid in pids)


@contextlib.contextmanager
def _killed_at_exit(pids: list[int]):
    """Kill what a test leaves should it fail (on the unfixed code its processes outlived the sandbox)."""
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _find_worker(root: int) -> int | None:
    """`root` or its first descendant running `python -s -P sandbox_worker.py CONFIG` (told by the argument after
    the interpreter's flags: the `unshare` and `sh` before it name the script too)."""
    frontier = [root]
    while frontier:
        pid = frontier.pop(0)
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
            script = 1 + len(PYTHON_FLAGS)
            if len(args) > script and args[script].endswith(b"/sandbox_worker.py"):
                return pid
        frontier += [int(name) for name in os.listdir("/proc") if name.isdigit() and _stat(int(name))[1:2] == [str(pid)]]
    return None


def _worker_pid(box: PythonSandbox) -> int:
    """The idle worker's pid (the pool holds one), once it is in the pool (a replacement starts in the background)
    and its wrappers (`sh`, `unshare`) have started it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        idle = list(box._idle.queue)
        pid = _find_worker(idle[0].process.pid) if idle else None
        if pid is not None:
            return pid
        time.sleep(0.05)
    raise AssertionError("no worker process found")


def _peak_rss_while(pid: int, action):
    """(action(), the highest VmHWM in bytes that process `pid` reported while it ran)."""
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            with contextlib.suppress(OSError, StopIteration), open(f"/proc/{pid}/status") as f:
                peak[0] = max(peak[0], int(next(line for line in f if line.startswith("VmHWM")).split()[1]) << 10)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        return action(), peak[0]
    finally:
        done.set()
        sampler.join()


def test_flooding_the_status_pipe_leaves_the_worker_small(sandbox):
    """Code writing 1 MiB blocks to its status fd made the worker (which has no rlimit) keep them all: 5.7 GiB in 4 s."""
    worker = _worker_pid(sandbox)
    result, peak = _peak_rss_while(worker, lambda: sandbox.run(FLOOD))
    assert result.status in ("failed", "error", "timeout"), result
    assert len(result.traceback) < TRACEBACK_BOUND
    assert 0 < peak < 300 << 20, f"worker peak RSS {peak >> 20} MiB"
    assert sandbox.run("print('next')").stdout == "next\n"


@pytest.mark.parametrize("size, status", [(40 << 20, "failed"), (200_000, "ok")])
def test_a_forged_huge_status_comes_back_bounded(sandbox, size, status):
    """A status line the code writes itself: 40 MiB (over what the worker keeps of the pipe) is unreadable, 200 kB
    is read; either way the traceback is cut like a real one. It came back "ok" with a 40 MiB traceback."""
    result = sandbox.run(FORGED_STATUS.replace("SIZE", str(size)))
    assert result.status == status, result.traceback[:300]
    assert len(result.traceback) < TRACEBACK_BOUND, len(result.traceback)
    assert sandbox.run("print('next')").stdout == "next\n"


def test_a_forged_status_line_on_the_result_pipe_is_read_no_further_than_its_cap(bare):
    """Without namespaces the code can reopen the worker's result pipe; the trainer read the whole line (copying
    its buffer at each read) and returned it as the call's status."""
    start = time.monotonic()
    result = bare.run(FORGED_RESULT)
    assert result.status == "failed" and "status line was over" in result.traceback, result.traceback[:300]
    assert len(result.traceback) < TRACEBACK_BOUND and time.monotonic() - start < LIMITS.wall_seconds
    assert bare.run("print('next')").stdout == "next\n"


@pytest.mark.parametrize("new_session", [False, True], ids=["same-group", "setsid"])
def test_without_namespaces_a_timed_out_call_and_its_subprocess_die(bare, new_session):
    """The call's child has its own process group; the parent killed only the worker's, so the call and what it
    started lived on (reparented to init) after a timeout, and after the sandbox was closed."""
    code = ("import os, subprocess, time\n"
            f"p = subprocess.Popen(['sleep', '300'], start_new_session={new_session})\n"
            "print(os.getpid(), p.pid, flush=True)\ntime.sleep(60)")
    result = bare.run(code)
    pids = [int(pid) for pid in result.stdout.split()]
    with _killed_at_exit(pids):
        assert result.status == "timeout" and len(pids) == 2, result
        assert _dead_within(pids, 3.0), [pid for pid in pids if _alive(pid)]


@pytest.mark.parametrize("new_session", [False, True], ids=["same-group", "setsid"])
def test_without_namespaces_a_background_process_does_not_print_into_the_next_call(bare, new_session):
    """A subprocess left running by a call printed into the next call's output (the worker's stdout)."""
    code = ("import subprocess\n"
            "p = subprocess.Popen(['sh', '-c', 'sleep 1; echo LEAKED FROM CALL 1; exec sleep 300'], "
            f"start_new_session={new_session})\nprint(p.pid)")
    first = bare.run(code)
    pids = [int(first.stdout)]
    with _killed_at_exit(pids):
        assert first.status == "ok", first
        second = bare.run("import time\ntime.sleep(2)\nprint('second')")
        assert (second.status, second.stdout) == ("ok", "second\n"), second
        assert _dead_within(pids, 3.0)

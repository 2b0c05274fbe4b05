"""Python sandbox: run model-written code in a bounded, isolated, warm worker process.

Each call runs in its own fresh process (spec §4, DESIGN "Tools"), taken from a
pool of pre-started workers that have already imported the interpreter and
the preload modules, so a call costs far less than starting Python. A worker
runs exactly one call and is then replaced: no state is ever shared between
calls. Limits per call: wall clock (the parent kills the process group),
CPU time, address space, file size and process count (rlimits), a fresh
temporary working directory removed afterwards, a minimal environment.

Isolation (probed once, reported in every result as `isolation`):
- `unshare --net --pid --fork --kill-child` (root) or the same with
  `--user --map-root-user` (non-root, if user namespaces are allowed): no
  network (only a loopback that is down), the code sees and can signal only
  its own processes, and every process it starts dies with the worker (the
  worker is the namespace's init).
- A pids cgroup per worker (where /sys/fs/cgroup/pids is writable) bounds the
  number of processes even as root, where RLIMIT_NPROC does not apply; the
  rlimit is still set for non-root callers.
- Where `unshare` is unavailable, the code runs without network isolation and
  `network_isolated` is False in the result.
Not isolated: the file system is reachable with the caller's permissions
(the stdlib must stay readable); only the working directory is fresh.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import queue
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Self

_WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_worker.py")

NAMESPACE_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("unshare", "--net", "--pid", "--fork", "--kill-child"),
    ("unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"),
)


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits. Defaults suit training; tests use smaller ones."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    max_processes: int = 32  # pids cgroup limit (and RLIMIT_NPROC)
    max_output_bytes: int = 8192
    traceback_lines: int = 8


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What one call did.

    status: "ok" (ran to the end), "error" (raised, syntax error or non-zero
    sys.exit; `traceback` has the last lines), "timeout" (wall or CPU limit),
    "killed" (died from a signal, e.g. killed itself), "failed" (the sandbox
    itself could not run the code).
    """

    status: str
    stdout: str
    stderr: str
    traceback: str
    exit_code: int | None
    seconds: float
    stdout_truncated: bool
    stderr_truncated: bool
    network_isolated: bool
    isolation: str


def probe_isolation() -> tuple[str, ...]:
    """The first namespace command that works on this machine, or () if none does."""
    if shutil.which("unshare") is None:
        return ()
    for command in NAMESPACE_COMMANDS:
        try:
            done = subprocess.run([*command, "true"], check=False, capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return command
    return ()


def probe_pids_cgroup(root: str = "/sys/fs/cgroup/pids") -> str:
    """`root` if per-worker pids cgroups can be made under it, else ''."""
    probe = os.path.join(root, f"aepo-sandbox-probe-{os.getpid()}")
    try:
        os.makedirs(probe, exist_ok=True)
        ok = os.path.exists(os.path.join(probe, "pids.max"))
        os.rmdir(probe)
    except OSError:
        return ""
    if ok:
        _remove_stale_cgroups(root)
    return root if ok else ""


def _remove_stale_cgroups(root: str) -> None:
    """Remove empty worker cgroups left by sandbox owners that died without closing."""
    for name in os.listdir(root):
        parts = name.split("-")
        if len(parts) != 4 or parts[:2] != ["aepo", "sandbox"] or not parts[2].isdigit():
            continue
        if not os.path.exists(f"/proc/{parts[2]}"):
            try:
                os.rmdir(os.path.join(root, name))
            except OSError:
                pass


def _remove_cgroup(path: str) -> None:
    """Kill what is left in a worker's cgroup and remove it (retrying while the kernel reaps)."""
    for _ in range(50):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                for pid in f.read().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


@dataclasses.dataclass
class _Worker:
    process: subprocess.Popen
    workdir: str
    result_read: int
    cgroup: str


class _Capture:
    """Keeps the first `limit` bytes of a stream, counts the rest."""

    def __init__(self, limit: int):
        self.limit, self.chunks, self.size, self.total = limit, [], 0, 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        if self.size < self.limit:
            keep = data[: self.limit - self.size]
            self.chunks.append(keep)
            self.size += len(keep)

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", errors="replace")

    @property
    def truncated(self) -> bool:
        return self.total > self.size


class PythonSandbox:
    """A pool of warm, isolated, single-use Python workers; `run` is thread-safe.

    Args:
      limits: per-call limits.
      pool_size: workers kept started and waiting.
      preload: modules each worker imports before it gets code.
      cgroup_root: a pids-cgroup directory for per-worker cgroups; None probes
        /sys/fs/cgroup/pids, "" disables them.
      workdir_root: where per-call temporary directories are made.
    """

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),
        pool_size: int = 4,
        preload: Sequence[str] = (),
        cgroup_root: str | None = None,
        workdir_root: str | None = None,
    ):
        if pool_size < 0:
            raise ValueError(f"pool_size must be >= 0, got {pool_size}")
        self.limits = limits
        self.pool_size = pool_size
        self.preload = tuple(preload)
        self.workdir_root = workdir_root
        self.namespace_command = probe_isolation()
        self.network_isolated = bool(self.namespace_command)
        self.cgroup_root = probe_pids_cgroup() if cgroup_root is None else cgroup_root
        parts = []
        if self.namespace_command:
            parts.append("net+pid namespaces")
        if self.cgroup_root:
            parts.append("pids cgroup")
        self.isolation = ", ".join(parts) or "rlimits only (no network isolation on this platform)"
        self._serial = itertools.count()
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(pool_size):
            self._idle.put(self._spawn())

    # -- workers -----------------------------------------------------------
    def _spawn(self) -> _Worker:
        serial = next(self._serial)
        workdir = tempfile.mkdtemp(prefix="aepo-sandbox-", dir=self.workdir_root)
        config = {
            "cpu_seconds": self.limits.cpu_seconds,
            "memory_bytes": self.limits.memory_bytes,
            "file_bytes": self.limits.file_bytes,
            "max_processes": self.limits.max_processes,
            "preload": list(self.preload),
        }
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        result_read, result_write = os.pipe()
        config["result_fd"] = result_write
        command = [*self.namespace_command, sys.executable, "-I", _WORKER_SCRIPT, json.dumps(config)]
        cgroup = ""
        if self.cgroup_root:
            cgroup = os.path.join(self.cgroup_root, f"aepo-sandbox-{os.getpid()}-{serial}")
            try:
                os.makedirs(cgroup, exist_ok=True)
                with open(os.path.join(cgroup, "pids.max"), "w") as f:
                    f.write(str(self.limits.max_processes))
                # The shell joins the cgroup, then execs, so every descendant is inside it.
                command = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(cgroup, "cgroup.procs"), *command]
            except OSError:
                cgroup = ""
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=env,
                start_new_session=True,
                pass_fds=(result_write,),
            )
        except BaseException:
            os.close(result_read)
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        finally:
            os.close(result_write)
        return _Worker(process=process, workdir=workdir, result_read=result_read, cgroup=cgroup)

    def _take(self) -> _Worker:
        try:
            worker = self._idle.get_nowait()
        except queue.Empty:
            return self._spawn()
        threading.Thread(target=self._refill, daemon=True).start()
        return worker

    def _refill(self) -> None:
        with self._lock:
            if self._closed or self._idle.qsize() >= self.pool_size:
                return
        try:
            worker = self._spawn()
        except OSError:
            return
        with self._lock:
            if not self._closed:
                self._idle.put(worker)
                return
        self._dispose(worker)

    @staticmethod
    def _dispose(worker: _Worker) -> None:
        """Kill the worker's whole process group, reap it, close pipes, remove its directory."""
        try:
            os.killpg(worker.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for stream in (worker.process.stdin, worker.process.stdout, worker.process.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            worker.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.close(worker.result_read)
        except OSError:
            pass
        shutil.rmtree(worker.workdir, ignore_errors=True)
        if worker.cgroup:
            _remove_cgroup(worker.cgroup)

    # -- calls -------------------------------------------------------------
    def run(self, code: str) -> SandboxResult:
        """Run `code` in a fresh worker under the limits; never raises for anything the code does."""
        start = time.monotonic()
        if self._closed:
            raise RuntimeError("PythonSandbox is closed")
        try:
            worker = self._take()
        except OSError as error:
            return self._result("failed", _Capture(0), _Capture(0), f"could not start worker: {error}", None, start)
        try:
            return self._execute(worker, code, start)
        finally:
            # Kill now; reap, remove the directory and cgroup off the caller's path.
            try:
                os.killpg(worker.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            threading.Thread(target=self._dispose, args=(worker,), daemon=True).start()

    def _execute(self, worker: _Worker, code: str, start: float) -> SandboxResult:
        limits = self.limits
        stdout, stderr, status_bytes = _Capture(limits.max_output_bytes), _Capture(limits.max_output_bytes), _Capture(1 << 20)
        deadline = start + limits.wall_seconds
        process = worker.process
        try:
            process.stdin.write(code.encode("utf-8", errors="replace"))
            process.stdin.close()
        except OSError:
            pass  # the worker died before reading; its status below says how
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ, stdout)
        selector.register(process.stderr, selectors.EVENT_READ, stderr)
        selector.register(worker.result_read, selectors.EVENT_READ, status_bytes)
        timed_out = False
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in selector.select(timeout=remaining):
                data = os.read(key.fd, 65536)
                if data:
                    key.data.add(data)
                else:
                    selector.unregister(key.fileobj)
        selector.close()
        if timed_out:
            os.killpg(process.pid, signal.SIGKILL)
        try:
            returncode = process.wait(timeout=max(0.1, deadline - time.monotonic()) + 1.0)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            returncode = process.wait()
            timed_out = True
        if timed_out:
            return self._result("timeout", stdout, stderr, f"wall-clock limit of {limits.wall_seconds:g} s exceeded",
                                None, start)
        if status_bytes.total:
            try:
                status = json.loads(status_bytes.text())
                return self._result(status["status"], stdout, stderr, status.get("traceback", ""),
                                    status.get("exit_code"), start)
            except (ValueError, KeyError, TypeError):
                pass
        return self._signal_result(returncode, stdout, stderr, start)

    def _signal_result(self, returncode: int, stdout: _Capture, stderr: _Capture, start: float) -> SandboxResult:
        """A worker that wrote no status died: from the CPU limit, a signal, or its own exit."""
        # unshare re-raises the child's signal on itself; as a fallback it exits 128 + signal.
        signum = -returncode if returncode < 0 else (returncode - 128 if returncode > 128 else 0)
        if signum == signal.SIGXCPU:
            return self._result("timeout", stdout, stderr, f"CPU-time limit of {self.limits.cpu_seconds} s exceeded",
                                returncode, start)
        if signum:
            name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
            return self._result("killed", stdout, stderr, f"process killed by signal {name}", returncode, start)
        return self._result("killed", stdout, stderr, f"process exited with code {returncode} without reporting",
                            returncode, start)

    def _result(self, status: str, stdout: _Capture, stderr: _Capture, trace: str, exit_code: int | None,
                start: float) -> SandboxResult:
        lines = trace.rstrip("\n").splitlines()[-self.limits.traceback_lines :]
        return SandboxResult(
            status=status,
            stdout=stdout.text(),
            stderr=stderr.text(),
            traceback="\n".join(lines),
            exit_code=exit_code,
            seconds=time.monotonic() - start,
            stdout_truncated=stdout.truncated,
            stderr_truncated=stderr.truncated,
            network_isolated=self.network_isolated,
            isolation=self.isolation,
        )

    def close(self) -> None:
        """Kill the idle workers; calls in flight finish on their own."""
        with self._lock:
            self._closed = True
        while True:
            try:
                self._dispose(self._idle.get_nowait())
            except queue.Empty:
                break

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

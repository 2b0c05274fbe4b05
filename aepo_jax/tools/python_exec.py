"""Python sandbox: run model-written code in bounded, isolated, warm worker processes (spec §4, DESIGN "Tools").

A pool of worker processes is started ahead of time; each has imported the
interpreter and the preload modules. A call is handed to an idle worker,
which forks a fresh child for it (so a call costs a fork, not an interpreter
start-up), waits for the child, kills everything the call started, and
reports. The worker never runs model code itself, so calls share no state;
it is replaced after `calls_per_worker` calls (1 = a new worker per call).

Limits per call: wall clock (the parent has the worker kill the call's
processes and exit, then kills the worker's whole session if it has not),
CPU time, address space (per process), memory of all the call's processes
together (a memory cgroup per worker, where the controller is usable), file
size and process count, a fresh working
directory (a size-limited tmpfs, or a temporary directory removed
afterwards without file-system isolation), a minimal environment, output
kept up to `max_output_bytes` per stream, a status line no longer than a
real one can be (`status_line_bytes`: the worker keeps no more of what the
code writes to its status pipe, the parent reads no more of a line).

Isolation (probed once; every result says what applied in `isolation`,
`network_isolated` and `filesystem_isolated`):
- `unshare --mount --net --pid --fork --kill-child` (root) or the same with
  `--user --map-root-user` (non-root, where user namespaces are allowed):
  no network (only a loopback that is down), the code sees and can signal
  only its own processes, and whatever it starts dies when the call ends.
- A private root file system per worker (`sandbox_root.plan_root` says what
  is in it, `sandbox_mounts` builds it): read-only binds of the interpreter,
  the venv, the preload modules, `/usr`, `/lib*`, `/bin`, the linker's `/etc`
  files and a few devices, a fresh `/proc`, and a fresh tmpfs working
  directory per call; the call's process holds no capabilities. Nothing
  else of the caller's files is reachable. Where mount namespaces do not
  work (or `isolate_filesystem=False`), `filesystem_isolated` is False and
  `isolation` says why.
- A pids cgroup per worker (where /sys/fs/cgroup/pids is writable) bounds a
  fork bomb even as root, where RLIMIT_NPROC does not apply; the rlimit is
  still set for non-root callers.
- A memory cgroup per worker, inside the caller's own (where one can be made
  with a limit): RLIMIT_AS bounds each process, so a call that forks could
  use it many times over; the cgroup bounds them together (see
  `SandboxLimits.worker_memory_bytes`). Without it, only RLIMIT_AS applies.
- Workers die with the parent, even a SIGKILLed one (they watch their stdin).
- Where `unshare` does not work, code runs without network isolation and
  `network_isolated` is False. The worker, a child subreaper then, still
  kills every process a call started, in its process group or not, when the
  call ends or times out (unless the code kills or stops the worker, which
  it can then signal).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import queue
import secrets
import selectors
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Self

from aepo_jax.tools.sandbox_process import (
    Worker,
    dispose_worker,
    kill_worker,
    make_cgroup,
    memory_limit_files,
    oom_kills,
    probe_filesystem,
    probe_isolation,
    probe_memory_cgroup,
    probe_pids_cgroup,
    send_call,
    spawn_worker,
    with_mount_namespace,
)
from aepo_jax.tools.sandbox_root import make_mount_point, plan_root


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits. Defaults suit training; tests use smaller ones."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30  # RLIMIT_AS of each process of a call
    # With a memory cgroup, a worker and all its call's processes together get memory_bytes + workdir_bytes
    # (the tmpfs's pages are charged to it) + this, the share of the idle worker itself (its interpreter and
    # preload modules: about 7 MiB bare, 50 MiB with numpy and sympy), so a call gets at least memory_bytes.
    worker_memory_bytes: int = 256 << 20
    file_bytes: int = 16 << 20
    workdir_bytes: int = 64 << 20  # the working directory's tmpfs, all files together (file-system isolation only)
    workdir_files: int = 10_000  # inodes in that tmpfs
    max_processes: int = 32  # per worker: pids cgroup limit (and RLIMIT_NPROC)
    max_output_bytes: int = 8192  # per stream; also the most characters kept of one traceback line
    traceback_lines: int = 8


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What one call did.

    status: "ok" (ran to the end), "error" (raised, syntax error or non-zero
    sys.exit; `traceback` has the last lines), "timeout" (wall or CPU limit),
    "killed" (died from a signal), "failed" (the sandbox could not run it, or could not read its status).
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
    filesystem_isolated: bool
    isolation: str


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


def _drain(fd: int, capture: _Capture) -> bool:
    """Read what is available now; False at EOF."""
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        if not data:
            return False
        capture.add(data)


# How long a call's caller waits for a worker it ends to kill the call's processes and exit (`kill_worker`):
# milliseconds for a worker that works; one the code stopped (possible without a pid namespace) costs no more.
CALLER_GRACE_S = 0.5
WORKER_START_S = 30.0  # the most a worker may take to start (namespaces, root, preload) before a call's clock


class PythonSandbox:
    """A pool of warm, isolated Python workers; `run` is thread-safe.

    Args:
      limits: per-call limits.
      pool_size: idle workers kept started and waiting.
      calls_per_worker: calls a worker serves (each in a fresh forked child) before it is replaced.
      preload: modules each worker imports before it gets code (e.g. "numpy", "sympy").
      cgroup_root: a pids-cgroup directory for per-worker cgroups; None probes
        /sys/fs/cgroup/pids, "" disables them.
      memory_cgroup_root: a memory-cgroup directory for per-worker cgroups; None probes the caller's own
        memory cgroup (v1 or v2), "" disables them.
      workdir_root: where per-call temporary directories are made when the file system is not isolated.
      isolate_filesystem: give each worker a private read-only root (where mount namespaces work);
        False runs code with the caller's view of the file system, and every result says so.
      latency_seconds: every call returns no sooner than this after it started (a remote
        sandbox service's round trip, for benchmarks; default 0). The worker is released first,
        so concurrent calls wait in parallel.
    """

    def __init__(self, limits: SandboxLimits = SandboxLimits(), pool_size: int = 4, calls_per_worker: int = 64,
                 preload: tuple[str, ...] = (), cgroup_root: str | None = None, workdir_root: str | None = None,
                 isolate_filesystem: bool = True, latency_seconds: float = 0.0,
                 memory_cgroup_root: str | None = None):
        if pool_size < 0 or calls_per_worker < 1:
            raise ValueError(f"need pool_size >= 0 and calls_per_worker >= 1, got {pool_size}, {calls_per_worker}")
        if latency_seconds < 0:
            raise ValueError(f"latency_seconds must be >= 0, got {latency_seconds}")
        self.limits, self.pool_size, self.calls_per_worker = limits, pool_size, calls_per_worker
        self.latency_seconds = float(latency_seconds)
        self.workdir_root = workdir_root
        self._config = {"cpu_seconds": limits.cpu_seconds, "memory_bytes": limits.memory_bytes,
                        "file_bytes": limits.file_bytes, "max_processes": limits.max_processes,
                        "workdir_bytes": limits.workdir_bytes, "workdir_files": limits.workdir_files,
                        # the child sends at most this much traceback (a 100 kB message is cut where it runs)
                        "traceback_lines": limits.traceback_lines, "traceback_line_chars": limits.max_output_bytes,
                        # the most of the child's status pipe the worker keeps, and of a status line the parent reads
                        "status_bytes": status_line_bytes(limits), "preload": list(preload)}
        self.namespace_command = probe_isolation()
        self.network_isolated = bool(self.namespace_command)
        self._root_mount_point = ""
        filesystem = self._isolate_filesystem(tuple(preload)) if isolate_filesystem else "turned off by the caller"
        self.filesystem_isolated = not filesystem
        self.root_plan: dict | None = self._config.get("root")  # what the workers see (sandbox_root.plan_root)
        self.visible_paths: tuple[str, ...] = tuple(self.root_plan["binds"]) if self.root_plan else ()
        self.cgroup_root = probe_pids_cgroup() if cgroup_root is None else cgroup_root
        self.memory_cgroup_root = probe_memory_cgroup() if memory_cgroup_root is None else memory_cgroup_root
        # All of a call's processes together, with the worker they were forked from and the working directory.
        self.call_memory_bytes = limits.memory_bytes + limits.workdir_bytes + limits.worker_memory_bytes
        namespaces = "net+pid+mount namespaces" if self.filesystem_isolated else "net+pid namespaces"
        parts = ([namespaces] if self.namespace_command else ["rlimits only (no network isolation on this platform)"])
        parts += ["pids cgroup"] if self.cgroup_root else []
        parts += [f"memory cgroup ({self.call_memory_bytes >> 20} MiB per call)" if self.memory_cgroup_root
                  else "memory bounded per process only (no memory cgroup)"]
        parts += ["private read-only root, tmpfs working directory" if self.filesystem_isolated
                  else f"file system NOT isolated ({filesystem})"]
        self.isolation = ", ".join(parts)
        self._serial = itertools.count()
        self._cgroup_prefix = f"aepo-sandbox-{os.getpid()}-{secrets.token_hex(4)}n"  # unique per sandbox, not per process
        self._idle: queue.Queue[Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._spawning = 0  # replacements being started: counted with the idle workers against pool_size
        self._background: list[threading.Thread] = []  # retirements and directory removals in flight
        for _ in range(pool_size):
            self._idle.put(self._spawn())

    def _isolate_filesystem(self, preload: tuple[str, ...]) -> str:
        """Probe a private root for the workers; '' when it works (the config then has it), else why not."""
        if not self.namespace_command:
            return "no namespaces on this platform"
        mount_point = make_mount_point()  # empty; each worker mounts its root on it, in its own namespace
        plan = plan_root(mount_point, preload)
        command = with_mount_namespace(self.namespace_command)
        reason, binds = probe_filesystem(command, plan, list(preload))
        if reason:
            os.rmdir(mount_point)
            return f"mount namespace unavailable: {reason}"
        self.namespace_command, self._root_mount_point = command, mount_point
        self._config["root"] = {**plan, "binds": binds}  # with the preload modules where the workers find them
        return ""

    # -- workers -----------------------------------------------------------
    def _spawn(self) -> Worker:
        name = f"{self._cgroup_prefix}{next(self._serial)}"
        pids = memory = ""
        if self.cgroup_root:
            pids = make_cgroup(os.path.join(self.cgroup_root, name), {"pids.max": str(self.limits.max_processes)})
        if self.memory_cgroup_root:
            memory = make_cgroup(os.path.join(self.memory_cgroup_root, name),
                                 memory_limit_files(self.memory_cgroup_root, self.call_memory_bytes))
        cgroups = tuple(path for path in (pids, memory) if path)
        return spawn_worker(self._config, self.namespace_command, cgroups, self.calls_per_worker, memory)

    def _take(self) -> Worker:
        """An idle worker that is still alive, else a new one: a worker that died while idle (killed, out of
        memory) once took the next call down with it as `killed`."""
        while True:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                return self._spawn()
            if worker.process.poll() is None:
                return worker
            self._in_background(self._retire, worker)  # disposed of, and replaced if the pool has room

    def _release(self, worker: Worker, healthy: bool) -> None:
        """Return a worker to the pool, or retire it (in the background) and start a replacement."""
        worker.calls_left -= 1
        with self._lock:
            keep = (healthy and worker.calls_left > 0 and not self._closed
                    and self._idle.qsize() + self._spawning < self.pool_size)
            if keep:
                self._idle.put(worker)
                return
        if not healthy:  # its call may still run (or be gone with it); a healthy one is idle: ended off the path
            kill_worker(worker, CALLER_GRACE_S)
        self._in_background(self._retire, worker)

    def _in_background(self, target: Callable[..., object], *args: object) -> None:
        """Run cleanup off the caller's path; `close` waits for it."""
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._background = [t for t in self._background if t.is_alive()] + [thread]
        thread.start()

    def _retire(self, worker: Worker) -> None:
        """Dispose of `worker`; start a replacement if the pool, counting replacements under way, has room."""
        dispose_worker(worker)
        with self._lock:  # decided and counted at once: retirements together cannot all see the same room
            if self._closed or self._idle.qsize() + self._spawning >= self.pool_size:
                return
            self._spawning += 1
        try:
            fresh = self._spawn()
        except OSError:
            fresh = None
        with self._lock:
            self._spawning -= 1
            if fresh is not None and not self._closed:
                self._idle.put(fresh)
                return
        if fresh is not None:
            dispose_worker(fresh)

    # -- calls -------------------------------------------------------------
    def run(self, code: str) -> SandboxResult:
        """Run `code` in a fresh child of a warm worker under the limits; never raises for what the code does."""
        start = time.monotonic()
        if self._closed:
            raise RuntimeError("PythonSandbox is closed")
        # With a private root the worker mounts a fresh tmpfs for the call; otherwise the call gets a temp dir here.
        workdir = None if self.filesystem_isolated else tempfile.mkdtemp(prefix="aepo-sandbox-", dir=self.workdir_root)
        for attempt in range(2):  # once more on a fresh worker if the first was gone before it read the call
            try:
                worker = self._take()
            except OSError as error:
                if workdir:
                    shutil.rmtree(workdir, ignore_errors=True)
                return self._result("failed", _Capture(0), _Capture(0), f"could not start a worker: {error}", None,
                                    start)
            outcome = self._execute(worker, code, workdir, start, retry_if_gone=attempt == 0)
            if outcome is not None:
                break
            self._release(worker, healthy=False)
        result, healthy = outcome
        self._release(worker, healthy)
        if workdir:
            self._in_background(shutil.rmtree, workdir, True)
        time.sleep(max(0.0, start + self.latency_seconds - time.monotonic()))
        return result

    def _execute(self, worker: Worker, code: str, workdir: str | None, start: float,
                 retry_if_gone: bool = False) -> tuple[SandboxResult, bool] | None:
        """Send the call, collect output until the status line (or EOF, or the deadline). None when the worker
        was gone before it read the call (nothing of it ran) and `retry_if_gone`."""
        limits = self.limits
        stdout, stderr = _Capture(limits.max_output_bytes), _Capture(limits.max_output_bytes)
        deadline = time.monotonic() + limits.wall_seconds
        kills_before = oom_kills(worker.memory_cgroup) if worker.memory_cgroup else 0
        try:
            send_call(worker, code, workdir)
        except OSError:
            if retry_if_gone:
                return None
            # the worker is gone; EOF below says so
        status_line, missing = self._collect(worker, stdout, stderr, deadline)
        if missing == "timeout":
            kill_worker(worker, CALLER_GRACE_S)
            return self._result("timeout", stdout, stderr, f"wall-clock limit of {limits.wall_seconds:g} s exceeded",
                                None, start), False
        if missing == "too long":
            kill_worker(worker, CALLER_GRACE_S)  # the rest of that line is still in the pipe: it cannot serve again
            _drain(worker.process.stdout.fileno(), stdout)
            _drain(worker.process.stderr.fileno(), stderr)
            cap = self._config["status_bytes"]
            return self._result("failed", stdout, stderr, f"the worker's status line was over {cap} bytes, more than "
                                "any real status: not read (something else wrote to its result pipe)", None, start), False
        # Everything the call wrote is in the pipes before its status line: take the rest.
        _drain(worker.process.stdout.fileno(), stdout)
        _drain(worker.process.stderr.fileno(), stderr)
        if status_line is None:
            returncode = worker.process.poll()
            trace = "\n".join(filter(None, [f"the sandbox worker died (exit status {returncode})",
                                             self._memory_note(worker, kills_before)]))
            return self._result("killed", stdout, stderr, trace, returncode, start), False
        status = _parse_status(status_line)
        trace = status.get("traceback", "") or ""
        if status["status"] != "ok":
            trace = "\n".join(filter(None, [trace, self._memory_note(worker, kills_before)]))
        return self._result(status["status"], stdout, stderr, trace, status.get("exit_code"), start), True

    def _collect(self, worker: Worker, stdout: _Capture, stderr: _Capture,
                 deadline: float) -> tuple[bytes | None, str]:
        """Read the worker's output until its status line: (the line, "") or (None, why not: "eof", "timeout",
        or "too long", a line over `status_bytes`, of which no more than that is read)."""
        cap = self._config["status_bytes"]
        selector = selectors.DefaultSelector()
        selector.register(worker.process.stdout, selectors.EVENT_READ, stdout)
        selector.register(worker.process.stderr, selectors.EVENT_READ, stderr)
        selector.register(worker.result_read, selectors.EVENT_READ, None)
        if not worker.ready:  # start-up gets its own allowance, then the call its whole wall clock
            deadline += WORKER_START_S
        try:
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None, "timeout"
                for key, _ in selector.select(timeout=remaining):
                    if key.data is not None:
                        if not _drain(key.fd, key.data):
                            selector.unregister(key.fileobj)
                        continue
                    data = os.read(worker.result_read, 65536)
                    if not data:
                        selector.unregister(key.fileobj)
                        continue
                    line = _take_line(worker.status_buffer, data)
                    while line == b"ready" and not worker.ready:
                        # The wall clock starts once the worker has started: a worker started for this call
                        # (numpy and sympy preloaded, a loaded machine) once used up a short limit first.
                        worker.ready, deadline = True, time.monotonic() + self.limits.wall_seconds
                        line = _take_line(worker.status_buffer, b"")
                    if line is not None:
                        return line, ""
                    if len(worker.status_buffer) > cap:
                        return None, "too long"
            return None, "eof"
        finally:
            selector.close()

    def _memory_note(self, worker: Worker, kills_before: int) -> str:
        """A last traceback line when the kernel killed some process of the call at the memory cgroup's limit."""
        if not worker.memory_cgroup or oom_kills(worker.memory_cgroup) <= kills_before:
            return ""
        return (f"memory limit exceeded: the call's processes together reached {self.call_memory_bytes >> 20} MiB"
                " and the kernel killed one")

    def _result(self, status: str, stdout: _Capture, stderr: _Capture, trace: str, exit_code: int | None,
                start: float) -> SandboxResult:
        lines = trace.rstrip("\n").splitlines()
        count = self.limits.traceback_lines
        if len(lines) > count:  # the first line stays: a traceback the worker cut starts with the exception's name
            lines = [lines[0], *lines[len(lines) - count + 1:]] if count > 1 else lines[-count:] if count else []
        return SandboxResult(
            status=status, stdout=stdout.text(), stderr=stderr.text(), traceback="\n".join(lines),
            exit_code=exit_code, seconds=time.monotonic() - start, stdout_truncated=stdout.truncated,
            stderr_truncated=stderr.truncated, network_isolated=self.network_isolated,
            filesystem_isolated=self.filesystem_isolated, isolation=self.isolation,
        )

    def close(self) -> None:
        """Kill the idle workers and wait for background cleanup; calls in flight finish on their own."""
        with self._lock:
            self._closed = True
        while True:
            try:
                dispose_worker(self._idle.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            pending = list(self._background)
        for thread in pending:
            thread.join(timeout=10)
        if self._root_mount_point:  # a mount point only inside the workers' namespaces; empty out here
            try:
                os.rmdir(self._root_mount_point)
            except OSError:
                pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def status_line_bytes(limits: SandboxLimits) -> int:
    """The most bytes a real status line can take, for the worker's and the parent's caps.

    Its traceback is `traceback_lines` lines of at most `max_output_bytes` characters and a "... [N more
    characters]" marker each; JSON escapes a character to at most 12 bytes (a surrogate pair, "\\ud83d\\ude00");
    the rest of the line is short."""
    return 12 * limits.traceback_lines * (limits.max_output_bytes + 64) + 4096


def _take_line(buffer: bytearray, data: bytes) -> bytes | None:
    """Append `data` to `buffer`; the first complete line, taken out of `buffer`, else None.

    A bytearray grows in place: `bytes += data` copied everything read so far at each read."""
    buffer += data
    end = buffer.find(b"\n")
    if end < 0:
        return None
    line = bytes(buffer[:end])
    del buffer[: end + 1]
    return line


def _parse_status(line: bytes) -> dict:
    """The worker's status line as a dict, or a 'failed' status saying it was unreadable."""
    try:
        status = json.loads(line)
        if isinstance(status, dict) and isinstance(status.get("status"), str):
            return status
    except ValueError:
        pass
    return {"status": "failed", "exit_code": None, "traceback": f"unreadable worker status: {line[:200]!r}"}

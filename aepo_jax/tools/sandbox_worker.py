"""The sandbox worker process (started by `sandbox_process.spawn_worker`; never imported by the trainer).

Run as `python -s -P sandbox_worker.py CONFIG_JSON` (`sandbox_process.PYTHON_FLAGS`), normally as the init process
of fresh net+pid(+mount) namespaces. With a `root` plan in the config it
first adds its preload modules' locations to the plan
(`sandbox_root.extend_plan`) and moves into its private root file system
(`sandbox_mounts.enter_root`; with `probe` it then reports the binds on
stdout and exits). It imports the
preload modules once (that makes it "warm"), then serves calls read from
stdin as frames (4-byte big-endian length + JSON `{"code", "workdir"}`), one
at a time, until EOF (the parent closed it, or died):

1. with a root: mount a fresh size-limited tmpfs as the call's working
   directory (the call's `workdir` is then ignored);
2. fork a child; the child moves to its own process group, enters the
   working directory, applies the resource limits, drops its capabilities
   (with a root), runs the code with the worker's stdout/stderr (stdout made
   line-buffered, so what it printed before a kill is in the pipe), and
   writes its status to a private pipe, which the worker reads while it waits
   (a status bigger than the pipe's buffer must not block the child); the
   status is the pipe's last line, so bytes the code wrote to the pipe
   before it do not change it;
   while it waits, the worker also watches its stdin: when the parent dies
   (its end of stdin closes, even by SIGKILL) it kills the child and exits
   at once, and with it everything in the namespace, so no call outlives
   the trainer that made it (the wall-clock limit is the parent's);
3. after the child exits (before it is reaped, so its process-group id
   cannot be reused), kill its process group, then every other process left:
   as the namespace init, `kill(-1)` reaches exactly those; without a pid
   namespace, the worker is a child subreaper (`PR_SET_CHILD_SUBREAPER`), so
   every orphan of the call, even one that left the group with `setsid`, is
   reparented to it, and it kills its children until none is left;
4. write one status line (JSON) to the result fd named in the config, then
   (with a root) detach the working directory's tmpfs.

The worker keeps only the last `status_bytes` (from the config) of what the
child writes to its status pipe and re-bounds the parsed traceback: code that
floods that pipe, or forges a huge status, costs the worker no more memory and
the parent no more bytes than a real status. The parent ends a timed-out call
by closing the worker's stdin: the worker then kills the call as in step 3
and exits (`sandbox_process.kill_worker`).

The worker itself never runs model code, so every call starts from the same
pristine state, and nothing a call started outlives it.
"""

import errno
import importlib
import importlib.util
import json
import os
import resource
import select
import signal
import struct
import sys
import traceback

_STATUSES = ("ok", "error", "timeout", "killed", "failed")
_MARKER_ROOM = 48  # the most characters "... [N more characters]" adds to a cut line
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_KILL_ROUNDS = 1000  # each round kills the worker's children; their orphans are the next round's children
_READ_AFTER_EXIT = 16 << 20  # the most bytes read from the status pipe after the call's processes are killed


def _apply_limits(config: dict, status_fd: int) -> None:
    """RLIMIT_CPU (SIGXCPU first, reported as a timeout), RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, no core files."""
    cpu = int(config["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (config["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (config["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (config["max_processes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:  # at a memory cgroup's limit, the kernel kills the call's processes before the worker
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    # Writing past RLIMIT_FSIZE raises OSError(EFBIG) instead of killing silently.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGXCPU, lambda *_: _finish(status_fd, {
        "status": "timeout", "exit_code": None, "traceback": f"CPU-time limit of {cpu} s exceeded"}))


def _finish(status_fd: int, status: dict) -> None:
    """Flush output, write the status as the pipe's last line, exit without running the code's cleanup
    handlers; the exit code (0 only for "ok") tells the worker what happened if the code closed the pipe."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001, S110 - a broken stream must not hide the status
            pass
    try:  # the leading newline ends whatever the code itself wrote to this fd
        os.write(status_fd, b"\n" + json.dumps(status, default=str).encode())
    except OSError:
        pass
    os._exit(0 if status["status"] == "ok" else 1)


def _bounded(text: str, config: dict, room: int = 0, keep_line: int | None = None) -> str:
    """The last `traceback_lines` lines of `text`, each over `traceback_line_chars + room` characters cut to
    `traceback_line_chars`; line `keep_line` (the exception's type and its message's first line) stays as
    the first of them when it would be cut: a message of many lines once left no `ValueError` in sight.

    A line's beginning is kept (`ValueError: xxx...`: the exception's name), so a
    100 kB message stays readable and the status stays small. `room` lets a line the child already cut
    (its marker included) through unchanged when the worker bounds the status again.
    """
    width, count = config["traceback_line_chars"], config["traceback_lines"]
    lines = text.rstrip("\n").splitlines()
    if keep_line is not None and count > 0 and keep_line < len(lines) - count:
        lines = [lines[keep_line], *lines[len(lines) - count + 1:]]
    else:
        lines = lines[-count:] if count > 0 else []
    return "\n".join(line if len(line) <= width + room
                     else f"{line[:width]}... [{len(line) - width} more characters]" for line in lines)


def _user_traceback(error: BaseException) -> tuple[str, int]:
    """Traceback without this worker's own frame, and the index of its line that names the exception (the
    first of `format_exception_only` that is not a SyntaxError's indented source line)."""
    tb = error.__traceback__
    if tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(error), error, tb))
    only = "".join(traceback.format_exception_only(type(error), error)).rstrip("\n").splitlines()
    named = next((i for i, line in enumerate(only) if not line.startswith(" ")), 0)
    return text, len(text.rstrip("\n").splitlines()) - len(only) + named


def _load_sibling(name: str) -> object:
    """Module `name` from beside this file (`-P` does not put this directory on sys.path)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_child(call: dict, config: dict, status_fd: int, mounts: object) -> None:
    """In the forked child: isolate, limit, run the code, report. Never returns."""
    os.setpgid(0, 0)
    os.close(config["result_fd"])  # the code cannot forge the worker's status line
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # stdin was the control pipe
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - lives as long as the process
    try:
        workdir = config["root"]["workdir"] if mounts else call["workdir"]
        os.chdir(workdir)
        os.environ["HOME"] = os.environ["TMPDIR"] = workdir
        _apply_limits(config, status_fd)
        if mounts:
            mounts.drop_privileges()
    except BaseException as error:  # noqa: BLE001 - never run code half-isolated, never return into the worker
        _finish(status_fd, {"status": "failed", "exit_code": None, "traceback": f"sandbox setup failed: {error!r}"})
    # Block-buffered stdout (a pipe) would lose what was printed before a wall-clock kill or a crash.
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except (AttributeError, ValueError, OSError):
        pass
    status = {"status": "ok", "exit_code": 0, "traceback": ""}
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        # "<code>", not "<python>": an agent tag in a traceback would come back as "&lt;python>".
        exec(compile(call["code"], "<code>", "exec"), namespace)  # noqa: S102 - running it is the point
    except SystemExit as error:
        if error.code not in (None, 0):
            exit_code = error.code if isinstance(error.code, int) else 1
            status = {"status": "error", "exit_code": exit_code,
                      "traceback": _bounded(f"SystemExit: {error.code}", config)}
    except BaseException as error:  # noqa: BLE001 - any failure of the code is reported, not raised
        trace, named = _user_traceback(error)
        status = {"status": "error", "exit_code": 1, "traceback": _bounded(trace, config, keep_line=named)}
    _finish(status_fd, status)


def _read_exact(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def _become_subreaper() -> None:
    """Have the orphans of every call reparented to this worker instead of to init (Linux; best effort).

    Without a pid namespace nothing else finds a process the call started once its parent has died, e.g.
    one detached with `setsid`: as a child subreaper the worker gets it as a child, and kills it."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes  # here, not at the top: a worker in a pid namespace needs no ctypes (~2 ms a start)

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # then only the call's process group is killed (its orphans go to init)


def _sigkill(pid: int, group: bool = False) -> None:
    """SIGKILL process `pid` (or process group `pid`); one already gone is fine."""
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _children() -> list[int]:
    """This worker's child processes, zombies included."""
    pid = os.getpid()
    try:  # one small read, where the kernel has CONFIG_PROC_CHILDREN (the worker has a single thread)
        with open(f"/proc/self/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except OSError:
        pass
    children = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                parent = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            children.append(int(name))
    return children


def _reap(pid: int) -> None:
    """Wait for child `pid` (already SIGKILLed) to die; one reaped already is fine."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _live_children_left() -> bool:
    """Reap the children that have exited; whether any child is left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _kill_descendants() -> None:
    """Kill and reap every process under this worker (not a namespace init: `kill(-1)` would reach the host).

    A process killed here leaves its own children to the worker (a subreaper), so the next round kills
    those; a round after which no child is left ends it. The rounds are bounded should a fork bomb keep
    pace (with no pids cgroup, as root, where RLIMIT_NPROC does not apply)."""
    for _ in range(_KILL_ROUNDS):
        if not _live_children_left():  # the usual case, without reading /proc
            return
        children = _children()
        if not children:
            return
        for pid in children:
            _sigkill(pid)
        for pid in children:
            _reap(pid)


def _kill_the_rest() -> None:
    """Kill and reap every process the call left: all but us in the namespace when we are its init."""
    if os.getpid() != 1:
        _kill_descendants()
        return
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except OSError as error:
            if error.errno != errno.EINTR:
                return


def _end_call(child: int) -> tuple[int, float]:
    """Kill the call's process group and every process it left, reap them; the child's wait status and the
    CPU seconds it used (its threads included).

    The group is killed before the child is reaped: while the child is a zombie its pid, and so the group's
    id, cannot be taken by another process."""
    _sigkill(child, group=True)
    _sigkill(child)  # should it have no group of its own yet
    _, wait_status, usage = os.wait4(child, 0)
    _kill_the_rest()
    return wait_status, usage.ru_utime + usage.ru_stime


def _keep_tail(tail: bytearray, chunk: bytes, limit: int) -> None:
    """Append `chunk` to `tail`, keeping its last `limit` bytes: the status is the last line, and what
    came before it (the code may flood the pipe) must not grow the worker."""
    tail += chunk
    if len(tail) > limit:
        del tail[: len(tail) - limit]


def _has_exited(child: int) -> bool:
    """Whether `child` has exited, leaving it unreaped (its group is killed first, `_end_call`)."""
    return os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _wait_for_child(child: int, status_read: int, limit: int) -> bytearray:
    """The last `limit` bytes the child wrote to its status pipe, once `child` has exited (not reaped).

    One thread, one poll: the status pipe is read as it fills (a status over the pipe's buffer must not
    block the child), and stdin is watched: when it closes (the parent ended the call at its wall-clock
    limit, or died, even SIGKILLed: its end closes by itself) the call is killed and the worker exits.
    No helper threads: each one left the worker, and so every later call's child, a 64 MiB malloc arena of
    address space, counted against RLIMIT_AS.
    """
    poller = select.poll()
    poller.register(status_read, select.POLLIN)
    poller.register(0, 0)  # no events asked: POLLHUP (every writer gone) is reported regardless
    try:
        exited = os.pidfd_open(child)  # readable when the child exits
        poller.register(exited, select.POLLIN)
        timeout_ms = None
    except (AttributeError, OSError):  # kernels before 5.3: look every 10 ms
        exited, timeout_ms = -1, 10
    tail = bytearray()
    try:
        while True:
            for fd, _ in poller.poll(timeout_ms):
                if fd == 0:
                    _end_call(child)
                    os._exit(1)
                if fd == status_read:
                    chunk = os.read(status_read, 65536)
                    if chunk:
                        _keep_tail(tail, chunk, limit)
                    else:
                        poller.unregister(status_read)
            if _has_exited(child):
                return tail
    finally:
        if exited >= 0:
            os.close(exited)


def _read_available(fd: int, tail: bytearray, limit: int) -> None:
    """Add what is in pipe `fd` now to `tail`, without waiting for an EOF that a process left behind could
    hold off, and reading no more than `_READ_AFTER_EXIT` bytes should one keep writing."""
    os.set_blocking(fd, False)
    for _ in range(_READ_AFTER_EXIT // 65536):
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            return
        _keep_tail(tail, chunk, limit)


def _checked_status(status: object, config: dict) -> dict | None:
    """The child's parsed status with its fields checked and its traceback bounded again, else None.

    The code can write its own "status" (it holds the pipe): it may claim any outcome, but not grow
    the worker's status line past a real one's size."""
    if not isinstance(status, dict) or status.get("status") not in _STATUSES:
        return None
    exit_code = status.get("exit_code")
    trace = status.get("traceback") or ""
    return {"status": status["status"], "exit_code": exit_code if isinstance(exit_code, int) else None,
            "traceback": _bounded(trace if isinstance(trace, str) else repr(trace), config, _MARKER_ROOM)}


def _status_of(raw: bytes | bytearray, wait_status: int, config: dict, cpu_used: float = 0.0) -> dict:
    """The child's status from its pipe (the last line), else from how it ended.

    SIGXCPU's handler is Python code and cannot run inside a long C call (`sum(range(10**11))`) or while
    other threads burn the CPU, so the hard limit's SIGKILL ends the call: with `cpu_used` at the limit that is
    the CPU-time limit (a timeout), not a kill."""
    if raw.strip():
        try:
            status = _checked_status(json.loads(raw.rsplit(b"\n", 1)[-1]), config)
            if status is not None:
                return status
        except ValueError:
            pass
        # Not the exit code's guess (0 for an exception whose status the code overwrote): say what happened.
        return {"status": "failed", "exit_code": None,
                "traceback": f"the call's status was unreadable (the code wrote to the sandbox's status pipe): "
                             f"{bytes(raw[-200:])!r}"}
    if os.WIFSIGNALED(wait_status):
        signum = os.WTERMSIG(wait_status)
        if signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu_used >= config["cpu_seconds"]):
            return {"status": "timeout", "exit_code": None,
                    "traceback": f"CPU-time limit of {config['cpu_seconds']} s exceeded"}
        return {"status": "killed", "exit_code": -signum,
                "traceback": f"process killed by signal {signal.Signals(signum).name}"}
    code = os.WEXITSTATUS(wait_status)
    return {"status": "error" if code else "ok", "exit_code": code,
            "traceback": f"the code exited with code {code} without a status (os._exit, or it closed the "
                         "sandbox's status pipe)" if code else ""}


def _serve_one(call: dict, config: dict, mounts: object) -> dict:
    if mounts:
        mounts.mount_workdir(config["root"]["workdir"], config["workdir_bytes"], config["workdir_files"])
    status_read, status_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(status_read)
        _run_child(call, config, status_write, mounts)
    try:
        os.setpgid(pid, pid)  # as the child does first: a kill of its group cannot miss it
    except OSError:
        pass
    os.close(status_write)
    limit = config["status_bytes"]
    tail = _wait_for_child(pid, status_read, limit)
    wait_status, cpu_used = _end_call(pid)
    _read_available(status_read, tail, limit)  # the child's writes are all in the pipe once it has exited
    os.close(status_read)
    return _status_of(tail, wait_status, config, cpu_used)


def main() -> None:
    config = json.loads(sys.argv[1])
    mounts = None
    if config.get("root"):
        mounts = _load_sibling("sandbox_mounts")
        # The preload modules where this interpreter finds them (its sys.path may differ from the parent's).
        config["root"] = _load_sibling("sandbox_root").extend_plan(config["root"], config.get("preload", []))
        notes = mounts.enter_root(config["root"])
        if config.get("probe"):
            print(json.dumps({"root": True, "binds": config["root"]["binds"], "notes": notes}), flush=True)
            return
    if os.getpid() != 1:  # no pid namespace (as its init, the worker already inherits every orphan in it)
        _become_subreaper()
    for module in config.get("preload", []):
        importlib.import_module(module)
    os.write(config["result_fd"], b"ready\n")  # the parent starts a call's wall clock from here
    while True:
        header = _read_exact(0, 4)
        if not header:  # at once, without the interpreter's shutdown: the parent may be waiting (`kill_worker`)
            os._exit(0)
        call = json.loads(_read_exact(0, struct.unpack(">I", header)[0]))
        status = _serve_one(call, config, mounts)
        os.write(config["result_fd"], json.dumps(status, default=str).encode() + b"\n")
        if mounts:  # after the status: the caller need not wait for the detach (it can take ms)
            mounts.umount(config["root"]["workdir"])


if __name__ == "__main__":
    main()

"""The sandbox worker process (started by `sandbox_process.spawn_worker`; never imported by the trainer).

Run as `python -I sandbox_worker.py CONFIG_JSON`, normally as the init process
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
3. after the child exits, kill every other process left in the namespace
   (`kill(-1)` from the namespace init reaches exactly those) and reap them;
4. write one status line (JSON) to the result fd named in the config, then
   (with a root) detach the working directory's tmpfs.

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


def _bounded(text: str, config: dict) -> str:
    """The last `traceback_lines` lines of `text`, each cut to `traceback_line_chars` characters.

    A line's beginning is kept (`ValueError: xxx...`: the exception's name), so a
    100 kB message stays readable and the status stays small.
    """
    width = config["traceback_line_chars"]
    lines = text.rstrip("\n").splitlines()[-config["traceback_lines"] :]
    return "\n".join(line if len(line) <= width else f"{line[:width]}... [{len(line) - width} more characters]"
                     for line in lines)


def _user_traceback(error: BaseException) -> str:
    """Traceback without this worker's own frame."""
    tb = error.__traceback__
    if tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def _load_sibling(name: str) -> object:
    """Module `name` from beside this file (`python -I` does not put this directory on sys.path)."""
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
        status = {"status": "error", "exit_code": 1, "traceback": _bounded(_user_traceback(error), config)}
    _finish(status_fd, status)


def _read_exact(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def _kill_the_rest() -> None:
    """Kill and reap every process left in the namespace (all but us, when we are its init)."""
    if os.getpid() == 1:
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


def _kill_call_and_exit(child: int) -> None:
    """The parent is gone: kill the call and exit (as the namespace's init, that kills everything it started)."""
    for kill in (os.killpg, os.kill):  # its process group, and itself should it not have one yet
        try:
            kill(child, signal.SIGKILL)
        except OSError:
            pass
    os._exit(1)


def _wait_for_child(child: int, status_read: int) -> tuple[int, list[bytes]]:
    """(wait status, what it has written to its status pipe so far) once `child` has exited.

    One thread, one poll: the status pipe is read as it fills (a status over the pipe's buffer must not
    block the child), and stdin is watched: when its writer, the parent, is gone (even SIGKILLed: its end
    closes by itself) the call is killed and the worker exits. No helper threads: each one left the worker,
    and so every later call's child, a 64 MiB malloc arena of address space, counted against RLIMIT_AS.
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
    chunks: list[bytes] = []
    try:
        while True:
            for fd, _ in poller.poll(timeout_ms):
                if fd == 0:
                    _kill_call_and_exit(child)
                if fd == status_read:
                    chunk = os.read(status_read, 65536)
                    if chunk:
                        chunks.append(chunk)
                    else:
                        poller.unregister(status_read)
            done, wait_status = os.waitpid(child, os.WNOHANG)
            if done:
                break
    finally:
        if exited >= 0:
            os.close(exited)
    return wait_status, chunks


def _read_available(fd: int) -> list[bytes]:
    """What is in pipe `fd` now, without waiting for an EOF that a process left behind (no pid namespace)
    could hold off."""
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return chunks
        if not chunk:
            return chunks
        chunks.append(chunk)


def _status_of(raw: bytes, wait_status: int, config: dict) -> dict:
    """The child's status from its pipe (the last line), else from how it ended."""
    if raw.strip():
        try:
            status = json.loads(raw.rsplit(b"\n", 1)[-1])
            if isinstance(status, dict) and isinstance(status.get("status"), str):
                return status
        except ValueError:
            pass
        # Not the exit code's guess (0 for an exception whose status the code overwrote): say what happened.
        return {"status": "failed", "exit_code": None,
                "traceback": f"the call's status was unreadable (the code wrote to the sandbox's status pipe): "
                             f"{raw[-200:]!r}"}
    if os.WIFSIGNALED(wait_status):
        signum = os.WTERMSIG(wait_status)
        if signum == signal.SIGXCPU:
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
    wait_status, chunks = _wait_for_child(pid, status_read)
    _kill_the_rest()
    chunks += _read_available(status_read)  # the child's writes are all in the pipe once it has exited
    os.close(status_read)
    return _status_of(b"".join(chunks), wait_status, config)


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
    for module in config.get("preload", []):
        importlib.import_module(module)
    while True:
        header = _read_exact(0, 4)
        if not header:
            return
        call = json.loads(_read_exact(0, struct.unpack(">I", header)[0]))
        status = _serve_one(call, config, mounts)
        os.write(config["result_fd"], json.dumps(status, default=str).encode() + b"\n")
        if mounts:  # after the status: the caller need not wait for the detach (it can take ms)
            mounts.umount(config["root"]["workdir"])


if __name__ == "__main__":
    main()

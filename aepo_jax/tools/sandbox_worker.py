"""The sandbox worker process (started by `sandbox_process.spawn_worker`; never imported by the trainer).

Run as `python -I sandbox_worker.py CONFIG_JSON`, normally as the init process
of fresh net+pid(+mount) namespaces. With a `root` plan in the config it
first adds its preload modules' locations to the plan
(`sandbox_root.extend_plan`) and moves into its private root file system
(`sandbox_mounts.enter_root`; with `probe` it then reports the binds on
stdout and exits). It imports the
preload modules once (that makes it "warm"), then serves calls read from
stdin as frames (4-byte big-endian length + JSON `{"code", "workdir"}`), one
at a time, until EOF:

1. with a root: mount a fresh size-limited tmpfs as the call's working
   directory (the call's `workdir` is then ignored);
2. fork a child; the child moves to its own process group, enters the
   working directory, applies the resource limits, drops its capabilities
   (with a root), runs the code with the worker's stdout/stderr (stdout made
   line-buffered, so what it printed before a kill is in the pipe), and
   writes its status to a private pipe, which the worker reads while it waits
   (a status bigger than the pipe's buffer must not block the child);
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
import signal
import struct
import sys
import threading
import traceback


def _apply_limits(config: dict, status_fd: int) -> None:
    """RLIMIT_CPU (SIGXCPU first, reported as a timeout), RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, no core files."""
    cpu = int(config["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (config["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (config["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (config["max_processes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Writing past RLIMIT_FSIZE raises OSError(EFBIG) instead of killing silently.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGXCPU, lambda *_: _finish(status_fd, {
        "status": "timeout", "exit_code": None, "traceback": f"CPU-time limit of {cpu} s exceeded"}))


def _finish(status_fd: int, status: dict) -> None:
    """Flush output, write the status, exit without running the code's cleanup handlers."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001, S110 - a broken stream must not hide the status
            pass
    try:
        os.write(status_fd, json.dumps(status, default=str).encode())
    except OSError:
        pass
    os._exit(0)


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
        exec(compile(call["code"], "<python>", "exec"), namespace)  # noqa: S102 - running it is the point
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


def _serve_one(call: dict, config: dict, mounts: object) -> dict:
    if mounts:
        mounts.mount_workdir(config["root"]["workdir"], config["workdir_bytes"], config["workdir_files"])
    status_read, status_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(status_read)
        _run_child(call, config, status_write, mounts)
    os.close(status_write)
    # Read the status while the child runs: a write bigger than the pipe's buffer blocks until read.
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(status_read, 65536), b"")))
    reader.start()
    _, wait_status = os.waitpid(pid, 0)
    _kill_the_rest()  # and every other holder of the pipe's write end: the reader sees EOF
    reader.join()
    raw = b"".join(chunks)
    os.close(status_read)
    try:
        return json.loads(raw)
    except ValueError:
        pass
    if os.WIFSIGNALED(wait_status):
        signum = os.WTERMSIG(wait_status)
        if signum == signal.SIGXCPU:
            return {"status": "timeout", "exit_code": None,
                    "traceback": f"CPU-time limit of {config['cpu_seconds']} s exceeded"}
        return {"status": "killed", "exit_code": -signum,
                "traceback": f"process killed by signal {signal.Signals(signum).name}"}
    code = os.WEXITSTATUS(wait_status)
    return {"status": "killed" if code else "ok", "exit_code": code,
            "traceback": f"process exited with code {code} without reporting" if code else ""}


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

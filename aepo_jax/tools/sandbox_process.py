"""Starting, feeding and killing sandbox worker processes (the parent side of `sandbox_worker.py`).

Isolation is probed here: which `unshare` namespace command works on this
machine, whether a worker can build its private root file system in a mount
namespace, and whether per-worker pids and memory cgroups can be made. See
`python_exec.PythonSandbox` for what the pieces add up to.

A worker's life is tied to the parent's: it watches its stdin (the parent's
pipe) while a call runs and exits when the parent is gone (`sandbox_worker`).
The parent ends a worker the same way, by closing that pipe (`kill_worker`):
the worker kills its call's processes first, which without a pid namespace
nothing else can find.
Not `PR_SET_PDEATHSIG`: it fires when the *thread* that started the process
exits, and replacements are started from short-lived background threads. A
process the parent forks without exec (fork-based `multiprocessing`) would
inherit the pipes' write ends and keep the workers waiting after the parent
died; in such a child they are pointed at /dev/null at once
(`os.register_at_fork`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time

_WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_worker.py")

NAMESPACE_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("unshare", "--net", "--pid", "--fork", "--kill-child"),
    ("unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"),
)

# Nothing of the parent's environment is passed on: no inherited secrets. PYTHONHASHSEED fixes str hashing,
# so a set's order printed by the code is the same in every worker (and run).
WORKER_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
}
# `python -I` less its `-E`: no user site directory (-s), no script directory on sys.path (-P). `-E` would
# ignore PYTHONHASHSEED, and it guards nothing here: WORKER_ENV is the worker's whole environment.
PYTHON_FLAGS = ("-s", "-P")


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


def with_mount_namespace(command: tuple[str, ...]) -> tuple[str, ...]:
    """The namespace command with a mount namespace added (`unshare` makes its propagation private)."""
    return (command[0], "--mount", *command[1:])


def probe_filesystem(command: tuple[str, ...], root_plan: dict, preload: list[str]) -> tuple[str, list[str]]:
    """('', the binds a worker made) if it can build `root_plan` under `command` (a probe worker really does),
    else (why not, [])."""
    config = json.dumps({"root": root_plan, "probe": True, "preload": preload})
    try:
        done = subprocess.run([*command, sys.executable, *PYTHON_FLAGS, _WORKER_SCRIPT, config], check=False,
                              capture_output=True, timeout=30, cwd="/", env=dict(WORKER_ENV))
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"probe worker did not run: {error}", []
    try:
        report = json.loads(done.stdout)
        if done.returncode == 0 and report.get("root") is True:
            return "", list(report["binds"])
    except (ValueError, AttributeError, KeyError):
        pass
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return (lines[-1] if lines else f"probe worker exited with status {done.returncode}"), []


def probe_pids_cgroup(root: str = "/sys/fs/cgroup/pids") -> str:
    """`root` if per-worker pids cgroups can be made under it, else ''."""
    return _probe_cgroup_root(root, "pids.max")


def own_memory_cgroup(proc_cgroup: str = "/proc/self/cgroup", mount: str = "/sys/fs/cgroup") -> str:
    """This process's memory cgroup directory (cgroup v1's memory hierarchy, or v2 alone), or ''.

    Worker cgroups are made inside it, not at the hierarchy's root: the workers stay within the limit
    and the accounting of the job that runs the trainer."""
    try:
        with open(proc_cgroup) as f:
            lines = [line.split(":", 2) for line in f.read().splitlines() if line.count(":") >= 2]
    except OSError:
        return ""
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            return os.path.normpath(os.path.join(mount, "memory", path.lstrip("/")))
    if os.path.exists(os.path.join(mount, "cgroup.controllers")):  # the v2 hierarchy mounted alone
        for number, controllers, path in lines:
            if number == "0" and not controllers:
                return os.path.normpath(os.path.join(mount, path.lstrip("/")))
    return ""


def probe_memory_cgroup(root: str | None = None) -> str:
    """A directory (`root`, default this process's memory cgroup) under which per-worker memory cgroups
    with a limit can be made, else '' (no memory controller here, or not writable, or not delegated)."""
    root = own_memory_cgroup() if root is None else root
    if not root:
        return ""
    return _probe_cgroup_root(root, "memory.max") or _probe_cgroup_root(root, "memory.limit_in_bytes")


def memory_limit_files(root: str, limit_bytes: int) -> dict[str, str]:
    """The files that set the limit of a memory cgroup made under `root` to `limit_bytes`, swap included
    (v1: every memory cgroup has `memory.limit_in_bytes`; v2: the limit is `memory.max`, swap apart)."""
    if os.path.exists(os.path.join(root, "memory.limit_in_bytes")):
        return {"memory.limit_in_bytes": str(limit_bytes), "memory.memsw.limit_in_bytes": str(limit_bytes)}
    return {"memory.max": str(limit_bytes), "memory.swap.max": "0"}


def oom_kills(cgroup: str) -> int:
    """Processes the kernel killed for reaching the memory cgroup's limit so far (0 when it cannot tell)."""
    for name in ("memory.events", "memory.oom_control"):  # v2, v1
        try:
            with open(os.path.join(cgroup, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return 0


def _probe_cgroup_root(root: str, limit_file: str) -> str:
    """`root` if a cgroup with `limit_file` can be made under it (stale worker cgroups there removed), else ''."""
    probe = os.path.join(root, f"aepo-sandbox-probe-{os.getpid()}")
    try:
        os.makedirs(probe, exist_ok=True)
        ok = os.path.exists(os.path.join(probe, limit_file))
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


def remove_cgroup(path: str) -> None:
    """Kill what is left in a worker's cgroup and remove it (retrying while the kernel reaps)."""
    for _ in range(100):
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


# The write ends of the workers' stdin pipes this process holds (what a worker watches for its parent): fd ->
# (device, inode) of its pipe, so that an fd number closed and reused for something else is left alone.
_WORKER_STDIN_FDS: dict[int, tuple[int, int]] = {}


def _pipe_identity(fd: int) -> tuple[int, int] | None:
    try:
        stat = os.fstat(fd)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _release_worker_pipes_in_child() -> None:
    """In a child forked without exec: its copies of the workers' stdin write ends become /dev/null (the
    file objects stay valid, and no fd number is freed for reuse), so only the parent holds the pipes."""
    held = dict(_WORKER_STDIN_FDS)
    _WORKER_STDIN_FDS.clear()
    if not held:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd, identity in held.items():
            if _pipe_identity(fd) != identity:  # closed, or its number reused by another file
                continue
            try:
                os.dup2(devnull, fd)
            except OSError:
                pass
    finally:
        os.close(devnull)


os.register_at_fork(after_in_child=_release_worker_pipes_in_child)


@dataclasses.dataclass
class Worker:
    """A started worker: its process (stdin = call frames), the status pipe, its cgroups, calls left."""

    process: subprocess.Popen
    result_read: int
    cgroups: tuple[str, ...]
    calls_left: int
    memory_cgroup: str = ""  # one of `cgroups`, where its out-of-memory kills are counted
    status_buffer: bytearray = dataclasses.field(default_factory=bytearray)  # the status line read so far
    ready: bool = False  # its "ready" line (written once it has started and preloaded) has been read


def make_cgroup(path: str, limits: dict[str, str]) -> str:
    """Make cgroup `path` with `limits` (file -> value; the first one required, the others where the kernel
    has them); `path` when made, else '' (nothing left behind)."""
    try:
        os.makedirs(path, exist_ok=True)
        for number, (name, value) in enumerate(limits.items()):
            target = os.path.join(path, name)
            if number == 0 or os.path.exists(target):
                with open(target, "w") as f:
                    f.write(value)
        return path
    except OSError:
        remove_cgroup(path)
        return ""


def spawn_worker(config: dict, namespace_command: tuple[str, ...], cgroups: tuple[str, ...], calls: int,
                 memory_cgroup: str = "") -> Worker:
    """Start `sandbox_worker.py` in its own session (and namespaces, and the made `cgroups`, when given)."""
    result_read, result_write = os.pipe()
    config = {**config, "result_fd": result_write}
    command = [*namespace_command, sys.executable, *PYTHON_FLAGS, _WORKER_SCRIPT, json.dumps(config)]
    if cgroups:
        # The shell joins the cgroups, then execs, so every descendant is inside them.
        joins = " && ".join(f"echo $$ > {shlex.quote(os.path.join(path, 'cgroup.procs'))}" for path in cgroups)
        command = ["/bin/sh", "-c", f'{joins} && exec "$@"', "sandbox-worker", *command]
    try:
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/",
            env=dict(WORKER_ENV), start_new_session=True, pass_fds=(result_write,),
        )
    except BaseException:
        os.close(result_read)
        for path in cgroups:
            remove_cgroup(path)
        raise
    finally:
        os.close(result_write)
    for stream in (process.stdout, process.stderr):
        os.set_blocking(stream.fileno(), False)
    _WORKER_STDIN_FDS[process.stdin.fileno()] = _pipe_identity(process.stdin.fileno())
    return Worker(process=process, result_read=result_read, cgroups=cgroups, calls_left=calls,
                  memory_cgroup=memory_cgroup)


def send_call(worker: Worker, code: str, workdir: str | None) -> None:
    """Hand one call to the worker (`workdir` None: the worker mounts its own). Raises OSError if it is gone."""
    frame = json.dumps({"code": code, "workdir": workdir}).encode()
    worker.process.stdin.write(struct.pack(">I", len(frame)) + frame)
    worker.process.stdin.flush()


def kill_worker(worker: Worker, grace_seconds: float = 2.0) -> None:
    """End the worker and its call: close its stdin, give it `grace_seconds` to exit, SIGKILL its session.

    The worker's session holds the worker, not its call: the call's child has a process group of its own,
    and what it starts may leave that too (`setsid`). Only the worker can find them all without a pid
    namespace (its call's group, and the orphans it inherits as a child subreaper), so it is asked first:
    on EOF it kills them and exits, as it does when the parent dies. The SIGKILL is for a worker that does
    not (stopped, or hung); with a pid namespace it also ends everything in it, as the namespace's init dies,
    but without one the call's processes then live on (code that can signal its worker can stop it).
    """
    _close_stdin(worker)
    try:
        worker.process.wait(timeout=grace_seconds)
        return  # reaped: its pid may be anyone's now, and its session held nothing else
    except subprocess.TimeoutExpired:
        pass
    try:  # not reaped, so the pid is still its own
        os.killpg(worker.process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _close_stdin(worker: Worker) -> None:
    """Close the worker's stdin (the worker sees EOF), once; its fd is no longer one the at-fork hook guards."""
    stdin = worker.process.stdin
    if stdin is None or stdin.closed:
        return
    _WORKER_STDIN_FDS.pop(stdin.fileno(), None)
    try:
        stdin.close()
    except OSError:  # a frame left unflushed to a worker that is gone
        pass


def dispose_worker(worker: Worker) -> None:
    """Kill, reap, close pipes and remove the cgroup."""
    kill_worker(worker)
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
    for path in worker.cgroups:
        remove_cgroup(path)

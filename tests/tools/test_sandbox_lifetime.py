"""How long sandbox processes live: not past the trainer that started them, and the idle pool stays at its size."""

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from aepo_jax.tools import PythonSandbox, SandboxLimits, python_exec

TRAINER = r"""
import sys, threading, time
from aepo_jax.tools import PythonSandbox, SandboxLimits
box = PythonSandbox(SandboxLimits(wall_seconds=600, cpu_seconds=600), pool_size=1)
threading.Thread(target=box.run, args=("import time\ntime.sleep(600)",), daemon=True).start()
print("started", flush=True)
time.sleep(600)
"""


FORKING_TRAINER = r"""
import os, sys, threading, time
from aepo_jax.tools import PythonSandbox, SandboxLimits
box = PythonSandbox(SandboxLimits(wall_seconds=600, cpu_seconds=600), pool_size=1)
threading.Thread(target=box.run, args=("import time\ntime.sleep(600)",), daemon=True).start()
time.sleep(0.5)
if os.fork() == 0:  # a data-loader-like child, forked without exec, that outlives its parent
    os.setsid()
    time.sleep(600)
    os._exit(0)
print("started", flush=True)
time.sleep(600)
"""


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every live process (zombies are dead: left out)."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            table[int(name)] = (int(fields[1]), fields[19])
    return table


def _descendants(root: int) -> dict[int, str]:
    """pid -> start time of every live descendant of `root`."""
    table = _processes()
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, started) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = started
                frontier.append(pid)
    return found


def _alive(processes: dict[int, str]) -> dict[int, str]:
    table = _processes()
    return {pid: started for pid, started in processes.items() if table.get(pid, (0, None))[1] == started}


def _wait_for(condition, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("script", [TRAINER, FORKING_TRAINER], ids=["plain", "forks_a_child"])
def test_a_call_in_flight_dies_with_a_sigkilled_trainer(script):
    """The wall-clock limit is the parent's: a trainer killed by SIGKILL left the worker waiting on a sleeping
    call forever (and its child, and the namespace's `unshare`). Now the worker sees its stdin close, also
    when the trainer forked a child without exec that lives on (it held a copy of the pipe's write end)."""
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    tree: dict[int, str] = {}
    forks: dict[int, str] = {}
    try:
        assert trainer.stdout.readline() == "started\n"
        trainer_command = _cmdline(trainer.pid)
        # The call runs once some process of the tree has a child that is not `unshare`'s: the worker's fork.
        def call_running():
            found = _descendants(trainer.pid)
            table = _processes()
            workers = {pid for pid in found if b"sandbox_worker.py" in _cmdline(pid)}
            return found if any(table.get(pid, (0,))[0] in workers for pid in found) else {}

        tree = _wait_for(call_running, 30)
        assert tree, "the call never started"
        forks = {pid: started for pid, started in tree.items() if _cmdline(pid) == trainer_command}
        assert len(forks) == (script is FORKING_TRAINER)
        tree = {pid: started for pid, started in tree.items() if pid not in forks}
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait()
        left = _wait_for(lambda: not _alive(tree), 5)
        assert left, f"sandbox processes outlived the trainer: {_alive(tree)}"
        assert _alive(forks) == forks  # the forked child itself lived on
    finally:
        trainer.kill()
        trainer.wait()
        for pid in {**_alive(tree), **_alive(forks)}:  # a failed run must not leave them behind
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_retirements_at_once_do_not_grow_the_idle_pool_past_its_size(monkeypatch):
    """Each retirement checked the pool's size, then started a replacement outside the lock: after a burst
    of timeouts, six retirements that all saw room left six idle workers in a pool of two."""
    limits = SandboxLimits(wall_seconds=2.0, cpu_seconds=1)
    with PythonSandbox(limits, pool_size=2) as box:
        real = [box._idle.get_nowait() for _ in range(2)]  # the pool is empty: every retirement sees room
        gate, waiting = threading.Event(), []

        def slow_spawn():
            waiting.append(1)
            gate.wait(10)
            return object()

        monkeypatch.setattr(box, "_spawn", slow_spawn)
        monkeypatch.setattr(python_exec, "dispose_worker", lambda worker: None)
        retirements = [threading.Thread(target=box._retire, args=(object(),)) for _ in range(6)]
        for thread in retirements:
            thread.start()
        # Every retirement is either done or inside a spawn before any spawn returns.
        _wait_for(lambda: len(waiting) + sum(not t.is_alive() for t in retirements) == 6, 10)
        gate.set()
        for thread in retirements:
            thread.join(10)
        assert box._idle.qsize() == 2, box._idle.qsize()
        while not box._idle.empty():
            box._idle.get_nowait()  # the fakes; the real ones are disposed of below
        monkeypatch.undo()
        for worker in real:
            python_exec.dispose_worker(worker)


MEMORY_LIMITS = SandboxLimits(wall_seconds=20.0, cpu_seconds=10, memory_bytes=128 << 20, workdir_bytes=16 << 20,
                              worker_memory_bytes=16 << 20)  # 160 MiB for a worker and its call's processes
HOLD = r"""
import os, time
def hold(mib, seconds):
    block = bytearray(mib << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(seconds)
"""


@pytest.fixture(scope="module")
def memory_sandbox():
    with PythonSandbox(MEMORY_LIMITS, pool_size=1) as box:
        if not box.memory_cgroup_root:
            pytest.skip("no memory cgroup can be made here (no v1 memory hierarchy, no delegated v2 memory "
                        "controller, or not writable): only RLIMIT_AS per process applies, as the result says")
        yield box


def test_forked_processes_share_one_memory_limit(memory_sandbox):
    """RLIMIT_AS is per process: four children of 80 MiB each under a 128 MiB limit all lived (a call could use
    the limit once per process). The worker's memory cgroup bounds them together: some are killed."""
    code = HOLD + r"""
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        hold(80, 1.5)
        os._exit(0)
    children.append(pid)
ends = [os.waitpid(pid, 0)[1] for pid in children]
print(sum(os.WIFSIGNALED(e) and os.WTERMSIG(e) == 9 for e in ends), sum(os.WIFEXITED(e) for e in ends))
"""
    result = memory_sandbox.run(code)
    assert result.status == "ok", result
    killed, finished = map(int, result.stdout.split())
    assert killed >= 1 and killed + finished == 4, result.stdout
    assert "memory cgroup (160 MiB per call)" in result.isolation


def test_a_call_killed_at_the_memory_limit_says_so(memory_sandbox):
    """A SIGKILL from the kernel's out-of-memory killer read as any other kill; now the last line says why."""
    code = HOLD + r"""
if os.fork() == 0:
    hold(60, 10)
    os._exit(0)
time.sleep(0.5)
hold(100, 0)  # 160 MiB with the child's: the kernel kills the biggest process, this one
print("not reached")
"""
    result = memory_sandbox.run(code)
    assert result.status == "killed" and result.stdout == "", result
    assert result.traceback.splitlines()[-1].startswith("memory limit exceeded: the call's processes together"), \
        result.traceback


@pytest.mark.parametrize("lines, v2_alone, expected", [
    ("4:memory:/job/abc\n8:pids:/\n0::/\n", False, "memory/job/abc"),
    ("4:cpu,memory:/\n0::/\n", False, "memory"),
    ("0::/user.slice/job\n", True, "user.slice/job"),
    ("0::/user.slice/job\n", False, ""),  # a v2 hierarchy beside v1 ones (hybrid) without the memory controller
], ids=["v1", "v1-root", "v2", "hybrid-without-memory"])
def test_worker_memory_cgroups_go_inside_the_callers_own(tmp_path, lines, v2_alone, expected):
    """Made at the hierarchy's root, worker cgroups would leave the trainer's job limit and accounting."""
    from aepo_jax.tools.sandbox_process import own_memory_cgroup

    (tmp_path / "cgroup").write_text(lines)
    mount = tmp_path / "fs"
    mount.mkdir()
    if v2_alone:
        (mount / "cgroup.controllers").write_text("cpu memory pids\n")
    found = own_memory_cgroup(str(tmp_path / "cgroup"), str(mount))
    assert found == (os.path.join(str(mount), expected) if expected else "")


def test_the_at_fork_hook_leaves_a_reused_fd_number_alone(tmp_path):
    """A worker's stdin fd closed without `dispose_worker` can have its number reused (by a pipe a
    fork-based `multiprocessing` makes before forking): the child's copy of that file must stay what it is."""
    from aepo_jax.tools import sandbox_process

    read_end, write_end = os.pipe()
    stale = {write_end: (0, 0)}  # recorded for another pipe, long gone
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sandbox_process, "_WORKER_STDIN_FDS", stale)
        pid = os.fork()
        if pid == 0:  # the hook ran in this child
            try:
                os.write(write_end, b"still a pipe")
            finally:
                os._exit(0)
    os.waitpid(pid, 0)
    os.close(write_end)
    assert os.read(read_end, 100) == b"still a pipe"
    os.close(read_end)


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "dead-not-yet-reaped"])
def test_a_worker_that_died_while_idle_does_not_take_the_next_call_with_it(reaped):
    """A killed idle worker stayed in the pool and the next call came back `killed`, "the sandbox worker died".
    Now a dead idle worker is replaced, and a call whose worker was gone before it read the call runs again
    on a fresh one (once)."""
    with PythonSandbox(SandboxLimits(wall_seconds=5, cpu_seconds=5), pool_size=1) as box:
        assert box.run("print('warm')").stdout == "warm\n"
        worker = box._idle.queue[0]  # white-box: the idle worker, killed for real
        os.killpg(worker.process.pid, signal.SIGKILL)
        if reaped:
            worker.process.wait(timeout=10)
        else:  # wait for its death, leaving it for the sandbox to find
            os.waitid(os.P_PID, worker.process.pid, os.WEXITED | os.WNOWAIT)
        results = [box.run("print('hello')") for _ in range(3)]
    assert [(r.status, r.stdout) for r in results] == [("ok", "hello\n")] * 3, results


def test_a_workers_start_up_does_not_count_against_the_calls_wall_clock():
    """Calls that found no idle worker started one, and its start (here numpy and sympy imported, about a
    second on a loaded machine) used up a 1 s wall limit before the code ran: `print(1)` timed out."""
    limits = SandboxLimits(wall_seconds=1.0, cpu_seconds=1)
    with (PythonSandbox(limits, pool_size=1, calls_per_worker=1, preload=("numpy", "sympy")) as box,
          ThreadPoolExecutor(4) as pool):
        results = list(pool.map(box.run, ["print(1)"] * 4))
    assert [(r.status, r.stdout) for r in results] == [("ok", "1\n")] * 4, results

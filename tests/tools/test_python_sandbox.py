"""Python sandbox against hostile programs (issue 4): every one ends with a clear result inside its limits.

File-system attacks (issue 17) are in test_sandbox_filesystem.py."""

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from aepo_jax.tools import PythonSandbox, PythonTool, SandboxLimits
from aepo_jax.tools.sandbox_root import WORKDIR

LIMITS = SandboxLimits(wall_seconds=2.0, cpu_seconds=1, memory_bytes=256 << 20, file_bytes=1 << 20,
                       max_processes=16, max_output_bytes=4096)


@pytest.fixture(scope="module", params=[1, 16], ids=["fresh-worker-per-call", "worker-reused-16-calls"])
def sandbox(request):
    with PythonSandbox(LIMITS, pool_size=2, calls_per_worker=request.param) as box:
        yield box


def test_trivial_call_runs_and_prints(sandbox):
    result = sandbox.run("print(1 + 1)")
    assert (result.status, result.stdout, result.exit_code) == ("ok", "2\n", 0)


def test_isolation_is_reported_honestly(sandbox):
    result = sandbox.run("print('x')")
    assert result.network_isolated == bool(sandbox.namespace_command)
    assert result.filesystem_isolated == sandbox.filesystem_isolated
    assert result.isolation == sandbox.isolation
    assert ("private read-only root" in result.isolation) == result.filesystem_isolated
    assert ("file system NOT isolated" in result.isolation) != result.filesystem_isolated


def test_infinite_loop_hits_the_cpu_limit(sandbox):
    result = sandbox.run("while True:\n    pass")
    assert result.status == "timeout" and "limit" in result.traceback
    assert result.seconds < LIMITS.wall_seconds + 1.5


def test_sleeping_forever_hits_the_wall_limit(sandbox):
    result = sandbox.run("import time\ntime.sleep(60)")
    assert result.status == "timeout" and "wall-clock" in result.traceback
    assert result.seconds < LIMITS.wall_seconds + 1.5


def test_memory_bomb_fails_with_memory_error(sandbox):
    # bytes(n) is calloc-backed: the address-space limit is hit without the machine touching the pages.
    result = sandbox.run("blocks = []\nwhile True:\n    blocks.append(bytes(64 << 20))")
    assert result.status == "error" and "MemoryError" in result.traceback


def test_fork_bomb_is_contained_and_cleaned_up(sandbox):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    before = time.monotonic()
    result = sandbox.run(code)
    assert result.status in ("timeout", "killed")
    assert time.monotonic() - before < LIMITS.wall_seconds + 3
    # Nothing of it survives: a fresh call works and no bomb process is left.
    assert sandbox.run("print('alive')").stdout == "alive\n"
    if sandbox.cgroup_root:  # idle workers hold 2 processes (unshare, python); a surviving bomb would hold more
        assert _wait_until(lambda: all(n <= 2 for n in _cgroup_process_counts(sandbox)))


def _cgroup_process_counts(sandbox):
    counts = []
    for name in os.listdir(sandbox.cgroup_root):
        if name.startswith(f"aepo-sandbox-{os.getpid()}-"):
            try:
                with open(os.path.join(sandbox.cgroup_root, name, "pids.current")) as f:
                    counts.append(int(f.read()))
            except OSError:  # removed while we looked (ENOENT, or ENODEV while the kernel tears it down)
                pass
    return counts


def _wait_until(condition, seconds=10.0):
    """Workers are disposed of in the background: poll the condition for a while."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_detached_daemon_does_not_outlive_its_call(sandbox):
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\n    os._exit(0)\nprint('done')"
    result = sandbox.run(code)
    assert (result.status, result.stdout) == ("ok", "done\n")
    if sandbox.cgroup_root:
        assert _wait_until(lambda: all(n <= 2 for n in _cgroup_process_counts(sandbox)))
    assert sandbox.run("print('next')").stdout == "next\n"


def test_huge_file_is_stopped_by_the_file_size_limit(sandbox):
    result = sandbox.run("with open('big', 'wb') as f:\n    f.write(b'x' * (8 << 20))")
    assert result.status == "error" and "File too large" in result.traceback


def test_megabytes_of_output_are_truncated(sandbox):
    result = sandbox.run("print('a' * 5_000_000)")
    assert result.status == "ok" and result.stdout_truncated
    assert len(result.stdout) == LIMITS.max_output_bytes


def test_no_secret_from_the_parent_environment_leaks(sandbox, monkeypatch):
    monkeypatch.setenv("AEPO_TEST_SECRET", "hunter2")
    result = sandbox.run("import os\nprint(dict(os.environ))")
    assert result.status == "ok" and "hunter2" not in result.stdout and "AEPO_TEST_SECRET" not in result.stdout


def test_socket_to_a_local_listener_gets_nowhere(sandbox):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        result = sandbox.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('in')")
        if not sandbox.network_isolated:
            pytest.skip("no network namespace on this platform; the result says so")
        assert result.status == "error" and "OSError" in result.traceback
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_killing_the_parent_does_not_reach_the_caller(sandbox):
    result = sandbox.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(os.getpid(), signal.SIGKILL)")
    assert result.status in ("ok", "killed", "error")
    assert sandbox.run("print(3)").stdout == "3\n"  # we are still here, and so is the pool


def test_sys_exit_and_syntax_error_are_reported(sandbox):
    assert sandbox.run("import sys\nsys.exit(0)").status == "ok"
    result = sandbox.run("import sys\nsys.exit(3)")
    assert (result.status, result.exit_code) == ("error", 3)
    result = sandbox.run("def broken(:\n    pass")
    assert result.status == "error" and "SyntaxError" in result.traceback


def test_exception_reports_the_last_traceback_lines(sandbox):
    result = sandbox.run("def f():\n    raise ValueError('bad value')\nf()")
    assert result.status == "error" and result.traceback.endswith("ValueError: bad value")
    assert "sandbox_worker" not in result.traceback


def test_calls_share_no_state_and_workdirs_are_removed(sandbox):
    first = sandbox.run("import os\nopen('mark', 'w').write('1')\nGLOBAL = 1\nprint(os.getcwd())")
    second = sandbox.run("import os\nprint(os.path.exists('mark'), 'GLOBAL' in globals(), os.getcwd())")
    assert second.stdout.split()[:2] == ["False", "False"]
    if sandbox.filesystem_isolated:  # a fresh tmpfs inside the sandbox's own root, nothing on the caller's disk
        assert first.stdout.strip() == second.stdout.split()[2] == WORKDIR
    else:
        assert _wait_until(lambda: not os.path.exists(first.stdout.strip()))


def test_many_threads_call_concurrently(sandbox):
    codes = [f"print({i} * {i})" for i in range(12)]
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(sandbox.run, codes))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(12)]
    assert threading.active_count() < 50


def test_python_tool_turns_failures_into_text(sandbox):
    tool = PythonTool(sandbox)
    ok = tool.run("print(6 * 7)")
    assert (ok.ok, ok.text, ok.status) == (True, "42", "ok")
    bad = tool.run("1 / 0")
    assert not bad.ok and "ZeroDivisionError" in bad.text and bad.status == "error"
    slow = tool.run("import time\ntime.sleep(30)")
    assert not slow.ok and slow.status == "timeout" and "timeout" in slow.text


def test_closing_one_sandbox_leaves_another_in_the_same_process_working():
    """Each sandbox's worker cgroups have their own names: closing one must not kill the other's workers."""
    with PythonSandbox(LIMITS, pool_size=1) as first:
        assert first.run("print(1)").stdout == "1\n"
        with PythonSandbox(LIMITS, pool_size=1) as second:
            assert second.run("print(2)").stdout == "2\n"
        result = first.run("print(3)")
        assert (result.status, result.stdout) == ("ok", "3\n"), result


def test_latency_option_delays_each_call_without_holding_a_worker():
    """`latency_seconds` (rollout_bench's tool latency): every call returns after >= it; four calls on
    two workers wait together, so the wait does not hold a worker."""
    latency = 1.0  # long beside a call's own work, so the bound below holds on a loaded machine

    def timed_run(box, code):
        start = time.monotonic()
        result = box.run(code)
        return start, time.monotonic(), result

    with PythonSandbox(LIMITS, pool_size=2, latency_seconds=latency) as box:
        start, end, result = timed_run(box, "print(6 * 7)")
        assert result.stdout == "42\n" and end - start >= latency
        with ThreadPoolExecutor(4) as pool:
            calls = list(pool.map(lambda code: timed_run(box, code), ["print(1)"] * 4))
        assert all(r.status == "ok" and e - s >= latency for s, e, r in calls)
        # Waits that held the two workers would take 2 latencies for four calls; together about one.
        assert max(e for _, e, _ in calls) - min(s for s, _, _ in calls) < 2 * latency


@pytest.mark.parametrize("code, last_line_start", [
    ("raise ValueError('x' * 100_000)", "ValueError: xxx"),
    ("import sys\nsys.exit('bad' * 30_000)", "SystemExit: badbad"),
])
def test_a_traceback_bigger_than_the_status_pipe_is_reported_not_timed_out(sandbox, code, last_line_start):
    """The child's status once went through a pipe the worker read only after the child exited: a status
    over the pipe's buffer (64 KiB) blocked the child until the wall limit, reported as a timeout."""
    result = sandbox.run(code)
    assert result.status == "error", result
    assert result.traceback.splitlines()[-1].startswith(last_line_start)
    assert "more characters]" in result.traceback  # the line is cut where it starts, with how much was cut
    assert len(result.traceback) < 2 * LIMITS.max_output_bytes


def test_a_status_over_the_pipe_buffer_even_when_cut_is_read_while_the_child_runs(sandbox):
    """Eight traceback lines of 4000 non-ASCII characters are about 190 kB of JSON (each one escaped):
    cutting lines alone does not keep the status under the pipe's buffer; reading it as it comes does."""
    result = sandbox.run("raise ValueError('\\n'.join(['\\u00e9' * 4000] * 10))")
    assert result.status == "error", result
    # the exception's own line stays first (`test_a_message_of_many_lines_keeps_the_exceptions_name`)
    assert result.traceback.splitlines() == ["ValueError: " + "\u00e9" * 4000] + ["\u00e9" * 4000] * (
        LIMITS.traceback_lines - 1)


@pytest.mark.parametrize("code, status", [
    ("print('partial result 42')\nimport time\ntime.sleep(60)", "timeout"),
    ("print('partial result 42')\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "killed"),
])
def test_output_printed_before_a_kill_is_returned(sandbox, code, status):
    """The child's stdout is line-buffered: a wall-clock kill or a crash does not lose what it printed."""
    result = sandbox.run(code)
    assert (result.status, result.stdout) == (status, "partial result 42\n")


def test_python_tool_keeps_the_error_and_status_when_stdout_is_long(sandbox):
    """The traceback tail and the status line take their room first; stdout is cut to the rest, marked."""
    rows = "for i in range(300):\n    print('row', i, 'value', i * i)\n"
    tool = PythonTool(sandbox, max_result_chars=2000)
    crashed = tool.run(rows + "1 / 0")
    assert crashed.status == "error" and crashed.text.startswith("row 0 value 0\n")
    assert crashed.text.endswith("ZeroDivisionError: division by zero")
    assert "... [truncated," in crashed.text and len(crashed.text) < 2100
    slow = tool.run(rows + "import time\ntime.sleep(60)")
    assert slow.status == "timeout" and slow.text.startswith("row 0 value 0\n")
    assert slow.text.endswith("wall-clock limit of 2 s exceeded\n[execution timeout]")
    assert "... [truncated," in slow.text


@pytest.mark.parametrize("code, status, last_line", [
    # Bytes written to every fd, the status pipe among them, before the status: it once read as unparseable,
    # and the exit code (always 0) made the exception an "ok".
    (("import os\nfor fd in range(3, 1024):\n    try:\n        os.write(fd, b'x')\n    except OSError:\n"
      "        pass\nraise ZeroDivisionError('the real error')"), "error", "ZeroDivisionError: the real error"),
    # The status pipe closed: no status at all, and the exit code says the code did not end well.
    ("import os\nos.closerange(3, 1024)\nraise ValueError('the real error')", "error", "without a status"),
    # Junk in the pipe and then closed: what is there cannot be read; that is said, not taken for "ok".
    (("import os\nfor fd in range(3, 1024):\n    try:\n        os.write(fd, b'{')\n    except OSError:\n"
      "        pass\nos.closerange(3, 1024)\nraise ValueError('the real error')"), "failed", "unreadable"),
])
def test_code_that_writes_to_or_closes_the_status_pipe_is_not_reported_ok(sandbox, code, status, last_line):
    result = sandbox.run(code)
    assert result.status == status, result
    assert last_line in result.traceback.splitlines()[-1], result.traceback


def test_tracebacks_name_the_code_without_an_agent_tag(sandbox):
    """The code's file was "<python>", which the registry makes inert as "&lt;python>" in every traceback."""
    result = sandbox.run("x = 1\n1 / 0")
    assert 'File "<code>", line 2' in result.traceback and "<python>" not in result.traceback, result.traceback


def test_every_call_of_a_worker_starts_with_the_same_address_space(sandbox):
    """The worker's helper threads (status reader) left it a malloc arena of 64 MiB of address space; every
    later call's child inherited it against RLIMIT_AS: the first call of a worker could allocate ~75 MiB more
    than the next ones (and with two threads, 150 MiB), so one program passed or hit MemoryError by chance."""
    code = "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmSize')))"
    sizes = [int(sandbox.run(code).stdout) for _ in range(3)]
    assert max(sizes) - min(sizes) < 4096, sizes  # kB


def test_a_set_prints_in_the_same_order_in_every_fresh_worker():
    """Workers ran `python -I`, which ignores PYTHONHASHSEED: str hashes were random per worker, so the same
    program printed a set in a different order from one call to the next (rewards that compare output)."""
    code = "print(list({'apple', 'banana', 'cherry', 'date', 'elder', 'fig'})); print(hash('abc'))"
    with PythonSandbox(LIMITS, pool_size=1, calls_per_worker=1) as box:
        outputs = {box.run(code).stdout for _ in range(4)}
    assert len(outputs) == 1, outputs


def test_the_worker_keeps_pythons_isolation_flags_but_a_fixed_hash_seed(sandbox):
    result = sandbox.run("import sys\nprint(sys.flags.no_user_site, sys.flags.safe_path, "
                         "sys.flags.ignore_environment, sys.flags.hash_randomization)")
    assert result.stdout.split() == ["1", "True", "0", "0"], result.stdout


@pytest.mark.parametrize("code", [
    "print(sum(range(10**11)))",  # one C call: SIGXCPU's Python handler never runs
    ("import threading\ndef spin():\n    while True:\n        pass\nfor _ in range(2):\n"
     "    threading.Thread(target=spin, daemon=True).start()\nimport time\ntime.sleep(60)"),
])
def test_the_cpu_limit_reached_inside_a_c_call_or_by_threads_is_a_timeout(code):
    """The hard limit's SIGKILL ended such calls and they came back `killed` by SIGKILL, not `timeout`."""
    with PythonSandbox(SandboxLimits(wall_seconds=30, cpu_seconds=1), pool_size=1) as box:
        result = box.run(code)
    assert result.status == "timeout" and "CPU-time limit of 1 s" in result.traceback, result


def test_a_message_of_many_lines_keeps_the_exceptions_name(sandbox):
    """Only the last traceback lines were kept: a message of 22 lines reached the model with no `ValueError`."""
    code = "raise ValueError('first\\nsecond\\n' + 'more\\n' * 20)"
    result = sandbox.run(code)
    lines = result.traceback.splitlines()
    assert result.status == "error" and len(lines) == LIMITS.traceback_lines, result.traceback
    assert lines[0] == "ValueError: first" and lines[-1] == "more", result.traceback
    text = PythonTool(sandbox, max_result_chars=300).run(code).text
    assert "ValueError: first" in text and len(text) <= 300, text

"""The test helper that runs multi-process clusters: a process that hangs past the timeout fails the test
with every thread's Python stack in the message (the only clue a CI log keeps of where it waited)."""

import subprocess
import sys

import pytest

from tests.child_process import child_env
from tests.training.local_cluster import outputs

HANGING = """
import threading, time
def waits_on_the_other_thread():
    time.sleep(600)
threading.Thread(target=waits_on_the_other_thread, name="helper").start()
time.sleep(600)
"""


def test_a_hang_fails_with_every_threads_stack():
    proc = subprocess.Popen([sys.executable, "-c", HANGING], env=child_env(PYTHONFAULTHANDLER="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(AssertionError) as failure:
        outputs([proc], timeout_s=2)
    message = str(failure.value)
    assert "did not exit within 2 s" in message
    assert "waits_on_the_other_thread" in message and "<module>" in message  # both threads' stacks
    assert proc.poll() is not None  # and it is gone


CRASHES_ONCE = """
import ctypes, os, pathlib

from tests.child_process import ran_in_child_process


def test_crashes_once():
    if ran_in_child_process(__file__, "test_crashes_once"):
        return
    mark = pathlib.Path(os.environ["CRASH_MARK"])
    if not mark.exists():
        mark.write_text("crashed")
        ctypes.string_at(0)  # SIGSEGV, as XLA:CPU did
"""


def test_a_test_run_in_its_own_process_is_run_again_once_after_a_crash(tmp_path, monkeypatch):
    """`tests.child_process.ran_in_child_process`: a child that segfaults is run once more, with a warning;
    one that crashes every time fails the test."""
    from tests.child_process import ran_in_child_process
    from tests.training.local_cluster import REPO

    test_file = tmp_path / "test_crashing.py"
    test_file.write_text(CRASHES_ONCE)
    monkeypatch.setenv("CRASH_MARK", str(tmp_path / "mark"))
    monkeypatch.setenv("PYTHONPATH", REPO)
    with pytest.warns(UserWarning, match="died of signal 11 in its own process; running it again"):
        assert ran_in_child_process(str(test_file), "test_crashes_once", timeout_s=120)
    (tmp_path / "mark").unlink()
    with pytest.raises(AssertionError, match=r"failed in its own process \(-11\)"):  # no second run
        ran_in_child_process(str(test_file), "test_crashes_once", timeout_s=120, retries_on_signal=0)

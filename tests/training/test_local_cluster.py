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

"""`parallel.peer_failure` on two real processes (`jax.distributed` on loopback): hosts that fail at the same
moment each finish their own clean-up and report their own error (a peer's announcement cut the clean-up
short and replaced the error), and a healthy host exits naming the failed one."""

from __future__ import annotations

import pytest

from tests.training.local_cluster import start_processes, stderr_of

_WORKER = r"""
import os, sys, time
from aepo_jax.parallel.distributed import maybe_initialize_distributed
index, count = maybe_initialize_distributed("auto")
from aepo_jax.parallel.multihost import gather_objects
from aepo_jax.parallel.peer_failure import announce_failure, peer_failure_watch
failing = [int(p) for p in sys.argv[2].split(",")]
gather_objects(index)  # both processes are up
with peer_failure_watch(poll_s=0.2):
    try:
        if index in failing:
            raise RuntimeError(f"the error of process {index}")
        time.sleep(60)  # a healthy host, blocked as in a collective
    except BaseException as err:  # as launch.run_setup._train_in does: announce, then clean up
        announce_failure(err)
        raise
    finally:
        time.sleep(2)  # the trainer's and the environment's clean-up
        open(os.path.join(sys.argv[1], f"cleaned-{index}"), "w").close()
"""


def _run(tmp_path, failing: str) -> list[tuple[int, str]]:
    return stderr_of(start_processes(["-c", _WORKER, str(tmp_path), failing], 2, 1), 120)


def test_processes_failing_together_each_clean_up_and_report_their_own_error(tmp_path):
    results = _run(tmp_path, "0,1")
    for index, (code, err) in enumerate(results):
        assert code == 1, err[-2000:]
        assert f"RuntimeError: the error of process {index}" in err, err[-2000:]
        assert "stops too" not in err, err[-2000:]
        assert (tmp_path / f"cleaned-{index}").exists()


@pytest.mark.parametrize("failing", [0, 1])
def test_a_healthy_host_names_the_failed_one_and_exits(tmp_path, failing):
    healthy = 1 - failing
    results = _run(tmp_path, str(failing))
    assert [code for code, _ in results] == [1, 1], [err[-2000:] for _, err in results]
    assert f"RuntimeError: the error of process {failing}" in results[failing][1]
    assert (f"error: process {failing} failed: RuntimeError: the error of process {failing} (process {healthy} "
            "stops too)") in results[healthy][1], results[healthy][1][-2000:]
    assert (tmp_path / f"cleaned-{failing}").exists()
    assert "Check failure stack trace" not in results[0][1] + results[1][1]

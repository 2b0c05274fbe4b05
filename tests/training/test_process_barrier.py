"""Processes meet at the coordination service before a CPU collective (gloo), whose first meeting
of a group of devices allows only 30 s: a host that reaches the run's first collective 35 s after
the other (the checkpoint manager's, or a host-side exchange's) still gets through, and a process
that never arrives is an error naming the barrier, not a hang."""

import pytest

from tests.training.local_cluster import outputs, result_lines, start_processes

# Process 1 arrives LATE_S after process 0 at the run's first collective over both processes; without
# a barrier before it, that collective fails after 30 s.
LATE_S = 35
_LATE_HOST = f"""
import sys, time
import numpy as np
from aepo_jax.parallel.distributed import maybe_initialize_distributed
index, count = maybe_initialize_distributed("auto")
import jax
from jax.sharding import NamedSharding, PartitionSpec
from aepo_jax.parallel.multihost import gather_objects
from aepo_jax.training.checkpoint import Checkpointer
if index == 1:
    time.sleep({LATE_S})
if sys.argv[2] == "exchange":
    print("RESULT", index, gather_objects(index * 10), flush=True)
else:
    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    values = np.arange(2.0 * jax.device_count(), dtype=np.float32)
    x = jax.make_array_from_callback(values.shape, NamedSharding(mesh, PartitionSpec("d")), lambda i: values[i])
    with Checkpointer(sys.argv[1], async_save=False) as ckpt:
        ckpt.save(1, {{"x": x}})
        ckpt.wait_until_finished()
        print("RESULT", index, ckpt.latest_step(), flush=True)
"""

_ABSENT_PEER = """
from aepo_jax.parallel.distributed import maybe_initialize_distributed, wait_for_every_process
index, count = maybe_initialize_distributed("auto")
if index == 0:
    wait_for_every_process("absent peer", timeout_s=3)
print("RESULT", index, flush=True)
"""


@pytest.mark.slow  # one process of each run sleeps past gloo's 30 s first-meeting limit
def test_a_host_arriving_35_s_late_at_the_first_collective_gets_through(tmp_path):
    """Both first collectives, the checkpoint manager's and a host-side exchange's, as two two-process
    runs side by side (each sleeps 35 s; in turn they took twice that)."""
    expected = {"checkpointer": ["RESULT 0 1", "RESULT 1 1"], "exchange": ["RESULT 0 [0, 10]", "RESULT 1 [0, 10]"]}
    runs = {first: start_processes(["-c", _LATE_HOST, str(tmp_path / f"ckpt-{first}"), first], 2, 1)
            for first in expected}
    try:
        results = {first: sorted(result_lines(procs, 240)) for first, procs in runs.items()}
    finally:
        for procs in runs.values():  # a failure of the first run must not leave the second running
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert results == expected


def test_a_process_that_never_arrives_is_an_error_naming_the_barrier():
    procs = start_processes(["-c", _ABSENT_PEER], 2, 1)
    with pytest.raises(AssertionError, match=r"barrier 'absent peer' failed on process 0 of 2 \(it waits up to 3 s"):
        outputs(procs, 120)

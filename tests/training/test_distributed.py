"""Multi-host detection, and a real two-process `jax.distributed` start on loopback."""

import pytest

from aepo_jax.parallel.distributed import (
    detect_multihost,
    initialize_arguments,
    maybe_initialize_distributed,
    slurm_tasks_on_this_node,
)
from tests.training.local_cluster import result_lines, start_processes


def test_single_host_environments_need_no_initialisation():
    assert detect_multihost({}) is None
    assert detect_multihost({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "1"}) is None
    assert detect_multihost({"TPU_WORKER_HOSTNAMES": "localhost"}) is None
    assert detect_multihost({"SLURM_NTASKS": "1"}) is None
    assert maybe_initialize_distributed("auto", env={}) == (0, 1)
    assert maybe_initialize_distributed(False, env={"SLURM_NTASKS": "4"}) == (0, 1)


def test_multi_host_environments_are_recognised():
    launch = detect_multihost({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
                               "JAX_PROCESS_ID": "3"})
    assert (launch.reason, launch.coordinator_address, launch.num_processes, launch.process_id) == (
        "env", "10.0.0.1:1234", 4, 3)
    assert detect_multihost({"TPU_WORKER_HOSTNAMES": "w0,w1,w2,w3"}).reason == "tpu_pod"
    assert detect_multihost({"SLURM_NTASKS": "16", "SLURM_PROCID": "3"}).reason == "slurm"
    # One process started by hand in an `salloc -n 16` shell: no task id, no multi-host launch (JAX's own
    # detection failed it with "coordinator_address should be defined").
    assert detect_multihost({"SLURM_NTASKS": "16", "SLURM_JOB_ID": "7"}) is None
    assert detect_multihost({"OMPI_COMM_WORLD_SIZE": "2"}).reason == "mpi"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"JAX_COORDINATOR_ADDRESS": "h:1"}, "set both"),
        ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2"}, "JAX_PROCESS_ID is required"),
        ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}, "outside"),
        ({"SLURM_NTASKS": "many"}, "not an integer"),
    ],
)
def test_inconsistent_environment_is_a_clear_error(env, message):
    with pytest.raises(ValueError, match=message):
        detect_multihost(env)


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="distributed mode"):
        maybe_initialize_distributed("sometimes", env={})


ONE_NODE = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}


def test_distributed_on_with_one_named_process_passes_the_environment_through():
    """`launch/gpu_multi.sh` on one node: "on" with one process named. A bare `initialize()` there
    looked for a cluster and failed on a GPU node ("Number of processes must be defined")."""
    assert initialize_arguments("on", ONE_NODE) == {"coordinator_address": "10.0.0.1:1234", "num_processes": 1,
                                                    "process_id": 0}
    without_id = {k: v for k, v in ONE_NODE.items() if k != "JAX_PROCESS_ID"}
    assert initialize_arguments(True, without_id)["process_id"] == 0
    assert initialize_arguments("auto", ONE_NODE) is None  # one process needs no runtime unless asked
    assert initialize_arguments("off", ONE_NODE) is None
    with pytest.raises(ValueError, match=r"JAX_PROCESS_ID=1 outside \[0, 1\)"):
        initialize_arguments("on", {**ONE_NODE, "JAX_PROCESS_ID": "1"})


def test_distributed_arguments_of_multi_host_and_auto_detected_launches():
    four = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "2"}
    expected = {"coordinator_address": "h:1", "num_processes": 4, "process_id": 2}
    assert initialize_arguments("auto", four) == initialize_arguments("on", four) == expected
    auto_detected = {"coordinator_address": None, "num_processes": None, "process_id": None}
    assert initialize_arguments("auto", {"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}) == auto_detected
    assert initialize_arguments("on", {}) == auto_detected  # "on" without a named coordinator: JAX looks
    assert initialize_arguments("auto", {}) is None


# Task 1 of `srun -N4 --ntasks-per-node=1 --gpus-per-node=8 launch/gpu_multi.sh ...`.
SLURM_ONE_TASK_PER_NODE = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "gpu[001-004]", "SLURM_NTASKS": "4",
                           "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
                           "SLURM_STEP_TASKS_PER_NODE": "1(x4)", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


def test_one_slurm_task_per_node_drives_every_gpu_of_its_node():
    """JAX's SLURM detection sets local_device_ids=[SLURM_LOCALID] whenever it is left None, so one
    process per node (what gpu_multi.sh documents) saw 1 of its 8 GPUs. The named JAX_* variables
    did not help: initialize() still auto-detects the missing local_device_ids."""
    every_gpu = list(range(8))
    assert initialize_arguments("on", SLURM_ONE_TASK_PER_NODE)["local_device_ids"] == every_gpu
    assert initialize_arguments("auto", SLURM_ONE_TASK_PER_NODE)["local_device_ids"] == every_gpu
    named = {**SLURM_ONE_TASK_PER_NODE, "JAX_COORDINATOR_ADDRESS": "gpu001:1", "JAX_NUM_PROCESSES": "4",
             "JAX_PROCESS_ID": "1"}
    assert initialize_arguments("on", named)["local_device_ids"] == every_gpu
    one_node = {**SLURM_ONE_TASK_PER_NODE, "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_NODEID": "0",
                "SLURM_STEP_TASKS_PER_NODE": "1"}
    assert initialize_arguments("on", one_node)["local_device_ids"] == every_gpu
    # JAX counts the visible GPUs from 0, whichever physical ones SLURM gave the job.
    four = {**SLURM_ONE_TASK_PER_NODE, "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert initialize_arguments("on", four)["local_device_ids"] == [0, 1, 2, 3]


def test_several_slurm_tasks_on_a_node_keep_jaxs_gpu_per_task():
    per_gpu = {**SLURM_ONE_TASK_PER_NODE, "SLURM_NTASKS": "32", "SLURM_PROCID": "9",
               "SLURM_STEP_TASKS_PER_NODE": "8(x4)"}
    assert "local_device_ids" not in initialize_arguments("on", per_gpu)
    assert "local_device_ids" not in initialize_arguments(  # JAX_LOCAL_DEVICE_IDS is JAX's own, and wins
        "on", {**SLURM_ONE_TASK_PER_NODE, "JAX_LOCAL_DEVICE_IDS": "0,1"})
    assert "local_device_ids" not in initialize_arguments("on", {**SLURM_ONE_TASK_PER_NODE, "JAX_PLATFORMS": "cpu"})


@pytest.mark.parametrize(("layout", "expected"), [
    ({"SLURM_STEP_TASKS_PER_NODE": "1(x4)"}, 1),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}, 1),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "0"}, 2),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1"}, None),  # nodes differ and this one is not named
    ({"SLURM_NTASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "8(x2)"}, 1),  # the request before the job layout
    ({"SLURM_TASKS_PER_NODE": "8(x2)"}, 8),
    ({}, None),
])
def test_the_tasks_on_this_node_come_from_slurms_layouts(layout, expected):
    assert slurm_tasks_on_this_node(layout) == expected


def test_one_slurm_task_per_node_without_its_gpus_listed_says_what_to_set():
    unlisted = {k: v for k, v in SLURM_ONE_TASK_PER_NODE.items() if k != "CUDA_VISIBLE_DEVICES"}
    for gpu_node in ({**unlisted, "JAX_PLATFORMS": "cuda"}, {**unlisted, "CUDA_VISIBLE_DEVICES": ""}):
        with pytest.raises(ValueError, match=r"SLURM runs one task on this node, but CUDA_VISIBLE_DEVICES does not "
                                             r"list its GPUs: .*--gpus-per-node=8.*JAX_LOCAL_DEVICE_IDS"):
            initialize_arguments("on", gpu_node)


def test_one_slurm_task_on_a_node_nothing_says_has_gpus_keeps_jaxs_choice():
    """No JAX_PLATFORMS and no CUDA_VISIBLE_DEVICES: a CPU cluster's node; JAX chooses, as before."""
    cpu_node = {k: v for k, v in SLURM_ONE_TASK_PER_NODE.items() if k != "CUDA_VISIBLE_DEVICES"}
    assert "local_device_ids" not in initialize_arguments("on", cpu_node)


_ONE_PROCESS_ON = (
    "from aepo_jax.parallel.distributed import maybe_initialize_distributed\n"
    "import jax\n"
    "index, count = maybe_initialize_distributed('on')\n"
    "print('RESULT', index, count, jax.distributed.is_initialized(), flush=True)\n"
)


def test_one_process_with_distributed_on_initialises():
    """The real runtime with JAX_NUM_PROCESSES=1, as `gpu_multi.sh` on one node starts it."""
    assert result_lines(start_processes(["-c", _ONE_PROCESS_ON], 1, 1), timeout_s=120) == ["RESULT 0 1 True"]


_WORKER = (
    "from aepo_jax.parallel.distributed import maybe_initialize_distributed\n"
    "import jax\n"
    "index, count = maybe_initialize_distributed('auto')\n"
    "print('RESULT', index, count, jax.device_count(), flush=True)\n"
)


def test_two_processes_initialise_on_loopback():
    results = result_lines(start_processes(["-c", _WORKER], 2, 2), timeout_s=120)
    # each process sees its own index, two processes, and all four devices of the job
    assert sorted(results) == ["RESULT 0 2 4", "RESULT 1 2 4"]


# Two processes of 4 devices, mesh fsdp 2 x tensor 4, devices handed over the way jax lays a v5p torus
# out (a line of 4 chips on two hosts as `tensor`): each batch slice would lie on both processes.
_MESH_WORKER = """
import jax
import numpy as np
from aepo_jax.parallel.distributed import maybe_initialize_distributed
index, count = maybe_initialize_distributed("auto")
from aepo_jax.parallel.mesh import MESH_AXES, batch_slice_owners, make_mesh, require_whole_batch_slices
own = [[d for d in jax.devices() if d.process_index == p] for p in range(count)]
torus_order = own[0][:2] + own[1][:2] + own[0][2:] + own[1][2:]
mesh = make_mesh({"data": 1, "fsdp": 2, "tensor": 4}, torus_order)
torus = jax.sharding.Mesh(np.array(torus_order, dtype=object).reshape(1, 2, 4), MESH_AXES,
                          axis_types=(jax.sharding.AxisType.Auto,) * 3)
try:
    require_whole_batch_slices(torus, index, 1)
    refused = "no"
except ValueError as err:
    refused = "yes" if "splits slices [0, 1] between processes" in str(err) else str(err)
require_whole_batch_slices(mesh, index, 1)
owners = lambda m: [sorted(held) for held in batch_slice_owners(m)]
print("RESULT", index, owners(mesh), owners(torus), refused, flush=True)
"""


def test_every_batch_slice_of_the_mesh_lies_on_one_process():
    """Each process builds the rows of its own batch slices (`place_train_batch`); a slice on two
    processes would get two different sets of rows. make_mesh lays each process's devices out in a
    row when the given order splits slices, and the trainer refuses a mesh that splits them."""
    results = result_lines(start_processes(["-c", _MESH_WORKER], 2, 4), timeout_s=120)
    assert sorted(results) == [f"RESULT {i} [[0], [1]] [[0, 1], [0, 1]] yes" for i in (0, 1)]

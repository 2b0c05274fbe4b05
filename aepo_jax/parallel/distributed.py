"""Multi-host start-up: `jax.distributed.initialize()` when launched on several
hosts (DESIGN.md, Configs and launch).

The same command runs on one CPU, a GPU node or a TPU pod slice: on one host
nothing is initialised (unless `distributed="on"` asks for it:
`launch/gpu_multi.sh` on one node); on several, every host calls this before
touching any device and then feeds the data shard of its `process_index`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import jax

MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class MultiHostLaunch:
    """What the environment says about this launch.

    `coordinator_address`, `num_processes`, `process_id` are None when the
    cluster is left to JAX's own auto-detection (TPU pods, SLURM, Open MPI).
    """

    reason: str
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError as err:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from err


def _named_launch(env: Mapping[str, str]) -> MultiHostLaunch | None:
    """The launch `JAX_COORDINATOR_ADDRESS` + `JAX_NUM_PROCESSES` (+ `JAX_PROCESS_ID`) name, one process
    included (its id defaults to 0), or None when neither is set."""
    address = env.get("JAX_COORDINATOR_ADDRESS") or None
    num = _int_env(env, "JAX_NUM_PROCESSES")
    if address is None and num is None:
        return None
    if address is None or num is None:
        raise ValueError("set both JAX_COORDINATOR_ADDRESS and JAX_NUM_PROCESSES for a multi-host launch")
    if num < 1:
        raise ValueError(f"JAX_NUM_PROCESSES must be >= 1, got {num}")
    pid = _int_env(env, "JAX_PROCESS_ID")
    if pid is None and num > 1:
        raise ValueError("JAX_PROCESS_ID is required with JAX_COORDINATOR_ADDRESS and JAX_NUM_PROCESSES > 1")
    pid = 0 if pid is None else pid
    if not 0 <= pid < num:
        raise ValueError(f"JAX_PROCESS_ID={pid} outside [0, {num})")
    return MultiHostLaunch("env", address, num, pid)


def detect_multihost(env: Mapping[str, str] | None = None) -> MultiHostLaunch | None:
    """Return how this process was launched on several hosts, or None for one host.

    Recognised, in order: explicit `JAX_COORDINATOR_ADDRESS` + `JAX_NUM_PROCESSES`
    (+ `JAX_PROCESS_ID`), a multi-worker Cloud TPU slice (`TPU_WORKER_HOSTNAMES`
    with several entries), SLURM (`SLURM_NTASKS` > 1 in a task of an `srun` step, which sets
    `SLURM_PROCID`), Open MPI
    (`OMPI_COMM_WORLD_SIZE` > 1).
    """
    env = os.environ if env is None else env
    named = _named_launch(env)
    if named is not None:
        return named if named.num_processes > 1 else None
    workers = [w for w in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if w.strip()]
    if len(workers) > 1:
        return MultiHostLaunch("tpu_pod")
    # A task of an `srun` step (SLURM_PROCID names it); a process started by hand in an `salloc` shell sees
    # SLURM_NTASKS too but is one process (JAX's own SLURM detection would fail it for want of a task id).
    if (_int_env(env, "SLURM_NTASKS") or 1) > 1 and env.get("SLURM_PROCID", "") != "":
        return MultiHostLaunch("slurm")
    if (_int_env(env, "OMPI_COMM_WORLD_SIZE") or 1) > 1:
        return MultiHostLaunch("mpi")
    return None


def initialize_arguments(mode: str | bool = "auto", env: Mapping[str, str] | None = None) -> dict[str, object] | None:
    """The keyword arguments of `jax.distributed.initialize` for this launch, or None to leave it alone.

    Args:
      mode: "auto" (initialise when `detect_multihost` finds several hosts),
        "on"/True (always: with the coordinator, process count and id the
        environment names, one process included, else JAX's own cluster
        auto-detection), "off"/False (never).
      env: environment to read (default `os.environ`).

    A one-process launch with "on" passes its variables through: without them
    `initialize()` looks for a cluster (SLURM, a TPU pod...) and, on a plain GPU
    node, fails with "Number of processes must be defined". Under SLURM with one
    task on this node, `local_device_ids` lists the node's GPUs
    (`slurm_local_device_ids`).
    """
    if isinstance(mode, bool):
        mode = "on" if mode else "off"
    if mode not in MODES:
        raise ValueError(f"distributed mode must be one of {MODES}, got {mode!r}")
    if mode == "off":
        return None
    env = os.environ if env is None else env
    launch = detect_multihost(env)
    if mode == "on" and launch is None:
        launch = _named_launch(env) or MultiHostLaunch("flag")
    if launch is None:
        return None
    arguments: dict[str, object] = {"coordinator_address": launch.coordinator_address,
                                    "num_processes": launch.num_processes, "process_id": launch.process_id}
    devices = slurm_local_device_ids(env)
    if devices is not None:
        arguments["local_device_ids"] = devices
    return arguments


# The variables JAX's own SLURM detection needs (jax._src.clusters.SlurmCluster.is_env_present): with them,
# `initialize()` fills every argument left None from SLURM, local_device_ids=[SLURM_LOCALID] included.
SLURM_TASK_VARIABLES = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")


def slurm_tasks_on_this_node(env: Mapping[str, str]) -> int | None:
    """How many tasks of this SLURM step run on this node, or None when SLURM does not say.

    From `SLURM_STEP_TASKS_PER_NODE` (the step's layout), else `SLURM_NTASKS_PER_NODE` (the
    `--ntasks-per-node` request), else `SLURM_TASKS_PER_NODE` (the job's layout). A layout lists the
    nodes in order, compressed ("2(x3),1": three nodes of 2 tasks, then one of 1); where the nodes
    differ, this node is entry `SLURM_NODEID`.
    """
    step = env.get("SLURM_STEP_TASKS_PER_NODE", "").strip()
    if step:
        return _tasks_in_layout(env, "SLURM_STEP_TASKS_PER_NODE")
    requested = _int_env(env, "SLURM_NTASKS_PER_NODE")
    if requested is not None:
        return requested
    return _tasks_in_layout(env, "SLURM_TASKS_PER_NODE")


def _tasks_in_layout(env: Mapping[str, str], name: str) -> int | None:
    """This node's entry of the task layout in variable `name` (`slurm_tasks_on_this_node`)."""
    layout = env.get(name, "").strip()
    if not layout:
        return None
    counts: list[int] = []
    for part in layout.split(","):
        count, _, repeat = part.strip().partition("(x")
        try:
            counts += [int(count)] * (int(repeat.removesuffix(")")) if repeat else 1)
        except ValueError as err:
            raise ValueError(f"environment variable {name}={layout!r} is not a SLURM task layout such as "
                             "'2(x3),1'") from err
    if len(set(counts)) == 1:
        return counts[0]
    node = _int_env(env, "SLURM_NODEID")
    return counts[node] if node is not None and 0 <= node < len(counts) else None


def slurm_local_device_ids(env: Mapping[str, str]) -> list[int] | None:
    """`local_device_ids` for `jax.distributed.initialize` under SLURM when one task runs on this node, so
    that it drives every GPU of the node; None to leave JAX's choice.

    JAX's SLURM detection gives each process the one GPU `SLURM_LOCALID` (one task per GPU). Launched one
    task per node, as `launch/gpu_multi.sh` documents, each process would see 1 of the node's GPUs: the
    mesh would be an eighth of the devices, and a config sized for them would not fit. Here one task on
    the node takes the GPUs `CUDA_VISIBLE_DEVICES` lists (JAX counts them from 0 in that list). Several
    tasks on a node keep JAX's one GPU each; `JAX_LOCAL_DEVICE_IDS`, when set, is JAX's own and wins; a
    platform list without a GPU (`JAX_PLATFORMS=cpu`, tpu) has no GPU to choose. With one task here and
    no `CUDA_VISIBLE_DEVICES`, the GPUs are not known before JAX starts: a ValueError says what to set.
    """
    if not all(env.get(name, "") != "" for name in SLURM_TASK_VARIABLES) or env.get("JAX_LOCAL_DEVICE_IDS"):
        return None
    if slurm_tasks_on_this_node(env) != 1:
        return None
    platforms = {p.strip() for p in env.get("JAX_PLATFORMS", "").split(",") if p.strip()}
    if platforms and not platforms & {"cuda", "gpu", "rocm"}:
        return None
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if visible and not set(visible) & {"-1", "NoDevFiles"}:
        return list(range(len(visible)))
    if not platforms and "CUDA_VISIBLE_DEVICES" not in env:
        return None  # nothing says this node has GPUs (a CPU cluster): JAX's own choice
    raise ValueError("SLURM runs one task on this node, but CUDA_VISIBLE_DEVICES does not list its GPUs: JAX "
                     f"would give this process only GPU SLURM_LOCALID={env['SLURM_LOCALID']}. Request the GPUs "
                     "from SLURM (--gpus-per-node=8 or --gres=gpu:8, which sets CUDA_VISIBLE_DEVICES), or set "
                     "CUDA_VISIBLE_DEVICES=0,1,...,7 (the node's GPUs) or JAX_LOCAL_DEVICE_IDS yourself; on "
                     "nodes without GPUs, set JAX_PLATFORMS=cpu")


def maybe_initialize_distributed(mode: str | bool = "auto", env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """Initialise JAX's multi-host runtime when `initialize_arguments(mode, env)` asks for it; returns
    (process_index, process_count)."""
    arguments = initialize_arguments(mode, env)
    if arguments is not None and not jax.distributed.is_initialized():
        jax.distributed.initialize(**arguments)
    return jax.process_index(), jax.process_count()


# How long `wait_for_every_process` lets the last process take to arrive: a host may still be loading a
# large checkpoint, compiling or finishing a longer rollout while the others wait.
PROCESS_BARRIER_TIMEOUT_S = 60 * 60


def wait_for_every_process(name: str, timeout_s: float = PROCESS_BARRIER_TIMEOUT_S) -> None:
    """Block until every process has called this with the same `name` (no-op with one process, or
    when `jax.distributed` was not initialised and so has no coordination service).

    It meets at the coordination service, not through a device collective. CPU collectives (gloo)
    give a group of devices only 30 s to meet on its first collective, so a process that starts up
    more slowly than its peers (a busy machine, a longer compile) would fail the run there; calling
    this first lets the later collective start together. A name may be used again once every process
    has passed it. A barrier that fails (a process not arriving within `timeout_s`, a process that
    stopped) is a RuntimeError naming it.
    """
    if jax.process_count() == 1:
        return
    # The runtime's client (there is no public handle to it).
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    if client is None:
        return
    try:
        client.wait_at_barrier(name, int(timeout_s * 1000))
    except Exception as err:  # the runtime raises its own error type (XlaRuntimeError / JaxRuntimeError)
        raise RuntimeError(f"barrier {name!r} failed on process {jax.process_index()} of "
                           f"{jax.process_count()} (it waits up to {timeout_s:g} s for every process): "
                           f"{err}") from err

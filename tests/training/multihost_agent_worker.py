"""One process of the two-process agentic RL test (`test_multihost_agent_rollout.py`): the composition
root's trainer (`rl_trainer_from`: sampler, agent loop, search server, sandbox) on a mesh spanning both
processes, 2 RL steps, then what each process's rollouts ran on and digests of the parameters. Run alone
(one process, 8 devices) it trains on the same fsdp 2 x tensor 2 mesh on one process.

With `--rollout-ahead`, 3 steps with `train.rollout_ahead`: each step's rollout on a background thread
during the previous step's update.

Run as `python -m tests.training.multihost_agent_worker WORKDIR [--rollout-ahead]` with `JAX_COORDINATOR_ADDRESS`,
`JAX_NUM_PROCESSES`, `JAX_PROCESS_ID` and `XLA_FLAGS=--xla_force_host_platform_device_count=4`.
"""

from __future__ import annotations

import json
import sys

from aepo_jax.parallel.distributed import maybe_initialize_distributed
from tests.training.param_digest import shard_digest, value_digest


def _record_copy_threads() -> set[str]:
    """The names of the threads that copy parameters to the hosts (a program over both processes)."""
    import threading

    from aepo_jax.parallel.host_rollout import HostRolloutPlacement

    threads: set[str] = set()
    place = HostRolloutPlacement.__call__

    def recording(self, state):
        if self.per_host and not self._on_mesh(state):
            threads.add(threading.current_thread().name)
        return place(self, state)

    HostRolloutPlacement.__call__ = recording
    return threads


def _refusal(placement, value, refused: list[str]) -> None:
    try:
        placement({"w": value})
    except RuntimeError as err:
        refused.append(str(err))


def _copy_over_interleaved_mesh(index: int) -> dict:
    """A run mesh whose tensor pairs span both processes (as a TPU slice's mesh may): the copy to this
    process's rollout mesh still holds the global value whole."""
    import threading

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from aepo_jax.parallel.host_rollout import HostRolloutPlacement

    devices = sorted(jax.devices(), key=lambda d: (d.id % 4, d.process_index))  # alternate the processes
    grid = np.array(devices, dtype=object).reshape(2, 2, 2)
    auto = (jax.sharding.AxisType.Auto,) * 3
    run_mesh = Mesh(grid, ("data", "fsdp", "tensor"), axis_types=auto)
    value = jax.jit(lambda: jnp.arange(4 * 6, dtype=jnp.float32).reshape(4, 6),
                    out_shardings=NamedSharding(run_mesh, PartitionSpec("fsdp", "tensor")))()
    copied = HostRolloutPlacement(run_mesh)({"w": value})["w"]
    half = HostRolloutPlacement(run_mesh, dtype="bfloat16")({"w": value + 1e-3})["w"]  # a copy in compute dtype
    expected = np.asarray(multihost_utils.process_allgather(value, tiled=True))
    # Weights on one local device (as a GGUF policy is loaded): put on the run's mesh first, then copied.
    one_device = HostRolloutPlacement(run_mesh)({"w": jax.device_put(expected, jax.local_devices()[0])})["w"]
    # Off the main thread the copy (a program over both processes) is refused, not run.
    refused: list[str] = []
    thread = threading.Thread(target=lambda: _refusal(HostRolloutPlacement(run_mesh), value, refused))
    thread.start()
    thread.join()
    return {
            "one_device_equal": bool(np.array_equal(np.asarray(one_device), expected)),
            "background_refused": refused,"tensor_pairs_span_processes": all(len({d.process_index for d in grid[i, j]}) == 2
                                               for i in range(2) for j in range(2)),
            "devices": sorted(d.id for d in copied.sharding.mesh.devices.flat),
            "equal": bool(np.array_equal(np.asarray(copied), expected)) and copied.is_fully_addressable,
            "bfloat16_equal": half.dtype == jnp.bfloat16 and bool(np.array_equal(
                np.asarray(half), np.asarray(jnp.asarray(expected + 1e-3).astype(jnp.bfloat16))))}


def main(workdir: str, ahead: bool) -> None:
    index, count = maybe_initialize_distributed("auto")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils

    from aepo_jax.experiment import fit_model_to_tokenizer, rl_trainer_from
    from configs.aepo_tiny import get_config
    from launch.run_setup import prepare_workdir, process_environment

    cfg = get_config()
    cfg.model.n_layers = 1
    cfg.data.prompts_per_step = 4  # global: 2 prompts per process
    cfg.data.num_examples = 16
    cfg.rollout.k = 2
    cfg.rollout.initial_rollouts = 1
    cfg.rollout.max_response_len = 16
    cfg.rollout.max_tool_calls = 1
    cfg.train.mini_batch_prompts = 4
    cfg.train.micro_batch_size = 2
    cfg.train.max_seq_len = 512
    cfg.total_steps = 3 if ahead else 2
    cfg.train.rollout_ahead = ahead
    cfg.train.recompute_logp_old = not ahead  # rollout_ahead: the sampler's log-probs are the denominator
    cfg.mesh.shape = {"data": -1, "fsdp": 2, "tensor": 2}  # 2 x 2 x 2 over the 8 devices of both processes
    # A visible step even when a random policy's equal rewards leave no advantage (decoupled weight decay).
    cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.warmup_steps = 1e-2, 5.0, 0
    cfg.checkpoint.async_save = False
    cfg.log.progress_bar = False
    cfg.log.tensorboard = False

    cfg.model.compute_dtype = "bfloat16"  # float32 master weights; each host's copy is bfloat16

    copy_threads = _record_copy_threads()
    prepare_workdir(cfg, workdir, resume=False, process_index=index)  # one workdir, shared like a bucket
    env = process_environment(cfg, workdir, index)  # each process's task files and tools in its own folder
    fit_model_to_tokenizer(cfg, env)
    trainer = rl_trainer_from(cfg, env, workdir, process_index=index, process_count=count)
    rollout = trainer.rollout_fn

    def compute_value(params) -> str:
        """The value digest of the trainer's global weights, gathered and cast to the compute dtype."""
        gathered = multihost_utils.process_allgather(params, tiled=True)
        return value_digest(jax.tree.map(lambda x: np.asarray(jnp.asarray(x).astype(jnp.bfloat16)), gathered))

    placed_values: list[str] = []  # what each placement handed to a rollout (on the trainer's thread)
    place = rollout.place_params

    def recording_place(params):
        placed = place(params)
        placed_values.append(value_digest(placed))
        return placed

    rollout.place_params = recording_place
    sampled_values: list[str] = []  # what the sampler held when each rollout set its parameters
    set_params = rollout.sampler.set_params

    def recording_set(state):
        set_params(state)
        sampled_values.append(value_digest(rollout.sampler._params_state))

    rollout.sampler.set_params = recording_set
    after_step: list[str] = []  # the weights after each step's update (a collective: both processes, same point)
    train_step = trainer.train_step

    def recording_step():
        metrics = train_step()
        after_step.append(compute_value(trainer.state.params))
        return metrics

    trainer.train_step = recording_step
    try:
        initial = shard_digest(trainer.state.params)
        initial_value = compute_value(trainer.state.params)
        records = trainer.train()
        final_value = compute_value(trainer.state.params)
        placed = rollout.placement(trainer.state.params)  # what a next rollout would sample with
        released = rollout.sampler._params is None  # no copy of the weights held between rollouts
    finally:
        trainer.close()
        env.close()
    training_copy_threads = sorted(copy_threads)  # before the checks below copy on purpose off the main thread
    local_ids = sorted(d.id for d in jax.local_devices())
    interleaved = _copy_over_interleaved_mesh(index) if count > 1 else {}
    print("RESULT " + json.dumps({
        "process": index, "processes": count, "devices": jax.device_count(),
        "sampler_devices": sorted(d.id for d in rollout.sampler.mesh.devices.flat), "local_devices": local_ids,
        "sampler_mesh": dict(rollout.sampler.mesh.shape), "run_mesh": dict(trainer.run.mesh.shape),
        "initial": initial, "final": shard_digest(trainer.state.params),
        "initial_value": initial_value, "final_value": final_value, "after_step": after_step,
        "placed_values": placed_values, "placed_value": value_digest(placed),
        "placed_dtypes": sorted({str(x.dtype) for x in jax.tree.leaves(placed)}),
        "placed_local": all(x.is_fully_addressable for x in jax.tree.leaves(placed)),
        "sampled_values": sampled_values, "released": released,
        "steps": [r["step"] for r in records], "trajectories": [r["trajectories"] for r in records],
        "loss": [r["loss"] for r in records], "interleaved": interleaved,
        "stale": [r["rollout_stale_params"] for r in records] if ahead else None,
        "copy_threads": training_copy_threads,
    }), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], "--rollout-ahead" in sys.argv[2:])

"""Two real CPU processes (`jax.distributed` on loopback, 4 fake devices each) train `aepo_tiny` for 2 RL
steps through the composition root: each process rolls out its own prompts with the real agent loop and
tools on its own devices (`parallel.host_rollout`), with the trainer's parameters copied there exactly."""

import json

import pytest

from tests.training.local_cluster import result_lines, start_processes

TIMEOUT_S = 300  # the run takes seconds; a process waiting on the other (a deadlock) fails here


def _run(tmp_path, *flags: str) -> tuple[dict, dict]:
    procs = start_processes(["-m", "tests.training.multihost_agent_worker", str(tmp_path / "run"), *flags], 2, 4)
    results = [json.loads(line[len("RESULT "):]) for line in result_lines(procs, TIMEOUT_S)]
    first, second = sorted(results, key=lambda r: r["process"])
    assert (first["process"], second["process"]) == (0, 1) and first["devices"] == 8
    assert first["run_mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
    for result in (first, second):
        # The sampler's mesh is this process's 4 devices, weights over tensor as in the run's mesh.
        assert result["sampler_devices"] == result["local_devices"] and len(result["local_devices"]) == 4
        assert result["sampler_mesh"] == {"data": 2, "fsdp": 1, "tensor": 2}
        assert result["placed_local"] and result["placed_dtypes"] == ["bfloat16"]
        # The copy on this host's devices is the trainer's global parameters in the compute dtype, bit for bit.
        assert result["placed_value"] == result["final_value"] == result["after_step"][-1]
        # Each rollout sampled with the weights it should have: see the tests below for which.
        assert result["sampled_values"] == result["placed_values"] and result["released"]
        assert len(set(result["after_step"])) == len(result["after_step"])  # every step moved the weights
        # A run mesh whose tensor pairs span the processes: each still gets the whole value on its devices.
        interleaved = result["interleaved"]
        assert interleaved["tensor_pairs_span_processes"] and interleaved["equal"] and interleaved["bfloat16_equal"]
        assert interleaved["devices"] == result["local_devices"]
        assert interleaved["one_device_equal"]  # weights loaded on one device are copied too
        assert len(interleaved["background_refused"]) == 1 and "main thread" in interleaved["background_refused"][0]
    assert set(first["local_devices"]).isdisjoint(second["local_devices"])
    assert first["loss"] == second["loss"]
    assert first["final_value"] == second["final_value"] != first["initial_value"]
    assert first["final"] == second["final"] != first["initial"]
    return first, second


@pytest.mark.slow  # two processes starting the environment and compiling the tiny trainer
def test_each_process_rolls_out_on_its_own_devices_with_the_trainers_parameters(tmp_path):
    first, second = _run(tmp_path)
    for result in (first, second):
        # Step 1's rollout sampled with the initial weights, step 2's with those after step 1.
        assert result["placed_values"] == [result["initial_value"], result["after_step"][0]]
    assert first["steps"] == second["steps"] == [1, 2]
    assert first["trajectories"] == second["trajectories"] == [8.0, 8.0]  # 4 global prompts x k = 2


@pytest.mark.slow
def test_rollout_ahead_runs_with_several_processes(tmp_path):
    """Each process's next rollout on its background thread while the train step (programs over both
    processes) runs on the main thread: no deadlock, one update round stale after the first step."""
    first, second = _run(tmp_path, "--rollout-ahead")
    for result in (first, second):
        # Step 1 (synchronous) and step 2 (launched during step 1) sampled with the initial weights, step 3
        # (launched during step 2) with those after step 1: one update round stale.
        assert result["placed_values"] == [result["initial_value"]] * 2 + [result["after_step"][0]]
    assert first["steps"] == second["steps"] == [1, 2, 3]
    assert first["stale"] == second["stale"] == [0.0, 1.0, 1.0]
    # Programs over both processes (the parameter copy) run on the main thread only, in the same order as
    # the train step's on every process; the background rollout runs this process's programs only.
    assert first["copy_threads"] == second["copy_threads"] == ["MainThread"]
    assert first["trajectories"] == second["trajectories"] == [8.0, 8.0, 8.0]


@pytest.mark.slow
def test_one_process_with_fsdp_rolls_out_on_replicas_beside_the_train_step(tmp_path):
    """The same run on one process with 8 devices (mesh data 2 x fsdp 2 x tensor 2) and `rollout_ahead`: the
    rollouts sample on bfloat16 replicas over all 8 devices, copied from the trainer's weights at the right
    step, and the sampler holds no copy once the run ends."""
    procs = start_processes(["-m", "tests.training.multihost_agent_worker", str(tmp_path / "run"),
                             "--rollout-ahead"], 1, 8)
    (result,) = [json.loads(line[len("RESULT "):]) for line in result_lines(procs, TIMEOUT_S)]
    assert result["processes"] == 1 and result["run_mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
    assert result["sampler_mesh"] == {"data": 4, "fsdp": 1, "tensor": 2}
    assert result["sampler_devices"] == result["local_devices"] and len(result["local_devices"]) == 8
    assert result["placed_dtypes"] == ["bfloat16"] and result["placed_value"] == result["final_value"]
    assert result["placed_values"] == [result["initial_value"]] * 2 + [result["after_step"][0]]
    assert result["sampled_values"] == result["placed_values"] and result["released"]
    assert result["stale"] == [0.0, 1.0, 1.0] and result["trajectories"] == [8.0, 8.0, 8.0]


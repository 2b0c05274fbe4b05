"""Two real CPU processes (`jax.distributed` on loopback, 4 fake devices each) train `aepo_tiny` for 2 RL
steps through the composition root: each process rolls out its own prompts with the real agent loop and
tools on its own devices (`parallel.host_rollout`), with the trainer's parameters copied there exactly."""

import json

import pytest

from tests.training.local_cluster import result_lines, start_processes

TIMEOUT_S = 300  # the run takes seconds; a process waiting on the other (a deadlock) fails here


@pytest.mark.slow  # two processes starting the environment and compiling the tiny trainer
def test_each_process_rolls_out_on_its_own_devices_with_the_trainers_parameters(tmp_path):
    procs = start_processes(["-m", "tests.training.multihost_agent_worker", str(tmp_path / "run")], 2, 4)
    results = [json.loads(line[len("RESULT "):]) for line in result_lines(procs, TIMEOUT_S)]
    first, second = sorted(results, key=lambda r: r["process"])
    assert (first["process"], second["process"]) == (0, 1) and first["devices"] == 8
    assert first["run_mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
    for result in (first, second):
        # The sampler's mesh is this process's 4 devices, weights over tensor as in the run's mesh.
        assert result["sampler_devices"] == result["local_devices"] and len(result["local_devices"]) == 4
        assert result["sampler_mesh"] == {"data": 2, "fsdp": 1, "tensor": 2}
        assert result["placed_local"]
        # The copy on this host's devices is the trainer's global parameters, bit for bit.
        assert result["placed_value"] == result["final_value"]
        # Step 2's rollout sampled with the parameters after step 1: neither the initial nor the final ones.
        assert result["sampled_with_value"] not in (result["initial_value"], result["final_value"])
        # A run mesh whose tensor pairs span the processes: each still gets the whole value on its devices.
        interleaved = result["interleaved"]
        assert interleaved["tensor_pairs_span_processes"] and interleaved["equal"]
        assert interleaved["devices"] == result["local_devices"]
    assert set(first["local_devices"]).isdisjoint(second["local_devices"])
    assert first["steps"] == second["steps"] == [1, 2]
    assert first["trajectories"] == second["trajectories"] == [8.0, 8.0]  # 4 global prompts x k = 2
    assert first["loss"] == second["loss"]
    assert first["final_value"] == second["final_value"] != first["initial_value"]
    assert first["final"] == second["final"] != first["initial"]

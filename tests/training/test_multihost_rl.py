"""Two real CPU processes (`jax.distributed` on loopback, 4 fake devices each) train `aepo_tiny`
for 2 RL steps on one mesh spanning both: global prompts split between the processes, global
batches built from each process's part, metrics gathered (the rollout statistics those of both processes'
groups together); both end with identical parameters."""

import json

import pytest

from tests.training.local_cluster import result_lines, start_processes

TIMEOUT_S = 600


@pytest.mark.slow  # two processes compiling the tiny trainer: 373 s on the loaded 2-core machine
def test_two_processes_train_two_rl_steps_to_identical_parameters(tmp_path):
    procs = start_processes(["-m", "tests.training.multihost_rl_worker", str(tmp_path / "run")], 2, 4)
    results = [json.loads(line[len("RESULT "):]) for line in result_lines(procs, TIMEOUT_S)]
    first, second = sorted(results, key=lambda r: r["process"])
    assert (first["process"], second["process"]) == (0, 1)
    assert first["devices"] == second["devices"] == 8 and first["local_devices"] == 4
    assert first["steps"] == second["steps"] == [1, 2] and first["rounds"] == 2
    # a micro-batch of max(micro_batch_size 4, 8 batch devices) = 8 rows: each process packs its 4
    assert first["local_micro_rows"] == second["local_micro_rows"] == 4
    # 2 global prompts x k = 2: the gathered metric counts both processes' trajectories
    assert first["trajectories"] == second["trajectories"] == [4.0, 4.0]
    # every rollout statistic is the whole step's: compute_stats of both processes' groups (no mean of theirs)
    assert first["rollout"] == second["rollout"] == first["expected_rollout"] == second["expected_rollout"]
    assert [r["rollout/num_prompts"] for r in first["rollout"]] == [2.0, 2.0]
    assert first["loss"] == second["loss"]  # the update's metrics are the global step's
    assert first["initial"] == second["initial"]
    assert first["final"] == second["final"]  # each process's own shards hold the same parameters
    assert first["final"] != first["initial"]  # and training moved them

"""Two real CPU processes (`jax.distributed` on loopback, 4 fake devices each) run one RL step whose
processes called different tools: the logged metrics are those of both processes' trajectories
together (merged by name, rates from counts), the same on both, and each process's rollout draws its
own branch-decision randoms."""

import json

import pytest

from aepo_jax.training.metric_keys import TOOL_FAIL_RATE
from tests.training.local_cluster import result_lines, start_processes

TIMEOUT_S = 300


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Each process's RESULT of `multihost_metrics_worker`, in process order (one run for the module)."""
    workdir = tmp_path_factory.mktemp("multihost_metrics") / "run"
    procs = start_processes(["-m", "tests.training.multihost_metrics_worker", str(workdir)], 2, 4)
    lines = [json.loads(line[len("RESULT "):]) for line in result_lines(procs, TIMEOUT_S)]
    return sorted(lines, key=lambda r: r["process"])


def test_tool_fail_rates_are_total_failures_over_total_calls_of_both_processes(results):
    first, second = results
    # process 0: a working search and a working python call per trajectory; process 1: two failing python
    # calls. Both processes log every tool: search 0/2, python 4/6 (a mean of per-process rates: 1/2),
    # overall 4/8; before, the sets of different size stopped the run, and sets of one size were misfiled.
    for record in (first["record"], second["record"]):
        assert record[f"{TOOL_FAIL_RATE}/search"] == 0.0
        assert record[f"{TOOL_FAIL_RATE}/python"] == pytest.approx(4 / 6)
        assert record[TOOL_FAIL_RATE] == pytest.approx(4 / 8)


def test_logged_rollout_metrics_are_those_of_both_processes_groups_together(results):
    first, second = results
    expected = first["expected"]
    assert expected == second["expected"]
    assert expected["trajectories"] == 4.0
    for record in (first["record"], second["record"]):
        assert {k: record[k] for k in expected} == pytest.approx(expected)  # reward_std included
        # the packing ratios of the step's summed counts, not a mean of each process's ratio
        assert record["pack/token_ratio"] == pytest.approx(record["pack/flat_tokens"] / record["pack/computed_tokens"])
        assert record["pack/slot_ratio"] == pytest.approx(record["pack/flat_slots"] / record["pack/computed_slots"])
    assert first["record"] == second["record"]  # every process logs the same figures


def test_each_process_draws_its_own_branch_decision_randoms(results):
    first, second = results
    assert len(first["draws"]) == len(second["draws"]) == 1
    assert first["draws"] != second["draws"]

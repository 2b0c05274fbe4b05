"""The rollout benchmark rotates the schedules' order per repeat and bounds the gain on compile-free seconds."""

from __future__ import annotations

import pytest

from benchmarks.rollout_bench import run_repeats, schedule_order, speedup_ceiling


def test_schedules_alternate_which_runs_first_and_rows_record_it():
    calls = []

    def run(branch_by, schedule, repeat):
        calls.append((repeat, branch_by, schedule))
        return {"repeat": repeat}

    rows = run_repeats(3, ["fork"], ["rounds", "continuous"], run)
    assert calls == [(1, "fork", "rounds"), (1, "fork", "continuous"), (2, "fork", "continuous"),
                     (2, "fork", "rounds"), (3, "fork", "rounds"), (3, "fork", "continuous")]
    assert [(r["schedule"], r["position_in_repeat"]) for r in rows if r["repeat"] == 2] == [
        ("continuous", 0), ("rounds", 1)]
    assert [schedule_order(["a", "b", "c"], i) for i in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def _row(schedule, repeat, seconds, compile_seconds, bound, branch_by="fork"):
    return {"schedule": schedule, "branch_by": branch_by, "repeat": repeat, "seconds": seconds,
            "seconds_without_compiles": seconds - compile_seconds, "tool_bound_seconds": bound,
            "tool_calls": 10 * repeat, "serial_tool_calls": repeat}


def test_speedup_ceiling_is_rounds_compile_free_seconds_over_the_largest_bound_of_any_run():
    rows = [_row("rounds", 1, 10.0, 4.0, 2.0), _row("continuous", 1, 5.0, 0.0, 3.0),
            _row("rounds", 2, 8.0, 0.0, 2.5), _row("rounds", 1, 99.0, 0.0, 1.0, branch_by="prefill")]
    ceiling = speedup_ceiling(rows, "fork")
    assert ceiling["seconds_without_compiles"] == pytest.approx((6.0 + 8.0) / 2)  # rounds' compiles taken out
    assert ceiling["speedup_ceiling"] == pytest.approx(7.0 / 3.0)  # the bound of continuous's run, the largest
    assert ceiling["tool_bound_run"] == {"schedule": "continuous", "branch_by": "fork", "repeat": 1,
                                         "tool_calls": 10, "serial_tool_calls": 1}
    assert ceiling["rounds_runs"] == 2
    assert speedup_ceiling([_row("rounds", 1, 10.0, 0.0, 0.0)], "fork") == {}  # no tool latency, no bound

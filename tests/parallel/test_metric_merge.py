"""Merging host-side metrics over processes by name (`parallel.multihost.merge_metrics`, what
`gather_metrics` does with every process's dict), and the one-process identities of the multi-host
helpers the RL trainer's metrics and rollout randomness go through."""

from dataclasses import dataclass

import numpy as np
import pytest

from aepo_jax.parallel.multihost import (
    gather_metrics,
    merge_metrics,
    process_rng,
    process_sum_fields,
)


def test_processes_reporting_different_names_are_merged_by_name():
    """Processes that called different tools report different `tool_fail_rate/<tool>` names: with sets of
    one size each value stays under its own name (no merge by sorted position), with sets of different
    sizes the merge still works, and a name one process lacks is that of the processes reporting it."""
    same_size = merge_metrics([({"loss": 1.0, "tool_fail_rate/search": 0.0}, {}),
                               ({"loss": 3.0, "tool_fail_rate/python": 1.0}, {})])
    assert same_size == {"loss": 2.0, "tool_fail_rate/python": 1.0, "tool_fail_rate/search": 0.0}
    other_size = merge_metrics([({"tool_fail_rate/search": 0.25, "tool_fail_rate/python": 0.5}, {}),
                                ({"tool_fail_rate/python": 1.0}, {})])
    assert other_size == {"tool_fail_rate/python": 0.75, "tool_fail_rate/search": 0.25}


def test_sum_keys_add_up_and_a_process_without_one_adds_nothing():
    merged = merge_metrics([({"kept_groups": 3.0, "x": 1.0}, {}), ({"x": 2.0}, {}), ({"kept_groups": 4.0}, {})],
                           sum_keys={"kept_groups"})
    assert merged == {"kept_groups": 7.0, "x": 1.5}


def test_weighted_means_are_the_whole_batch_token_means():
    """A per-process token mean with its token count as weight gives the mean over every token."""
    tokens = [np.array([1.0, 2.0, 3.0]), np.array([10.0]), np.array([])]  # per process
    parts = [({"entropy_mean": float(t.mean()) if t.size else 0.0, "rollout_s": float(i)},
              {"entropy_mean": float(t.size)}) for i, t in enumerate(tokens)]
    merged = merge_metrics(parts)
    assert merged["entropy_mean"] == pytest.approx(np.concatenate(tokens).mean())  # 4.0, not (2 + 10 + 0) / 3
    assert merged["rollout_s"] == 1.0  # unweighted: the plain mean
    assert merge_metrics([({"m": 1.0}, {"m": 0.0}), ({"m": 3.0}, {"m": 0.0})]) == {"m": 2.0}  # no tokens anywhere


def test_one_process_keeps_its_metrics_its_counts_and_its_random_stream():
    metrics = {"b": 1.5, "a": 2.0}
    assert gather_metrics(metrics, {"a"}, {"b": 3.0}) == metrics

    @dataclass
    class Tally:
        tokens: int = 3
        slots: int = 8

    tally = Tally()
    assert process_sum_fields(tally) is tally
    # the rollout's generator of (seed, step) is what a one-process run always drew
    assert np.array_equal(process_rng(7, 3).random(5), np.random.default_rng([7, 3]).random(5))
    assert not np.array_equal(process_rng(7, 3).random(5), process_rng(7, 4).random(5))

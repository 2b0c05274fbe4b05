"""The rollout metrics of one RL step: what one process holding all of the step's groups would report.

Three kinds of entries:

- the trained trajectories' figures (`rollout_batch.rollout_metrics`: reward
  mean and std, accuracy, lengths, tool calls and tool-failure rates, overall
  and per tool) from every process's `RolloutMetricSums`: rates are total
  failures over total calls (a process that never called a tool adds zero
  calls), the reward std that of all the step's rewards.

- structural statistics (`rollout.stats.STRUCTURE_STATS`, spec 2.4: trajectories
  per prompt, branches, top-3 fraction, branch runs, tool calls per trajectory,
  segment entropy) describe the groups the step trains on: with DAPO dynamic
  sampling the groups kept from every rollout (not the dropped ones), with
  several processes every process's. They are made again from the groups'
  `TreeParts`, summed over the processes, never averaged.
- work counters (every other numeric entry of the rollout function's stats:
  tokens computed, tool calls made, rounds, tool seconds) describe what the
  step's rollouts did: summed over every rollout of the step, DAPO's resample
  rounds and dropped groups included. Over processes, counts are summed; the
  chains that run one after another (`DEPTH_COUNTERS`) take the maximum, as
  processes run side by side; seconds (`*_seconds`) the mean, as the trainer's
  other timings (`rollout_s`).

`forward_to_trajectory_ratio` is made again from the summed tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aepo_jax.agent.trajectory import Trajectory
from aepo_jax.parallel.multihost import gather_objects
from aepo_jax.rollout.stats import STRUCTURE_STATS, TreeParts, tree_parts, tree_stats
from aepo_jax.training.rollout_batch import RolloutMetricSums, combine_rollout_metrics

RATIO = "forward_to_trajectory_ratio"
DEPTH_COUNTERS = frozenset({"rounds", "serial_tool_calls"})  # over processes: the longest, not the sum


@dataclass(frozen=True)
class StepRolloutStats:
    """This process's part of one step's rollout statistics: the trained groups' tree sums and the
    work counters of every rollout. Made on the rollout's thread: no collective."""

    tree: TreeParts
    work: dict[str, float]


def numeric_stats(stats: Any) -> dict[str, float]:
    """Numeric entries of a rollout function's stats (a mapping, or anything with `as_dict()`)."""
    if stats is None:
        return {}
    raw = stats.as_dict() if hasattr(stats, "as_dict") else dict(stats)
    return {k: float(v) for k, v in raw.items() if isinstance(v, (bool, int, float, np.integer, np.floating))}


def step_rollout_stats(groups: Sequence[Sequence[Trajectory]], rollout_stats: Sequence[Any]) -> StepRolloutStats:
    """The part of this process: tree sums of `groups` (those it trains on) and the work counters of
    `rollout_stats` (one per rollout call of the step), summed; their structural entries are dropped."""
    work: dict[str, float] = {}
    for stats in rollout_stats:
        for key, value in numeric_stats(stats).items():
            if key not in STRUCTURE_STATS and key != RATIO:
                work[key] = work.get(key, 0.0) + value
    return StepRolloutStats(tree_parts(groups), work)


def _combine_work(key: str, values: Sequence[float]) -> float:
    """One work counter of the step from each process's value (see the module docstring)."""
    if key in DEPTH_COUNTERS:
        return float(max(values))
    if key.endswith("_seconds"):
        return float(np.mean(values))
    return float(sum(values))


def combine_step_stats(parts: Sequence[StepRolloutStats]) -> dict[str, float]:
    """The step's `rollout/*` metrics (and their short aliases) from every process's part."""
    out = {k: float(v) for k, v in tree_stats(sum((p.tree for p in parts), TreeParts())).items()}
    for key in sorted({k for p in parts for k in p.work}):
        out[key] = _combine_work(key, [p.work[key] for p in parts if key in p.work])
    if "forward_tokens" in out and "trajectory_tokens" in out:
        out[RATIO] = out["forward_tokens"] / max(out["trajectory_tokens"], 1.0)
    metrics = {f"rollout/{k}": v for k, v in out.items()}
    metrics["branch_top3_fraction"] = out["top3_branch_fraction"]
    metrics["tool_calls_per_trajectory"] = out["tool_calls_per_trajectory"]
    return metrics


def rollout_step_metrics(part: StepRolloutStats, sums: RolloutMetricSums | None = None) -> dict[str, float]:
    """The whole step's `rollout/*` metrics and, given this process's `sums` of its trained trajectories
    (`rollout_batch.rollout_metric_sums`), the whole step's `rollout_metrics`: the same on every process.
    With several processes a collective: every process calls it at the same point, on the thread that
    launches collectives."""
    parts = gather_objects((part, sums))
    trained = [s for _, s in parts if s is not None]
    return {**(combine_rollout_metrics(trained) if trained else {}), **combine_step_stats([p for p, _ in parts])}

"""Held-out metrics of a demo policy (spec §6): pass@k, tool use, length, entropy, branch concentration.

`aepo_jax.experiment.evaluate_policy` runs the evaluation driver twice: `n`
independent samples per held-out question give pass@1 (their mean) and the
unbiased pass@k; one tree rollout (the AEPO strategy) over a few questions
measures where branches go (the share of branches on the three most-branched
trajectories of each question, spec §2.4) and the policy's segment entropy.
`policy_metrics` turns the two results into the demo's flat report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def policy_metrics(result: Any, samples: int, questions: int, tree: Any = None,
                   tree_questions: int = 0) -> dict[str, float]:
    """The demo's report of one policy from the driver's `EvalResult`s (`tree`: the tree rollout's, or None).

    Every value is a plain float: `pass@1..n`, `tool_calls` (calls the loop ran, per answer),
    `python_rate` (answers in which a python call ran) and `answer_rate` (shares of answers),
    `response_length` (generated tokens), and from the tree rollout `branch_top3` (NaN when
    nothing branched) and `entropy` (mean segment entropy, spec §1: the first K tokens after each
    tool result, not a token-weighted mean).
    """
    report = result.reports[-1]
    metrics = {f"pass@{k}": float(v) for k, v in report.pass_at_k.items()}
    metrics.update({
        "questions": float(questions),
        "samples": float(samples),
        "tool_calls": float(report.tool_calls_per_question),
        "response_length": float(report.mean_response_length),
        "python_rate": float(np.mean([_python_calls(s) > 0 for s in result.samples])),
        "answer_rate": float(np.mean([s["stop_reason"] == "answer" for s in result.samples])),
        "branch_top3": math.nan,
        "entropy": math.nan,
    })
    if tree is not None and tree_questions > 0:
        stats = tree.tree_stats["all"]
        metrics["branch_top3"] = float(stats["top3_branch_fraction"])
        metrics["entropy"] = float(stats["mean_segment_entropy"])
        metrics["branches_per_question"] = float(stats["num_branch"]) / tree_questions
    return metrics


def format_rollout_tree(group: Sequence[Any], tokenizer: Any, width: int = 100) -> str:
    """One prompt's trajectories as an indented text tree: each branch under the trajectory it forked from.

    A line shows the trajectory id, why it ended, its tool calls, and the text it
    generated after its branch point (the shared prefix is not repeated).
    """
    children: dict[int | None, list[Any]] = {}
    for traj in group:
        children.setdefault(traj.parent_id, []).append(traj)
    lines: list[str] = []

    def show(traj: Any, depth: int) -> None:
        start = traj.branch_point or 0
        text = tokenizer.decode([t for t, m in zip(traj.response_ids[start:], traj.mask[start:]) if m])
        text = " ".join(text.split())
        kind = "global" if traj.is_global else f"branch of #{traj.parent_id} after tool call {_calls_before(traj)}"
        lines.append(f"{'    ' * depth}#{traj.traj_id} [{kind}; {traj.stop_reason}; {traj.num_tool_calls} calls] "
                     f"{text[:width]}{'...' if len(text) > width else ''}")
        for child in sorted(children.get(traj.traj_id, []), key=lambda t: t.traj_id):
            show(child, depth + 1)

    for root in sorted(children.get(None, []), key=lambda t: t.traj_id):
        show(root, 0)
    return "\n".join(lines)


def _calls_before(traj: Any) -> int:
    return sum(1 for step in traj.tool_steps if step.result_end <= (traj.branch_point or 0))


def _python_calls(sample: dict) -> int:
    """Python calls the loop ran for one evaluation sample; from its text for samples written before
    the driver recorded them (a tag inside <think> or a malformed closing counted there too)."""
    from aepo_jax.rewards import count_tool_calls

    if "python_calls" in sample:
        return int(sample["python_calls"])
    return count_tool_calls(sample["response"])["python"]


"""Branch-concentration statistics credited by root, on hand-built trees with known answers."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from aepo_jax.agent.trajectory import Segment, ToolStep, Trajectory
from aepo_jax.rollout.stats import (
    compute_stats,
    root_branch_shares,
    top3_branch_fraction,
)


class Tree:
    """Builds one prompt's group: globals with four tool results each, and branches at those results."""

    def __init__(self, prompt_index: int = 0) -> None:
        self.prompt_index, self.group, self.next_id = prompt_index, [], 100 * prompt_index

    def root(self) -> Trajectory:
        t = Trajectory(traj_id=self._id(), prompt_index=self.prompt_index, prompt_ids=[5], root_id=0, h_init=0.0)
        t.root_id = t.traj_id
        self._finish(t)
        self.group.append(t)
        return t

    @staticmethod
    def _finish(t: Trajectory) -> None:
        """Generate and call tools until `t` has four tool results, then answer."""
        while len(t.tool_steps) < 4:
            start = len(t.response_ids)
            t.add_generated([1, 2], [-0.1, -0.1], [0.5, 0.5])
            t.segments.append(Segment(start, start + 2, 0.5, bool(t.tool_steps)))
            t.add_tool_result([7, 7])
            t.tool_steps.append(ToolStep("search", "q", "r", True, start + 2, start + 4))
        t.stop_reason = "answer"

    def branch(self, parent: Trajectory, step: int) -> Trajectory:
        """Fork `parent` at its `step`-th tool result (0-based); the child shares the tool steps before it."""
        point = parent.tool_result_ends[step]
        parent.decisions = sorted({*parent.decisions, (point, True)})
        child = parent.branch(self._id(), point)
        self._finish(child)
        self.group.append(child)
        return child

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def test_a_chain_counts_as_concentrated_on_one_root():
    """root -> child -> grandchild -> ... (four branches, each forked by the previous one): by parent the
    branches sit on four trajectories (spread: top-3 share 3/4); by root all four sit on one tree."""
    tree = Tree()
    a, _b, _c, _d = (tree.root() for _ in range(4))
    node = a
    for step in range(4):
        node = tree.branch(node, step)
    stats = compute_stats([tree.group])
    assert list(root_branch_shares(tree.group)) == [1.0, 0.0, 0.0, 0.0]
    assert stats.branch_roots == 1.0
    assert stats.max_root_branch_share == 1.0
    assert stats.effective_branch_roots == 1.0
    assert stats.top3_branch_fraction == 1.0
    assert parent_counts(tree.group) == [1, 1, 1, 1]
    assert stats.top3_parent_branch_fraction == 0.75
    # The chain branched at four consecutive tool results.
    assert node.lineage == [True, True, True, True]
    assert stats.longest_branch_run == 4


def parent_counts(group):
    return sorted(Counter(t.parent_id for t in group if not t.is_global).values(), reverse=True)


def test_spread_and_concentrated_groups_against_hand_counts():
    # Group 0: six roots; root 0 gets 4 branches (a chain of 2 + 2 siblings), roots 1 and 2 one each, root 3 one.
    t0 = Tree(0)
    roots = [t0.root() for _ in range(6)]
    c = t0.branch(roots[0], 0)
    t0.branch(c, 1)
    t0.branch(roots[0], 1)
    t0.branch(roots[0], 2)
    for r in roots[1:4]:
        t0.branch(r, 0)
    # Group 1: two roots, one branch each.
    t1 = Tree(1)
    r0, r1 = t1.root(), t1.root()
    t1.branch(r0, 2)
    t1.branch(r1, 2)
    # Group 2: no branches (left out of the per-group means).
    t2 = Tree(2)
    t2.root()
    groups = [t0.group, t1.group, t2.group]
    stats = compute_stats(groups)
    shares0 = np.array([4, 1, 1, 1, 0, 0]) / 7
    shares1 = np.array([1, 1]) / 2
    assert np.allclose(root_branch_shares(t0.group), shares0)
    assert np.allclose(root_branch_shares(t1.group), shares1)
    assert stats.branch_roots == pytest.approx((4 + 2) / 2)
    assert stats.max_root_branch_share == pytest.approx((4 / 7 + 1 / 2) / 2)
    assert stats.effective_branch_roots == pytest.approx((1 / np.sum(shares0**2) + 2.0) / 2)
    # Top-3 by root: group 0 has 6 of 7 branches on its top-3 trees, group 1 both of 2.
    assert stats.top3_branch_fraction == pytest.approx((6 + 2) / 9)
    assert top3_branch_fraction(groups, by="root") == stats.top3_branch_fraction
    # By parent: group 0's parents are root0 (3), c (1), roots 1-3 (1 each): top 3 hold 5 of 7.
    assert stats.top3_parent_branch_fraction == pytest.approx((5 + 2) / 9)
    # Lineage runs: per trajectory, the longest run of consecutive forked decisions on its lineage.
    runs = {t.traj_id: t for g in groups for t in g}
    expected = [max_run(t.lineage) for t in runs.values()]
    assert stats.mean_lineage_branch_run == pytest.approx(np.mean(expected))
    assert stats.longest_branch_run == max(expected) == 3  # root 0 forked at its first three results


def max_run(flags):
    best = run = 0
    for f in flags:
        run = run + 1 if f else 0
        best = max(best, run)
    return best


def test_no_branches_gives_nan_concentration_and_bad_trees_raise():
    tree = Tree()
    tree.root()
    stats = compute_stats([tree.group])
    for name in ("top3_branch_fraction", "top3_parent_branch_fraction", "branch_roots", "max_root_branch_share",
                 "effective_branch_roots"):
        assert math.isnan(getattr(stats, name)), name
    assert stats.longest_branch_run == 0 and stats.mean_lineage_branch_run == 0.0
    with pytest.raises(ValueError, match="without branches"):
        root_branch_shares(tree.group)
    orphan = Tree()
    orphan.branch(Tree().root(), 0)  # the root lives in another group
    with pytest.raises(ValueError, match="root_id"):
        root_branch_shares(orphan.group)
    with pytest.raises(ValueError, match="by must be"):
        top3_branch_fraction([tree.group], by="child")
    assert "branch_roots" in stats.as_dict()

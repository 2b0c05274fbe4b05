"""Tree statistics every rollout reports (spec section 2.4), plus forward-token accounting.

The collapse measure is `top3_branch_fraction`: for each prompt, the branches
on its three most-branched trees, summed over prompts and divided by all
branches (ARPO's paper value: 93.4%). A branch is credited to the global
trajectory (root) whose tree holds it: a root -> child -> grandchild chain is
one concentrated tree. `top3_parent_branch_fraction` keeps the older measure
that credits the trajectory that forked it, which counts such a chain as
spread out. Since the top-3 share of a group with three or fewer roots is 1
whatever happens, the per-group measures below are normalised by the group's
branch count: `max_root_branch_share` (the largest tree's share of the group's
branches), `effective_branch_roots` (1 / sum of squared shares: 1 when one
root takes every branch, r when r roots share them equally) and
`branch_roots` (roots that received any branch); each is a mean over the
groups that branched (NaN when none did). `mean_lineage_branch_run` is the
longest run of consecutive branchings along each trajectory's lineage,
averaged over trajectories, and `longest_branch_run` its maximum.

The statistics of the trees (`STRUCTURE_STATS`) are ratios of sums over the
groups, and one maximum: `tree_parts` holds those sums, parts of disjoint
batches add up (`+`) to the sums of all their groups, and `tree_stats` makes
the statistics of them. So the statistics of groups held by several processes,
or kept from several rollouts (DAPO), are those `compute_stats` gives on all
of the groups together (`training/rollout_step_metrics.py`). The other
numeric fields count the work of the rollout calls (`runs`): tokens computed,
tool calls made, rounds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from aepo_jax.agent.trajectory import Trajectory
from aepo_jax.rollout.critical_path import rollout_tool_path


@dataclass
class RolloutStats:
    num_prompts: int
    trajectories_per_prompt: float
    num_global: int
    num_branch: int
    branches_per_trajectory: float  # children forked per trajectory
    top3_branch_fraction: float  # by the root whose tree holds the branch; nan when there are no branches
    top3_parent_branch_fraction: float  # by the trajectory that forked the branch (the older measure)
    branch_roots: float  # roots that received branches, mean over groups that branched
    max_root_branch_share: float  # largest tree's share of its group's branches, mean over groups
    effective_branch_roots: float  # 1 / sum(share^2) over a group's roots, mean over groups
    longest_branch_run: int  # longest chain of consecutive branch decisions
    mean_lineage_branch_run: float  # longest consecutive-branch run per lineage, mean over trajectories
    tool_calls_per_trajectory: float
    mean_segment_entropy: float  # over each trajectory's own segments (nan if none)
    num_topups: int  # globals started after the initial ones
    end_reasons: dict[str, int] = field(default_factory=dict)
    global_budgets: list[int] | None = None  # AEPO's m per prompt
    branch_decisions: int = 0
    rounds: int = 0
    repacks: int = 0
    prefill_tokens: int = 0
    append_tokens: int = 0
    decode_tokens: int = 0
    forward_tokens: int = 0  # computed by the generator, pre-monitoring included
    trajectory_tokens: int = 0  # prompt + response tokens over the finished trajectories
    branch_prefix_tokens: int = 0  # what re-prefilling every branch's prefix would add
    tool_calls: int = 0  # tool calls the runs made (a branch's inherited calls are not made again)
    serial_tool_calls: int = 0  # calls on the longest chain that must run one after another (critical_path.py)

    @property
    def forward_to_trajectory_ratio(self) -> float:
        return self.forward_tokens / max(self.trajectory_tokens, 1)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["forward_to_trajectory_ratio"] = self.forward_to_trajectory_ratio
        return d


def top3_branch_fraction(groups: Sequence[Sequence[Trajectory]], by: str = "root") -> float:
    """Fraction of all branches on the three most-branched trajectories of each prompt.

    `by="root"` credits a branch to the global trajectory whose tree it belongs
    to; `by="parent"` to the trajectory that forked it.
    """
    top = sum(top3_branches(group, by) for group in groups)
    total = sum(1 for group in groups for t in group if not t.is_global)
    return top / total if total else float("nan")


def top3_branches(group: Sequence[Trajectory], by: str = "root") -> int:
    """Branches of `group` on its three most-branched trajectories (see `top3_branch_fraction`)."""
    if by not in ("parent", "root"):
        raise ValueError(f"by must be 'parent' or 'root', got {by!r}")
    per_parent = Counter(t.parent_id if by == "parent" else t.root_id for t in group if not t.is_global)
    return sum(sorted(per_parent.values(), reverse=True)[:3])


def root_branch_shares(group: Sequence[Trajectory]) -> np.ndarray:
    """Each root's branches divided by the group's branch count, largest first, zeros for roots without.

    Raises:
      ValueError: when the group has no branches (there is nothing to share).
    """
    counts = Counter(t.root_id for t in group if not t.is_global)
    total = sum(counts.values())
    if total == 0:
        raise ValueError("root_branch_shares of a group without branches")
    per_root = [counts.get(t.traj_id, 0) for t in group if t.is_global]
    if sum(per_root) != total:
        raise ValueError("a branch's root_id is not a global trajectory of its group")
    return np.sort(np.asarray(per_root, np.float64))[::-1] / total


def root_concentration(groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
    """`branch_roots`, `max_root_branch_share`, `effective_branch_roots`: means over groups that branched."""
    stats = tree_stats(tree_parts(groups))
    return {k: stats[k] for k in ("branch_roots", "max_root_branch_share", "effective_branch_roots")}


def longest_run(flags: Sequence[bool]) -> int:
    best = run = 0
    for flag in flags:
        run = run + 1 if flag else 0
        best = max(best, run)
    return best


@dataclass(frozen=True)
class TreeParts:
    """The sums over a batch's groups that its tree statistics are ratios of, and the longest run (a
    maximum). `a + b` are the parts of both batches together; `TreeParts()` those of no groups."""

    num_prompts: int = 0
    num_trajectories: int = 0
    num_branch: int = 0
    top3_root_branches: int = 0  # over groups, branches on the three most-branched roots
    top3_parent_branches: int = 0
    branched_groups: int = 0  # groups with a branch: the concentration means' denominator
    branch_roots_sum: float = 0.0
    max_root_branch_share_sum: float = 0.0
    effective_branch_roots_sum: float = 0.0
    lineage_branch_run_sum: int = 0
    longest_branch_run: int = 0  # a maximum, not a sum
    tool_steps: int = 0  # tool steps of every trajectory (a branch's inherited ones included)
    segment_entropy_sum: float = 0.0  # over each trajectory's own segments
    segments: int = 0

    def __add__(self, other: TreeParts) -> TreeParts:
        combine = {f.name: (max if f.name == "longest_branch_run" else sum) for f in fields(self)}
        return TreeParts(**{k: op((getattr(self, k), getattr(other, k))) for k, op in combine.items()})


def tree_parts(groups: Sequence[Sequence[Trajectory]]) -> TreeParts:
    """The sums of `groups` that `tree_stats` needs (no groups: all zero)."""
    trajs = [t for g in groups for t in g]
    shares = [root_branch_shares(g) for g in groups if any(not t.is_global for t in g)]
    runs = [longest_run(t.lineage) for t in trajs]
    own_entropy = [s.entropy for t in trajs for s in t.segments if t.branch_point is None or s.start >= t.branch_point]
    return TreeParts(
        num_prompts=len(groups),
        num_trajectories=len(trajs),
        num_branch=sum(1 for t in trajs if not t.is_global),
        top3_root_branches=sum(top3_branches(g, by="root") for g in groups),
        top3_parent_branches=sum(top3_branches(g, by="parent") for g in groups),
        branched_groups=len(shares),
        branch_roots_sum=float(np.sum([np.count_nonzero(s) for s in shares])),
        max_root_branch_share_sum=float(np.sum([s[0] for s in shares])),
        effective_branch_roots_sum=float(np.sum([1.0 / np.sum(s**2) for s in shares])),
        lineage_branch_run_sum=sum(runs),
        longest_branch_run=max(runs, default=0),
        tool_steps=sum(t.num_tool_calls for t in trajs),
        segment_entropy_sum=float(np.sum(own_entropy)),
        segments=len(own_entropy),
    )


def _ratio(num: float, den: float) -> float:
    return num / den if den else float("nan")


def tree_stats(parts: TreeParts) -> dict[str, float | int]:
    """The tree statistics (`STRUCTURE_STATS`) of the groups `parts` sums; NaN for a ratio over none."""
    p = parts
    return {
        "num_prompts": p.num_prompts,
        "trajectories_per_prompt": _ratio(p.num_trajectories, p.num_prompts),
        "num_global": p.num_trajectories - p.num_branch,
        "num_branch": p.num_branch,
        "branches_per_trajectory": _ratio(p.num_branch, p.num_trajectories),
        "top3_branch_fraction": _ratio(p.top3_root_branches, p.num_branch),
        "top3_parent_branch_fraction": _ratio(p.top3_parent_branches, p.num_branch),
        "branch_roots": _ratio(p.branch_roots_sum, p.branched_groups),
        "max_root_branch_share": _ratio(p.max_root_branch_share_sum, p.branched_groups),
        "effective_branch_roots": _ratio(p.effective_branch_roots_sum, p.branched_groups),
        "longest_branch_run": p.longest_branch_run,
        "mean_lineage_branch_run": _ratio(p.lineage_branch_run_sum, p.num_trajectories),
        "tool_calls_per_trajectory": _ratio(p.tool_steps, p.num_trajectories),
        "mean_segment_entropy": _ratio(p.segment_entropy_sum, p.segments),
    }


# Statistics of the groups themselves (spec 2.4), as opposed to counters of the work that produced them.
STRUCTURE_STATS = frozenset(tree_stats(TreeParts())) | {"end_reasons", "global_budgets"}


def compute_stats(
    groups: Sequence[Sequence[Trajectory]],
    runs: Sequence[object] = (),
    global_budgets: Sequence[int] | None = None,
    decisions: Sequence[dict] | None = None,
) -> RolloutStats:
    """Statistics of one batch of groups; `runs` are the loop results whose counters and events to add up."""
    trajs = [t for g in groups for t in g]
    if not trajs:
        raise ValueError("compute_stats needs at least one trajectory")
    branches = [t for t in trajs if not t.is_global]
    counters: Counter = Counter()
    path = rollout_tool_path(runs)
    rounds = repacks = topups = 0
    for run in runs:
        counters.update(run.counters)
        rounds += run.rounds
        repacks += run.repacks
        topups += sum(1 for e in run.events if e.kind == "topup")
    return RolloutStats(
        **tree_stats(tree_parts(groups)),
        num_topups=topups,
        end_reasons=dict(Counter(str(t.stop_reason) for t in trajs)),
        global_budgets=list(global_budgets) if global_budgets is not None else None,
        branch_decisions=len(decisions) if decisions is not None else 0,
        rounds=rounds,
        repacks=repacks,
        prefill_tokens=int(counters["prefill_tokens"]),
        append_tokens=int(counters["append_tokens"]),
        decode_tokens=int(counters["decode_tokens"]),
        forward_tokens=int(counters["forward_tokens"]),
        trajectory_tokens=sum(t.total_length for t in trajs),
        branch_prefix_tokens=sum(len(t.prompt_ids) + int(t.branch_point) for t in branches),
        tool_calls=path.total,
        serial_tool_calls=path.serial,
    )

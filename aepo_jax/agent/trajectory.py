"""One agent trajectory: token ids, masks, per-token sampler statistics and tree links.

Token-in, token-out (spec section 4): `response_ids` is exactly the sampled ids
interleaved with the tokenised tool results, so the trainer scores the same ids
the sampler produced. `mask` is 1 on generated tokens and 0 on tool-result
tokens; tool-result tokens carry `logp_old = 0` and `entropy = 0`.

Tree links (spec section 2.2-2.4): a branch records its parent, the response
index it was forked at (always the end of a tool result), the root of its
lineage and the chain of branch decisions along that lineage, which is what the
consecutive-branch penalty counts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

# Why a trajectory ended.
END_ANSWER = "answer"  # stopped after a final answer (`</answer>` or EOS after one)
END_EOS = "eos"  # EOS without an answer
END_LENGTH = "length"  # response token budget reached
END_CONTEXT = "context_length"  # prompt + response would exceed the context
END_TOOL_LIMIT = "tool_limit"  # asked for a tool call beyond `max_tool_calls`
END_REASONS = (END_ANSWER, END_EOS, END_LENGTH, END_CONTEXT, END_TOOL_LIMIT)


@dataclass
class Segment:
    """Generated text between two tool results (or prompt to first call), spec section 1.

    `start`/`end` are response indices (end exclusive); `entropy` is the segment
    entropy over its first K tokens; `after_tool` is True when the segment
    follows a tool result (False for the first segment, which follows the prompt).
    """

    start: int
    end: int
    entropy: float
    after_tool: bool


@dataclass
class ToolStep:
    """One tool call: the tag, the content executed, the result text and whether it worked."""

    tag: str
    content: str
    result_text: str
    ok: bool
    result_start: int  # response index of the first result token
    result_end: int  # response index one past the last result token (an anchor state)


@dataclass
class Trajectory:
    """A single rollout of one prompt; see the module docstring for the conventions."""

    traj_id: int
    prompt_index: int
    prompt_ids: list[int]
    root_id: int
    is_global: bool = True
    parent_id: int | None = None
    branch_point: int | None = None  # response index where this branch was forked
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logp_old: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    tool_steps: list[ToolStep] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    # Branch decisions along the lineage, in order: (tool-result end, forked?).
    # A branch inherits its parent's decisions before the branch point.
    decisions: list[tuple[int, bool]] = field(default_factory=list)
    h_init: float | None = None  # entropy of the lineage root's first segment (spec 2.2)
    stop_reason: str | None = None
    # A tool call that ran but whose result did not fit (the trajectory ended there, by length or
    # context): made, so counted as made (`rollout.critical_path`), though not a tool step.
    unappended_tool_calls: int = 0
    # Whether its answer is correct as evaluation decides (`experiment.Environment.reward_fn` sets it while
    # scoring; the trainer's `accuracy`); None: no reward recorded one.
    correct: bool | None = None

    @property
    def finished(self) -> bool:
        return self.stop_reason is not None

    @property
    def num_tool_calls(self) -> int:
        return len(self.tool_steps)

    @property
    def tool_result_ends(self) -> list[int]:
        """Response indices right after each tool result: anchor states (GiGPO) and shared prefixes (ARPO)."""
        return [s.result_end for s in self.tool_steps]

    @property
    def total_length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def lineage(self) -> list[bool]:
        """The chain of branch decisions from the root to this node (True = forked)."""
        return [forked for _, forked in self.decisions]

    @property
    def consecutive_branchings(self) -> int:
        """Number of trailing branch decisions that forked, the `l` of the lineage-scope penalty (spec 2.3)."""
        run = 0
        for branched in reversed(self.lineage):
            if not branched:
                break
            run += 1
        return run

    def add_generated(self, ids: list[int], logp: list[float], entropy: list[float]) -> None:
        """Append sampled tokens (mask 1)."""
        if not (len(ids) == len(logp) == len(entropy)):
            raise ValueError(f"ids/logp/entropy lengths differ: {len(ids)}, {len(logp)}, {len(entropy)}")
        self.response_ids.extend(int(t) for t in ids)
        self.mask.extend([1] * len(ids))
        self.logp_old.extend(float(x) for x in logp)
        self.entropy.extend(float(x) for x in entropy)

    def add_tool_result(self, ids: list[int]) -> None:
        """Append tool-result tokens (mask 0, no log-prob or entropy)."""
        self.response_ids.extend(int(t) for t in ids)
        self.mask.extend([0] * len(ids))
        self.logp_old.extend([0.0] * len(ids))
        self.entropy.extend([0.0] * len(ids))

    def branch(self, traj_id: int, branch_point: int) -> Trajectory:
        """A new trajectory sharing this one's prefix up to response index `branch_point`.

        The child copies ids, masks, log-probs, entropies, tool steps and segments
        that end at or before the branch point; its decisions are this one's
        decisions before the branch point, plus the branch decision itself (True).
        """
        if branch_point not in self.tool_result_ends:
            raise ValueError(f"branch point {branch_point} is not the end of a tool result: {self.tool_result_ends}")
        steps = [s for s in self.tool_steps if s.result_end <= branch_point]
        child = Trajectory(
            traj_id=traj_id,
            prompt_index=self.prompt_index,
            prompt_ids=list(self.prompt_ids),
            root_id=self.root_id,
            is_global=False,
            parent_id=self.traj_id,
            branch_point=branch_point,
            response_ids=self.response_ids[:branch_point],
            mask=self.mask[:branch_point],
            logp_old=self.logp_old[:branch_point],
            entropy=self.entropy[:branch_point],
            tool_steps=copy.deepcopy(steps),
            segments=[copy.copy(s) for s in self.segments if s.end <= branch_point],
            decisions=[d for d in self.decisions if d[0] < branch_point] + [(branch_point, True)],
            h_init=self.h_init,
        )
        return child

    def as_arrays(self) -> dict[str, np.ndarray]:
        """Numpy views for the trainer: prompt/response ids, mask, logp_old, entropy."""
        return {
            "prompt_ids": np.asarray(self.prompt_ids, np.int32),
            "response_ids": np.asarray(self.response_ids, np.int32),
            "mask": np.asarray(self.mask, np.int32),
            "logp_old": np.asarray(self.logp_old, np.float32),
            "entropy": np.asarray(self.entropy, np.float32),
        }


def tree_shared_prefixes(group: list[Trajectory]) -> np.ndarray:
    """`int32[n, n]`: response tokens trajectories i and j share through the rollout tree (ARPO, spec §3.2).

    A branch copies its parent's response up to its `branch_point` and samples
    on independently, so two trajectories of one tree share the response up
    to where their lineages part: below their lowest common ancestor `a`,
    the branch point of the child of `a` on each side (the smaller of the
    two); when one is the other's ancestor, the branch point of the child on
    the descendant's side. Trajectories of different roots share no response
    token (their prompt is shared, but it is not part of the response). The
    diagonal is each trajectory's response length. Unlike comparing token ids,
    prefixes that coincide by chance do not count. A parent missing from
    `group` ends the lineage there.
    """
    by_id = {t.traj_id: t for t in group}

    def chain(t: Trajectory) -> list[Trajectory]:
        """t, its parent, ..., the root of its lineage (within the group)."""
        out = [t]
        while getattr(out[-1], "parent_id", None) in by_id:
            out.append(by_id[out[-1].parent_id])
        return out

    chains = [chain(t) for t in group]
    n = len(group)
    shared = np.zeros((n, n), np.int32)
    for i in range(n):
        shared[i, i] = len(group[i].response_ids)
        for j in range(i + 1, n):
            ids_j = [t.traj_id for t in chains[j]]
            common = next((k for k, t in enumerate(chains[i]) if t.traj_id in ids_j), None)
            if common is None:
                continue  # different roots
            below_i = chains[i][common - 1].branch_point if common > 0 else None  # child of the LCA towards i
            k_j = ids_j.index(chains[i][common].traj_id)
            below_j = chains[j][k_j - 1].branch_point if k_j > 0 else None
            points = [int(p) for p in (below_i, below_j) if p is not None]
            shared[i, j] = shared[j, i] = min(points)
    return shared

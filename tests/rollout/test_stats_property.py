"""Every spec §2.4 statistic, rebuilt from the raw trajectories of random scripted ARPO / AEPO rollouts.

The reference below reads only what a trajectory holds as tokens and tree links (response ids, masks,
entropies, parent ids, branch points, the count of calls whose result did not fit) and the tool-call
rule of spec §4 (`parse_last_tool_call`), never the code's own bookkeeping (`decisions`, `segments`,
`tool_steps`, `root_id`, `is_global`). `compute_stats` and `rollout_metrics` must agree with it under
both schedules, with branching, top-ups, malformed closings and length limits.
"""

from __future__ import annotations

import math
from collections import Counter
from types import SimpleNamespace

import jax
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aepo_jax.agent.loop import SCHEDULES, AgentLoop, LoopConfig
from aepo_jax.agent.protocol import parse_last_tool_call
from aepo_jax.agent.scripted import (
    ByteTokenizer,
    ScriptedGenerator,
    ScriptedSegment,
    tool_use_script,
)
from aepo_jax.agent.trajectory import Trajectory
from aepo_jax.rollout.strategies import RolloutConfig, rollout
from aepo_jax.training.metric_keys import TOOL_CALLS_MADE
from aepo_jax.training.rollout_batch import rollout_metrics
from tests.property_budget import examples

TOK = ByteTokenizer()
K = 5  # entropy tokens per segment
MALFORMED = "<think>r</think>oops</search>"  # a closing tag without a complete call: no tool runs


class EchoTools:
    def run_many(self, calls):
        return [SimpleNamespace(text=f"{c.tag} says {c.content}", ok=True) for c in calls]


def spans(mask: list[int], value: int) -> list[tuple[int, int]]:
    """Maximal runs [start, end) of `value` in `mask`."""
    out, start = [], None
    for i, m in enumerate([*mask, None]):
        if m == value and start is None:
            start = i
        elif m != value and start is not None:
            out.append((start, i))
            start = None
    return out


def chain(traj: Trajectory, by_id: dict[int, Trajectory]) -> list[Trajectory]:
    """traj, its parent, ..., its root, by parent ids."""
    out = [traj]
    while out[-1].parent_id is not None:
        out.append(by_id[out[-1].parent_id])
    return out


def branch_runs(trajs: list[Trajectory], by_id: dict[int, Trajectory]) -> list[int]:
    """Per trajectory, the longest run of consecutive tool-result ends along its response at which the
    trajectory owning that part of the response (deepest on its chain, forked before it) forked a child."""
    forks = {(t.parent_id, t.branch_point) for t in trajs if t.parent_id is not None}
    runs = []
    for t in trajs:
        lineage = chain(t, by_id)
        best = run = 0
        for _, end in spans(t.mask, 0):
            owner = next(a for a in lineage if (a.branch_point or 0) < end)
            run = run + 1 if (owner.traj_id, end) in forks else 0
            best = max(best, run)
        runs.append(best)
    return runs


def calls_made(traj: Trajectory) -> int:
    """Tool results after the branch point whose generated segment holds a complete call (spec §4), plus
    the calls that ran but whose result did not fit."""
    generated = spans(traj.mask, 1)
    made = 0
    for start, _ in spans(traj.mask, 0):
        if start < (traj.branch_point or 0):
            continue  # inherited: the ancestor made it
        seg_start, seg_end = max((a, b) for a, b in generated if b <= start)
        made += parse_last_tool_call(TOK.decode(traj.response_ids[seg_start:seg_end])) is not None
    return made + traj.unappended_tool_calls


def reference_stats(groups: list[list[Trajectory]]) -> dict[str, float]:
    """The spec §2.4 statistics from raw trajectories (see the module docstring)."""
    trajs = [t for g in groups for t in g]
    by_id = {t.traj_id: t for t in trajs}
    branches = [t for t in trajs if t.parent_id is not None]
    top = 0
    for group in groups:
        per_root = Counter(chain(t, by_id)[-1].traj_id for t in group if t.parent_id is not None)
        top += sum(sorted(per_root.values(), reverse=True)[:3])
    runs = branch_runs(trajs, by_id)
    entropies = [float(np.mean(t.entropy[a:b][:K])) for t in trajs for a, b in spans(t.mask, 1)
                 if a >= (t.branch_point or 0)]
    return {
        "trajectories_per_prompt": len(trajs) / len(groups),
        "num_global": len(trajs) - len(branches),
        "num_branch": len(branches),
        "branches_per_trajectory": len(branches) / len(trajs),
        "top3_branch_fraction": top / len(branches) if branches else math.nan,
        "longest_branch_run": max(runs),
        "mean_lineage_branch_run": float(np.mean(runs)),
        "tool_calls_per_trajectory": float(np.mean([len(spans(t.mask, 0)) for t in trajs])),  # tool steps
        "tool_calls_made_per_trajectory": sum(calls_made(t) for t in trajs) / len(trajs),
        "mean_segment_entropy": float(np.mean(entropies)) if entropies else math.nan,
    }


def script_with_malformed(tool_probability: float, malformed: float, entropy_scale: float):
    """`tool_use_script`, with some tool-call segments replaced by a malformed closing."""
    base = tool_use_script(TOK, tool_probability, max_calls=5, entropy=lambda r: r.uniform(0, entropy_scale))

    def script(ids, rng):
        seg = base(ids, rng)
        if "</answer>" not in TOK.decode(seg.tokens) and rng.uniform() < malformed:
            tokens = TOK.encode(MALFORMED)
            return ScriptedSegment(tokens, seg.entropy[:1] * len(tokens), "stop")
        return seg

    return script


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or abs(a - b) < 1e-9


@settings(max_examples=examples(80), suppress_health_check=[HealthCheck.too_slow])
# Bushy trees (every decision branches): lineage runs of 4 and 3, malformed closings, several roots.
@example(strategy="arpo", schedule="rounds", num_prompts=3, k=11, width=2, tau=0.0, reuse=True, scope="lineage",
         tool_probability=0.8, malformed=0.15, entropy_scale=3.0, max_response=400, chunked=True, seed=25)
@example(strategy="aepo", schedule="continuous", num_prompts=3, k=11, width=2, tau=0.0, reuse=False,
         scope="prompt", tool_probability=0.8, malformed=0.15, entropy_scale=3.0, max_response=400, chunked=False,
         seed=4)
@given(
    strategy=st.sampled_from(["arpo", "aepo"]),
    schedule=st.sampled_from(SCHEDULES),
    num_prompts=st.integers(1, 3),
    k=st.integers(2, 11),
    width=st.integers(2, 3),
    tau=st.floats(0.0, 1.0),
    reuse=st.booleans(),
    scope=st.sampled_from(["lineage", "prompt"]),
    tool_probability=st.floats(0.3, 1.0),
    malformed=st.sampled_from([0.0, 0.15, 0.3]),
    entropy_scale=st.floats(0.5, 3.0),
    max_response=st.integers(60, 400),
    chunked=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_compute_stats_matches_statistics_rebuilt_from_raw_trajectories(
        strategy, schedule, num_prompts, k, width, tau, reuse, scope, tool_probability, malformed, entropy_scale,
        max_response, chunked, seed):
    loop = AgentLoop(ScriptedGenerator(script_with_malformed(tool_probability, malformed, entropy_scale), seed=seed),
                     TOK, EchoTools(),
                     LoopConfig(max_tool_calls=4, max_response_tokens=max_response, max_context_len=4000,
                                schedule=schedule, entropy_tokens=K,
                                max_segment_tokens=25 if chunked and schedule == "rounds" else None))
    config = RolloutConfig(strategy=strategy, branch_threshold=tau, premonitor_reuse=reuse, penalty_scope=scope,
                           entropy_tokens=K, branch_width=width)
    groups, stats = rollout([TOK.encode(f"q{i}?") for i in range(num_prompts)], k, loop=loop, config=config,
                            rng=np.random.default_rng(seed), key=jax.random.key(seed))
    want = reference_stats(groups)
    got = {**stats.as_dict(), TOOL_CALLS_MADE: rollout_metrics(groups, [[0.0] * len(g) for g in groups])[TOOL_CALLS_MADE]}
    wrong = {key: (got[key], value) for key, value in want.items() if not same(got[key], value)}
    assert not wrong, f"(code, reference) {wrong}"
    made = want[TOOL_CALLS_MADE] * sum(len(g) for g in groups)
    if strategy == "arpo" or reuse:  # every call made is in the groups (no pre-monitoring sample dropped)
        assert stats.tool_calls == round(made)
    else:
        assert stats.tool_calls >= round(made)

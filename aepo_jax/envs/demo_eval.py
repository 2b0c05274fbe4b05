"""Held-out evaluation of a demo policy (spec §6): pass@k, tool use, length, entropy, branch concentration.

`n` independent samples per held-out question give pass@1 (their mean) and the
unbiased pass@k; each sample is a full agent-loop rollout with the real tools,
scored with the math-equivalence reward's correctness. One extra tree rollout
(the AEPO strategy) over a few questions measures where branches go: the share
of branches on the three most-branched trajectories of each question (spec §2.4),
and the policy's segment entropy. Both go through `aepo_jax.evaluation.driver`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np

from aepo_jax.agent.loop import AgentLoop, LoopConfig, agent_stop_sequences
from aepo_jax.rollout.strategies import RolloutConfig
from aepo_jax.sampling import Sampler, SamplingParams


def make_agent_loop(cfg: ml_collections.ConfigDict, demo: Any, graphdef: Any, params: Any,
                    temperature: float, seed: int) -> AgentLoop:
    """A sampler over `params` and the agent loop with the demo's tools and limits.

    The cache gets twice the context limit: rows advance in lockstep and
    prefill/append blocks round up to powers of two, so a row within its own
    limit can still need slots past `max_prompt_len + max_response_len`.
    """
    r = cfg.rollout
    sampler = Sampler(graphdef, params, eos_ids=[demo.tokenizer.eos_id], pad_id=demo.tokenizer.pad_id,
                      stop_sequences=agent_stop_sequences(demo.tokenizer),
                      params=SamplingParams(temperature=float(temperature)),
                      max_cache_len=2 * (int(r.max_prompt_len) + int(r.max_response_len)), seed=seed)
    return AgentLoop(sampler, demo.tokenizer, demo.tools, LoopConfig(
        max_tool_calls=int(r.max_tool_calls), max_response_tokens=int(r.max_response_len),
        max_context_len=int(r.max_prompt_len) + int(r.max_response_len), entropy_tokens=int(r.entropy_tokens)))


def tree_rollout_config(cfg: ml_collections.ConfigDict, strategy: str = "aepo") -> RolloutConfig:
    r = cfg.rollout
    return RolloutConfig(
        strategy=strategy, initial_rollouts=int(r.initial_rollouts), entropy_weight=float(r.entropy_weight),
        branch_threshold=float(r.branch_threshold), branch_width=int(r.branch_width),
        entropy_tokens=int(r.entropy_tokens), dynamic_budget=bool(r.dynamic_budget), beta=float(r.beta),
        premonitor_reuse=bool(r.premonitor_reuse), penalty_slope=float(r.penalty_slope),
        penalty_scope=r.penalty_scope)


def _loop_config(cfg: ml_collections.ConfigDict) -> LoopConfig:
    r = cfg.rollout
    return LoopConfig(max_tool_calls=int(r.max_tool_calls), max_response_tokens=int(r.max_response_len),
                      max_context_len=int(r.max_prompt_len) + int(r.max_response_len),
                      entropy_tokens=int(r.entropy_tokens))


def evaluate_policy(cfg: ml_collections.ConfigDict, demo: Any, graphdef: Any, params: Any,
                    examples: Sequence[dict], *, seed: int = 0, progress: bool = True,
                    tree_strategy: str = "aepo") -> dict[str, float]:
    """Metrics of `params` on `examples` through the evaluation driver (see the module docstring).

    Every value is a plain float: `pass@1..n`, `tool_calls` (per answer),
    `python_rate` and `answer_rate` (shares of answers), `response_length`
    (generated tokens), and from the tree rollout `branch_top3` (NaN when
    nothing branched) and `entropy` (mean segment entropy, spec §1).
    """
    from aepo_jax.evaluation.driver import EvalConfig, evaluate
    from aepo_jax.rewards import count_tool_calls

    e = cfg.eval
    common = {"temperature": float(e.temperature), "top_p": 1.0, "seed": seed, "loop": _loop_config(cfg),
                  "reward": cfg.reward.name, "questions_per_batch": max(1, int(e.batch_questions))}
    kwargs = {"graphdef": graphdef, "params": params, "tokenizer": demo.tokenizer, "tools": demo.tools,
                  "encode_prompt": demo.encode_prompt}
    result = evaluate(list(examples), config=EvalConfig(n=int(e.samples), **common), progress=progress, **kwargs)
    report = result.reports[-1]
    metrics = {f"pass@{k}": float(v) for k, v in report.pass_at_k.items()}
    metrics.update({
        "questions": float(len(examples)),
        "samples": float(e.samples),
        "tool_calls": float(report.tool_calls_per_question),
        "response_length": float(report.mean_response_length),
        "python_rate": float(np.mean([count_tool_calls(s["response"])["python"] > 0 for s in result.samples])),
        "answer_rate": float(np.mean([s["stop_reason"] == "answer" for s in result.samples])),
        "branch_top3": math.nan,
        "entropy": math.nan,
    })
    tree_questions = min(int(e.tree_questions), len(examples))
    if tree_questions > 0:
        tree = evaluate(list(examples[:tree_questions]), progress=False, **kwargs, config=EvalConfig(
            n=int(cfg.rollout.k), rollout=tree_rollout_config(cfg, tree_strategy), **common))
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

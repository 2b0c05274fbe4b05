"""Held-out evaluation of a demo policy (spec §6): pass@k, tool use, length, entropy, branch concentration.

`n` independent samples per held-out question give pass@1 (their mean) and the
unbiased pass@k; each sample is a full agent-loop rollout with the real tools,
scored with the math-equivalence reward's correctness. One extra tree rollout
(the AEPO strategy) over a few questions measures where branches go: the share
of branches on the three most-branched trajectories of each question (spec §2.4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from aepo_jax.agent.loop import AgentLoop, LoopConfig, agent_stop_sequences
from aepo_jax.evaluation import build_reports, score_question
from aepo_jax.rollout.strategies import RolloutConfig, rollout
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


def _mean_generated_entropy(trajs: Sequence[Any]) -> float:
    total = sum(float(np.dot(t.entropy, t.mask)) for t in trajs)
    count = sum(float(np.sum(t.mask)) for t in trajs)
    return total / max(count, 1.0)


def evaluate_policy(cfg: ml_collections.ConfigDict, demo: Any, graphdef: Any, params: Any,
                    examples: Sequence[dict], *, seed: int = 0, progress: bool = True,
                    tree_strategy: str = "aepo") -> dict[str, float]:
    """Metrics of `params` on `examples` (see the module docstring); every value is a plain float."""
    e = cfg.eval
    n = int(e.samples)
    loop = make_agent_loop(cfg, demo, graphdef, params, float(e.temperature), seed)
    key = jax.random.key(seed)
    rng = np.random.default_rng(seed)
    results, trajectories = [], []
    per_batch = max(1, int(e.batch_questions))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(examples), desc="eval", unit="question", dynamic_ncols=True)
    for start in range(0, len(examples), per_batch):
        batch = list(examples[start:start + per_batch])
        key, sub = jax.random.split(key)
        groups, _ = rollout([demo.encode_prompt(ex) for ex in batch], n, loop=loop,
                            config=RolloutConfig(strategy="independent"), rng=rng, key=sub)
        for ex, group in zip(batch, groups, strict=True):
            texts = [demo.tokenizer.decode(t.response_ids) for t in group]
            results.append(score_question(ex, texts, [int(np.sum(t.mask)) for t in group],
                                          tool_calls=[t.num_tool_calls for t in group], reward=cfg.reward.name))
            trajectories += group
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    report = build_reports(results)[-1]
    metrics = {f"pass@{k}": float(v) for k, v in report.pass_at_k.items()}
    metrics.update({
        "questions": float(len(examples)),
        "samples": float(n),
        "tool_calls": float(report.tool_calls_per_question),
        "response_length": float(report.mean_response_length),
        "python_rate": float(np.mean([any(s.tag == "python" for s in t.tool_steps) for t in trajectories])),
        "answer_rate": float(np.mean([t.stop_reason == "answer" for t in trajectories])),
        "entropy": _mean_generated_entropy(trajectories),
    })
    tree_questions = min(int(e.tree_questions), len(examples))
    metrics["branch_top3"] = math.nan
    if tree_questions > 0:
        key, sub = jax.random.split(key)
        prompts = [demo.encode_prompt(ex) for ex in examples[:tree_questions]]
        _, stats = rollout(prompts, int(cfg.rollout.k), loop=loop, config=tree_rollout_config(cfg, tree_strategy),
                           rng=rng, key=sub)
        metrics["branch_top3"] = float(stats.top3_branch_fraction)
        metrics["branches_per_question"] = float(stats.num_branch) / tree_questions
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

"""Scripted entropy scenarios for studying where the tree strategies put their branches.

`few_uncertain_lineages` is the situation the AEPO paper diagnoses in ARPO: a
few lineages meet consecutive high-entropy tool steps while the others stay
calm. Each global trajectory draws, in its first segment, whether it is
uncertain (probability `uncertain_fraction`); the draw is written into that
segment's tokens as a marker character that occurs nowhere else (not in the
prompts, not in the tool results), so every branch of the tree inherits it.
After each tool result an uncertain lineage's segment has entropy
`h_uncertain`, a calm one's `h_calm`, and first segments `h_root` (each plus
Gaussian noise). With the defaults, `gamma * dH` is +0.4 on uncertain and
-0.08 on calm lineages, so ARPO branches at about 90% and 42% of their
decisions: P does not saturate.

Pre-monitoring sees `H_root - H_tool_mean` = +0.4 from a calm sample and -2.0
from an uncertain one, so AEPO's dynamic budget gives m = 9 or 5 of k = 16:
at the default fraction its mean is 8, ARPO's fixed k/2, so full AEPO and
ARPO have the same branch budget on average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import jax
import numpy as np

from aepo_jax.agent.loop import AgentLoop, LoopConfig
from aepo_jax.agent.scripted import (
    ByteTokenizer,
    Script,
    ScriptedGenerator,
    ScriptedSegment,
)
from aepo_jax.rollout.stats import compute_stats
from aepo_jax.rollout.strategies import RolloutConfig, rollout

MARKER = "Z"  # in an uncertain lineage's first segment only


@dataclass(frozen=True)
class Scenario:
    uncertain_fraction: float = 0.25
    h_root: float = 1.5
    h_calm: float = 1.1
    h_uncertain: float = 3.5
    noise: float = 0.1
    tool_probability: float = 0.9
    max_calls: int = 6

    def __post_init__(self) -> None:
        if not 0.0 <= self.uncertain_fraction <= 1.0:
            raise ValueError(f"uncertain_fraction must be in [0, 1], got {self.uncertain_fraction}")
        if not 0.0 <= self.tool_probability <= 1.0:
            raise ValueError(f"tool_probability must be in [0, 1], got {self.tool_probability}")
        if self.max_calls < 1 or self.noise < 0:
            raise ValueError(f"need max_calls >= 1 and noise >= 0, got {self.max_calls}, {self.noise}")


def is_uncertain(tokenizer: ByteTokenizer, ids: list[int]) -> bool:
    """True when the lineage holding `ids` drew uncertain (its first segment carries the marker)."""
    return tokenizer.encode(MARKER)[0] in ids


def few_uncertain_lineages(tokenizer: ByteTokenizer, scenario: Scenario | None = None) -> Script:
    """The script of the scenario (see the module docstring); prompts must not contain `MARKER`."""
    scenario = scenario or Scenario()
    result_id = tokenizer.token_to_id("<result>")

    def script(ids: list[int], rng: np.random.Generator) -> ScriptedSegment:
        calls = ids.count(result_id)
        if calls == 0:
            uncertain = rng.uniform() < scenario.uncertain_fraction
            think, h = "<think>" + (MARKER if uncertain else "c") + "</think>", scenario.h_root
        else:
            think = "<think></think>"
            h = scenario.h_uncertain if is_uncertain(tokenizer, ids) else scenario.h_calm
        h = max(0.0, h + scenario.noise * rng.normal())
        tool = calls < scenario.max_calls and rng.uniform() < scenario.tool_probability
        tokens = tokenizer.encode(think + ("<search>q</search>" if tool else "<answer>\\boxed{1}</answer>"))
        return ScriptedSegment(tokens, [h] * len(tokens), "stop")

    return script


# ----- measuring the strategies on the scenario (benchmarks/branch_scenario.py, tests) -----------

TOK = ByteTokenizer()
METRICS = (  # (key, header)
    ("top3_branch_fraction", "top-3 root share"),
    ("max_root_branch_share", "largest root share"),
    ("branch_roots", "roots w/ branches"),
    ("effective_branch_roots", "effective roots"),
    ("mean_lineage_branch_run", "lineage run (mean)"),
    ("longest_branch_run", "lineage run (max)"),
    ("top3_parent_branch_fraction", "top-3 parent share"),
    ("uncertain_tree_share", "branches in uncertain trees"),
    ("branch_rate", "decisions that branch"),
    ("num_branch", "branches / group"),
    ("global_m", "m"),
)


def configs(k: int) -> dict[str, RolloutConfig]:
    half = k // 2
    out = {"arpo": RolloutConfig(strategy="arpo", initial_rollouts=half)}
    for slope in (0.05, 0.3):
        for scope in ("lineage", "prompt"):
            tag = f"{scope}, slope {slope}"
            out[f"aepo penalty only ({tag})"] = RolloutConfig(
                strategy="aepo", dynamic_budget=False, initial_rollouts=half, penalty_scope=scope, penalty_slope=slope)
            out[f"aepo full ({tag})"] = RolloutConfig(strategy="aepo", penalty_scope=scope, penalty_slope=slope)
    return out


def prompts(n: int, seed: int) -> list[list[int]]:
    return [TOK.encode(f"question {seed}-{i}?") for i in range(n)]


def run_seed(config: RolloutConfig, seed: int, k: int, num_prompts: int, scenario: Scenario) -> dict[str, float]:
    """One seeded rollout of `num_prompts` groups; the seed fixes the script, alpha draws and sampling key."""
    loop = AgentLoop(ScriptedGenerator(few_uncertain_lineages(TOK, scenario), seed=seed), TOK, _EchoTools(),
                     LoopConfig(max_tool_calls=scenario.max_calls, max_response_tokens=2000, max_context_len=4000))
    groups, stats = rollout(prompts(num_prompts, seed), k, loop=loop, config=config, rng=np.random.default_rng(seed),
                            key=jax.random.key(seed))
    recomputed = compute_stats(groups).as_dict()
    out = {key: float(recomputed[key]) for key, _ in METRICS if key in recomputed}
    trajs = [t for g in groups for t in g]
    branches = [t for t in trajs if not t.is_global]
    by_id = {t.traj_id: t for t in trajs}
    uncertain = [is_uncertain(TOK, by_id[t.root_id].response_ids) for t in branches]
    out["uncertain_tree_share"] = float(np.mean(uncertain)) if branches else math.nan
    own = [flag for t in trajs for point, flag in t.decisions if t.branch_point is None or point > t.branch_point]
    out["branch_rate"] = float(np.mean(own)) if own else math.nan  # each decision once, on its trajectory
    out["num_branch"] = len(branches) / len(groups)
    out["global_m"] = float(np.mean(stats.global_budgets)) if stats.global_budgets else float(config.initial_for(k))
    return out


class _EchoTools:
    """Answers every call with its own content: tool results carry no marker and no signal."""

    def run_many(self, calls):
        return [SimpleNamespace(text=f"{c.tag} says {c.content}", ok=True) for c in calls]


def measure(seeds: int, k: int = 16, num_prompts: int = 4, scenario: Scenario | None = None,
            names: list[str] | None = None) -> dict[str, dict[str, list[float]]]:
    """config name -> metric -> per-seed values."""
    scenario = scenario or Scenario()
    out: dict[str, dict[str, list[float]]] = {}
    for name, config in configs(k).items():
        if names is not None and name not in names:
            continue
        per_seed = [run_seed(config, seed, k, num_prompts, scenario) for seed in range(seeds)]
        out[name] = {key: [s[key] for s in per_seed] for key, _ in METRICS}
    return out

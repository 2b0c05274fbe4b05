"""The three rollout strategies behind one interface (spec section 2).

    groups, stats = rollout(prompts, k, loop=loop, config=RolloutConfig(strategy="aepo"), rng=rng, key=key)

`groups[i]` holds exactly `k` finished trajectories of prompt `i`, one
advantage group; `stats` are the tree statistics of spec section 2.4.
- `independent`: `k` global samples per prompt (2.1).
- `arpo`: `initial_rollouts` globals, entropy-change branching, top-ups (2.2).
- `aepo`: ARPO plus entropy pre-monitoring for the global budget and the
  consecutive-branch penalty (2.3).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np

from aepo_jax.agent.entropy import ENTROPY_MEASURES
from aepo_jax.agent.loop import AgentLoop, LoopResult
from aepo_jax.agent.loop_config import DECISION_ENTROPY
from aepo_jax.agent.trajectory import Trajectory
from aepo_jax.rollout.branching import COUNTER_UPDATES, PENALTY_SCOPES, decide_branch
from aepo_jax.rollout.budget import global_sample_budget, premonitor_tool_entropy
from aepo_jax.rollout.stats import RolloutStats, compute_stats

STRATEGIES = ("independent", "arpo", "aepo")


@dataclass(frozen=True)
class RolloutConfig:
    """Strategy parameters; names and defaults follow spec sections 2.2-2.3 and 7."""

    strategy: str = "aepo"
    initial_rollouts: int | None = None  # ARPO's m (and AEPO's without dynamic_budget); None: k // 2
    entropy_weight: float = 0.2  # gamma
    branch_threshold: float = 0.5  # tau
    branch_width: int = 2  # Z: a branch decision forks Z - 1 new trajectories
    entropy_tokens: int = 20  # K
    entropy_measure: str = "exact_mean"  # or "top10_sum" (released code; needs top-10 log-probs)
    dynamic_budget: bool = True  # AEPO entropy pre-monitoring
    beta: float = 0.5
    premonitor_reuse: bool = True  # keep the pre-monitoring sample as the first global (it branches too)
    # Under the continuous schedule (with reuse), each prompt's rollout starts as soon as its own
    # pre-monitoring sample ends, inside one loop run; off, or under rounds: all samples first, then the rest.
    premonitor_overlap: bool = True
    penalty_slope: float = 0.05
    penalty_scope: str = "lineage"  # or "prompt" (released code)
    # The segment a decision reads (`agent.loop_config.DECISION_ENTROPY`): after the result (spec 2.2) or
    # the one that ended with the call (released code, spec 7.1; schedule "rounds" only).
    decision_entropy: str = "after_result"
    # When the prompt-scope counters move (COUNTER_UPDATES): after every round, or (released code, spec 7.1)
    # only after rounds in which some prompt of the batch got a new trajectory (schedule "rounds" only).
    counter_updates: str = "every_round"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown rollout strategy {self.strategy!r}; choose from {STRATEGIES}")
        if self.penalty_scope not in PENALTY_SCOPES:
            raise ValueError(f"unknown penalty_scope {self.penalty_scope!r}; choose from {PENALTY_SCOPES}")
        if self.entropy_measure not in ENTROPY_MEASURES:
            raise ValueError(f"unknown entropy_measure {self.entropy_measure!r}; choose from {ENTROPY_MEASURES}")
        if self.decision_entropy not in DECISION_ENTROPY:
            raise ValueError(f"unknown decision_entropy {self.decision_entropy!r}; choose from {DECISION_ENTROPY}")
        if self.counter_updates not in COUNTER_UPDATES:
            raise ValueError(f"unknown counter_updates {self.counter_updates!r}; choose from {COUNTER_UPDATES}")
        if self.branch_width < 1:
            raise ValueError(f"branch_width must be >= 1, got {self.branch_width}")
        if self.entropy_tokens < 1:
            raise ValueError(f"entropy_tokens must be >= 1, got {self.entropy_tokens}")
        for name in ("beta", "entropy_weight", "branch_threshold", "penalty_slope"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.beta < 0:  # spec 2.3: more uncertainty in the question means more global samples, never fewer
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.entropy_weight < 0:  # spec 2.2: rising entropy after a tool result makes a branch more likely
            raise ValueError(f"entropy_weight must be >= 0, got {self.entropy_weight}")
        if self.penalty_slope < 0:
            raise ValueError(f"penalty_slope must be >= 0, got {self.penalty_slope}")
        if self.initial_rollouts is not None and self.initial_rollouts < 1:
            raise ValueError(f"initial_rollouts must be >= 1, got {self.initial_rollouts}")

    def initial_for(self, k: int) -> int:
        """Global samples when the budget is fixed: `initial_rollouts`, default `k // 2` (at least 1)."""
        m = self.initial_rollouts if self.initial_rollouts is not None else k // 2
        if m > k:
            raise ValueError(f"initial_rollouts={m} exceeds k={k}")
        return max(1, m)


INDEPENDENT = RolloutConfig(strategy="independent")  # k i.i.d. samples per prompt (what pass@k assumes)


class EntropyBranchPolicy:
    """ARPO/AEPO branch decisions (spec 2.2 step 3, 2.3); ARPO is `penalty_slope = 0`.

    Keeps a log of every decision (`log`: dicts with traj_id, prompt_index,
    consecutive, entropy_change, probability, branched, round) for statistics and tests.
    """

    def __init__(
        self,
        num_prompts: int,
        entropy_weight: float,
        branch_threshold: float,
        branch_width: int,
        penalty_slope: float = 0.0,
        penalty_scope: str = "lineage",
        counter_updates: str = "every_round",
    ) -> None:
        if penalty_scope not in PENALTY_SCOPES:
            raise ValueError(f"unknown penalty_scope {penalty_scope!r}; choose from {PENALTY_SCOPES}")
        if counter_updates not in COUNTER_UPDATES:
            raise ValueError(f"unknown counter_updates {counter_updates!r}; choose from {COUNTER_UPDATES}")
        self.counter_updates = counter_updates
        self.entropy_weight = entropy_weight
        self.branch_threshold = branch_threshold
        self.branch_width = branch_width
        self.penalty_slope = penalty_slope
        self.penalty_scope = penalty_scope
        self.prompt_counters = [0] * num_prompts
        self.rounds_ended = 0
        self.log: list[dict] = []

    def branch_count(self, traj: Trajectory, entropy_now: float, rng: np.random.Generator) -> int:
        if traj.h_init is None:
            raise ValueError(f"trajectory {traj.traj_id} has no H_init: its first segment was never measured")
        if self.penalty_scope == "lineage":
            consecutive = traj.consecutive_branchings
        else:
            consecutive = self.prompt_counters[traj.prompt_index]
        change = entropy_now - traj.h_init
        branched, p = decide_branch(
            rng, change, self.entropy_weight, self.branch_threshold, consecutive, self.penalty_slope
        )
        self.log.append(
            {"traj_id": traj.traj_id, "prompt_index": traj.prompt_index, "consecutive": consecutive,
                 "entropy_change": change, "probability": p, "branched": branched, "round": self.rounds_ended + 1}
        )
        return self.branch_width - 1 if branched else 0

    def end_round(self, new_trajectories: Sequence[int | None]) -> None:
        """Prompt scope: +1 after a round that gave the prompt new trajectories, else reset to 0 (None: the
        prompt's own round goes on, `agent.prompt_rounds`; its counter stays). With `counter_updates=
        "batch_branched"` (the released code's `if new_inputs:`) no counter moves when none of the prompts
        whose round ended got a new trajectory: under `rounds` without `max_segment_tokens` every prompt's
        round ends with the loop's, so that is a loop round in which the batch got none."""
        self.rounds_ended += 1
        if self.counter_updates == "batch_branched" and not any(n for n in new_trajectories if n is not None):
            return
        self.prompt_counters = [c if n is None else c + 1 if n > 0 else 0
                                for c, n in zip(self.prompt_counters, new_trajectories, strict=True)]


def rollout(
    prompts: Sequence[Sequence[int]],
    k: int,
    *,
    loop: AgentLoop,
    config: RolloutConfig,
    rng: np.random.Generator,
    key: jax.Array,
) -> tuple[list[list[Trajectory]], RolloutStats]:
    """Roll out `k` finished trajectories per prompt with the configured strategy.

    Args:
      prompts: prompt token ids (rendered with the chat template).
      k: group size.
      loop: the agent loop (generator, tokenizer, tools, limits).
      config: strategy and its parameters.
      rng: numpy Generator for every branch decision.
      key: jax PRNG key for sampling.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not prompts:
        raise ValueError("rollout needs at least one prompt")
    require_counter_schedule(config.counter_updates, loop.config.schedule)
    loop = AgentLoop(
        loop.generator,
        loop.tokenizer,
        loop.tools,
        dataclasses.replace(loop.config, entropy_tokens=config.entropy_tokens, entropy_measure=config.entropy_measure,
                            decision_entropy=config.decision_entropy),
    )
    num = len(prompts)
    runs: list[LoopResult] = []
    budgets: list[int] | None = None
    existing = None
    if config.strategy == "independent":
        initial = [k] * num
        policy = None
    else:
        slope = config.penalty_slope if config.strategy == "aepo" else 0.0
        scope = config.penalty_scope if config.strategy == "aepo" else "lineage"
        policy = EntropyBranchPolicy(num, config.entropy_weight, config.branch_threshold, config.branch_width, slope, scope,
                                     config.counter_updates)
        dynamic = config.strategy == "aepo" and config.dynamic_budget
        initial = None if dynamic else [config.initial_for(k)] * num  # pre-monitoring sets m (initial_rollouts unused)
        if dynamic and overlaps_premonitoring(config, loop):
            budget_of: dict[int, int] = {}

            def more_globals(sample: Trajectory) -> int:
                budget_of[sample.prompt_index] = premonitor_budget(sample, k, config.beta)
                return budget_of[sample.prompt_index] - 1

            main = loop.run(prompts, k, 1, rng=rng, key=key, policy=policy, premonitor=more_globals)
            return _finish(main.groups, [main], k, [budget_of[i] for i in range(num)], policy)
        if dynamic:
            key, sub = jax.random.split(key)
            pre = loop.run(prompts, 1, 1, rng=rng, key=sub)
            runs.append(pre)
            budgets = [premonitor_budget(g[0], k, config.beta) for g in pre.groups]
            if config.premonitor_reuse:
                existing = pre.groups
                initial = [m - 1 for m in budgets]
            else:
                initial = list(budgets)
    main = loop.run(prompts, k, initial, rng=rng, key=key, policy=policy, existing=existing)
    runs.append(main)
    return _finish(main.groups, runs, k, budgets, policy)


def require_counter_schedule(counter_updates: str, schedule: str) -> None:
    """A ValueError when `counter_updates` cannot run under the agent loop's `schedule`."""
    if counter_updates == "batch_branched" and schedule != "rounds":
        raise ValueError("counter_updates='batch_branched' (the released code's counters, moved only after a round "
                         "in which the batch got a new trajectory) runs under schedule='rounds' only; under "
                         f"{schedule!r} each prompt's rounds are its own, not the batch's")


def overlaps_premonitoring(config: RolloutConfig, loop: AgentLoop) -> bool:
    """True when AEPO's pre-monitoring runs inside the main loop run, per prompt (`premonitor_overlap`)."""
    return config.premonitor_overlap and config.premonitor_reuse and loop.config.schedule == "continuous"


def _finish(groups: list[list[Trajectory]], runs: list[LoopResult], k: int, budgets: list[int] | None,
            policy: EntropyBranchPolicy | None) -> tuple[list[list[Trajectory]], RolloutStats]:
    """Checks every group holds k finished trajectories; the rollout's statistics."""
    for i, group in enumerate(groups):
        if len(group) != k or not all(t.finished for t in group):
            raise RuntimeError(f"prompt {i} ended with {len(group)} trajectories, expected {k} finished ones")
    return groups, compute_stats(groups, runs, global_budgets=budgets, decisions=getattr(policy, "log", None))


def premonitor_budget(traj: Trajectory, k: int, beta: float) -> int:
    """AEPO's `m` from one complete pre-monitoring trajectory (spec 2.3)."""
    if not traj.segments:
        raise ValueError(f"pre-monitoring trajectory {traj.traj_id} generated nothing")
    h_root = traj.segments[0].entropy
    h_tool = premonitor_tool_entropy(h_root, [s.entropy for s in traj.segments if s.after_tool])
    return global_sample_budget(k, h_root, h_tool, beta)

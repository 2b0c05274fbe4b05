"""GiGPO: episode advantage plus step advantage within anchor-state groups
(trajectories sharing a prefix up to a tool result; branch points are such states).

Tiny scale: the `tiny` model preset, 4 prompts x k=4 per step, short
sequences; one step runs on a CPU in seconds (hardware: any CPU, mesh
data=-1). `arg` is unused.
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = shrink_to_tiny(get_base_config())
    c.name = "gigpo_tiny"
    c.rollout.strategy = "arpo"  # branching makes shared-prefix anchor groups
    c.rollout.dynamic_budget = False
    c.rollout.penalty_slope = 0.0
    c.objective.surrogate = "ppo"
    c.objective.advantage = "gigpo"
    c.objective.gigpo_step_weight = 1.0  # omega = 1
    c.objective.gigpo_gamma = 0.95
    c.objective.entropy_adv_coef = 0.0
    c.objective.clip_low = 0.2
    c.objective.clip_high = 0.2
    c.objective.dual_clip_c = 3.0
    return c

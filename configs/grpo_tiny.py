"""GRPO (spec §2.1, §3.2): k independent samples, PPO clipping, group-normalised advantages.

Tiny scale: the `tiny` model preset, 4 prompts x k=4 per step, short
sequences; one step runs on a CPU in seconds (hardware: any CPU, mesh
data=-1). `arg` is unused.
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = shrink_to_tiny(get_base_config())
    c.name = "grpo_tiny"
    c.rollout.strategy = "independent"
    c.rollout.initial_rollouts = c.rollout.k  # the paper's GRPO = ARPO machinery with m = k
    c.rollout.dynamic_budget = False
    c.objective.surrogate = "ppo"
    c.objective.advantage = "grpo"
    c.objective.entropy_adv_coef = 0.0
    c.objective.clip_low = 0.2
    c.objective.clip_high = 0.2
    c.objective.dual_clip_c = 3.0
    return c

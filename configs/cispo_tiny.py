"""CISPO: clipped, detached importance weight times A times logp; no lower clip.

Tiny scale: the `tiny` model preset, 4 prompts x k=4 per step, short
sequences; one step runs on a CPU in seconds (hardware: any CPU, mesh
data=-1). `arg` is unused.
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = shrink_to_tiny(get_base_config())
    c.name = "cispo_tiny"
    c.rollout.strategy = "independent"
    c.rollout.initial_rollouts = c.rollout.k
    c.rollout.dynamic_budget = False
    c.objective.surrogate = "cispo"
    c.objective.advantage = "grpo"
    c.objective.entropy_adv_coef = 0.0
    c.objective.clip_low = 1.0  # 1 - el = 0: no lower bound on the ratio
    c.objective.clip_high = 0.28
    c.objective.dual_clip_c = None  # not defined for CISPO (spec §3.1)
    return c

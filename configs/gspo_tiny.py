"""GSPO: sequence-level importance ratio clipped at (1 - 3e-4, 1 + 4e-4).

Tiny scale: the `tiny` model preset, 4 prompts x k=4 per step, short
sequences; one step runs on a CPU in seconds (hardware: any CPU, mesh
data=-1). `arg` is unused.
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = shrink_to_tiny(get_base_config())
    c.name = "gspo_tiny"
    c.rollout.strategy = "independent"
    c.rollout.initial_rollouts = c.rollout.k
    c.rollout.dynamic_budget = False
    c.objective.surrogate = "gspo"
    c.objective.advantage = "grpo"
    c.objective.entropy_adv_coef = 0.0
    c.objective.clip_low = 3e-4  # GSPO paper
    c.objective.clip_high = 4e-4
    c.objective.dual_clip_c = None
    c.objective.loss_agg = "seq_mean_token_mean"
    return c

"""DAPO: clip-higher (0.2 / 0.28), token-mean loss, dynamic sampling, overlong shaping.

Tiny scale: the `tiny` model preset, 4 prompts x k=4 per step, short
sequences; one step runs on a CPU in seconds (hardware: any CPU, mesh
data=-1). `arg` is unused.
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = shrink_to_tiny(get_base_config())
    c.name = "dapo_tiny"
    c.rollout.strategy = "independent"
    c.rollout.initial_rollouts = c.rollout.k
    c.rollout.dynamic_budget = False
    c.objective.surrogate = "ppo"
    c.objective.advantage = "grpo"
    c.objective.entropy_adv_coef = 0.0
    c.objective.clip_low = 0.2
    c.objective.clip_high = 0.28  # DAPO clip-higher
    c.objective.dual_clip_c = None  # DAPO has no dual clip
    c.objective.loss_agg = "token_mean"
    c.objective.dynamic_sampling = True  # drop all-equal-reward groups, resample (bounded, logged)
    c.objective.max_resample_rounds = 2
    c.objective.overlong_buffer_len = 8  # L_c; DAPO paper uses 4096 of a 20480 budget
    return c

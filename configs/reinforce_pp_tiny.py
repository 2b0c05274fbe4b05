"""REINFORCE++: outcome return at the last token minus a per-token KL penalty,
whitened over the batch; PPO clipping.

Tiny scale: the `tiny` model preset, 4 prompts x k=4 per step, short
sequences; one step runs on a CPU in seconds (hardware: any CPU, mesh
data=-1). `arg` is unused.
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = shrink_to_tiny(get_base_config())
    c.name = "reinforce_pp_tiny"
    c.rollout.strategy = "independent"
    c.rollout.initial_rollouts = c.rollout.k
    c.rollout.dynamic_budget = False
    c.objective.surrogate = "ppo"
    c.objective.advantage = "reinforce_pp"
    c.objective.entropy_adv_coef = 0.0
    c.objective.kl_coef = 0.01  # REINFORCE++ puts a KL penalty in the reward (needs the reference model)
    c.objective.kl_in_reward = True
    c.objective.kl_estimator = "k1"
    c.objective.clip_low = 0.2
    c.objective.clip_high = 0.2
    c.objective.dual_clip_c = 3.0
    return c

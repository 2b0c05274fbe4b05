"""AEPO (spec §2.3, §3.1): entropy pre-monitored budget, consecutive-branch penalty,
stop-gradient clipping that keeps high-entropy tokens' gradients, entropy-aware advantages.

Tiny scale: the `tiny` model preset, 4 prompts x k=4 per step, short
sequences; one step runs on a CPU in seconds (hardware: any CPU, mesh
data=-1). `arg` is unused.
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = shrink_to_tiny(get_base_config())
    c.name = "aepo_tiny"
    c.rollout.strategy = "aepo"
    c.rollout.dynamic_budget = True  # m = clamp(floor(k sigmoid(beta (H_root - H_tool))) + 1, 1, k)
    c.rollout.penalty_slope = 0.05  # paper 0.05
    c.objective.surrogate = "aepo"  # F = 1+eh above the upper clip (A > 0)
    c.objective.advantage = "grpo"
    c.objective.entropy_adv_coef = 0.2  # a = 0.2 in the paper
    c.objective.clip_low = 0.2
    c.objective.clip_high = 0.2
    c.objective.dual_clip_c = 3.0
    return c

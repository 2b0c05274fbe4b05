"""ARPO (spec §2.2): entropy-based adaptive branching with PPO clipping and GRPO
advantages (soft attribution; `objective.hard_attribution` is the switch).

Tiny scale (hardware: any CPU; mesh data=-1 over whatever devices exist): the
`tiny` model, 4 prompts x k=4 trajectories per step, short sequences, so a
step takes seconds. Objective values come from the `arpo` preset of
`aepo_jax.objectives` (see configs/base.py). It takes no argument (one is refused, not ignored).
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, select_variant, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    select_variant(arg, (), "configs/arpo_tiny.py")
    c = shrink_to_tiny(get_base_config("arpo"))
    c.name = "arpo_tiny"
    c.rollout.dynamic_budget = False  # fixed m = k / 2 global samples
    c.rollout.penalty_slope = 0.0  # ARPO has no consecutive-branch penalty
    return c

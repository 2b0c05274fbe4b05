"""GiGPO: episode advantage plus a step advantage (omega = 1, gamma = 0.95) within
anchor-state groups, the trajectories that share a prefix up to a tool result;
the ARPO tree makes such shared states at its branch points.

Tiny scale (hardware: any CPU; mesh data=-1 over whatever devices exist): the
`tiny` model, 4 prompts x k=4 trajectories per step, short sequences, so a
step takes seconds. Objective values come from the `gigpo` preset of
`aepo_jax.objectives` (see configs/base.py). It takes no argument (one is refused, not ignored).
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, select_variant, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    select_variant(arg, (), "configs/gigpo_tiny.py")
    c = shrink_to_tiny(get_base_config("gigpo"))
    c.name = "gigpo_tiny"
    c.rollout.dynamic_budget = False
    c.rollout.penalty_slope = 0.0
    return c

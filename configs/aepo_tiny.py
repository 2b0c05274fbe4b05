"""AEPO (spec §2.3, §3.1-3.2): entropy pre-monitored global budget, consecutive-branch
penalty, stop-gradient clipping that keeps the gradient of clipped high-entropy
tokens (F = 1+eh), entropy-aware advantages (a = 0.2).

Tiny scale (hardware: any CPU; mesh data=-1 over whatever devices exist): the
`tiny` model, 4 prompts x k=4 trajectories per step, short sequences, so a
step takes seconds. Objective values come from the `aepo` preset of
`aepo_jax.objectives` (see configs/base.py). It takes no argument (one is refused, not ignored).
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, select_variant, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    select_variant(arg, (), "configs/aepo_tiny.py")
    c = shrink_to_tiny(get_base_config("aepo"))
    c.name = "aepo_tiny"
    c.rollout.dynamic_budget = True  # m = clamp(floor(k sigmoid(beta (H_root - H_tool))) + 1, 1, k)
    c.rollout.penalty_slope = 0.05  # paper: 0.05
    return c

"""REINFORCE++: outcome return at the last token minus a per-token k1 KL penalty
(coefficient 0.01, in the reward), whitened over the batch; PPO clipping. The
reference model runs because kl_coef > 0.

Tiny scale (hardware: any CPU; mesh data=-1 over whatever devices exist): the
`tiny` model, 4 prompts x k=4 trajectories per step, short sequences, so a
step takes seconds. Objective values come from the `reinforce_pp` preset of
`aepo_jax.objectives` (see configs/base.py). It takes no argument (one is refused, not ignored).
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, select_variant, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    select_variant(arg, (), "configs/reinforce_pp_tiny.py")
    c = shrink_to_tiny(get_base_config("reinforce_pp"))
    c.name = "reinforce_pp_tiny"
    return c

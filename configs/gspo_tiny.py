"""GSPO: sequence-level importance ratio clipped at (1 - 3e-4, 1 + 4e-4),
sequence-mean aggregation.

Tiny scale (hardware: any CPU; mesh data=-1 over whatever devices exist): the
`tiny` model, 4 prompts x k=4 trajectories per step, short sequences, so a
step takes seconds. Objective values come from the `gspo` preset of
`aepo_jax.objectives` (see configs/base.py). It takes no argument (one is refused, not ignored).
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, select_variant, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    select_variant(arg, (), "configs/gspo_tiny.py")
    c = shrink_to_tiny(get_base_config("gspo"))
    c.name = "gspo_tiny"
    return c

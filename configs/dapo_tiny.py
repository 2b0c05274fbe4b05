"""DAPO: clip-higher (0.2 / 0.28), token-mean loss, dynamic sampling (groups with
equal rewards are dropped and more prompts sampled, bounded), overlong shaping.

Tiny scale (hardware: any CPU; mesh data=-1 over whatever devices exist): the
`tiny` model, 4 prompts x k=4 trajectories per step, short sequences, so a
step takes seconds. Objective values come from the `dapo` preset of
`aepo_jax.objectives` (see configs/base.py). It takes no argument (one is refused, not ignored).
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, select_variant, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    select_variant(arg, (), "configs/dapo_tiny.py")
    c = shrink_to_tiny(get_base_config("dapo"))
    c.name = "dapo_tiny"
    c.objective.overlong_buffer_len = 8  # L_c; the DAPO paper uses 4096 of a 20480-token budget
    c.objective.max_resample_rounds = 2
    return c

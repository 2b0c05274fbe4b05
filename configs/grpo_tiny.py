"""GRPO (spec §2.1, §3.2): k independent samples, PPO clipping, group-normalised
advantages, token mean (ARPO's machinery, spec §2.3; the GRPO paper's per-sequence token mean is
objective.loss_agg="seq_mean_token_mean").

Tiny scale (hardware: any CPU; mesh data=-1 over whatever devices exist): the
`tiny` model, 4 prompts x k=4 trajectories per step, short sequences, so a
step takes seconds. Objective values come from the `grpo` preset of
`aepo_jax.objectives` (see configs/base.py). It takes no argument (one is refused, not ignored).
"""

from __future__ import annotations

import ml_collections

from configs.base import get_base_config, select_variant, shrink_to_tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    select_variant(arg, (), "configs/grpo_tiny.py")
    c = shrink_to_tiny(get_base_config("grpo"))
    c.name = "grpo_tiny"
    c.rollout.initial_rollouts = c.rollout.k  # the paper's GRPO baseline = ARPO machinery with m = k
    return c

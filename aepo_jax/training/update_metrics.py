"""One RL step's metrics from its optimiser updates (mini-batches x epochs).

Each update reports token means over its own policy tokens (`accumulate_gradients`); the step's value
is their mean weighted by each update's `train_tokens`, so it equals the mean over every token the
step trained on, however the mini-batches split them. Per-update quantities (`loss`, `grad_norm`,
`update_norm`) are plain means, `learning_rate` is the last update's, and counts are summed. The
entropy of the updates, under parameters that change from one update to the next, is logged as
`UPDATE_ENTROPY_MEAN`: `ENTROPY_MEAN` stays the rollouts' (spec §1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from aepo_jax.training.metric_keys import (
    ENTROPY_MEAN,
    GRAD_NORM,
    LEARNING_RATE,
    LOSS,
    SKIPPED_UPDATES,
    UPDATE_ENTROPY_MEAN,
)

TRAIN_TOKENS = "train_tokens"
# Values of an update as a whole, not means over its tokens.
PER_UPDATE_KEYS = frozenset({LOSS, GRAD_NORM, "update_norm"})


def step_update_metrics(updates: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The step's metrics from its updates' (host scalars; see the module docstring)."""
    if not updates:
        return {}
    weights = np.asarray([float(u[TRAIN_TOKENS]) for u in updates], np.float64)
    out: dict[str, float] = {}
    for key in updates[0]:
        values = np.asarray([float(u[key]) for u in updates], np.float64)
        if key == LEARNING_RATE:
            value = float(values[-1])
        elif key in (TRAIN_TOKENS, SKIPPED_UPDATES):
            value = float(values.sum())
        elif key in PER_UPDATE_KEYS or weights.sum() <= 0:
            value = float(values.mean())
        else:
            value = float(np.sum(values * weights) / weights.sum())
        out[UPDATE_ENTROPY_MEAN if key == ENTROPY_MEAN else key] = value
    out[SKIPPED_UPDATES] = int(out.get(SKIPPED_UPDATES, 0))  # a count
    out["updates"] = float(len(updates))
    return out

"""Branch decisions: ARPO's entropy-change probability and AEPO's consecutive-branch penalty.

ARPO (spec 2.2): `P = alpha + gamma * dH`, `alpha ~ U(0, 1)` per decision.
AEPO (spec 2.3): `P = (alpha + gamma * dH) * max(0, 1 - penalty_slope * l)`,
`l` the number of consecutive branchings before this step. Branch iff `P >= tau`.
ARPO is AEPO with `penalty_slope = 0`, so one function serves both.
"""

from __future__ import annotations

import numpy as np

PENALTY_SCOPES = ("lineage", "prompt")
# When prompt-scope counters move: after every round (spec 2.3), or only after rounds in which some prompt of
# the batch got a new trajectory (the released code's `if new_inputs:`, spec 7.1).
COUNTER_UPDATES = ("every_round", "batch_branched")


def consecutive_branch_penalty(consecutive: int, penalty_slope: float) -> float:
    """`max(0, 1 - penalty_slope * l)`."""
    if consecutive < 0:
        raise ValueError(f"consecutive branch count must be >= 0, got {consecutive}")
    return max(0.0, 1.0 - penalty_slope * consecutive)


def branch_probability(
    alpha: float, entropy_change: float, entropy_weight: float, consecutive: int = 0, penalty_slope: float = 0.0
) -> float:
    """`(alpha + gamma * dH) * max(0, 1 - slope * l)`; with slope 0 this is ARPO's `alpha + gamma * dH`."""
    return (alpha + entropy_weight * entropy_change) * consecutive_branch_penalty(consecutive, penalty_slope)


def decide_branch(
    rng: np.random.Generator,
    entropy_change: float,
    entropy_weight: float,
    threshold: float,
    consecutive: int = 0,
    penalty_slope: float = 0.0,
) -> tuple[bool, float]:
    """Draw `alpha ~ U(0, 1)` from `rng` and return (branch?, P)."""
    alpha = float(rng.uniform(0.0, 1.0))
    p = branch_probability(alpha, entropy_change, entropy_weight, consecutive, penalty_slope)
    return p >= threshold, p

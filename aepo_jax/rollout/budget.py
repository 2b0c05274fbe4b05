"""AEPO entropy pre-monitoring: how many global samples a prompt gets (spec section 2.3)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def premonitor_tool_entropy(h_root: float, tool_segment_entropies: Sequence[float]) -> float:
    """`H_tool_mean`: the mean tool-result segment entropy, or `H_root` when no tool was called."""
    if len(tool_segment_entropies) == 0:
        return float(h_root)
    return float(sum(tool_segment_entropies) / len(tool_segment_entropies))


def global_sample_budget(k: int, h_root: float, h_tool_mean: float, beta: float = 0.5) -> int:
    """`m = clamp(floor(k * sigmoid(beta * (H_root - H_tool_mean))) + 1, 1, k)`.

    More uncertainty in the question than in tool feedback gives more global
    samples; otherwise more branch budget `k - m`.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not (math.isfinite(h_root) and math.isfinite(h_tool_mean)):
        raise ValueError(f"entropies must be finite, got H_root={h_root}, H_tool_mean={h_tool_mean}")
    x = beta * (h_root - h_tool_mean)
    # Numerically stable logistic on both tails.
    sig = 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
    return int(min(max(math.floor(k * sig) + 1, 1), k))

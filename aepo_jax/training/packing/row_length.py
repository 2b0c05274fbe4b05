"""Choose the packed row length: fewer ancestor copies (long rows) versus dense attention cost (short rows).

With the dense masked attention a packed row of length `L` costs `L^2` score
entries whatever the tree, while the projections, MLP and vocabulary head cost
per slot. Longer rows hold whole groups (no copies); shorter rows keep the
quadratic term small. `choose_row_len` lays the forest out for each candidate
length and keeps the one with the lowest modelled forward FLOPs (the backward
pass scales both terms alike).
"""

from __future__ import annotations

from collections.abc import Sequence

from aepo_jax.models import ModelConfig
from aepo_jax.training.packing.layout import layout_forest
from aepo_jax.training.packing.trie import build_prefix_forest


def forward_flops(config: ModelConfig, rows: int, row_len: int) -> float:
    """Modelled forward FLOPs of `rows` dense rows of `row_len` tokens (matmuls only)."""
    d, h, kvh, dh, f = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim, config.mlp_dim
    per_token = config.n_layers * 2 * (d * h * dh * 2 + d * kvh * dh * 2 + 3 * d * f) + 2 * d * config.vocab_size
    per_pair = config.n_layers * 2 * 2 * h * dh  # q.k and p.v for every (query, key) pair
    return float(rows * row_len * per_token + rows * row_len * row_len * per_pair)


def choose_row_len(
    token_lists: Sequence[Sequence[int]],
    group_ids: Sequence[int] | None,
    config: ModelConfig,
    candidates: Sequence[int],
    length_multiple: int = 8,
) -> tuple[int, dict[int, float]]:
    """The candidate row length with the lowest `forward_flops` of its layout.

    Returns:
      `(best_row_len, {candidate: modelled FLOPs})`; candidates shorter than the
      longest sequence are skipped.
    """
    longest = max(len(t) for t in token_lists)
    usable = sorted({int(c) for c in candidates if c >= longest})
    if not usable:
        raise ValueError(f"no candidate row length fits the longest sequence ({longest} tokens): {list(candidates)}")
    forest = build_prefix_forest(token_lists, group_ids)
    costs = {}
    for row_len in usable:
        layout = layout_forest(forest, row_len, length_multiple=length_multiple)
        costs[row_len] = forward_flops(config, layout.num_rows, layout.row_len)
    return min(costs, key=costs.get), costs

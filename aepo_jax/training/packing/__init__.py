"""Prefix-shared ("tree-packed") training: every shared prefix token computed once (docs/packing.md).

    batch, stats = build_train_batch(sequences, "tree", group_ids=groups, length=T)
    step = make_train_step_for_pack(graphdef, tx, step_config, "tree")
    state, metrics = step(state, place_train_batch(batch, "tree", mesh))
"""

from aepo_jax.training.packing.buckets import bucket_size, pad_to_buckets
from aepo_jax.training.packing.layout import (
    PackedLayout,
    first_fit_decreasing,
    layout_forest,
)
from aepo_jax.training.packing.packed_batch import (
    PackingStats,
    build_packed_batch,
    empty_tree_batch,
    unpack_flat,
)
from aepo_jax.training.packing.packed_scorer import packed_logprobs
from aepo_jax.training.packing.trainer_batches import (
    DEFAULT_PACK,
    PACK_MODES,
    PackingTally,
    agree_batch_shapes,
    build_train_batch,
    check_pack_mode,
    make_logprob_fn_for_pack,
    make_train_step_for_pack,
    pack_mini_batch,
    per_sequence_values,
    place_train_batch,
    train_batch_shardings,
)
from aepo_jax.training.packing.trie import (
    PrefixForest,
    build_prefix_forest,
    preorder_and_sizes,
)

__all__ = [
    "DEFAULT_PACK",
    "PACK_MODES",
    "PackedLayout",
    "PackingStats",
    "PackingTally",
    "PrefixForest",
    "agree_batch_shapes",
    "bucket_size",
    "build_packed_batch",
    "build_prefix_forest",
    "build_train_batch",
    "check_pack_mode",
    "empty_tree_batch",
    "first_fit_decreasing",
    "layout_forest",
    "make_logprob_fn_for_pack",
    "make_train_step_for_pack",
    "pack_mini_batch",
    "packed_logprobs",
    "pad_to_buckets",
    "per_sequence_values",
    "place_train_batch",
    "preorder_and_sizes",
    "train_batch_shardings",
    "unpack_flat",
]

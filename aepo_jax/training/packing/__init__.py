"""Prefix-shared ("tree-packed") training: every shared prefix token computed once (docs/packing.md).

    batch, stats = build_train_batch(sequences, "tree", group_ids=groups, max_len=4096)
    step = make_train_step_for_pack(graphdef, tx, step_config, "tree")
    state, metrics = step(state, batch)
"""

from aepo_jax.training.packing.ancestor_mask import ancestor_mask
from aepo_jax.training.packing.buckets import bucket_size, pad_to_buckets
from aepo_jax.training.packing.layout import (
    PackedLayout,
    first_fit_decreasing,
    layout_forest,
)
from aepo_jax.training.packing.pack_mode import (
    DEFAULT_PACK,
    PACK_MODES,
    build_train_batch,
    check_pack_mode,
    make_logprob_fn_for_pack,
    make_train_step_for_pack,
    per_sequence_values,
)
from aepo_jax.training.packing.packed_batch import (
    PackingStats,
    build_packed_batch,
    empty_tree_batch,
    unpack_flat,
)
from aepo_jax.training.packing.packed_step import (
    make_packed_logprob_fn,
    make_packed_rl_train_step,
    packed_logprobs,
    packed_loss_and_grads,
    packed_rl_loss_fn,
)
from aepo_jax.training.packing.trainer_batches import (
    PackingTally,
    pack_mini_batch,
    place_tree_batch,
    rows_to_sequences,
    tree_batch_shardings,
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
    "ancestor_mask",
    "bucket_size",
    "build_packed_batch",
    "build_prefix_forest",
    "build_train_batch",
    "check_pack_mode",
    "empty_tree_batch",
    "first_fit_decreasing",
    "layout_forest",
    "make_logprob_fn_for_pack",
    "make_packed_logprob_fn",
    "make_packed_rl_train_step",
    "make_train_step_for_pack",
    "pack_mini_batch",
    "packed_logprobs",
    "packed_loss_and_grads",
    "packed_rl_loss_fn",
    "pad_to_buckets",
    "per_sequence_values",
    "place_tree_batch",
    "preorder_and_sizes",
    "rows_to_sequences",
    "tree_batch_shardings",
    "unpack_flat",
]

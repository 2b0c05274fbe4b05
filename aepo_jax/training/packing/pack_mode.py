"""`train.pack = "tree" | "flat"`: one switch for the trainer, batch builder and step together.

The trainer calls `build_train_batch` on its per-trajectory sequences, then
`make_train_step_for_pack` (and `make_logprob_fn_for_pack` for reference
log-probs or current entropies) with the same `pack`; `per_sequence_values`
turns that function's output back into input order for either layout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import optax
from flax import nnx

from aepo_jax.training.batch import pad_sequences
from aepo_jax.training.packing.packed_batch import (
    PackingStats,
    build_packed_batch,
    unpack_flat,
)
from aepo_jax.training.packing.packed_step import (
    make_packed_logprob_fn,
    make_packed_rl_train_step,
)
from aepo_jax.training.train_step import StepConfig, make_logprob_fn, make_rl_train_step

PACK_MODES = ("tree", "flat")
DEFAULT_PACK = "tree"


def check_pack_mode(pack: str) -> None:
    """Raise a ValueError naming the known modes if `pack` is not one of them."""
    if pack not in PACK_MODES:
        raise ValueError(f"unknown train.pack {pack!r}; choose from {PACK_MODES}")


def build_train_batch(
    sequences: Sequence[Mapping[str, Sequence]],
    pack: str = DEFAULT_PACK,
    *,
    group_ids: Sequence[int] | None,
    max_len: int,
    row_len: int | None = None,
    micro_batch_size: int | None = None,
    pad_id: int = 0,
    row_multiple: int = 1,
    length_multiple: int = 8,
) -> tuple[dict[str, np.ndarray], PackingStats | None]:
    """The training batch for `pack` (numpy arrays) and, for "tree", its packing statistics.

    Args:
      sequences: per trajectory `tokens`, `mask`, `logp_old`, `advantages`, ... (`pad_sequences`).
      pack: "tree" or "flat".
      group_ids: the prompt group of each sequence (tree sharing stays inside a group).
      max_len: longest allowed sequence (prompt + response).
      row_len: packed row length (default `max_len`); must be >= `max_len`'s longest sequence.
      micro_batch_size: trajectories per micro-batch, as in `StepConfig`. "tree"
        turns it into `ceil(num_sequences / micro_batch_size)` micro-batches of
        whole groups (at most one per group); pass the same `StepConfig` to
        `make_train_step_for_pack` ("tree" ignores its `micro_batch_size`).
    """
    check_pack_mode(pack)
    if pack == "flat":
        return pad_sequences(sequences, max_len=max_len, pad_id=pad_id, row_multiple=row_multiple,
                             length_multiple=length_multiple), None
    num_groups = len(set(group_ids)) if group_ids is not None else 1
    micro = 1 if micro_batch_size is None else -(-len(sequences) // micro_batch_size)
    return build_packed_batch(sequences, row_len or max_len, group_ids, max_len=max_len, pad_id=pad_id,
                              row_multiple=row_multiple, length_multiple=length_multiple,
                              micro_batches=max(1, min(micro, num_groups)))


def make_train_step_for_pack(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    cfg: StepConfig,
    pack: str = DEFAULT_PACK,
    schedule: optax.Schedule | None = None,
    state_sharding: Any | None = None,
    batch_sharding: Any | None = None,
) -> Callable:
    """The jitted RL step for batches from `build_train_batch(..., pack)`; same metrics either way.

    With a mesh, "tree" batches have a leading micro-batch axis: shard their
    arrays along axis 1 (`PartitionSpec(None, "data")`).
    """
    check_pack_mode(pack)
    if pack == "flat":
        return make_rl_train_step(graphdef, tx, cfg, schedule, state_sharding, batch_sharding)
    return make_packed_rl_train_step(graphdef, tx, cfg, schedule, state_sharding, batch_sharding)


def make_logprob_fn_for_pack(graphdef: nnx.GraphDef, cfg: StepConfig, pack: str = DEFAULT_PACK,
                             batch_sharding: Any | None = None) -> Callable:
    """Jitted `(params, batch) -> (logp, entropy)` in the batch's own row order."""
    check_pack_mode(pack)
    if pack == "flat":
        return make_logprob_fn(graphdef, cfg, batch_sharding)
    return make_packed_logprob_fn(graphdef, cfg, batch_sharding)


def per_sequence_values(values: Any, batch: Mapping[str, np.ndarray], pack: str, num_sequences: int) -> np.ndarray:
    """Per-token values in the batch's row order -> `[num_sequences, T]` in input order."""
    check_pack_mode(pack)
    if pack == "flat":
        return np.asarray(values)[:num_sequences]
    return unpack_flat(values, batch, num_sequences)

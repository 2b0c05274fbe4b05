"""Per-row stopping: EOS ids, token-level stop sequences, budgets.

Stop sequences are matched on token ids over a rolling window of the last
generated ids, so a multi-token tag such as `</search>` stops the row right
after its last token whatever its tokenisation.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

# Stop reasons as int32 codes inside jit; names on the host.
NOT_STOPPED, STOP_EOS, STOP_SEQUENCE, STOP_LENGTH = 0, 1, 2, 3
STOP_REASON_NAMES = {STOP_EOS: "eos", STOP_SEQUENCE: "stop", STOP_LENGTH: "length"}
_WINDOW_FILL = -1  # never a token id, so an empty window matches nothing


@flax.struct.dataclass
class StopTable:
    """Stop sequences right-aligned in a [M, L] table with a compare mask.

    Attributes:
      ids: int32[M, L], sequence j occupies the last len_j columns.
      compare: bool[M, L], True on the columns that belong to sequence j.
      eos_ids: int32[E] end-of-sequence ids (E may be 0).
    """

    ids: jax.Array
    compare: jax.Array
    eos_ids: jax.Array

    @property
    def window(self) -> int:
        """How many trailing ids the rolling window keeps (L, at least 1)."""
        return self.ids.shape[1]


def build_stop_table(stop_sequences: Sequence[Sequence[int]], eos_ids: Sequence[int]) -> StopTable:
    """Validates and packs stop sequences and EOS ids into arrays."""
    for j, seq in enumerate(stop_sequences):
        if len(seq) == 0:
            raise ValueError(f"stop sequence {j} is empty")
        if any(int(t) < 0 for t in seq):
            raise ValueError(f"stop sequence {j} has a negative token id: {list(seq)}")
    if any(int(t) < 0 for t in eos_ids):
        raise ValueError(f"eos ids must be non-negative, got {list(eos_ids)}")
    window = max([1, *(len(s) for s in stop_sequences)])
    ids = np.full((len(stop_sequences), window), _WINDOW_FILL, np.int32)
    compare = np.zeros((len(stop_sequences), window), bool)
    for j, seq in enumerate(stop_sequences):
        ids[j, window - len(seq):] = seq
        compare[j, window - len(seq):] = True
    return StopTable(jnp.asarray(ids), jnp.asarray(compare), jnp.asarray(np.asarray(eos_ids, np.int32)))


def empty_window(batch: int, table: StopTable) -> jax.Array:
    """int32[B, L] window holding no generated ids yet."""
    return jnp.full((batch, table.window), _WINDOW_FILL, jnp.int32)


def push_window(window: jax.Array, tokens: jax.Array) -> jax.Array:
    """Shifts the newest ids int32[B] into the rolling window int32[B, L]."""
    return jnp.concatenate([window[:, 1:], tokens[:, None]], axis=1)


def match_stop_sequence(window: jax.Array, table: StopTable) -> jax.Array:
    """Index of the first stop sequence the window ends with, per row; -1 if none.

    Args:
      window: int32[B, L] last generated ids, newest last.
      table: the packed stop sequences.

    Returns:
      int32[B].
    """
    num_sequences = table.ids.shape[0]
    if num_sequences == 0:
        return jnp.full(window.shape[:1], -1, jnp.int32)
    equal = (window[:, None, :] == table.ids[None]) | ~table.compare[None]  # [B, M, L]
    matched = jnp.all(equal, axis=-1)  # [B, M]
    first = jnp.argmax(matched, axis=-1).astype(jnp.int32)  # [B]
    return jnp.where(jnp.any(matched, axis=-1), first, -1)


def is_eos(tokens: jax.Array, table: StopTable) -> jax.Array:
    """bool[B]: the token is one of the EOS ids."""
    if table.eos_ids.shape[0] == 0:
        return jnp.zeros(tokens.shape, bool)
    return jnp.any(tokens[:, None] == table.eos_ids[None, :], axis=-1)


def stop_reason_after(
    tokens: jax.Array, window: jax.Array, num_generated: jax.Array, budget: jax.Array, table: StopTable
) -> tuple[jax.Array, jax.Array]:
    """Why each row stops after emitting `tokens` (EOS before stop sequence before length).

    Args:
      tokens: int32[B] ids just generated.
      window: int32[B, L] rolling window already containing `tokens`.
      num_generated: int32[B] tokens generated so far, `tokens` included.
      budget: int32[B] per-row token budget.
      table: stop sequences and EOS ids.

    Returns:
      (reason int32[B] in {NOT_STOPPED, STOP_EOS, STOP_SEQUENCE, STOP_LENGTH},
       stop_sequence_index int32[B], -1 unless reason is STOP_SEQUENCE).
    """
    eos = is_eos(tokens, table)
    seq_index = match_stop_sequence(window, table)
    by_sequence = ~eos & (seq_index >= 0)
    by_length = num_generated >= budget
    reason = jnp.where(
        eos, STOP_EOS, jnp.where(by_sequence, STOP_SEQUENCE, jnp.where(by_length, STOP_LENGTH, NOT_STOPPED))
    ).astype(jnp.int32)
    return reason, jnp.where(by_sequence, seq_index, -1).astype(jnp.int32)

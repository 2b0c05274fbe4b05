"""What crosses jit between sampler calls (DecodeState) and what a generate returns (SampleOutput)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.struct
import jax
import numpy as np


@flax.struct.dataclass
class DecodeArrays:
    """The device half of a decode state: a pytree of arrays, donated to jitted calls.

    Rows are ragged: each has its own write cursor, and a block writes only a
    row's real tokens, at `cursor[b]` onwards, so a row that receives nothing
    (a row waiting on a tool, a finished row, a padding row) uses no slots.
    `slot_valid` marks the slots that hold real tokens.

    Attributes:
      cache: the model's KVCache, k/v [L, B, KVH, S, Dh] (its scalar `index` is unused:
        the cursors below replace it).
      slot_valid: bool[B, S], True where the slot holds a real token of the row.
      next_position: int32[B], rotary position of the row's next token.
      last_logits: float32[B, V], logits for the row's next token.
      cursor: int32[B], the row's next free slot.
    """

    cache: object
    slot_valid: jax.Array
    next_position: jax.Array
    last_logits: jax.Array
    cursor: jax.Array


@flax.struct.dataclass
class DecodeState:
    """A batch of sequences in progress: device arrays plus the number of real rows.

    The batch axis is bucketed (a power of two, a multiple of the mesh's data
    axis); rows at and after `num_rows` are padding that never generates.
    `num_rows` is static and is kept out of the jitted programs so that
    different row counts within a bucket share one compiled program.
    """

    arrays: DecodeArrays
    num_rows: int = flax.struct.field(pytree_node=False)

    @property
    def batch_size(self) -> int:
        """Bucketed batch size B (>= num_rows)."""
        return self.arrays.slot_valid.shape[0]

    @property
    def cache_length(self) -> int:
        """Bucketed number of cache slots S."""
        return self.arrays.slot_valid.shape[1]

    @property
    def cursor(self) -> int:
        """The largest next free slot over the real rows: the cache needs room past it."""
        return int(np.max(self.cursors, initial=0))

    @property
    def cursors(self) -> np.ndarray:
        """int32[num_rows]: each real row's next free slot (fetched whole, sliced on the host: a
        device-side slice of each new length would compile a program of its own)."""
        return np.asarray(self.arrays.cursor)[: self.num_rows]

    @property
    def last_logits(self) -> jax.Array:
        """float32[num_rows, V] logits for each real row's next token."""
        return self.arrays.last_logits[: self.num_rows]

    @property
    def next_position(self) -> np.ndarray:
        """int32[num_rows]: number of real tokens in each row (its next rotary position)."""
        return np.asarray(self.arrays.next_position)[: self.num_rows]


@flax.struct.dataclass
class RowMarks:
    """The device half of `Marks`: rows' cursor, next position and next-token logits at one moment."""

    next_position: jax.Array  # int32[M]
    last_logits: jax.Array  # float32[M, V]
    cursor: jax.Array  # int32[M]


@dataclasses.dataclass(frozen=True)
class Marks:
    """Where some rows of a decode state stood at one moment (`Sampler.mark`), so that they can be
    forked later as they were then (`Sampler.fork_marked`) without copying their cache now.

    Rows only grow (every write lands at a row's own cursor), so while a marked row stays in its
    state, its first `cursor` slots still hold exactly what they held when it was marked; only the
    cursor, the next position and the next-token logits need keeping. A branch snapshot kept this
    way costs `[M, V]` logits instead of a copy of M whole cache rows.
    """

    arrays: RowMarks
    cursors: np.ndarray  # int32[num_rows]: host copy of the marked cursors

    @property
    def num_rows(self) -> int:
        return len(self.cursors)


@dataclasses.dataclass(frozen=True)
class SampleOutput:
    """Host-side result of one generate call, one row per real row.

    Attributes:
      tokens: int32[B, N] generated ids, pad_id after num_tokens.
      logp: float32[B, N] log-prob under the full-vocabulary softmax at the
        sampling temperature (spec section 1). This is the one the trainer uses
        as `logp_old`: it is what the trainer's own forward recomputes.
      logp_truncated: float32[B, N] log-prob under the distribution the token was
        actually drawn from: the top-k / top-p one (equals `logp` without
        truncation); 0 when greedy (a point mass on the argmax).
      entropy: float32[B, N] full-vocabulary entropy at the sampling temperature.
      num_tokens: int32[B] tokens generated per row.
      stop_reason: per row "eos", "stop" or "length".
      stop_sequence_index: int32[B], which stop sequence matched, -1 if none.
      top_logprobs: float32[B, N, k] the k largest full-vocabulary log-probs at
        the sampling temperature for each generated token, descending; None
        unless `generate(..., top_logprobs=k)` asked for them.
      top_ids: int32[B, N, k] the token ids of `top_logprobs` (None likewise).
    """

    tokens: np.ndarray
    logp: np.ndarray
    logp_truncated: np.ndarray
    entropy: np.ndarray
    num_tokens: np.ndarray
    stop_reason: list[str]
    stop_sequence_index: np.ndarray
    top_logprobs: np.ndarray | None = None
    top_ids: np.ndarray | None = None

    def spread(self, rows: Sequence[int], num_rows: int, pad_id: int) -> SampleOutput:
        """This output's row i as row rows[i] of an output of `num_rows` rows; the others generated
        nothing (budget 0: pad tokens, zero scores, stop reason "length")."""
        rows = list(rows)

        def table(values: np.ndarray | None, fill) -> np.ndarray | None:
            if values is None:
                return None
            out = np.full((num_rows, *values.shape[1:]), fill, values.dtype)
            out[rows] = values[: len(rows)]
            return out

        reasons = ["length"] * num_rows
        for i, row in enumerate(rows):
            reasons[row] = self.stop_reason[i]
        return SampleOutput(
            tokens=table(self.tokens, pad_id), logp=table(self.logp, 0.0),
            logp_truncated=table(self.logp_truncated, 0.0), entropy=table(self.entropy, 0.0),
            num_tokens=table(self.num_tokens, 0), stop_reason=reasons,
            stop_sequence_index=table(self.stop_sequence_index, -1),
            top_logprobs=table(self.top_logprobs, 0.0), top_ids=table(self.top_ids, 0))

    def with_rows_of(self, other: SampleOutput, rows: Sequence[int], pad_id: int) -> SampleOutput:
        """This output with rows `rows` taken from `other` (same rows; the token axis is padded to
        the longer of the two with pad tokens and zero scores)."""
        rows = list(rows)
        width = max(self.tokens.shape[1], other.tokens.shape[1])

        def table(mine: np.ndarray | None, theirs: np.ndarray | None, fill) -> np.ndarray | None:
            if mine is None:
                return None
            out = np.full((mine.shape[0], width, *mine.shape[2:]), fill, mine.dtype)
            out[:, : mine.shape[1]] = mine
            out[rows] = fill
            out[rows, : theirs.shape[1]] = theirs[rows]
            return out

        def per_row(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
            out = mine.copy()
            out[rows] = theirs[rows]
            return out

        reasons = list(self.stop_reason)
        for row in rows:
            reasons[row] = other.stop_reason[row]
        return SampleOutput(
            tokens=table(self.tokens, other.tokens, pad_id), logp=table(self.logp, other.logp, 0.0),
            logp_truncated=table(self.logp_truncated, other.logp_truncated, 0.0),
            entropy=table(self.entropy, other.entropy, 0.0), num_tokens=per_row(self.num_tokens, other.num_tokens),
            stop_reason=reasons, stop_sequence_index=per_row(self.stop_sequence_index, other.stop_sequence_index),
            top_logprobs=table(self.top_logprobs, other.top_logprobs, 0.0), top_ids=table(self.top_ids, other.top_ids, 0))

    def row_tokens(self, row: int) -> list[int]:
        """The ids generated for one row, without padding."""
        return self.tokens[row, : self.num_tokens[row]].tolist()

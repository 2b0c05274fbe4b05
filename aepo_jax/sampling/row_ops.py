"""The Sampler's row operations: copying rows between decode states, growing a batch, and branch
snapshots by marks (`Sampler` inherits them; docs/interfaces.md)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from aepo_jax.sampling.buckets import bucket_length
from aepo_jax.sampling.jitted import (
    fork_marked_program,
    grow_program,
    mark_program,
    place_program,
    take_program,
)
from aepo_jax.sampling.program_runs import padded_rows
from aepo_jax.sampling.state import DecodeArrays, DecodeState, Marks


class RowOps:
    """fork / mark / fork_marked / concat / extend / reserve / place of a `Sampler` (it provides _call,
    _empty_arrays, _batch_for, layout and min_batch)."""

    def fork(self, state: DecodeState, rows: Sequence[int]) -> DecodeState:
        """A new state whose row i is a copy of row rows[i] (same prefix, same cursor)."""
        rows = self._checked_rows(state, rows, "fork")
        return DecodeState(self._gather(state.arrays, rows), len(rows))

    def mark(self, state: DecodeState, rows: Sequence[int]) -> Marks:
        """Marks rows `rows` as they stand now, for `fork_marked` later: a branch snapshot that copies
        no cache (their cursors, positions and logits only; `Marks`)."""
        rows = self._checked_rows(state, rows, "mark")
        # As many marks as the state has rows (padding repeats the first): one mark and one marked-fork
        # program per batch size, not one per count of marked rows.
        index = padded_rows(rows, state.batch_size)
        return Marks(self._call("reshape", mark_program, state.arrays, index, self.layout), state.cursors[rows].copy())

    def fork_marked(self, state: DecodeState, rows: Sequence[int], marks: Marks, mark_rows: Sequence[int]) -> DecodeState:
        """A new state whose row i is row rows[i] of `state` as it stood at mark mark_rows[i]: what
        `fork` would have given at `mark` time. Row rows[i] must be the marked row, in this or a later
        state, having only grown since (rows only ever grow; `fork`, `place` and `extend` move them whole)."""
        rows = self._checked_rows(state, rows, "fork_marked")
        mark_rows = [int(m) for m in mark_rows]
        if len(mark_rows) != len(rows) or not all(0 <= m < marks.num_rows for m in mark_rows):
            raise ValueError(f"fork_marked: mark rows {mark_rows} need one per row, each in [0, {marks.num_rows})")
        shrunk = [r for r, m in zip(rows, mark_rows, strict=True) if state.cursors[r] < marks.cursors[m]]
        if shrunk:
            raise ValueError(f"fork_marked: rows {shrunk} hold fewer tokens than when marked: not the marked rows")
        size = self._batch_for(len(rows))
        arrays = self._call("reshape", fork_marked_program, state.arrays, padded_rows(rows, size), marks.arrays,
                            padded_rows(mark_rows, size), self.layout)
        return DecodeState(arrays, len(rows))

    def concat(self, states: Sequence[DecodeState]) -> DecodeState:
        """Rows of all states in order, in one state.

        The result is allocated at its bucketed batch and the largest cache length of the states
        (a state with fewer slots gets invalid ones), and each state's rows are placed into it, so
        its shape, and every program that later runs on it, stays inside the buckets whatever the
        states' sizes. Rows keep their own cursors, so no slot moves.
        """
        if not states:
            raise ValueError("concat needs at least one state")
        length = max(s.cache_length for s in states)
        total = sum(s.num_rows for s in states)
        out = DecodeState(self._empty_arrays(self._batch_for(total), length, "reshape"), total)
        offset = 0
        for s in states:
            out = self.place(out, range(offset, offset + s.num_rows), s, range(s.num_rows))
            offset += s.num_rows
        return out

    def extend(self, state: DecodeState, source: DecodeState) -> DecodeState:
        """`concat([state, source])` that consumes `state` (donated): when its batch bucket already holds
        the rows of both, `source`'s rows are placed into its spare rows, so nothing is allocated and
        `state`'s rows are not copied (the agent loop adding branches and top-ups); else a concat."""
        total = state.num_rows + source.num_rows
        if total > state.batch_size or source.cache_length > state.cache_length:
            return self.concat([state, source])
        wider = DecodeState(state.arrays, total)
        return self._place_rows(wider, list(range(state.num_rows, total)), source, list(range(source.num_rows)),
                                bucket_length(source.num_rows, self.min_batch))

    def reserve(self, state: DecodeState, rows: int) -> DecodeState:
        """`state` (consumed) with batch rows for at least `rows` rows, so that `extend` by up to
        `rows - num_rows` rows places them into spare rows. Growing the batch before the new rows
        exist keeps the old and the grown state the only two caches alive while it is copied."""
        if rows <= state.batch_size:
            return state
        grown = DecodeState(self._empty_arrays(self._batch_for(rows), state.cache_length, "reshape"), state.num_rows)
        every = list(range(state.num_rows))
        return self._place_rows(grown, every, state, every, bucket_length(state.num_rows, self.min_batch))

    def place(self, state: DecodeState, dst_rows: Sequence[int], source: DecodeState,
              src_rows: Sequence[int]) -> DecodeState:
        """Row dst_rows[i] of `state` becomes a copy of row src_rows[i] of `source` (its cache, cursor,
        position and last logits); the other rows are untouched. Reuses rows of a decode state in place
        (continuous batching: a finished row's slot takes a branch or a new trajectory) instead of
        concatenating states, so the batch keeps its shape. Donates `state`; `source` stays usable."""
        dst, src = [int(r) for r in dst_rows], [int(r) for r in src_rows]
        if len(dst) != len(src) or not dst:
            raise ValueError(f"place needs as many (>= 1) destination rows as source rows, got {len(dst)} and {len(src)}")
        if len(set(dst)) != len(dst):
            raise ValueError(f"place: destination rows {dst} repeat")
        bad = [r for r in dst if not 0 <= r < state.num_rows] + [r for r in src if not 0 <= r < source.num_rows]
        if bad:
            raise ValueError(f"place: rows {bad} are outside the destination's {state.num_rows} "
                             f"or the source's {source.num_rows} rows")
        return self._place_rows(state, dst, source, src, bucket_length(len(dst), self.min_batch))

    def _place_rows(self, state: DecodeState, dst: list[int], source: DecodeState, src: list[int],
                    width: int) -> DecodeState:
        """`place` with its index lists padded to `width` entries (padding writes out of range: dropped);
        each width is a compiled program. A source that shares buffers with `state` (rows copied within
        one state) is copied out first: `state`'s buffers are donated."""
        if any(a is b for a, b in zip(jax.tree.leaves(state.arrays), jax.tree.leaves(source.arrays), strict=False)):
            source, src = self.fork(source, src), list(range(len(src)))
        length = max(state.cache_length, source.cache_length)
        arrays, source_arrays = state.arrays, source.arrays
        if state.cache_length < length:
            arrays = self._call("reshape", grow_program, arrays, length, self.layout)
        if source.cache_length < length:
            source_arrays = self._call("reshape", grow_program, source_arrays, length, self.layout)
        dst_index = np.full((width,), state.batch_size, np.int32)
        src_index = np.zeros((width,), np.int32)
        dst_index[: len(dst)], src_index[: len(src)] = dst, src
        arrays = self._call("reshape", place_program, arrays, dst_index, source_arrays, src_index, self.layout)
        return DecodeState(arrays, state.num_rows)

    # ----------------------------------------------------------------- internals

    @staticmethod
    def _checked_rows(state: DecodeState, rows: Sequence[int], what: str) -> list[int]:
        rows = [int(r) for r in rows]
        if not rows:
            raise ValueError(f"{what} needs at least one row")
        bad = [r for r in rows if not 0 <= r < state.num_rows]
        if bad:
            raise ValueError(f"{what}: rows {bad} are outside [0, {state.num_rows})")
        return rows

    def _gather(self, arrays: DecodeArrays, rows: list[int]) -> DecodeArrays:
        """Takes `rows` and pads the batch to its bucket with copies of the first row."""
        index = padded_rows(rows, self._batch_for(len(rows)))
        return self._call("reshape", take_program, arrays, index, self.layout)

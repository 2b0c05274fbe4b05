"""The generation interface the agent loop drives.

A `Protocol` that `aepo_jax.sampling.Sampler` satisfies (docs/interfaces.md),
written down here so the loop's branching and budget logic can also be driven
by a scripted generator in tests. The decode state is opaque to the loop: it
only ever passes states back to the generator that made them, and row `i` of a
state is always the loop's row `i`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np


class GenerationOutput(Protocol):
    """What one `generate` call returns, one row per state row (host numpy)."""

    tokens: np.ndarray  # int32[B, N]
    logp: np.ndarray  # float32[B, N] full-vocabulary log-prob at temperature T
    entropy: np.ndarray  # float32[B, N] exact token entropy at temperature T
    num_tokens: np.ndarray  # int32[B] valid tokens per row
    stop_reason: list[str]  # per row: "eos", "stop" or "length"


class Generator(Protocol):
    """prefill / generate / append / fork / concat (and optionally place) over an opaque decode state."""

    @property
    def counters(self) -> Mapping[str, int]:
        """Cumulative forward-token counts: prefill_tokens, append_tokens, decode_tokens."""
        ...

    def prefill(self, prompts: Sequence[Sequence[int]]) -> Any: ...

    def generate(self, state: Any, max_new_tokens: int | Sequence[int], rng: Any) -> tuple[Any, GenerationOutput]: ...

    def append(self, state: Any, tokens: Sequence[Sequence[int]]) -> Any: ...

    def fork(self, state: Any, rows: Sequence[int]) -> Any: ...

    def concat(self, states: Sequence[Any]) -> Any: ...

    # Optional: with `continues_stops = True`, generate(state, max_new_tokens, rng, continue_ids=...)
    # takes per row the ids of the paused segment it goes on with (else []), so a stop begun before
    # the pause still ends it.
    # Optional (the continuous schedule reuses rows with it when present, else concatenates):
    # def place(self, state, dst_rows, source, src_rows) -> state: row dst_rows[i] of `state`
    # becomes a copy of row src_rows[i] of `source`, the other rows untouched.
    # Optional (the loop adds rows with it when present, else with concat):
    # def extend(self, state, source) -> state: concat([state, source]) that may consume `state`.
    # Optional, together (branch snapshots are then marks, not forks of the deciding rows):
    # def mark(self, state, rows) -> marks: rows as they stand now; rows only grow afterwards.
    # def fork_marked(self, state, rows, marks, mark_rows) -> state: row i is row rows[i] of `state`
    # as it stood at mark mark_rows[i] (what `fork` would have given at `mark` time).
    # Optional (the loop grows the batch with it before adding rows that do not fit):
    # def reserve(self, state, rows) -> state: `state` (consumed) with room for `rows` rows.
    # Optional (a loop run with `LoopConfig.compiles_after_run` is one such block when present):
    # def compiles_held(self) -> context manager: background compiles asked for inside it start when it ends.


def forward_tokens(counters: Mapping[str, int]) -> int:
    """Tokens pushed through the model: prefill + append + decode."""
    return int(counters.get("prefill_tokens", 0) + counters.get("append_tokens", 0) + counters.get("decode_tokens", 0))

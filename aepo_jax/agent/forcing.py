"""A generator that mixes real sampling with forced tool-call tokens.

A random-weight (or barely trained) model almost never closes a tool tag, so an
end-to-end run of the agent loop with the real sampler would exercise no tools
and no branching. `ToolForcingGenerator` wraps a `Sampler`: each segment first
samples up to `free_tokens` real tokens (a fixed count, or for each segment a
count drawn uniformly from a `(low, high)` range, so rows stop at different
times as a real policy's do); if the row has not stopped by itself,
the next planned call (`<search>...</search>`, `<python>...</python>`, finally
`<answer>...</answer>`) is fed through the sampler's `score_append` and
reported as generated, with the log-probs and entropies that forward gives it
(teacher forcing), so every reported token's `logp` is what the trainer recomputes.
For end-to-end tests and benchmarks only; training uses the `Sampler` itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class ForcedState:
    inner: Any  # the sampler's DecodeState
    ids: list[list[int]]  # every id of each row (prompt, generated, appended)
    forced: list[int]  # planned segments already forced per row
    free_left: list[int]  # real tokens each row still samples in its current segment before it is forced

    @property
    def cursor(self) -> int:
        return self.inner.cursor

    @property
    def cursors(self) -> np.ndarray:
        return self.inner.cursors

    @property
    def num_rows(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class ForcedMarks:
    inner: Any  # the sampler's Marks
    ids: list[list[int]]  # each marked row's ids at the mark
    forced: list[int]
    free_left: list[int]


@dataclass(frozen=True)
class ForcedOutput:
    tokens: np.ndarray  # int32[B, N]
    logp: np.ndarray  # float32[B, N]
    entropy: np.ndarray  # float32[B, N]
    num_tokens: np.ndarray  # int32[B]
    stop_reason: list[str]
    forced_tokens: np.ndarray  # int32[B]: how many of each row's tokens (at its end) were forced


class ToolForcingGenerator:
    """Wraps `sampler` (an `aepo_jax.sampling.Sampler`); see the module docstring.

    Forced tokens are fed with `Sampler.score_append`, which scores each of them
    (log-prob and entropy at `temperature`) in the same forward that writes it
    to the cache, so a forced segment costs what an append costs.
    """

    def __init__(self, sampler: Any, plan: Sequence[Sequence[int]], free_tokens: int | tuple[int, int] = 8,
                 temperature: float = 1.0, seed: int = 0) -> None:
        if not plan or any(len(p) == 0 for p in plan):
            raise ValueError("plan needs at least one non-empty forced segment")
        low, high = (free_tokens, free_tokens) if isinstance(free_tokens, int) else tuple(free_tokens)
        if not 0 <= low <= high:
            raise ValueError(f"free_tokens must be a count >= 0 or a range (low, high) with 0 <= low <= high, "
                             f"got {free_tokens}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.sampler = sampler
        self.plan = [list(map(int, p)) for p in plan]
        self.free_tokens = (int(low), int(high))
        self.temperature = float(temperature)
        self.forced_total = 0
        self._draws = np.random.default_rng(seed)  # free-token counts of new segments

    def _draw_free(self, rows: int) -> list[int]:
        """Free-token counts of `rows` new segments (all equal for a fixed count)."""
        low, high = self.free_tokens
        return [low] * rows if low == high else [int(x) for x in self._draws.integers(low, high + 1, size=rows)]

    @property
    def counters(self) -> dict[str, int]:
        return self.sampler.counters

    @property
    def max_cache_len(self) -> int:
        return self.sampler.max_cache_len

    def compiles_held(self) -> contextlib.AbstractContextManager:
        held = getattr(self.sampler, "compiles_held", None)
        return contextlib.nullcontext() if held is None else held()

    def prefill(self, prompts: Sequence[Sequence[int]]) -> ForcedState:
        return ForcedState(self.sampler.prefill(prompts), [list(map(int, p)) for p in prompts], [0] * len(prompts),
                           self._draw_free(len(prompts)))

    def append(self, state: ForcedState, tokens: Sequence[Sequence[int]]) -> ForcedState:
        """Appends (tool results); a row that receives tokens starts a new segment."""
        inner = self.sampler.append(state.inner, tokens)
        draws = iter(self._draw_free(sum(1 for t in tokens if len(t))))
        free_left = [next(draws) if len(t) else left for t, left in zip(tokens, state.free_left, strict=True)]
        return ForcedState(inner, [r + list(map(int, t)) for r, t in zip(state.ids, tokens, strict=True)],
                           list(state.forced), free_left)

    def fork(self, state: ForcedState, rows: Sequence[int]) -> ForcedState:
        return ForcedState(self.sampler.fork(state.inner, rows), [list(state.ids[r]) for r in rows],
                           [state.forced[r] for r in rows], [state.free_left[r] for r in rows])

    def mark(self, state: ForcedState, rows: Sequence[int]) -> ForcedMarks:
        return ForcedMarks(self.sampler.mark(state.inner, rows), [list(state.ids[r]) for r in rows],
                           [state.forced[r] for r in rows], [state.free_left[r] for r in rows])

    def fork_marked(self, state: ForcedState, rows: Sequence[int], marks: ForcedMarks,
                    mark_rows: Sequence[int]) -> ForcedState:
        return ForcedState(self.sampler.fork_marked(state.inner, rows, marks.inner, mark_rows),
                           [list(marks.ids[m]) for m in mark_rows], [marks.forced[m] for m in mark_rows],
                           [marks.free_left[m] for m in mark_rows])

    def place(self, state: ForcedState, dst_rows: Sequence[int], source: ForcedState,
              src_rows: Sequence[int]) -> ForcedState:
        ids, forced, free_left = [list(r) for r in state.ids], list(state.forced), list(state.free_left)
        for d, s in zip(dst_rows, src_rows, strict=True):
            ids[d], forced[d], free_left[d] = list(source.ids[s]), source.forced[s], source.free_left[s]
        return ForcedState(self.sampler.place(state.inner, dst_rows, source.inner, src_rows), ids, forced, free_left)

    def concat(self, states: Sequence[ForcedState]) -> ForcedState:
        return ForcedState(self.sampler.concat([s.inner for s in states]), [list(r) for s in states for r in s.ids],
                           [f for s in states for f in s.forced], [f for s in states for f in s.free_left])

    def extend(self, state: ForcedState, source: ForcedState) -> ForcedState:
        extend = getattr(self.sampler, "extend", None)
        inner = extend(state.inner, source.inner) if extend else self.sampler.concat([state.inner, source.inner])
        return ForcedState(inner, [list(r) for s in (state, source) for r in s.ids],
                           [*state.forced, *source.forced], [*state.free_left, *source.free_left])

    def reserve(self, state: ForcedState, rows: int) -> ForcedState:
        return ForcedState(self.sampler.reserve(state.inner, rows), state.ids, state.forced, state.free_left)

    continues_stops = True  # passes continue_ids on to the sampler

    def generate(self, state: ForcedState, max_new_tokens: int | Sequence[int], rng: Any = None,
                 continue_ids: Sequence[Sequence[int]] | None = None):
        budgets = [int(max_new_tokens)] * state.num_rows if isinstance(max_new_tokens, int) else list(max_new_tokens)
        free = [min(b, left) for b, left in zip(budgets, state.free_left, strict=True)]
        inner, out = self.sampler.generate(state.inner, free, rng, continue_ids=continue_ids)
        ids = [list(r) for r in state.ids]
        forced_count = list(state.forced)
        free_left = [left - int(n) for left, n in zip(state.free_left, out.num_tokens, strict=True)]
        rows_tokens, rows_logp, rows_entropy, reasons, forced_lens = [], [], [], [], []
        forced_ids: list[list[int]] = []
        for i in range(state.num_rows):
            n = int(out.num_tokens[i])
            rows_tokens.append([int(t) for t in out.tokens[i, :n]])
            rows_logp.append([float(x) for x in out.logp[i, :n]])
            rows_entropy.append([float(x) for x in out.entropy[i, :n]])
            ids[i].extend(rows_tokens[i])
            segment = self.plan[min(forced_count[i], len(self.plan) - 1)]
            reason = out.stop_reason[i]
            if reason == "length" and free_left[i] == 0 and budgets[i] - n >= len(segment):
                forced_ids.append(segment)
                forced_count[i] += 1
                reason = "stop"
            else:
                forced_ids.append([])
            reasons.append(reason)
            forced_lens.append(len(forced_ids[i]))
        if any(forced_lens):
            inner, logp, entropy = self.sampler.score_append(inner, forced_ids, self.temperature)
            for i in range(state.num_rows):
                rows_tokens[i].extend(forced_ids[i])
                rows_logp[i].extend(float(x) for x in logp[i])
                rows_entropy[i].extend(float(x) for x in entropy[i])
                ids[i].extend(forced_ids[i])
            self.forced_total += sum(forced_lens)
        width = max([1, *(len(t) for t in rows_tokens)])
        pack = lambda rows, dtype: np.array([r + [0] * (width - len(r)) for r in rows], dtype)
        output = ForcedOutput(pack(rows_tokens, np.int32), pack(rows_logp, np.float32), pack(rows_entropy, np.float32),
                              np.array([len(r) for r in rows_tokens], np.int32), reasons,
                              np.array(forced_lens, np.int32))
        return ForcedState(inner, ids, forced_count, free_left), output

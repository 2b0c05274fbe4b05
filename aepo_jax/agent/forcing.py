"""A generator that mixes real sampling with forced tool-call tokens.

A random-weight (or barely trained) model almost never closes a tool tag, so an
end-to-end run of the agent loop with the real sampler would exercise no tools
and no branching. `ToolForcingGenerator` wraps a `Sampler`: each segment first
samples up to `free_tokens` real tokens; if the row has not stopped by itself,
the next planned call (`<search>...</search>`, `<python>...</python>`, finally
`<answer>...</answer>`) is fed through the sampler's `append` and reported as
generated, with its log-probs and entropies scored by a full forward of the
same model, so every reported token's `logp` is what the trainer recomputes.
For end-to-end tests and benchmarks only; training uses the `Sampler` itself.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


@dataclass
class ForcedState:
    inner: Any  # the sampler's DecodeState
    ids: list[list[int]]  # every id of each row (prompt, generated, appended)
    forced: list[int]  # planned segments already forced per row

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
class ForcedOutput:
    tokens: np.ndarray  # int32[B, N]
    logp: np.ndarray  # float32[B, N]
    entropy: np.ndarray  # float32[B, N]
    num_tokens: np.ndarray  # int32[B]
    stop_reason: list[str]
    forced_tokens: np.ndarray  # int32[B]: how many of each row's tokens (at its end) were forced


class ToolForcingGenerator:
    """Wraps `sampler` (a `aepo_jax.sampling.Sampler` of the model `graphdef, params`); see module docstring.

    `score_bucket`: the scoring forward pads rows to a multiple of this length
    (and the batch to a multiple of 8) so it compiles once or twice per run.
    """

    def __init__(self, sampler: Any, graphdef: nnx.GraphDef, params: nnx.State, plan: Sequence[Sequence[int]],
                 free_tokens: int = 8, temperature: float = 1.0, score_bucket: int = 512) -> None:
        if not plan or any(len(p) == 0 for p in plan):
            raise ValueError("plan needs at least one non-empty forced segment")
        if free_tokens < 0:
            raise ValueError(f"free_tokens must be >= 0, got {free_tokens}")
        self.sampler = sampler
        self.plan = [list(map(int, p)) for p in plan]
        self.free_tokens = free_tokens
        self.score_bucket = score_bucket
        self.forced_total = 0
        self.score_seconds = 0.0  # wall seconds in the scoring forward of forced tokens (results fetched)

        def score(params, ids):  # ids int32[B, T] -> (logp, entropy) of ids[:, 1:] given the prefix, [B, T-1]
            logits = nnx.merge(graphdef, params)(ids).astype(jnp.float32) / temperature  # [B, T, V]
            logz = jax.nn.log_softmax(logits[:, :-1], axis=-1)  # [B, T-1, V]
            logp = jnp.take_along_axis(logz, ids[:, 1:, None], axis=-1)[..., 0]
            entropy = -(jnp.exp(logz) * logz).sum(-1)
            return logp, entropy

        self._params = params
        self._score = jax.jit(score)

    @property
    def counters(self) -> dict[str, int]:
        return self.sampler.counters

    @property
    def max_cache_len(self) -> int:
        return self.sampler.max_cache_len

    def prefill(self, prompts: Sequence[Sequence[int]]) -> ForcedState:
        return ForcedState(self.sampler.prefill(prompts), [list(map(int, p)) for p in prompts], [0] * len(prompts))

    def append(self, state: ForcedState, tokens: Sequence[Sequence[int]]) -> ForcedState:
        inner = self.sampler.append(state.inner, tokens)
        return ForcedState(inner, [r + list(map(int, t)) for r, t in zip(state.ids, tokens, strict=True)],
                           list(state.forced))

    def fork(self, state: ForcedState, rows: Sequence[int]) -> ForcedState:
        return ForcedState(self.sampler.fork(state.inner, rows), [list(state.ids[r]) for r in rows],
                           [state.forced[r] for r in rows])

    def concat(self, states: Sequence[ForcedState]) -> ForcedState:
        return ForcedState(self.sampler.concat([s.inner for s in states]), [list(r) for s in states for r in s.ids],
                           [f for s in states for f in s.forced])

    def generate(self, state: ForcedState, max_new_tokens: int | Sequence[int], rng: Any = None):
        budgets = [int(max_new_tokens)] * state.num_rows if isinstance(max_new_tokens, int) else list(max_new_tokens)
        free = [min(b, self.free_tokens) for b in budgets]
        inner, out = self.sampler.generate(state.inner, free, rng)
        ids = [list(r) for r in state.ids]
        forced_count = list(state.forced)
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
            if reason == "length" and budgets[i] - n >= len(segment):
                forced_ids.append(segment)
                forced_count[i] += 1
                reason = "stop"
            else:
                forced_ids.append([])
            reasons.append(reason)
            forced_lens.append(len(forced_ids[i]))
        if any(forced_lens):
            inner = self.sampler.append(inner, forced_ids)
            scored = self._score_tail([ids[i] + forced_ids[i] for i in range(state.num_rows)], forced_lens)
            for i, (lp, h) in enumerate(scored):
                rows_tokens[i].extend(forced_ids[i])
                rows_logp[i].extend(lp)
                rows_entropy[i].extend(h)
                ids[i].extend(forced_ids[i])
            self.forced_total += sum(forced_lens)
        width = max([1, *(len(t) for t in rows_tokens)])
        pack = lambda rows, dtype: np.array([r + [0] * (width - len(r)) for r in rows], dtype)
        output = ForcedOutput(pack(rows_tokens, np.int32), pack(rows_logp, np.float32), pack(rows_entropy, np.float32),
                              np.array([len(r) for r in rows_tokens], np.int32), reasons,
                              np.array(forced_lens, np.int32))
        return ForcedState(inner, ids, forced_count), output

    def _score_tail(self, rows: list[list[int]], tails: list[int]) -> list[tuple[list[float], list[float]]]:
        """Log-probs and entropies of the last `tails[i]` ids of each row, by a full forward (right-padded)."""
        scored = [i for i, tail in enumerate(tails) if tail > 0]
        length = max(len(rows[i]) for i in scored)
        bucket = self.score_bucket * -(-length // self.score_bucket)
        batch = np.zeros((8 * -(-len(scored) // 8), bucket), np.int32)  # rows padded to a multiple of 8
        for j, i in enumerate(scored):
            batch[j, : len(rows[i])] = rows[i]
        start = time.perf_counter()
        logp, entropy = jax.device_get(self._score(self._params, jnp.asarray(batch)))  # [B, T-1]
        self.score_seconds += time.perf_counter() - start
        result: list[tuple[list[float], list[float]]] = [([], []) for _ in rows]
        for j, i in enumerate(scored):
            positions = range(len(rows[i]) - 1 - tails[i], len(rows[i]) - 1)  # predicting the last tails[i] ids
            result[i] = ([float(logp[j, p]) for p in positions], [float(entropy[j, p]) for p in positions])
        return result

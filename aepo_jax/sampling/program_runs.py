"""The Sampler's calls of its block and decode-window programs: shape choice and host bookkeeping.

`ProgramRuns` is a part of `Sampler` (sampler.py): it picks each call's buckets (block length,
attention span, decode window, sub-batch), the compiled variant to run (`compile_ahead.py`), builds
the padded host inputs and reads the outputs back. The arithmetic is in `programs.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from aepo_jax.sampling.buckets import attention_span, bucket_length, span_ladder
from aepo_jax.sampling.cache_sharding import place_rows
from aepo_jax.sampling.jitted import (
    block_program,
    decode_program,
    rows_block_program,
    rows_decode_program,
    rows_scored_block_program,
    scored_block_program,
    start_program,
)
from aepo_jax.sampling.params import SamplingParams
from aepo_jax.sampling.state import DecodeState, SampleOutput
from aepo_jax.sampling.stopping import NOT_STOPPED, STOP_REASON_NAMES, StartWindows

MIN_CACHE_SLOTS = 128  # smallest cache bucket
MIN_BLOCK = 8  # smallest prompt / append block bucket
MIN_NEW_TOKENS = 16  # smallest decode window
# Decode runs in windows of at most this many steps; each window's attention reads only the leading
# cache slots that hold every row's tokens by its end (`attention_span`, at least MIN_SPAN), not
# the whole cache.
DECODE_WINDOW = 32
MIN_SPAN = 64
# Longest block one forward writes: a longer prefill, repack or append runs as successive
# chunks of this many tokens, so the dense attention scores of a cached block
# ([B, KVH, G, T, S] float32) stay bounded at the paper configs' 8k-token repacks.
MAX_BLOCK_TOKENS = 256
SUB_BATCH_FRACTION = 4  # an append to at most batch / 4 rows runs on a sub-batch of that size
SUB_BATCH_PIECES = 2  # an append to at most this many sub-batches of rows runs as that many sub-batch calls


class ProgramRuns:
    """Block and decode-window calls of a `Sampler` (it provides _call, _compiles, layout, pad_id,
    max_block_tokens, _data_size, _graphdef, _params_state, _stop_table, _counters, _layerwise_weights,
    _check_ids and last_decode_spans)."""

    def _decode(self, state: DecodeState, budgets: np.ndarray, row_keys: jax.Array, sampling: SamplingParams,
                top_logprobs: int, rows: Sequence[int] | None = None, starts: StartWindows | None = None
                ) -> tuple[DecodeState, SampleOutput]:
        """The decode windows of `generate` over every row of `state` (budgets int32[batch]), or over rows
        `rows` only (at most half the batch; `budgets` and `row_keys` are then theirs, padded to half the
        batch, and the output's rows are theirs): each window takes their live span, decodes it and puts
        it back (`rows_decode_program`)."""
        target = _DecodeTarget(state, rows)
        longest = int(budgets.max())
        row_keys = place_rows(self.layout, row_keys)
        budget = place_rows(self.layout, jnp.asarray(budgets))
        progress = self._call("decode", start_program, budget, self._stop_table)
        if starts is not None:  # rows going on with a paused segment: the stops they had begun
            # placed as start_program placed the empty ones: another layout would be another compile
            progress = progress.replace(window=jax.device_put(starts.ids, progress.window.sharding),
                                        text_window=jax.device_put(starts.text, progress.text_window.sharding))
        # The variant any window of this batch may run (the longest window over the whole cache): a later
        # window whose own shape and every longer span are not compiled runs as it, not compiling on the spot.
        self._compile_window_later(target, (self._graphdef, self._params_state, state.arrays,
                                            *target.row_inputs(self.layout), row_keys, budget, self._stop_table,
                                            progress), DECODE_WINDOW, state.cache_length, sampling, top_logprobs)
        arrays, cursors, windows = state.arrays, target.cursors, []
        self.last_decode_spans = []
        n, width = target.num_rows, max(longest, 0)
        num_tokens = np.zeros((n,), np.int32)
        decoding = budgets[:n] > 0  # rows with no budget (waiting on a tool, free slots) write nothing
        while True:
            # One window: its span holds every decoding row's tokens up to the window's end (a row
            # with no budget may be longer: it writes nothing, and its outputs are discarded). Variants
            # that do not need compiling now: longer spans, then the longest window (the budgets stop
            # rows in time).
            variants, keys = self._window_variants(target, longest - int(num_tokens.max(initial=0)),
                                                   int((cursors + num_tokens)[decoding].max(initial=0)),
                                                   sampling, top_logprobs)
            pick = self._compiles.choose(keys)
            args = (self._graphdef, self._params_state, arrays, *target.row_inputs(self.layout), row_keys, budget,
                    self._stop_table, progress)
            options = self._decode_options(sampling, top_logprobs)
            if pick:
                self._compile_window_later(target, args, *variants[0], sampling, top_logprobs)
            arrays, out, progress = self._call("decode", target.program, *args, max_steps=variants[pick][0],
                                               span=variants[pick][1], **options)
            self._compiles.ran(keys[pick])
            windows.append(out)
            self.last_decode_spans.append(variants[pick][1])
            done = jax.device_get((progress.num_tokens, progress.stop_reason))
            num_tokens = np.asarray(done[0][:n])
            if not (np.asarray(done[1][:n]) == NOT_STOPPED).any() or int(num_tokens.max(initial=0)) >= longest:
                break
        out = jax.device_get(windows)
        stop_reason, stop_sequence_index = jax.device_get((progress.stop_reason, progress.stop_sequence_index))
        joined = lambda name: None if getattr(out[0], name) is None else \
            np.concatenate([getattr(w, name) for w in out], axis=1)[:n, :width]
        result = SampleOutput(
            tokens=joined("tokens"),
            logp=joined("logp"),
            logp_truncated=joined("logp_truncated"),
            entropy=joined("entropy"),
            num_tokens=num_tokens,
            stop_reason=[STOP_REASON_NAMES[int(r)] for r in stop_reason[:n]],
            stop_sequence_index=stop_sequence_index[:n],
            top_logprobs=joined("top_logprobs"),
            top_ids=joined("top_ids"),
        )
        self._counters["decode_tokens"] += int(result.num_tokens.sum())
        return DecodeState(arrays, state.num_rows), result

    @staticmethod
    def _window_variants(target: _DecodeTarget, tokens_left: int, end: int, sampling: SamplingParams,
                         top_logprobs: int) -> tuple[list[tuple[int, int]], list[tuple]]:
        """(window, span) variants a decode window may run, the exact one first, and their compile keys.

        `tokens_left`: the most tokens a row still may generate; `end`: the furthest cursor of a
        decoding row. Its span holds every decoding row's tokens up to the window's end (a row with no
        budget may be longer: it writes nothing, and its outputs are discarded). Variants that do not
        need compiling now: longer spans, then the longest window (the budgets stop rows in time)."""
        steps = min(DECODE_WINDOW, bucket_length(max(tokens_left, 1), MIN_NEW_TOKENS))
        length = target.cache_length
        variants = [(w, s) for w in dict.fromkeys((steps, DECODE_WINDOW))
                    for s in span_ladder(attention_span(end + w, length, MIN_SPAN), length, MIN_SPAN)]
        return variants, [_decode_key(target, w, s, sampling, top_logprobs) for w, s in variants]

    def _compile_window_later(self, target: _DecodeTarget, args: tuple, window: int, span: int,
                              sampling: SamplingParams, top_logprobs: int) -> None:
        """Queues the background compile of the decode window of `window` steps over `span` slots of
        `target` (`args`: its program's arguments), unless it is compiled or queued."""
        key = _decode_key(target, window, span, sampling, top_logprobs)
        if not self._compiles.knows(key):  # (before the options: they split the layer weights on first use)
            self._compiles.compile_later(key, target.program, args, {
                **self._decode_options(sampling, top_logprobs), "max_steps": window, "span": span})

    def _decode_options(self, sampling: SamplingParams, top_logprobs: int) -> dict:
        """The decode program's static options."""
        return {"sampling": sampling, "pad_id": self.pad_id, "num_top_logprobs": int(top_logprobs),
                "layout": self.layout, "layer_params": self._layerwise_weights()}

    def _halves_would_serve(self, state: DecodeState) -> bool:
        """Whether a decode over more than half of `state`'s batch should run as two half-batch decodes
        (`_decode_in_halves`): no decode program at this batch has run or compiled, and the
        half-batch decode of this batch has (`rows_decode_program` at this batch ran)."""
        compiles, batch, length = self._compiles, state.batch_size, state.cache_length
        return (compiles.enabled and not compiles.has_ready(("decode", batch, length))
                and compiles.has_ready(("rows", batch, length)))

    def _decode_in_halves(self, state: DecodeState, active: np.ndarray, budgets: np.ndarray, row_keys: jax.Array,
                          sampling: SamplingParams, top_logprobs: int, starts: StartWindows | None = None
                          ) -> tuple[DecodeState, SampleOutput]:
        """A compiled stand-in for a decode over more than half the batch that would otherwise compile on
        the spot: its rows decode in two half batches (`_generate_rows`; each row keeps its own key,
        so it draws what one decode would draw), and the whole-batch decode program is queued to compile
        in the background (a half-batch program is the fallback of no other call)."""
        half = state.batch_size // 2
        # Shapes only (a budget array would compile a staging program here): as `_decode` places them.
        budget = jax.ShapeDtypeStruct(budgets.shape, jnp.int32, sharding=None if self.layout is None else self.layout.rows(1))
        progress = jax.eval_shape(start_program, budget, self._stop_table)
        target = _DecodeTarget(state, None)
        variants, _ = self._window_variants(target, int(budgets.max()),
                                            int(state.cursors[budgets[: state.num_rows] > 0].max(initial=0)),
                                            sampling, top_logprobs)
        args = (self._graphdef, self._params_state, state.arrays, place_rows(self.layout, row_keys), budget,
                self._stop_table, progress)
        self._compile_window_later(target, args, *variants[0], sampling, top_logprobs)
        self._compiles.fallback_calls += 1
        state, first = self._generate_rows(state, active[:half], budgets, row_keys, sampling, top_logprobs, starts)
        state, second = self._generate_rows(state, active[half:], budgets, row_keys, sampling, top_logprobs, starts)
        return state, first.with_rows_of(second, active[half:].tolist(), self.pad_id)

    def _run_block(self, state: DecodeState, token_lists: Sequence[Sequence[int]], block: int, kind: str,
                   score_temperature: float | None = None):
        """Feeds right-aligned ragged token lists in chunks of at most `max_block_tokens`; returns the
        state, and with `score_temperature` also the host (logp, entropy) `[B, block]` of every entry.

        When the rows that receive tokens fit in a quarter of the batch, only a quarter of the batch
        runs the forward (`rows_block_program`): those rows' cache rows are gathered, written and put
        back (an append of a few tool results to a large batch costs a quarter of the batch's forward).
        Rows that fit in SUB_BATCH_PIECES quarters run as that many such sub-batches, one after the
        other, through the same program (the continuous schedule's appends mostly feed a third of
        the batch: two quarters cost half the batch's forward).
        """
        for row, ids in enumerate(token_lists):
            self._check_ids(ids, f"row {row}")
        span = self._block_span(state, [len(t) for t in token_lists])
        receiving = [row for row, ids in enumerate(token_lists) if len(ids)]
        # One sub-batch size per batch (a quarter of it), not one per count of receiving rows: each
        # size is another compiled program for every block and cache length.
        sub_batch = sub_batch_rows(state.batch_size, self._data_size)
        extra = () if score_temperature is None else (score_temperature,)
        # Variants that do not need compiling now (a single-chunk block only): longer spans, then longer
        # blocks; then the same over the whole batch when the exact one runs on sub-batches.
        lengths = [block] if block > self.max_block_tokens else \
            [block << i for i in range((self.max_block_tokens // block).bit_length())]
        pieces = -(-len(receiving) // sub_batch)
        on_fewer_rows = pieces <= SUB_BATCH_PIECES and pieces * sub_batch < state.batch_size
        paths = [True, False] if receiving and on_fewer_rows else [False]
        if receiving and not on_fewer_rows and sub_batch < state.batch_size:
            # Only a fallback, never the exact variant: a compiled sub-batch program runs an append to more
            # rows, in more pieces, while the whole-batch one it needs compiles (with compiles in the background).
            paths.append(True)
        variants = [(on_rows, t, s) for on_rows in paths for t in lengths for s in self._block_spans(state, span)]
        keys = [(_block_program(on_rows, score_temperature).__name__, sub_batch if on_rows else state.batch_size,
                 state.cache_length, t, s, *extra) for on_rows, t, s in variants]
        pick = self._compiles.choose(keys)
        if pick:
            on_rows, exact, exact_span = variants[0]  # a block longer than max_block_tokens runs in chunks
            n_rows = sub_batch if on_rows else state.batch_size
            blank = place_rows(self.layout, np.zeros((n_rows, min(exact, self.max_block_tokens)), np.int32))
            row_inputs = (place_rows(self.layout, np.zeros((n_rows,), np.int32)),) * 2 if on_rows else ()
            self._compiles.compile_later(keys[0], _block_program(on_rows, score_temperature), (
                self._graphdef, self._params_state, state.arrays, *row_inputs, blank, blank.astype(bool),
                self.layout, exact_span, *extra), {})
        on_rows, block, span = variants[pick]
        program = _block_program(on_rows, score_temperature)
        groups = [receiving[i:i + sub_batch] for i in range(0, len(receiving), sub_batch)] if on_rows else [None]
        arrays, per_entry = state.arrays, None
        for group in groups:
            arrays, scores = self._feed_block(arrays, program, token_lists, group, sub_batch, block, span, kind, extra)
            if score_temperature is None:
                continue
            if group is None:
                per_entry = scores
                continue
            if per_entry is None:  # back to one row per batch row (zero where nothing was appended)
                per_entry = tuple(np.zeros((state.batch_size, p.shape[1]), np.float32) for p in scores)
            for full, part in zip(per_entry, scores, strict=True):
                full[group] = part[: len(group)]
        self._compiles.ran(keys[pick])
        state = DecodeState(arrays, state.num_rows)
        return state if score_temperature is None else (state, per_entry)

    def _feed_block(self, arrays, program, token_lists: Sequence[Sequence[int]], group: list[int] | None,
                    sub_batch: int, block: int, span: int | None, kind: str, extra: tuple):
        """One block call of `_run_block`: the rows of `group` as a sub-batch of `sub_batch` rows (None: the
        whole batch); `extra` is (score temperature,) for a scored block, () otherwise. Returns the arrays and,
        when scored, the host (logp, entropy) of the call's rows."""
        if group is not None:
            rows = padded_rows(group, sub_batch)
            dst = np.full((sub_batch,), arrays.cursor.shape[0], np.int32)  # padding rows: written nowhere
            dst[: len(group)] = group
            token_lists = [token_lists[r] for r in group] + [[]] * (sub_batch - len(group))
            row_inputs = (place_rows(self.layout, rows), place_rows(self.layout, dst))
        else:
            row_inputs = ()
        n_rows = sub_batch if group is not None else arrays.cursor.shape[0]
        tokens = np.full((n_rows, block), self.pad_id, np.int32)
        valid = np.zeros(tokens.shape, bool)
        for row, ids in enumerate(token_lists):
            if len(ids):
                tokens[row, block - len(ids):] = ids
                valid[row, block - len(ids):] = True
        # Blocks are powers of two, so chunks tile them; a row writes only its real tokens, at its cursor.
        # A block's attention reads the slots a cache grown by buckets would hold (`_block_span`): the whole
        # cache unless `min_cache_len` made it longer.
        chunk = min(block, self.max_block_tokens)
        scores = []
        for start in range(0, block, chunk):
            inputs = (self._graphdef, self._params_state, arrays, *row_inputs,
                      place_rows(self.layout, tokens[:, start:start + chunk]),
                      place_rows(self.layout, valid[:, start:start + chunk]), self.layout, span, *extra)
            if not extra:
                arrays = self._call(kind, program, *inputs)
            else:
                arrays, chunk_scores = self._call(kind, program, *inputs)
                scores.append(jax.device_get(chunk_scores))
        if not extra:
            return arrays, None
        return arrays, tuple(np.concatenate([s[i] for s in scores], axis=1) for i in range(2))

    @staticmethod
    def _block_spans(state: DecodeState, span: int | None) -> list[int | None]:
        """`span` (`_block_span`) and every larger one a block may also read, up to the whole cache (None)."""
        spans: list[int | None] = []
        while span is not None:
            spans.append(span)
            span = None if 2 * span >= state.cache_length else 2 * span
        return [*spans, None]

    def _block_span(self, state: DecodeState, counts: Sequence[int]) -> int | None:
        """Leading cache slots a block of `counts[i]` tokens per row reads: as many as a cache grown by
        buckets would hold (the power of two, at least MIN_CACHE_SLOTS, of the receiving rows' furthest
        end; a row that receives nothing writes nothing, and its outputs are discarded), so a longer
        cache (`min_cache_len`) costs a block no more than a grown one; None: the whole cache."""
        counts = np.asarray(counts, np.int64)
        end = int(np.max((state.cursors + counts)[counts > 0], initial=1))
        span = bucket_length(end, MIN_CACHE_SLOTS)
        return None if span >= state.cache_length else span


class _DecodeTarget:
    """What a generate's decode windows run on: every row of `state` (`decode_program`), or rows `rows`
    of it (`rows_decode_program`, padded to half the batch)."""

    def __init__(self, state: DecodeState, rows: Sequence[int] | None) -> None:
        self.batch_size, self.cache_length = state.batch_size, state.cache_length
        if rows is None:
            self.rows, self.num_rows, self.cursors = None, state.num_rows, state.cursors
            self.program, self.name, self.decoded_rows = decode_program, "decode", state.batch_size
            return
        rows = [int(r) for r in rows]
        self.decoded_rows = state.batch_size // 2  # (the Sampler decodes rows only when it divides the mesh's batch)
        self.rows, self.num_rows = padded_rows(rows, self.decoded_rows), len(rows)
        self.dst = np.full((self.decoded_rows,), state.batch_size, np.int32)  # padding rows: written nowhere
        self.dst[: len(rows)] = rows
        self.cursors = np.asarray(state.arrays.cursor)[rows]
        self.program, self.name = rows_decode_program, "rows_decode"
        self._placed: tuple | None = None

    def row_inputs(self, layout) -> tuple:
        """The program's row-index arguments: none, or (rows, dst) placed like the batch (once per generate)."""
        if self.rows is None:
            return ()
        if self._placed is None:
            self._placed = (place_rows(layout, self.rows), place_rows(layout, self.dst))
        return self._placed


def _decode_key(target: _DecodeTarget, window: int, span: int, sampling: SamplingParams, top_logprobs: int) -> tuple:
    """The compiled-variant key of a decode window of `window` steps over `span` slots of `target`."""
    return (target.name, target.batch_size, target.cache_length, target.decoded_rows, window, span, sampling,
            int(top_logprobs))


def _block_program(on_rows: bool, score_temperature: float | None):
    """The jitted block program: over a sub-batch of receiving rows or the whole batch, scored or not."""
    if on_rows:
        return rows_block_program if score_temperature is None else rows_scored_block_program
    return block_program if score_temperature is None else scored_block_program


def sub_batch_rows(batch: int, batch_devices: int) -> int:
    """Rows of a sub-batch append to a batch of `batch` rows: a quarter of it, sharded like the batch (a
    multiple of its devices)."""
    return -(-max(batch // SUB_BATCH_FRACTION, 1) // batch_devices) * batch_devices


def padded_rows(rows: Sequence[int], size: int) -> np.ndarray:
    """int32[size]: `rows`, then copies of the first to fill a batch of `size` rows."""
    rows = list(rows)
    return np.asarray(rows + [rows[0]] * (size - len(rows)), np.int32)

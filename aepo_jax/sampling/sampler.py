"""The host-side Sampler: token ids in, tokens with log-probs and entropies out.

It calls the jitted programs of `jitted.py` (one compile per shape bucket; the block and
decode-window calls are in `program_runs.py`, the row operations in `row_ops.py`) and
does the bookkeeping around them: bucketing, padding rows, cache growth, PRNG
keys, counters. All arithmetic happens in `programs.py`, `layout.py` and
`token_distribution.py`.

Consumption rule: `generate` and `append` donate the arrays of the state they
receive (the cache is updated in place); use only the state they return.
`fork` and `concat` copy and leave their inputs usable; `place` donates its
destination and leaves its source usable; `extend` and `reserve` consume the
state they grow. `mark` copies no cache, and `fork_marked` reads the live rows.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from aepo_jax.parallel import shard_state
from aepo_jax.sampling.buckets import (
    bucket_batch,
    bucket_length,
)
from aepo_jax.sampling.cache_sharding import (
    DecodeSharding,
    empty_program,
)
from aepo_jax.sampling.compile_ahead import BackgroundCompiler
from aepo_jax.sampling.jitted import (
    PROGRAMS,
    HashedGraphDef,
    grow_program,
    split_layers_program,
)
from aepo_jax.sampling.params import SamplingParams
from aepo_jax.sampling.program_runs import (
    MAX_BLOCK_TOKENS,
    MIN_BLOCK,
    MIN_CACHE_SLOTS,
    ProgramRuns,
    padded_rows,
)
from aepo_jax.sampling.row_ops import RowOps
from aepo_jax.sampling.state import DecodeArrays, DecodeState, SampleOutput
from aepo_jax.sampling.stopping import StartWindows, build_stop_table, start_windows


def _signature(state: nnx.State) -> tuple:
    """The tree structure, shapes and dtypes of a parameter state (what `set_params` must keep)."""
    return jax.tree.structure(state), [(tuple(x.shape), jnp.dtype(x.dtype)) for x in jax.tree.leaves(state)]


# Platforms whose compiler copies each layer's slice of the stacked weights and cache out of the stack at
# every step of a scanned decode (XLA:CPU; XLA:GPU, seen in the optimized HLO on an H200, where the
# layerwise window ran a 0.5B decode step in 2.09 ms against the scan's 3.42 ms in one run:
# docs/rollout_engine.md, "On a GPU"). Not TPU: its compiled layer loop reads the stacks in place through
# fused dynamic slices (v5p, ahead of time), and the stacked scan is the layout its memory plan compiles.
LAYERWISE_DECODE_PLATFORMS = frozenset({"cpu", "gpu"})


def default_layerwise_decode(platforms: set[str] | frozenset[str]) -> bool:
    """Whether a Sampler on devices of these platforms decodes layerwise by default: only when every
    device is of a platform in `LAYERWISE_DECODE_PLATFORMS` (a mixed or unknown set keeps the scan)."""
    return bool(platforms) and set(platforms) <= LAYERWISE_DECODE_PLATFORMS


class Sampler(ProgramRuns, RowOps):
    """Jitted KV-cache sampler with prefill, generate, append, fork and concat (DESIGN.md, Sampler).

    `generate(..., continue_ids=)` lets a row going on with a paused segment keep the stop it had begun
    (`continues_stops`).

    Args:
      graphdef: the model's nnx GraphDef (`nnx.split(model)`).
      state: the model's parameter state.
      eos_ids: ids that end a row (stop reason "eos").
      pad_id: id written for padding (never attended to).
      stop_sequences: token-id sequences that end a row right after their last token.
      stop_strings: texts that end a row right after the token that completes one, however the
        text is split into tokens (stop reason "stop"; index M + j after the M id sequences).
      token_bytes: the bytes each id decodes to (`aepo_jax.tokenizers.token_bytes`); needed with
        `stop_strings`.
      params: default SamplingParams.
      max_cache_len: cache slots a row may never exceed (growth beyond raises).
      mesh: optional mesh (the run's, from the composition root). The decode
        arrays' rows are sharded over its batch axes (`data`, `fsdp`) and the
        KV cache's heads over `tensor` (`cache_sharding.DecodeSharding`); the
        parameters as `aepo_jax.parallel.shard_state` says (a no-op when the
        caller already sharded them).
      seed: base of the internal key stream used when generate gets no key.
        Default: drawn from the OS, so two Samplers (and two calls) never
        share samples unless a key is passed explicitly.
      cache_dtype: dtype of the KV cache (default: the model's compute dtype).
      max_block_tokens: longest block one forward writes (a power of two); longer
        prefills, repacks and appends run as successive chunks (same result).
      layerwise_decode: run each decode window on per-layer copies of the weights (made once per
        parameter update, so the weights are held twice) and of the cache's live span, layers
        unrolled (`jitted.decode_program`), instead of scanning the stacked layers every step.
        Default (None): `default_layerwise_decode` of the sampler's device platforms.
      min_cache_len: every decode state has at least this many cache slots (a power of two, at most
        max_cache_len). The default lets a state's cache grow with its rows; max_cache_len fixes
        every state at that length (no grow, one cache length for every program), and blocks and
        decode windows still read only the span their rows fill.
      half_batch_decode: when at most half the batch has a budget, decode those rows in a batch of
        half the size (taken out and placed back) instead of the whole batch. Default (None): on
        where the sampler's devices are CPUs, whose decode cost grows with every row; off on TPU /
        GPU, where the taken half would be a second copy of up to half the cache that the
        ahead-of-time memory plan does not include.
      min_batch: every decode state holds at least this many rows (its batch bucket is that of
        max(rows, min_batch)), so states of a few rows share the programs of one batch size
        instead of compiling their own for 1, 2, 4, ... rows.
      compile_in_background: a block or decode window whose exact shape is not compiled yet runs as
        a compiled variant that holds it (a longer span, block or window) while the exact one
        compiles on a background thread (`compile_ahead.py`), so a call waits for a compile only
        when no variant is compiled. Results then depend on compile timing up to float rounding,
        so it is off by default (every call runs its exact shape: bit-reproducible).
    """

    continues_stops = True  # generate takes continue_ids (the agent loop passes them for paused segments)

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        state: nnx.State,
        *,
        eos_ids: Sequence[int] = (),
        pad_id: int = 0,
        stop_sequences: Sequence[Sequence[int]] = (),
        stop_strings: Sequence[str | bytes] = (),
        token_bytes: Sequence[bytes] | None = None,
        params: SamplingParams | None = None,
        max_cache_len: int = 4096,
        mesh: jax.sharding.Mesh | None = None,
        seed: int | None = None,
        cache_dtype: jnp.dtype | None = None,
        max_block_tokens: int = MAX_BLOCK_TOKENS,
        layerwise_decode: bool | None = None,
        min_batch: int = 1,
        min_cache_len: int = MIN_CACHE_SLOTS,
        half_batch_decode: bool | None = None,
        compile_in_background: bool = False,
    ):
        if min_batch < 1:
            raise ValueError(f"min_batch must be >= 1, got {min_batch}")
        self.min_batch = int(min_batch)
        if min_cache_len < 1 or min_cache_len & (min_cache_len - 1) or min_cache_len > max(max_cache_len, MIN_CACHE_SLOTS):
            raise ValueError(f"min_cache_len must be a power of two in [1, max_cache_len={max_cache_len}], "
                             f"got {min_cache_len}")
        self.min_cache_len = int(min_cache_len)
        if max_block_tokens < MIN_BLOCK or max_block_tokens & (max_block_tokens - 1):
            raise ValueError(f"max_block_tokens must be a power of two >= {MIN_BLOCK}, got {max_block_tokens}")
        self.max_block_tokens = int(max_block_tokens)
        self._graphdef = HashedGraphDef(graphdef)  # a static argument of every program: hashed once
        self.mesh = mesh
        self._params = self._shard_params(state)
        self._params_signature = _signature(self._params)
        self._layer_params = None  # the parameters split per layer, made on the first layerwise decode
        self.config = nnx.merge(graphdef, state).config
        self.pad_id = int(pad_id)
        self.params = params if params is not None else SamplingParams()
        self.max_cache_len = int(max_cache_len)
        self._cache_dtype = cache_dtype if cache_dtype is not None else self.config.dtype
        self._stop_table = build_stop_table(stop_sequences, eos_ids, stop_strings, token_bytes,
                                            self.config.vocab_size)
        if mesh is not None:  # replicated once: an uncommitted table would be copied to the mesh every call
            self._stop_table = jax.device_put(self._stop_table,
                                              jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
        self._token_bytes = list(token_bytes) if stop_strings else None
        self._seed = int(seed) if seed is not None else secrets.randbits(31)
        self._calls = 0
        self._counters = {"prefill_tokens": 0, "append_tokens": 0, "decode_tokens": 0}
        self._device_seconds = {"prefill": 0.0, "append": 0.0, "decode": 0.0, "reshape": 0.0}
        self.layout = None if mesh is None else DecodeSharding(mesh)
        platforms = {d.platform for d in (jax.devices() if mesh is None else mesh.devices.flat)}
        on_cpu = platforms == {"cpu"}
        self.layerwise_decode = (default_layerwise_decode(platforms) if layerwise_decode is None
                                 else bool(layerwise_decode))
        self.half_batch_decode = on_cpu if half_batch_decode is None else bool(half_batch_decode)
        self._data_size = 1 if self.layout is None else self.layout.batch_devices
        self.last_decode_spans: list[int] = []  # cache slots each window of the last generate read
        self._compiles = BackgroundCompiler(compile_in_background, self._mesh_context)
        self._check_ids([self.pad_id, *eos_ids, *(t for s in stop_sequences for t in s)], "sampler token ids")

    # ----------------------------------------------------------------- public API

    @property
    def counters(self) -> dict[str, int]:
        """Real tokens run through the model so far, by kind (prefill, append, decode)."""
        return dict(self._counters)

    @property
    def device_seconds(self) -> dict[str, float]:
        """Wall seconds spent inside the sampler's jitted programs so far, by kind (prefill,
        append, decode, reshape = grow / fork / concat), each call timed until its results are
        ready. Their sum over a rollout's wall time is the device-busy fraction
        (`benchmarks/rollout_bench.py`); the first call of a shape includes its compilation."""
        return dict(self._device_seconds)

    @property
    def compile_counters(self) -> dict[str, int]:
        """`compile_in_background`'s counters: calls that ran a larger compiled variant than they needed
        (`fallback_calls`), exact variants compiled on the background thread (`background_compiles`)
        and, of those, the ones asked for inside `compiles_held()` (`held_compiles`, counted when they start)."""
        return {"fallback_calls": self._compiles.fallback_calls,
                "background_compiles": self._compiles.background_compiles,
                "held_compiles": self._compiles.held_compiles}

    def compiles_held(self) -> contextlib.AbstractContextManager:
        """A block whose calls compile nothing in the background: a shape not compiled yet runs as a
        compiled larger variant (or compiles on the spot where there is none), and its own program
        starts compiling in the background when the block ends (`compile_ahead.py` says why)."""
        return self._compiles.held()

    def wait_for_compiles(self) -> None:
        """Blocks until the background compiles under way have finished (a no-op when there are none)."""
        self._compiles.wait()

    @staticmethod
    def compiled_programs() -> int:
        """How many compiled programs the sampling functions hold (shared by all Samplers)."""
        return sum(p._cache_size() for p in PROGRAMS)

    def set_params(self, state: nnx.State) -> None:
        """Uses new policy parameters (same tree and shapes) from the next call on; no recompile."""
        if _signature(state) != self._params_signature:
            raise ValueError("set_params: the new state's tree, shapes or dtypes differ from the sampler's")
        self._params = self._shard_params(state)
        self._layer_params = None

    def release_params(self) -> None:
        """Drops the sampler's references to its parameters until the next `set_params` (a rollout's copy
        of the weights then does not stay beside the train step); decode states are kept."""
        self._params = None
        self._layer_params = None

    @property
    def _params_state(self) -> nnx.State:
        if self._params is None:
            raise RuntimeError("the sampler's parameters were released (release_params): set_params first")
        return self._params

    def prefill(
        self, prompts: Sequence[Sequence[int]] | np.ndarray, lengths: Sequence[int] | None = None
    ) -> DecodeState:
        """Runs the prompts into a fresh cache, left-padded to a bucketed block.

        Args:
          prompts: ragged token-id lists (each non-empty), or an int array
            [B, T] left-padded, in which case `lengths` gives each row's real
            length (its last lengths[i] ids); without `lengths` every id is real.
          lengths: real lengths of a left-padded array.
        """
        if lengths is not None:
            array = np.asarray(prompts)
            if array.ndim != 2 or len(lengths) != array.shape[0]:
                raise ValueError(f"prefill: lengths ({len(lengths)}) needs a 2-D prompt array with one row each")
            if any(not 0 < n <= array.shape[1] for n in lengths):
                raise ValueError(f"prefill: lengths {list(lengths)} must be in [1, {array.shape[1]}]")
            prompts = [array[i, array.shape[1] - n :].tolist() for i, n in enumerate(lengths)]
        elif isinstance(prompts, np.ndarray | jax.Array):
            prompts = np.asarray(prompts).tolist()
        if len(prompts) == 0:
            raise ValueError("prefill needs at least one prompt")
        for row, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise ValueError(f"prefill: prompt {row} is empty")
        batch = self._batch_for(len(prompts))
        longest = max(len(p) for p in prompts)
        self._check_capacity(longest)  # rows write their real tokens only: the block's padding needs no slot
        block = bucket_length(longest, MIN_BLOCK)
        arrays = self._empty_arrays(batch, min(bucket_length(block, self.min_cache_len), self.max_cache_len))
        state = DecodeState(arrays, len(prompts))
        state = self._run_block(state, prompts, block, "prefill")
        self._counters["prefill_tokens"] += sum(len(p) for p in prompts)
        return state

    def append(self, state: DecodeState, token_lists: Sequence[Sequence[int]]) -> DecodeState:
        """Feeds ragged token lists (one per real row, [] for none) into the cache in one forward."""
        if len(token_lists) != state.num_rows:
            raise ValueError(f"append got {len(token_lists)} token lists for {state.num_rows} rows")
        longest = max((len(t) for t in token_lists), default=0)
        if longest == 0:
            return state
        block = bucket_length(longest, MIN_BLOCK)
        state = self._ensure_room(state, [len(t) for t in token_lists])  # rows write only their real tokens
        state = self._run_block(state, token_lists, block, "append")
        self._counters["append_tokens"] += sum(len(t) for t in token_lists)
        return state

    def score_append(self, state: DecodeState, token_lists: Sequence[Sequence[int]],
                     temperature: float | None = None) -> tuple[DecodeState, list[np.ndarray], list[np.ndarray]]:
        """`append` that also returns, per row, each appended token's log-prob and entropy under the
        full-vocabulary distribution the row would have sampled it from at `temperature` (default:
        the sampler's), as `generate` reports sampled tokens: forced tokens scored by teacher forcing
        in the same forward that writes them, with no second pass over the row."""
        if len(token_lists) != state.num_rows:
            raise ValueError(f"score_append got {len(token_lists)} token lists for {state.num_rows} rows")
        temperature = float(self.params.temperature if temperature is None else temperature)
        if temperature <= 0:
            raise ValueError(f"score_append needs a temperature > 0, got {temperature}")
        longest = max((len(t) for t in token_lists), default=0)
        if longest == 0:
            empty = [np.zeros((0,), np.float32) for _ in token_lists]
            return state, empty, list(empty)
        block = bucket_length(longest, MIN_BLOCK)
        state = self._ensure_room(state, [len(t) for t in token_lists])
        state, (logp, entropy) = self._run_block(state, token_lists, block, "append", score_temperature=temperature)
        self._counters["append_tokens"] += sum(len(t) for t in token_lists)
        width = logp.shape[1]  # the block may have run as a longer compiled variant
        rows = [(logp[r, width - len(t):], entropy[r, width - len(t):]) for r, t in enumerate(token_lists)]
        return state, [lp for lp, _ in rows], [h for _, h in rows]

    def generate(
        self,
        state: DecodeState,
        max_new_tokens: int | Sequence[int],
        rng: jax.Array | None = None,
        params: SamplingParams | None = None,
        top_logprobs: int = 0,
        continue_ids: Sequence[Sequence[int]] | None = None,
    ) -> tuple[DecodeState, SampleOutput]:
        """Samples up to max_new_tokens per row (int, or one budget per real row).

        Rows stop at an EOS id, right after a stop sequence, or at their budget.
        Every returned token is in the returned state's cache. With `rng=None`
        the key is `fold_in(PRNGKey(seed), call_number)`, different for every
        call; each row gets its own key split from the call's key.
        `top_logprobs=k > 0` also returns, per generated token, the k largest
        full-vocabulary log-probs at the sampling temperature and their ids
        (a separate compiled program per k; 0 leaves the default program as is).
        `continue_ids` (one list per real row): the ids a row generated since its last append when it
        goes on with a paused segment, so that a stop sequence or string it had begun still ends it.
        """
        if not 0 <= int(top_logprobs) <= self.config.vocab_size:
            raise ValueError(f"top_logprobs must be in [0, vocab_size={self.config.vocab_size}], got {top_logprobs}")
        sampling = params if params is not None else self.params
        budgets = self._budgets(state, max_new_tokens)
        state = self._ensure_room(state, budgets[: state.num_rows])
        key = rng if rng is not None else jax.random.fold_in(jax.random.key(self._seed), self._calls)
        self._calls += 1
        if jnp.issubdtype(key.dtype, jnp.uint32):
            key = jax.random.wrap_key_data(key)
        row_keys = jax.random.split(key, state.batch_size)  # row b's key, whichever batch it decodes in
        starts = self._start_windows(state, continue_ids)
        active = np.flatnonzero(budgets[: state.num_rows] > 0)
        half = state.batch_size // 2
        if self.half_batch_decode and len(active) and half % self._data_size == 0 and half >= self.min_batch:
            if len(active) <= half:
                return self._generate_rows(state, active, budgets, row_keys, sampling, int(top_logprobs), starts)
            if self._halves_would_serve(state):
                return self._decode_in_halves(state, active, budgets, row_keys, sampling, int(top_logprobs), starts)
        return self._decode(state, budgets, row_keys, sampling, int(top_logprobs), starts=starts)

    def _start_windows(self, state: DecodeState, continue_ids: Sequence[Sequence[int]] | None) -> StartWindows | None:
        """The stop windows rows continuing a paused segment start from (None: every row starts empty)."""
        if continue_ids is None or not any(len(ids) for ids in continue_ids):
            return None
        if len(continue_ids) != state.num_rows:
            raise ValueError(f"generate got continue_ids for {len(continue_ids)} rows, the state has {state.num_rows}")
        table = self._stop_table
        return start_windows(continue_ids, state.batch_size, table.window, table.text_window, self._token_bytes)

    def _generate_rows(self, state: DecodeState, active: np.ndarray, budgets: np.ndarray, row_keys: jax.Array,
                       sampling: SamplingParams, top_logprobs: int, starts: StartWindows | None = None
                       ) -> tuple[DecodeState, SampleOutput]:
        """`generate` when at most half the batch has a budget (the others wait on tools or are done): each
        decode window runs on those rows only, in a batch of half the size, taking their live span and
        putting it back (`rows_decode_program`), with their own keys, so the decode costs half the batch's
        forward. The other rows are untouched. One half-size batch per batch, not one per count of
        budgeted rows: each size is another decode program for every span and window."""
        rows = active.tolist()
        index = padded_rows(rows, state.batch_size // 2)
        inner_budgets = np.zeros((len(index),), np.int32)
        inner_budgets[: len(rows)] = budgets[active]
        state, out = self._decode(state, inner_budgets, row_keys[index], sampling, top_logprobs, rows=rows,
                                  starts=None if starts is None else starts.take(index))
        self._compiles.ran(("rows", state.batch_size, state.cache_length))  # its decode windows ran
        return state, out.spread(rows, state.num_rows, self.pad_id)

    # ----------------------------------------------------------------- internals

    def _shard_params(self, state: nnx.State) -> nnx.State:
        return state if self.mesh is None else shard_state(state, self.mesh)

    def _layerwise_weights(self):
        """The layerwise decode's weights (`split_layers_program`, made once per parameter update),
        or None when `layerwise_decode` is off."""
        if not self.layerwise_decode:
            return None
        if self._layer_params is None:
            self._layer_params = self._call("reshape", split_layers_program, self._params_state,
                                            jnp.dtype(self.config.dtype).name)
        return self._layer_params

    def _mesh_context(self):
        return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    def _call(self, kind: str, program, *args, **kwargs):
        """Runs a jitted program under the mesh and waits for its results; the wall time goes to
        `device_seconds[kind]`."""
        start = time.perf_counter()
        with self._mesh_context():
            out = jax.block_until_ready(program(*args, **kwargs))
        self._device_seconds[kind] += time.perf_counter() - start
        return out

    def _empty_arrays(self, batch: int, length: int, kind: str = "prefill") -> DecodeArrays:
        """Zero decode arrays, created under jit directly on their shards (never whole on one device)."""
        c = self.config
        make = empty_program(self.layout, c.n_layers, batch, length, c.n_kv_heads, c.head_dim, c.vocab_size,
                             jnp.dtype(self._cache_dtype).name)
        return self._call(kind, make)

    def _batch_for(self, rows: int) -> int:
        """The batch bucket of a state of `rows` real rows."""
        return bucket_batch(max(rows, self.min_batch), self._data_size)

    def _ensure_room(self, state: DecodeState, needed: Sequence[int] | np.ndarray) -> DecodeState:
        """Grows the cache (to the next bucket) when some row's `needed[i]` more slots do not fit
        after its own cursor."""
        end = int(np.max(state.cursors + np.asarray(needed, np.int64), initial=0))
        self._check_capacity(end)
        if end <= state.cache_length:
            return state
        arrays = self._call("reshape", grow_program, state.arrays,
                            min(bucket_length(end, self.min_cache_len), self.max_cache_len), self.layout)
        return DecodeState(arrays, state.num_rows)

    def _check_capacity(self, slots: int) -> None:
        if slots > self.max_cache_len:
            raise ValueError(
                f"the cache would need {slots} slots but max_cache_len is {self.max_cache_len}; "
                "raise max_cache_len or start a new state"
            )

    def _budgets(self, state: DecodeState, max_new_tokens: int | Sequence[int]) -> np.ndarray:
        if isinstance(max_new_tokens, int | np.integer):
            per_row = [int(max_new_tokens)] * state.num_rows
        else:
            per_row = [int(b) for b in max_new_tokens]
            if len(per_row) != state.num_rows:
                raise ValueError(f"generate got {len(per_row)} budgets for {state.num_rows} rows")
        if any(b < 0 for b in per_row):
            raise ValueError(f"max_new_tokens must be >= 0, got {per_row}")
        budgets = np.zeros((state.batch_size,), np.int32)
        budgets[: state.num_rows] = per_row
        return budgets

    def _check_ids(self, ids: Sequence[int], what: str) -> None:
        vocab = self.config.vocab_size
        values = np.asarray(ids)
        if values.size and values.dtype.kind not in "iubf":
            raise ValueError(f"{what}: token ids must be integers, got {values.dtype} ({values.ravel()[:5].tolist()})")
        if values.dtype.kind == "f":  # written into int32 they were cut (3.7 -> 3), silently
            fractional = values[values != np.trunc(values)]
            if fractional.size:
                raise ValueError(f"{what}: token ids {fractional[:5].tolist()} are not whole numbers")
        bad = values[(values < 0) | (values >= vocab)].tolist()
        if bad:
            raise ValueError(f"{what}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})")

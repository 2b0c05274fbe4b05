"""Ragged rows: every row writes only its own real tokens at its own cursor, and decode windows
read only the leading span of the cache that holds the live rows."""

import jax
import numpy as np
import pytest
from flax import nnx

from aepo_jax.sampling import SamplingParams
from aepo_jax.sampling.buckets import attention_span
from aepo_jax.sampling.program_runs import DECODE_WINDOW, MIN_SPAN
from tests.sampling.conftest import random_prompts

GREEDY = SamplingParams(greedy=True)


def test_each_row_uses_exactly_as_many_slots_as_it_has_real_tokens(greedy_sampler):
    sampler = greedy_sampler
    prompts = random_prompts(20, [3, 17, 9])
    st = sampler.prefill(prompts)
    assert st.cursors.tolist() == [3, 17, 9]
    st, out = sampler.generate(st, [5, 0, 2])  # row 1 gets no budget: it must not move
    st = sampler.append(st, [[7, 8], [], [9, 10, 11, 12]])  # row 1 receives nothing again
    expected = [3 + out.num_tokens[0] + 2, 17, 9 + out.num_tokens[2] + 4]
    assert st.cursors.tolist() == expected
    valid = np.asarray(st.arrays.slot_valid[:3])
    for row, n in enumerate(expected):
        assert valid[row, :n].all() and not valid[row, n:].any(), f"row {row}: slots are not packed from 0"
    assert st.next_position.tolist() == expected


def test_rows_with_different_cursors_continue_exactly_after_ragged_appends(greedy_sampler, full_logits):
    sampler = greedy_sampler
    prompts = random_prompts(21, [2, 25, 11, 6])
    st, first = sampler.generate(sampler.prefill(prompts), [9, 1, 0, 4])
    results = random_prompts(22, [0, 13, 5, 1])
    st = sampler.append(st, results)
    whole = [p + first.row_tokens(r) + results[r] for r, p in enumerate(prompts)]
    st, out = sampler.generate(st, 7)
    for row, ids in enumerate(whole):
        ids = ids + out.row_tokens(row)
        expected = full_logits(ids)[-1]
        np.testing.assert_allclose(np.asarray(st.last_logits[row]), expected, rtol=1e-5,
                                   atol=1e-5 * np.abs(expected).max())
        assert st.cursors[row] == len(ids)


def test_decode_over_a_large_cache_reads_a_span_and_matches_a_small_cache(greedy_sampler):
    sampler = greedy_sampler
    prompts = random_prompts(23, [4, 10])
    _, small_out = sampler.generate(sampler.prefill(prompts), 40)
    big = sampler.concat([sampler.prefill(prompts), sampler.fork(
        sampler.generate(sampler.prefill(random_prompts(24, [5])), 300)[0], [0])])
    assert big.cache_length >= 512  # the long row grew the cache; the two short rows sit at its front
    _, big_out = sampler.generate(sampler.fork(big, [0, 1]), 40)
    assert sampler.last_decode_spans == [MIN_SPAN, MIN_SPAN]  # windows of 32 and 16 steps from cursors 4 and 10
    assert big_out.tokens.tolist() == small_out.tokens.tolist()
    np.testing.assert_allclose(big_out.logp, small_out.logp, rtol=1e-5, atol=1e-6)


def test_an_idle_long_row_does_not_widen_the_span_short_rows_read(greedy_sampler, tiny_model):
    """A row with no budget (waiting on a tool, a free slot) may be far longer than the rows that
    decode or receive an append: the span follows only the rows that write, and the long row is left
    exactly as it was. Three of four rows decode, so the whole batch runs (no half-batch decode)."""
    sampler = greedy_sampler
    prompts = random_prompts(23, [140, 150, 145])  # longer than the smallest block span (MIN_CACHE_SLOTS)
    _, small_out = sampler.generate(sampler.prefill(prompts), 40)
    long_state, _ = sampler.generate(sampler.prefill(random_prompts(24, [5])), 300)
    big = sampler.concat([sampler.prefill(prompts), long_state])
    long_before = jax.device_get(sampler.fork(big, [3]).arrays)  # a copy of the long row
    assert big.cursors[3] == 305 and big.cache_length >= 512 and big.batch_size == 4
    big, big_out = sampler.generate(big, [40, 40, 40, 0])
    # Two windows from cursors <= 150, whose rows end by slot 190: spans sized by them, not by the idle 305.
    assert len(sampler.last_decode_spans) == 2 and max(sampler.last_decode_spans) <= attention_span(190 + 16, 512, MIN_SPAN) < 305
    assert big_out.tokens[:3].tolist() == small_out.tokens.tolist() and big_out.num_tokens[3] == 0
    np.testing.assert_allclose(big_out.logp[:3], small_out.logp, rtol=1e-5, atol=1e-6)
    results = random_prompts(25, [6, 3, 5])
    big = sampler.append(big, [results[0], [], [], []])  # a block that only row 0 receives
    big = sampler.append(big, [results[0][:2], results[1], results[2], []])  # three rows: the whole batch runs
    received = [[*results[0], *results[0][:2]], results[1], results[2]]
    _, graphdef, params = tiny_model
    reference = jax.jit(lambda p, ids: nnx.merge(graphdef, p)(ids))  # plain causal forward, no cache
    for row in range(3):
        ids = prompts[row] + big_out.row_tokens(row) + received[row]
        padded = np.zeros((1, 256), np.int32)
        padded[0, : len(ids)] = ids
        expected = np.asarray(reference(params, padded)[0, len(ids) - 1])
        np.testing.assert_allclose(np.asarray(big.last_logits[row]), expected, rtol=1e-5,
                                   atol=1e-5 * np.abs(expected).max())
        assert big.cursors[row] == len(ids)
    long_after = jax.device_get(sampler.fork(big, [3]).arrays)  # untouched, bit for bit
    for now, before in zip(jax.tree.leaves(long_after), jax.tree.leaves(long_before), strict=True):
        np.testing.assert_array_equal(now, before)


def test_window_boundaries_do_not_change_sampled_tokens_or_stop_sequences(tiny_model):
    from aepo_jax.sampling import Sampler

    _, graphdef, state = tiny_model
    sampled = SamplingParams(temperature=1.0)
    sampler = Sampler(graphdef, state, params=sampled)
    prompts = random_prompts(25, [3, 8, 5])
    budget = 3 * DECODE_WINDOW + 5  # several windows
    _, once = sampler.generate(sampler.prefill(prompts), budget, rng=jax.random.key(1))
    # Fewer windows, same key: the PRNG stream runs on across window boundaries (no reseeding).
    _, first = sampler.generate(sampler.prefill(prompts), DECODE_WINDOW + 5, rng=jax.random.key(1))
    assert first.tokens.tolist() == once.tokens[:, :DECODE_WINDOW + 5].tolist()
    assert once.num_tokens.tolist() == [budget] * 3
    # A stop sequence made of tokens that straddle a window boundary is still found.
    straddle = [int(t) for t in once.tokens[1, DECODE_WINDOW - 1 : DECODE_WINDOW + 1]]
    stopper = Sampler(graphdef, state, params=sampled, stop_sequences=[straddle])
    _, stopped = stopper.generate(stopper.prefill(prompts), budget, rng=jax.random.key(1))
    first_hit = next(i for i in range(1, budget) if once.tokens[1, i - 1:i + 1].tolist() == straddle)
    assert first_hit == DECODE_WINDOW, "the pair occurs earlier: the check would not cross a window boundary"
    assert stopped.stop_reason[1] == "stop"
    assert stopped.num_tokens[1] == first_hit + 1


@pytest.mark.parametrize(("needed", "n_slots", "expected"), [
    (1, 4096, MIN_SPAN), (MIN_SPAN, 4096, MIN_SPAN), (MIN_SPAN + 1, 4096, 96), (97, 4096, 128), (129, 4096, 192),
    (193, 4096, 256), (300, 256, 256), (700, 4096, 768), (769, 4096, 1024),
])
def test_attention_span_buckets_hold_the_live_slots_with_at_most_half_again(needed, n_slots, expected):
    assert attention_span(needed, n_slots, MIN_SPAN) == expected


def _reference_scores(logits: np.ndarray, targets: list[int], temperature: float):
    """float64 log-probs and entropies of `targets` under softmax(logits / T), one row per target."""
    scaled = logits.astype(np.float64) / temperature
    log_probs = scaled - np.log(np.exp(scaled - scaled.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - scaled.max(-1, keepdims=True)
    logp = log_probs[np.arange(len(targets)), targets]
    entropy = -(np.exp(log_probs) * log_probs).sum(-1)
    return logp, entropy


@pytest.mark.parametrize("max_block_tokens", [8, 256])  # 8: the 13-token append runs as two chunks
def test_score_append_scores_each_appended_token_like_a_full_forward(tiny_model, full_logits, max_block_tokens):
    """Teacher-forced scores of appended tokens (ragged rows, one row receiving nothing, rows with a generated
    prefix) equal float64 scores of a full causal forward over the whole row, at the sampling temperature."""
    from aepo_jax.sampling import Sampler

    _, graphdef, state = tiny_model
    temperature = 0.7
    sampler = Sampler(graphdef, state, params=SamplingParams(temperature=temperature), max_block_tokens=max_block_tokens)
    prompts = random_prompts(26, [5, 12, 3])
    st, first = sampler.generate(sampler.prefill(prompts), [6, 0, 3], rng=jax.random.key(2))
    forced = random_prompts(27, [13, 4, 0])
    st, logp, entropy = sampler.score_append(st, forced)
    for row, prompt in enumerate(prompts):
        before = prompt + first.row_tokens(row)
        whole = before + forced[row]
        assert logp[row].shape == entropy[row].shape == (len(forced[row]),)
        if not forced[row]:
            continue
        logits = full_logits(whole)[len(before) - 1 : len(whole) - 1]  # position t - 1 predicts token t
        ref_logp, ref_entropy = _reference_scores(logits, forced[row], temperature)
        np.testing.assert_allclose(logp[row], ref_logp, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(entropy[row], ref_entropy, rtol=1e-4, atol=1e-4)
    # The state continues exactly as after a plain append.
    np.testing.assert_allclose(np.asarray(st.last_logits[0]), full_logits(prompts[0] + first.row_tokens(0) + forced[0])[-1],
                               rtol=1e-5, atol=1e-4)
    assert st.cursors.tolist() == [len(p) + first.num_tokens[r] + len(forced[r]) for r, p in enumerate(prompts)]
    with pytest.raises(ValueError, match="temperature"):
        sampler.score_append(st, [[1], [], []], temperature=0.0)


def test_place_reuses_rows_in_place_and_they_continue_like_fresh_rows(greedy_sampler, full_logits):
    """Rows placed into a state (from a state with a shorter cache) continue exactly as a prefill of their
    ids would; rows not placed into are untouched."""
    sampler = greedy_sampler
    base = random_prompts(31, [6, 40, 9])
    st, first = sampler.generate(sampler.prefill(base), [140, 4, 2])  # row 0 grows the cache past 128 slots
    assert st.cache_length > 128
    incoming = random_prompts(32, [3, 11])
    source = sampler.prefill(incoming)
    assert source.cache_length < st.cache_length
    st = sampler.place(st, [2, 0], source, [1, 0])  # row 2 <- incoming 1, row 0 <- incoming 0
    expected_ids = [incoming[0], base[1] + first.row_tokens(1), incoming[1]]
    assert st.cursors.tolist() == [len(ids) for ids in expected_ids]
    st, out = sampler.generate(st, 5)
    for row, ids in enumerate(expected_ids):
        ids = ids + out.row_tokens(row)
        np.testing.assert_allclose(np.asarray(st.last_logits[row]), full_logits(ids)[-1], rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="repeat"):
        sampler.place(st, [1, 1], source, [0, 1])
    with pytest.raises(ValueError, match="outside"):
        sampler.place(st, [3], source, [0])


def test_place_and_extend_copy_rows_within_one_state(greedy_sampler, full_logits):
    """The source may be the destination itself (a row copied into a free row of the same state): its
    buffers are donated, so the rows are copied out first (regression: an XLA donation error)."""
    sampler = greedy_sampler
    prompts = random_prompts(33, [5, 9, 4])
    st = sampler.prefill(prompts)
    assert st.batch_size == 4
    st = sampler.place(st, [2], st, [0])  # row 2 <- row 0
    st = sampler.extend(st, st)  # no spare rows for 3 more: a concat of the state with itself
    expected = [prompts[0], prompts[1], prompts[0]] * 2
    assert st.num_rows == 6 and st.cursors.tolist() == [len(ids) for ids in expected]
    one = sampler.reserve(sampler.fork(st, [1]), 2)  # one row, a spare one: extend places into it
    one = sampler.extend(one, one)
    st, out = sampler.generate(st, 3)
    one, out_one = sampler.generate(one, 3)
    for row, ids in enumerate(expected):
        np.testing.assert_allclose(np.asarray(st.last_logits[row]), full_logits(ids + out.row_tokens(row))[-1],
                                   rtol=1e-5, atol=1e-4)
    assert out_one.row_tokens(0) == out_one.row_tokens(1) == out.row_tokens(1)


def _assert_row_untouched(after, before, row: int) -> None:
    """Row `row` of two host copies of a state's arrays is equal, bit for bit (cache included)."""
    for name in ("last_logits", "cursor", "slot_valid", "next_position"):
        np.testing.assert_array_equal(getattr(after, name)[row], getattr(before, name)[row], err_msg=name)
    np.testing.assert_array_equal(after.cache.k[:, row], before.cache.k[:, row])
    np.testing.assert_array_equal(after.cache.v[:, row], before.cache.v[:, row])


def _assert_continues_like_a_full_forward(after, row: int, ids, forced, logp, full_logits, entropy=None) -> None:
    """Row `row` holds `ids` (its last logits are a plain forward's), and its `forced` last ids scored
    their teacher-forced log-probs (and entropies, when given), computed here in float64."""
    np.testing.assert_allclose(after.last_logits[row], full_logits(ids)[-1], rtol=1e-5, atol=1e-4)
    assert after.cursor[row] == len(ids)
    if not forced:
        return
    logits = full_logits(ids)[len(ids) - len(forced) - 1: len(ids) - 1].astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    ref = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    np.testing.assert_allclose(logp, ref[np.arange(len(forced)), forced], rtol=1e-4, atol=1e-4)
    if entropy is not None:
        np.testing.assert_allclose(entropy, -(np.exp(ref) * ref).sum(axis=-1), rtol=1e-4, atol=1e-4)


def test_append_to_a_few_rows_runs_only_those_rows_and_leaves_the_others_bit_identical(greedy_sampler, full_logits):
    """An append to at most a quarter of the batch runs the forward on a quarter of it (`rows_block_program`,
    and its scored form): the receiving rows continue like a full forward over their ids, scored tokens score
    like teacher forcing, and every other row's cache, cursor and logits are untouched, bit for bit."""
    from aepo_jax.sampling.jitted import rows_block_program, rows_scored_block_program

    sampler = greedy_sampler
    prompts = random_prompts(33, [4, 9, 2, 15, 7, 3, 11, 6])
    st, first = sampler.generate(sampler.prefill(prompts), 3)
    before = jax.device_get(st.arrays)
    runs = rows_block_program._cache_size(), rows_scored_block_program._cache_size()
    results = [[] for _ in prompts]
    results[5] = random_prompts(34, [10])[0]  # one row of eight: a sub-batch of two, one of them padding
    st = sampler.append(st, results)
    forced = [[] for _ in prompts]
    forced[1], forced[6] = random_prompts(35, [3, 12])  # two rows: the sub-batch of two
    st, logp, _ = sampler.score_append(st, forced, temperature=1.0)
    assert rows_block_program._cache_size() > runs[0] and rows_scored_block_program._cache_size() > runs[1]
    after = jax.device_get(st.arrays)
    for row in (0, 2, 3, 4, 7):  # received nothing
        _assert_row_untouched(after, before, row)
    for row in (1, 5, 6):
        ids = prompts[row] + first.row_tokens(row) + results[row] + forced[row]
        _assert_continues_like_a_full_forward(after, row, ids, forced[row], logp[row], full_logits)
    st, out = sampler.generate(st, 4)
    for row in range(len(prompts)):
        ids = prompts[row] + first.row_tokens(row) + results[row] + forced[row] + out.row_tokens(row)
        np.testing.assert_allclose(np.asarray(st.last_logits[row]), full_logits(ids)[-1], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("cache_slots", [128, 512])
def test_append_to_at_most_half_the_batch_runs_as_two_sub_batches_and_leaves_the_others_bit_identical(
        tiny_model, greedy_sampler, full_logits, cache_slots):
    """Six of 16 rows receive tokens: more than a quarter of the batch (a sub-batch of 4) and at most two
    sub-batches, so the append runs as two calls of the sub-batch program, never the whole-batch one. The
    receiving rows continue like a full forward over their ids, scored tokens score like teacher forcing,
    and every other row is untouched, bit for bit. In a 512-slot cache the block's span is 128 slots, so
    the sub-batches gather and write back only the rows' first 128 slots (`take_leading_rows`)."""
    from aepo_jax.sampling import Sampler, SamplingParams
    from aepo_jax.sampling.jitted import (
        block_program,
        rows_block_program,
        rows_scored_block_program,
        scored_block_program,
    )

    _, graphdef, state = tiny_model
    sampler = greedy_sampler if cache_slots == 128 else Sampler(
        graphdef, state, params=SamplingParams(greedy=True), max_cache_len=cache_slots, min_cache_len=cache_slots)
    lengths = [3, 8, 5, 12, 2, 9, 6, 4, 10, 7, 3, 5, 11, 2, 8, 6]
    prompts = random_prompts(61, lengths)
    st, first = sampler.generate(sampler.prefill(prompts), 3)
    assert st.batch_size == 16
    before = jax.device_get(st.arrays)
    calls, call = [], sampler._call

    spans = []

    def spy(kind, program, *args, **kwargs):
        calls.append(program)
        if program in (rows_block_program, rows_scored_block_program):
            spans.append(args[8])
        return call(kind, program, *args, **kwargs)

    sampler._call = spy
    try:
        receiving = [1, 4, 6, 9, 13, 15]
        results = [[] for _ in prompts]
        for row, ids in zip(receiving, random_prompts(62, [5, 11, 2, 7, 9, 4]), strict=True):
            results[row] = ids
        st = sampler.append(st, results)
        assert calls == [rows_block_program] * 2, "the append did not run as two sub-batches"
        calls.clear()
        forced = [[] for _ in prompts]
        for row, ids in zip(receiving[1:], random_prompts(63, [3, 6, 1, 5, 4]), strict=True):
            forced[row] = ids
        st, logp, entropy = sampler.score_append(st, forced, temperature=1.0)
        assert calls == [rows_scored_block_program] * 2, "the scored append did not run as two sub-batches"
        assert block_program not in calls and scored_block_program not in calls
    finally:
        sampler._call = call
    assert st.cache_length == cache_slots
    assert spans == [None if cache_slots == 128 else 128] * 4  # the cache's 128 slots are all of it: None
    after = jax.device_get(st.arrays)
    for row in sorted(set(range(16)) - set(receiving)):
        _assert_row_untouched(after, before, row)
        assert len(logp[row]) == 0 and len(entropy[row]) == 0
    for row in receiving:
        ids = prompts[row] + first.row_tokens(row) + results[row] + forced[row]
        _assert_continues_like_a_full_forward(after, row, ids, forced[row], logp[row], full_logits, entropy[row])


def test_min_batch_pads_small_states_and_their_rows_decode_as_without_it(tiny_model, greedy_sampler, full_logits):
    """With min_batch=8 a state of 1-3 rows (prefill, fork, concat) has the batch of 8 rows, so it runs the
    programs compiled for 8; its rows decode exactly what a min_batch=1 sampler decodes (greedy), and each
    row's logits match a plain forward over its ids. A place of 1 row pads its index lists to 8."""
    from aepo_jax.sampling import Sampler, SamplingParams
    from aepo_jax.sampling.jitted import place_program

    _, graphdef, state = tiny_model
    padded = Sampler(graphdef, state, params=SamplingParams(greedy=True), min_batch=8)
    prompts = random_prompts(41, [5, 12, 3])
    st = padded.prefill(prompts[:1])
    assert st.batch_size == 8 and st.num_rows == 1
    st, out = padded.generate(st, 6)
    _, ref = greedy_sampler.generate(greedy_sampler.prefill(prompts[:1]), 6)
    assert greedy_sampler.prefill(prompts[:1]).batch_size == 1
    assert out.row_tokens(0) == ref.row_tokens(0)
    both = padded.concat([st, padded.prefill(prompts[1:3])])
    assert both.batch_size == 8 and both.num_rows == 3
    fork = padded.fork(both, [2])
    assert fork.batch_size == 8
    widths, call = [], padded._call

    def spy(kind, program, *args, **kwargs):
        if program is place_program:
            widths.append(args[1].shape[0])  # the destination index list
        return call(kind, program, *args, **kwargs)

    padded._call = spy
    both = padded.place(both, [1], fork, [0])  # row 1 <- prompt 2
    assert widths == [8]
    both, out = padded.generate(both, 4)
    expected = [prompts[0] + ref.row_tokens(0), prompts[2], prompts[2]]
    for row, ids in enumerate(expected):
        ids = ids + out.row_tokens(row)
        np.testing.assert_allclose(np.asarray(both.last_logits[row]), full_logits(ids)[-1], rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="min_batch"):
        Sampler(graphdef, state, min_batch=0)


def test_min_cache_len_fixes_the_cache_and_blocks_still_read_only_their_span(tiny_model, full_logits):
    """With min_cache_len = max_cache_len every state has that many slots from its prefill on (no grow);
    a prefill or append reads only the slots a grown cache would hold (128 here, not 512); the rows
    continue exactly like a plain forward over their ids."""
    from aepo_jax.sampling import Sampler, SamplingParams
    from aepo_jax.sampling.jitted import block_program, grow_program, rows_block_program

    _, graphdef, state = tiny_model
    fixed = Sampler(graphdef, state, params=SamplingParams(greedy=True), max_cache_len=512, min_cache_len=512)
    spans, call = [], fixed._call

    def spy(kind, program, *args, **kwargs):
        assert program is not grow_program
        if program is block_program:
            spans.append(args[6])
        if program is rows_block_program:  # an append to a few rows of the batch
            spans.append(args[8])
        return call(kind, program, *args, **kwargs)

    fixed._call = spy
    prompts = random_prompts(51, [7, 20])
    st = fixed.prefill(prompts)
    assert st.cache_length == 512
    st, out = fixed.generate(st, 5)
    tail = random_prompts(52, [9])[0]
    st = fixed.append(st, [tail, []])
    assert spans == [128, 128] and st.cache_length == 512
    st, more = fixed.generate(st, 3)
    expected = [prompts[0] + out.row_tokens(0) + tail + more.row_tokens(0), prompts[1] + out.row_tokens(1) + more.row_tokens(1)]
    for row, ids in enumerate(expected):
        np.testing.assert_allclose(np.asarray(st.last_logits[row]), full_logits(ids)[-1], rtol=1e-5, atol=1e-4)
    for bad in (3, 1024):
        with pytest.raises(ValueError, match="min_cache_len"):
            Sampler(graphdef, state, max_cache_len=512, min_cache_len=bad)


def test_generate_with_few_budgeted_rows_decodes_only_those_rows(tiny_model, full_logits):
    """When at most half the batch has a budget (the others wait on tools), generate decodes those rows in
    half the batch, taking their live span and putting it back: they sample what they sample in the whole
    batch (each row keeps its own key), the other rows and the decoded rows' slots past the span are
    untouched bit for bit, and every row continues like a full forward."""
    from aepo_jax.sampling import Sampler, SamplingParams
    from aepo_jax.sampling.jitted import decode_program, rows_decode_program

    _, graphdef, state = tiny_model
    sampler = Sampler(graphdef, state, params=SamplingParams(temperature=1.0), seed=3)
    batches, spans, call = [], [], sampler._call

    def spy(kind, program, *args, **kwargs):
        if program is decode_program:
            batches.append(args[2].slot_valid.shape[0])
        if program is rows_decode_program:
            batches.append(args[3].shape[0])
            spans.append(kwargs["span"])
        return call(kind, program, *args, **kwargs)

    sampler._call = spy
    prompts = random_prompts(61, [4, 9, 2, 15, 7, 3, 11, 6])
    key = jax.random.key(5)
    few = [5, 0, 0, 3, 0, 0, 0, 0]
    st = sampler.prefill(prompts)
    before = jax.device_get(st.arrays)
    st, out = sampler.generate(st, few, rng=key)
    assert batches == [4], batches  # two rows decoded in half the batch
    span = spans[0]
    assert span < st.cache_length, (span, st.cache_length)  # only the live span moved
    _, ref = sampler.generate(sampler.prefill(prompts), [5, 1, 1, 3, 1, 1, 1, 1], rng=key)
    assert batches[1:] == [8]
    assert out.num_tokens.tolist() == few and out.stop_reason[1] == "length"
    for row in (0, 3):
        assert out.row_tokens(row) == ref.row_tokens(row)[: few[row]]
        np.testing.assert_allclose(out.logp[row, : few[row]], ref.logp[row, : few[row]], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out.entropy[row, : few[row]], ref.entropy[row, : few[row]], rtol=1e-5, atol=1e-5)
        ids = prompts[row] + out.row_tokens(row)
        np.testing.assert_allclose(np.asarray(st.last_logits[row]), full_logits(ids)[-1], rtol=1e-5, atol=1e-4)
    after = jax.device_get(st.arrays)
    for row in (0, 3):
        np.testing.assert_array_equal(after.cache.k[:, row, :, span:], before.cache.k[:, row, :, span:])
        np.testing.assert_array_equal(after.slot_valid[row, span:], before.slot_valid[row, span:])
    for row in (1, 2, 4, 5, 6, 7):
        assert out.row_tokens(row) == [] and out.logp[row].tolist() == [0.0] * out.logp.shape[1]
        for name in ("last_logits", "cursor", "slot_valid", "next_position"):
            np.testing.assert_array_equal(getattr(after, name)[row], getattr(before, name)[row], err_msg=name)
        np.testing.assert_array_equal(after.cache.k[:, row], before.cache.k[:, row])
    whole = Sampler(graphdef, state, params=SamplingParams(temperature=1.0), seed=3, half_batch_decode=False)
    whole_call = whole._call

    def whole_spy(kind, program, *args, **kwargs):
        if program is decode_program:
            batches.append(args[2].slot_valid.shape[0])
        return whole_call(kind, program, *args, **kwargs)

    whole._call = whole_spy
    _, out_whole = whole.generate(whole.prefill(prompts), few, rng=key)
    assert batches[2:] == [8]  # the option off: the whole batch decodes
    assert [out_whole.row_tokens(r) for r in (0, 3)] == [out.row_tokens(r) for r in (0, 3)]

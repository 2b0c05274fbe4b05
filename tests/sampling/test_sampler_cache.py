"""The cache is exact: cached logits, log-probs, entropies, append and fork equal full forwards."""

import jax
import numpy as np
import pytest

from aepo_jax.sampling import DecodeState, SamplingParams
from tests.sampling.conftest import random_prompts

GREEDY = SamplingParams(greedy=True)


def assert_logits_close(cached, full):
    np.testing.assert_allclose(cached, full, rtol=1e-5, atol=1e-5 * np.abs(full).max())


def test_cached_decoding_equals_full_forward_at_every_step(greedy_sampler, full_logits):
    sampler = greedy_sampler
    prompts = random_prompts(0, [5, 11, 2])
    st = sampler.prefill(prompts)
    sequences = [list(p) for p in prompts]
    for _ in range(6):
        for row, ids in enumerate(sequences):
            assert_logits_close(np.asarray(st.last_logits[row]), full_logits(ids)[-1])
        st, out = sampler.generate(st, 1)
        for row in range(3):
            sequences[row] += out.row_tokens(row)
    st, out = sampler.generate(st, 9)  # several steps inside one while_loop
    for row, ids in enumerate(sequences):
        ids = ids + out.row_tokens(row)
        assert_logits_close(np.asarray(st.last_logits[row]), full_logits(ids)[-1])
        assert st.next_position[row] == len(ids)


def test_greedy_output_is_batch_invariant_under_left_padding(greedy_sampler, full_logits):
    sampler = greedy_sampler
    short, middle, long = random_prompts(1, [3, 9, 30])
    _, alone = sampler.generate(sampler.prefill([middle]), 12)
    _, batched = sampler.generate(sampler.prefill([long, middle, short]), 12)
    assert batched.row_tokens(1) == alone.row_tokens(0)
    assert len(set(alone.row_tokens(0))) > 1, "degenerate continuation would make the check weak"


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7, top_k=20), SamplingParams(temperature=1.3, top_p=0.9)])
def test_returned_logp_and_entropy_equal_full_forward_recomputation(greedy_sampler, full_logits, params):
    sampler = greedy_sampler
    prompts = random_prompts(2, [4, 13, 9])
    _, out = sampler.generate(sampler.prefill(prompts), 10, rng=jax.random.key(3), params=params)
    t = params.temperature
    for row, prompt in enumerate(prompts):
        generated = out.row_tokens(row)
        logits = full_logits(prompt + generated).astype(np.float64)[len(prompt) - 1 : -1] / t  # [N, V]
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        picked = log_probs[np.arange(len(generated)), generated]
        entropy = -(np.exp(log_probs) * log_probs).sum(-1)
        np.testing.assert_allclose(out.logp[row], picked, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(out.entropy[row], entropy, rtol=1e-4, atol=1e-5)
        # The distribution drawn from: the top-k / top-p set of the float64 reference, renormalised; every
        # sampled token lies in it (earlier only `logp_truncated >= logp` was checked).
        kept = np.ones_like(log_probs, bool)
        order = np.argsort(-log_probs, axis=-1)
        if params.top_k:
            kept = np.zeros_like(kept)
            np.put_along_axis(kept, order[:, :params.top_k], True, axis=-1)
        if params.top_p < 1.0:
            sorted_probs = np.take_along_axis(np.exp(log_probs), order, axis=-1)
            inside = np.cumsum(sorted_probs, axis=-1) - sorted_probs < params.top_p  # mass before it < top_p
            np.put_along_axis(kept, order, inside & np.take_along_axis(kept, order, axis=-1), axis=-1)
        assert kept[np.arange(len(generated)), generated].all()
        assert 1 < kept.sum(-1).min() and kept.sum(-1).max() < kept.shape[-1]  # truncation applies here
        kept_mass = np.log(np.where(kept, np.exp(log_probs), 0.0).sum(-1))
        np.testing.assert_allclose(out.logp_truncated[row], picked - kept_mass, rtol=1e-4, atol=1e-5)


def test_append_then_decode_equals_prefill_of_concatenation(greedy_sampler, full_logits):
    sampler = greedy_sampler
    prompts = random_prompts(4, [6, 3, 8])
    tool_results = random_prompts(5, [7, 0, 2])
    st, first = sampler.generate(sampler.prefill(prompts), 5)
    st = sampler.append(st, tool_results)
    whole = [p + first.row_tokens(r) + tool_results[r] for r, p in enumerate(prompts)]
    for row, ids in enumerate(whole):
        assert_logits_close(np.asarray(st.last_logits[row]), full_logits(ids)[-1])
    _, continued = sampler.generate(st, 10)
    _, reference = sampler.generate(sampler.prefill(whole), 10)
    assert continued.tokens.tolist() == reference.tokens.tolist()
    np.testing.assert_allclose(continued.logp, reference.logp, rtol=1e-4, atol=1e-5)


def test_fork_then_greedy_gives_identical_continuations(greedy_sampler, full_logits):
    sampler = greedy_sampler
    sampled = SamplingParams(temperature=1.0)
    st, _ = sampler.generate(sampler.prefill(random_prompts(6, [5, 9, 2])), 4, rng=jax.random.key(0), params=sampled)
    child = sampler.fork(st, [1, 0, 1])
    assert child.num_rows == 3
    _, child_out = sampler.generate(child, 8, params=GREEDY)
    _, parent_out = sampler.generate(st, 8, params=GREEDY)
    assert child_out.row_tokens(0) == parent_out.row_tokens(1) == child_out.row_tokens(2)
    assert child_out.row_tokens(1) == parent_out.row_tokens(0)


def test_fork_marked_later_equals_fork_at_mark_time_bit_for_bit(greedy_sampler):
    """A branch snapshot by marks: rows marked after a step, grown further (an append to some, a decode
    of all), then forked as marked, hold what a fork taken at mark time holds (cursor, positions, logits,
    valid slots and their keys and values, bit for bit) and continue alike; and the other rows' marks
    are independent of the row order asked for."""
    sampler = greedy_sampler
    sampled = SamplingParams(temperature=1.0)
    st, _ = sampler.generate(sampler.prefill(random_prompts(80, [5, 9, 2, 7])), 3, rng=jax.random.key(1), params=sampled)
    at_mark = jax.device_get(sampler.fork(st, [2, 0, 2]).arrays)
    marks = sampler.mark(st, [0, 2])
    st = sampler.append(st, [[5, 6, 7], [], [8], [9, 10]])  # the marked rows keep growing
    st, _ = sampler.generate(st, 6, rng=jax.random.key(2), params=sampled)
    forked = sampler.fork_marked(st, [2, 0, 2], marks, [1, 0, 1])
    assert forked.num_rows == 3
    got = jax.device_get(forked.arrays)
    rows = slice(0, 3)
    for name in ("cursor", "slot_valid", "next_position", "last_logits"):
        np.testing.assert_array_equal(getattr(got, name)[rows], getattr(at_mark, name)[rows], err_msg=name)
    valid = at_mark.slot_valid[rows]  # [3, S]: later slots hold what the rows wrote since, and are invalid
    for name in ("k", "v"):
        ours, theirs = getattr(got.cache, name)[:, rows], getattr(at_mark.cache, name)[:, rows]  # [L, 3, KVH, S, Dh]
        mask = valid[None, :, None, :, None]
        np.testing.assert_array_equal(np.where(mask, ours, 0), np.where(mask, theirs, 0), err_msg=name)
    _, from_marks = sampler.generate(forked, 6, params=GREEDY)
    _, from_fork = sampler.generate(DecodeState(jax.device_put(at_mark), 3), 6, params=GREEDY)
    assert from_marks.tokens.tolist() == from_fork.tokens.tolist()


def test_fork_marked_refuses_rows_that_hold_fewer_tokens_than_their_marks(greedy_sampler):
    sampler = greedy_sampler
    st, _ = sampler.generate(sampler.prefill(random_prompts(81, [6, 2])), 2)
    marks = sampler.mark(st, [0])
    with pytest.raises(ValueError, match="fewer tokens than when marked"):
        sampler.fork_marked(st, [1], marks, [0])  # row 1 (4 tokens) is not the marked row 0 (8 tokens)
    with pytest.raises(ValueError, match="mark rows"):
        sampler.fork_marked(st, [0], marks, [1])


def test_concat_of_states_with_different_cursors_continues_each_row_exactly(greedy_sampler, full_logits):
    sampler = greedy_sampler
    prompts_a, prompts_b = random_prompts(7, [3]), random_prompts(8, [20, 4])
    st_a = sampler.prefill(prompts_a)
    st_b, _ = sampler.generate(sampler.prefill(prompts_b), 150)  # cursor and cache length both differ from a
    assert st_b.cache_length > st_a.cache_length
    joined = sampler.concat([st_a, sampler.fork(st_b, [0, 1])])
    assert joined.num_rows == 3
    _, together = sampler.generate(joined, 6)
    _, alone_a = sampler.generate(st_a, 6)
    _, alone_b = sampler.generate(st_b, 6)
    assert together.row_tokens(0) == alone_a.row_tokens(0)
    assert together.row_tokens(1) == alone_b.row_tokens(0)
    assert together.row_tokens(2) == alone_b.row_tokens(1)


@pytest.mark.parametrize("extra_rows", [2, 4])
def test_extend_places_rows_into_spare_batch_rows_and_equals_concat(greedy_sampler, extra_rows):
    """`extend(a, b)` holds what `concat([a, b])` holds, row for row and bit for bit. When a's batch of 8
    has room for b's rows (5 + 2) they go into its spare rows and nothing is allocated; when it has not
    (5 + 4), it is a concat into a batch of 16 (one allocation)."""
    sampler = greedy_sampler
    st_a, _ = sampler.generate(sampler.prefill(random_prompts(70, [3, 9, 5, 12, 7])), 4)
    st_b, _ = sampler.generate(sampler.prefill(random_prompts(71, [6, 2, 10, 4][:extra_rows])), 7)
    assert st_a.batch_size == 8
    joined = sampler.concat([st_a, st_b])
    expected = jax.device_get(joined.arrays)
    allocations, allocate = [], sampler._empty_arrays

    def spy(*args, **kwargs):
        allocations.append(args)
        return allocate(*args, **kwargs)

    sampler._empty_arrays = spy
    try:
        extended = sampler.extend(st_a, st_b)
    finally:
        sampler._empty_arrays = allocate
    assert extended.num_rows == 5 + extra_rows
    assert (extended.batch_size, len(allocations)) == ((8, 0) if extra_rows == 2 else (16, 1))
    got = jax.device_get(extended.arrays)
    rows = slice(0, 5 + extra_rows)
    for name in ("cursor", "slot_valid", "next_position", "last_logits"):
        np.testing.assert_array_equal(getattr(got, name)[rows], getattr(expected, name)[rows], err_msg=name)
    np.testing.assert_array_equal(got.cache.k[:, rows], expected.cache.k[:, rows])
    np.testing.assert_array_equal(got.cache.v[:, rows], expected.cache.v[:, rows])
    _, from_extended = sampler.generate(extended, 5)
    _, from_joined = sampler.generate(joined, 5)
    assert from_extended.tokens.tolist() == from_joined.tokens.tolist()


def test_blocks_longer_than_max_block_tokens_run_in_chunks_with_the_same_result(tiny_model, full_logits):
    from aepo_jax.sampling import Sampler

    _, graphdef, state = tiny_model
    chunked = Sampler(graphdef, state, params=GREEDY, max_block_tokens=8)
    prompts = random_prompts(7, [27, 5, 17])  # block 32 = four chunks; the 5-token row starts in the last one
    st = chunked.prefill(prompts)
    for row, ids in enumerate(prompts):
        assert_logits_close(np.asarray(st.last_logits[row]), full_logits(ids)[-1])
    extra = random_prompts(8, [12, 0, 3])  # append block 16 = two chunks; row 1 receives nothing
    st = chunked.append(st, extra)
    sequences = [p + e for p, e in zip(prompts, extra, strict=True)]
    st, out = chunked.generate(st, 6)
    for row, ids in enumerate(sequences):
        ids = ids + out.row_tokens(row)
        assert_logits_close(np.asarray(st.last_logits[row]), full_logits(ids)[-1])
        assert st.next_position[row] == len(ids)


@pytest.mark.parametrize("bad", [4, 12])
def test_max_block_tokens_must_be_a_power_of_two_of_at_least_the_smallest_block(tiny_model, bad):
    from aepo_jax.sampling import Sampler

    _, graphdef, state = tiny_model
    with pytest.raises(ValueError, match="max_block_tokens"):
        Sampler(graphdef, state, max_block_tokens=bad)


@pytest.mark.parametrize("params", [SamplingParams(greedy=True), SamplingParams(greedy=True, top_k=5, top_p=0.8)])
def test_greedy_logp_truncated_is_the_point_mass_it_was_drawn_from(greedy_sampler, params):
    """Greedy draws from a point mass on the argmax, so its log-prob under the distribution actually
    sampled is 0 (with truncation on it read as the log-prob renormalised over the kept set);
    `logp` stays the full-vocabulary one."""
    sampler = greedy_sampler
    _, out = sampler.generate(sampler.prefill(random_prompts(6, [5, 9])), 6, rng=jax.random.key(1), params=params)
    for row in range(2):
        n = int(out.num_tokens[row])
        assert n > 0 and np.all(out.logp_truncated[row, :n] == 0.0)
        assert np.all(out.logp[row, :n] < 0.0)

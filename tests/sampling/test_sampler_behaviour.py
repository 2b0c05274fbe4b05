"""Per-row stopping, fresh keys, budgets, bucketing and bad input on the real tiny model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aepo_jax.sampling import Sampler, SamplingParams
from aepo_jax.sampling.program_runs import DECODE_WINDOW
from tests.sampling.conftest import random_prompts

SAMPLED = SamplingParams(temperature=1.0)


def first_match_end(tokens: list[int], sequence: list[int]) -> int:
    """Index of the token that completes the first occurrence of `sequence`."""
    for end in range(len(sequence) - 1, len(tokens)):
        if tokens[end - len(sequence) + 1 : end + 1] == sequence:
            return end
    raise AssertionError("sequence does not occur")


def test_multi_token_stop_sequence_stops_exactly_after_its_last_token(tiny_model, greedy_sampler):
    _, graphdef, state = tiny_model
    prompts = random_prompts(10, [4, 7, 5])
    key = jax.random.key(11)
    _, free = greedy_sampler.generate(greedy_sampler.prefill(prompts), 24, rng=key, params=SAMPLED)
    row0 = free.row_tokens(0)
    stop = row0[9:12]  # three tokens from the middle of row 0's free continuation
    never = [row0[5], 1, 1]  # starts like text that occurs but never completes
    sampler = Sampler(graphdef, state, params=SAMPLED, stop_sequences=[never, stop])
    _, out = sampler.generate(sampler.prefill(prompts), 24, rng=key)
    end = first_match_end(row0, stop)
    assert out.row_tokens(0) == row0[: end + 1]
    assert out.stop_reason[0] == "stop" and out.stop_sequence_index[0] == 1
    for row in (1, 2):  # other rows run on unchanged unless they contain the sequence too
        tokens = free.row_tokens(row)
        try:
            expected = tokens[: first_match_end(tokens, stop) + 1]
        except AssertionError:
            expected = tokens
        assert out.row_tokens(row) == expected


def test_eos_stops_a_row_and_others_keep_going(greedy_sampler, tiny_model):
    _, graphdef, state = tiny_model
    prompts = random_prompts(12, [6, 6])
    key = jax.random.key(5)
    _, free = greedy_sampler.generate(greedy_sampler.prefill(prompts), 16, rng=key, params=SAMPLED)
    eos = free.row_tokens(0)[4]
    sampler = Sampler(graphdef, state, params=SAMPLED, eos_ids=[eos])
    st, out = sampler.generate(sampler.prefill(prompts), 16, rng=key)
    first = free.row_tokens(0).index(eos)
    assert out.row_tokens(0) == free.row_tokens(0)[: first + 1] and out.stop_reason[0] == "eos"
    if eos not in free.row_tokens(1):
        assert out.row_tokens(1) == free.row_tokens(1) and out.stop_reason[1] == "length"
    # the stopped row did not advance while the other one ran on
    assert st.next_position.tolist() == [6 + out.num_tokens[0], 6 + out.num_tokens[1]]


def test_per_row_budgets_and_padding_in_outputs(greedy_sampler):
    st, out = greedy_sampler.generate(greedy_sampler.prefill(random_prompts(13, [3, 5, 4])), [2, 9, 0])
    assert out.num_tokens.tolist() == [2, 9, 0]
    assert out.stop_reason == ["length", "length", "length"]
    assert out.tokens.shape == (3, 9)
    assert np.all(out.tokens[0, 2:] == greedy_sampler.pad_id) and np.all(out.logp[0, 2:] == 0)
    assert st.next_position.tolist() == [5, 14, 4]


def test_fresh_key_per_call_and_row_unless_given(tiny_model):
    _, graphdef, state = tiny_model
    sampler = Sampler(graphdef, state, params=SAMPLED)
    prompt = random_prompts(14, [5])[0]
    _, first = sampler.generate(sampler.prefill([prompt, prompt]), 12)
    _, second = sampler.generate(sampler.prefill([prompt, prompt]), 12)
    assert first.row_tokens(0) != second.row_tokens(0)
    assert first.row_tokens(0) != first.row_tokens(1)  # same prompt, two rows, two keys
    key = jax.random.key(99)
    _, again_a = sampler.generate(sampler.prefill([prompt, prompt]), 12, rng=key)
    _, again_b = sampler.generate(sampler.prefill([prompt, prompt]), 12, rng=key)
    assert again_a.tokens.tolist() == again_b.tokens.tolist()
    other = Sampler(graphdef, state, params=SAMPLED)  # a second sampler does not replay the first's stream
    _, third = other.generate(other.prefill([prompt, prompt]), 12)
    assert third.row_tokens(0) != first.row_tokens(0)


def test_step_s_of_row_b_draws_with_the_uniform_of_fold_in_row_key_b_s(tiny_model, full_logits):
    """The PRNG stream is fixed per (row, step), whatever the decode windows: row b's key is
    split(key, batch)[b] and step s draws with uniform(fold_in(row key, s)). Checked against a plain
    full forward and `draw_tokens` on those keys, over two windows (the window's uniforms are drawn
    before its loop, so a wrong step offset or row order shows here)."""
    from aepo_jax.sampling.token_distribution import draw_tokens

    _, graphdef, state = tiny_model
    sampler = Sampler(graphdef, state, params=SAMPLED)
    prompts = random_prompts(21, [4, 9, 6])
    steps = DECODE_WINDOW + 5
    key = jax.random.key(5)
    st = sampler.prefill(prompts)
    _, out = sampler.generate(st, steps, rng=key)
    row_keys = jax.random.split(key, st.batch_size)
    for b, prompt in enumerate(prompts):
        ids = list(prompt)
        for s in range(steps):
            logits = jnp.asarray(full_logits(ids)[-1:])  # [1, V]
            step_key = jax.random.fold_in(row_keys[b], s)[None]
            token = int(draw_tokens(logits, step_key, SAMPLED)[0][0])
            assert out.tokens[b, s] == token, f"row {b} step {s}"
            ids.append(token)


def test_jit_cache_does_not_grow_within_a_bucket(tiny_model):
    _, graphdef, state = tiny_model
    sampler = Sampler(graphdef, state, params=SamplingParams(greedy=True))

    def rollout_round(seed, lengths, budget, result_lengths):
        st = sampler.prefill(random_prompts(seed, lengths))
        st, _ = sampler.generate(st, budget)
        st = sampler.append(st, random_prompts(seed + 1, result_lengths))
        st, _ = sampler.generate(st, budget)
        sampler.fork(st, [0, 0])

    rollout_round(0, [5, 9, 3], 12, [4, 6, 1])
    compiled = sampler.compiled_programs()
    # other rows, prompt lengths, budgets and result lengths, all inside the same buckets (every append
    # feeds more than half of the 4-row batch, so none runs on sub-batches)
    rollout_round(2, [16, 10, 2, 6], 16, [8, 0, 1, 2])
    rollout_round(4, [1, 2, 12, 7], 9, [3, 3, 2, 5])
    assert sampler.compiled_programs() == compiled


def test_reading_cursors_of_any_row_count_compiles_nothing(tiny_model):
    """The host reads a state's cursors every tick; a device-side slice per row count would compile
    one program per count (it did, as `jit(dynamic_slice)`, in every rollout)."""
    from aepo_jax.sampling.state import DecodeState

    _, graphdef, state = tiny_model
    sampler = Sampler(graphdef, state, params=SamplingParams(greedy=True))
    st = sampler.prefill(random_prompts(30, [3, 7, 5, 2, 9]))
    compiles = []
    listener = lambda event, seconds, **_: compiles.append(event) if "backend_compile" in event else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        seen = [(DecodeState(st.arrays, n).cursors.tolist(), DecodeState(st.arrays, n).cursor,
                 DecodeState(st.arrays, n).next_position.tolist()) for n in range(1, 6)]
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    assert seen[-1] == ([3, 7, 5, 2, 9], 9, [3, 7, 5, 2, 9])
    assert [len(c) for c, _, _ in seen] == [1, 2, 3, 4, 5]


def test_counters_count_real_tokens_by_kind(tiny_model):
    _, graphdef, state = tiny_model
    sampler = Sampler(graphdef, state, params=SamplingParams(greedy=True))
    st = sampler.prefill(random_prompts(20, [5, 9]))
    st, _ = sampler.generate(st, [3, 4])
    st = sampler.append(st, [[5, 6], []])
    assert sampler.counters == {"prefill_tokens": 14, "append_tokens": 2, "decode_tokens": 7}


def test_set_params_changes_outputs_without_recompiling(tiny_model):
    _, graphdef, state = tiny_model
    sampler = Sampler(graphdef, state, params=SamplingParams(greedy=True))
    prompts = random_prompts(21, [6])
    _, before = sampler.generate(sampler.prefill(prompts), 8)
    compiled = sampler.compiled_programs()
    negated = jax.tree.map(lambda x: -x, state)
    sampler.set_params(negated)
    _, after = sampler.generate(sampler.prefill(prompts), 8)
    assert before.row_tokens(0) != after.row_tokens(0)
    assert sampler.compiled_programs() == compiled
    # Every program uses the new parameters (the layerwise decode's per-layer copy included).
    fresh = Sampler(graphdef, negated, params=SamplingParams(greedy=True))
    _, expected = fresh.generate(fresh.prefill(prompts), 8)
    assert after.row_tokens(0) == expected.row_tokens(0)
    np.testing.assert_allclose(after.logp, expected.logp, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="differ"):
        sampler.set_params(jax.tree.map(lambda x: x[..., :1], state))


def test_bad_input_raises_clear_errors(greedy_sampler):
    sampler = greedy_sampler
    with pytest.raises(ValueError, match="empty"):
        sampler.prefill([[3], []])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sampler.prefill([[3, 512]])
    with pytest.raises(ValueError, match=r"token ids \[3.7, 4.2\] are not whole numbers"):  # were cut to 3, 4
        sampler.prefill([[3.7, 4.2]])
    for temperature in (float("inf"), 0.0, float("nan")):  # inf sampled uniformly, silently
        with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
            SamplingParams(temperature=temperature)
    st = sampler.prefill([[3, 4]])
    with pytest.raises(ValueError, match="budgets"):
        sampler.generate(st, [1, 2])
    with pytest.raises(ValueError, match="rows"):
        sampler.fork(st, [1])
    with pytest.raises(ValueError, match="token lists"):
        sampler.append(st, [[1], [2]])
    with pytest.raises(ValueError, match="max_cache_len"):
        sampler.generate(st, 5000)


def test_a_cache_of_any_length_takes_every_prompt_that_fits(tiny_model, full_logits):
    """max_cache_len 40 (not a power of two): a 36-token prompt (a 64-token block) fits, and its row
    fills the cache to the last slot (regression: refused, "would need 64 slots"); one more does not."""
    _, graphdef, state = tiny_model
    sampler = Sampler(graphdef, state, params=SamplingParams(greedy=True), max_cache_len=40)
    prompt = random_prompts(41, [36])[0]
    st = sampler.prefill([prompt])
    assert st.cache_length == 40 and st.cursors.tolist() == [36]
    st, out = sampler.generate(st, 4)
    assert st.cursors.tolist() == [40]
    np.testing.assert_allclose(np.asarray(st.last_logits[0]), full_logits(prompt + out.row_tokens(0))[-1],
                               rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="would need 41 slots but max_cache_len is 40"):
        sampler.append(st, [[5]])
    with pytest.raises(ValueError, match="would need 41 slots but max_cache_len is 40"):
        sampler.prefill([random_prompts(42, [41])[0]])


def test_prefill_of_left_padded_array_equals_ragged_lists(greedy_sampler):
    prompts = random_prompts(40, [3, 6])
    padded = np.zeros((2, 6), np.int32)
    padded[0, 3:], padded[1] = prompts[0], prompts[1]
    _, from_lists = greedy_sampler.generate(greedy_sampler.prefill(prompts), 5)
    _, from_array = greedy_sampler.generate(greedy_sampler.prefill(padded, lengths=[3, 6]), 5)
    assert from_array.tokens.tolist() == from_lists.tokens.tolist()
    with pytest.raises(ValueError, match="lengths"):
        greedy_sampler.prefill(padded, lengths=[0, 6])


def test_samplers_of_equal_models_share_programs_and_hash_the_graph_once(tiny_model):
    """Programs take the graph as a static argument hashed once per Sampler (`HashedGraphDef`); a
    Sampler of an equal model split on its own still finds every program the first one compiled."""
    from flax import nnx

    from aepo_jax.models import Decoder, get_preset
    from aepo_jax.sampling.jitted import HashedGraphDef

    _, graphdef, state = tiny_model
    prompts = random_prompts(22, [4, 7])
    first = Sampler(graphdef, state, params=SamplingParams(greedy=True))
    _, expected = first.generate(first.prefill(prompts), 6)
    compiled = first.compiled_programs()
    other_graphdef, _ = nnx.split(Decoder(get_preset("tiny"), rngs=nnx.Rngs(1)))
    second = Sampler(other_graphdef, state, params=SamplingParams(greedy=True))
    _, again = second.generate(second.prefill(prompts), 6)
    assert again.row_tokens(1) == expected.row_tokens(1)
    assert second.compiled_programs() == compiled
    wrapped = HashedGraphDef(graphdef)
    assert wrapped == HashedGraphDef(other_graphdef) and hash(wrapped) == hash(graphdef)
    different, _ = nnx.split(Decoder(get_preset("tiny").replace(n_layers=1), rngs=nnx.Rngs(0)))
    assert wrapped != HashedGraphDef(different) and wrapped != graphdef

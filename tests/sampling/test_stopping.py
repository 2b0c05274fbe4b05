"""Token-level stop sequences on the rolling window, EOS, budgets; shape buckets."""

import jax.numpy as jnp
import numpy as np
import pytest

from aepo_jax.sampling.buckets import bucket_batch, bucket_length, next_power_of_two
from aepo_jax.sampling.stopping import (
    NOT_STOPPED,
    STOP_EOS,
    STOP_LENGTH,
    STOP_SEQUENCE,
    build_stop_table,
    empty_window,
    match_stop_sequence,
    push_window,
    stop_reason_after,
)


def run_stream(stream, table):
    """Pushes one id at a time and returns the first step at which each row matched (or None)."""
    window = empty_window(1, table)
    for step, token in enumerate(stream):
        window = push_window(window, jnp.asarray([token], jnp.int32))
        index = int(match_stop_sequence(window, table)[0])
        if index >= 0:
            return step, index
    return None


def test_multi_token_sequence_matches_exactly_at_its_last_token():
    table = build_stop_table([[7, 8, 9], [4]], eos_ids=[])
    assert run_stream([1, 7, 8, 2, 7, 8, 9, 5], table) == (6, 0)
    assert run_stream([1, 2, 4, 7], table) == (2, 1)
    assert run_stream([7, 8, 2, 9], table) is None  # broken sequence never matches


def test_empty_window_matches_nothing_and_no_sequences_is_fine():
    table = build_stop_table([[3, 3]], eos_ids=[])
    assert run_stream([3], table) is None
    none = build_stop_table([], eos_ids=[2])
    assert run_stream([1, 2, 3], none) is None


def test_reason_priority_eos_then_sequence_then_length():
    table = build_stop_table([[5, 6]], eos_ids=[6, 9])
    window = jnp.asarray([[5, 6], [5, 6], [1, 2], [1, 9]], jnp.int32)
    tokens = window[:, -1]
    table_seq = build_stop_table([[5, 6], [1, 2]], eos_ids=[9])
    reason, index = stop_reason_after(tokens, window, jnp.asarray([1, 1, 4, 1]), jnp.asarray([9, 9, 4, 9]), table)
    assert reason.tolist() == [STOP_EOS, STOP_EOS, STOP_LENGTH, STOP_EOS]
    assert index.tolist() == [-1, -1, -1, -1]
    reason, index = stop_reason_after(tokens, window, jnp.asarray([1, 1, 1, 1]), jnp.asarray([9, 9, 9, 9]), table_seq)
    assert reason.tolist() == [STOP_SEQUENCE, STOP_SEQUENCE, STOP_SEQUENCE, STOP_EOS]
    assert index.tolist() == [0, 0, 1, -1]
    reason, _ = stop_reason_after(
        jnp.asarray([3]), jnp.asarray([[0, 3]]), jnp.asarray([1]), jnp.asarray([5]), table_seq
    )
    assert reason.tolist() == [NOT_STOPPED]


@pytest.mark.parametrize("sequences,eos,message", [([[]], [], "empty"), ([[1, -2]], [], "negative"), ([], [-1], "eos")])
def test_bad_stop_table_raises(sequences, eos, message):
    with pytest.raises(ValueError, match=message):
        build_stop_table(sequences, eos)


def test_buckets():
    assert [next_power_of_two(n) for n in (1, 2, 3, 8, 9)] == [1, 2, 4, 8, 16]
    assert [bucket_batch(n) for n in (1, 3, 5)] == [1, 4, 8]
    assert [bucket_batch(n, 8) for n in (1, 3, 9)] == [8, 8, 16]
    assert bucket_batch(5, 6) == 12
    assert [bucket_length(n, 128) for n in (1, 128, 129, 300)] == [128, 128, 256, 512]
    with pytest.raises(ValueError, match="n >= 1"):
        next_power_of_two(0)
    assert np.all(np.asarray(empty_window(2, build_stop_table([[1, 2, 3]], []))) == -1)

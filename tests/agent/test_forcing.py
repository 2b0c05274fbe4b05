"""ToolForcingGenerator: free tokens per segment (fixed or drawn from a range), then the planned call,
on a real tiny Sampler (random weights, no stop ids, so a row stops only where it is forced)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from aepo_jax.agent.forcing import ToolForcingGenerator
from aepo_jax.models import Decoder, get_preset
from aepo_jax.sampling import Sampler

PLAN = [[5, 6, 7], [8, 9]]
PROMPTS = [[1 + i, 2, 3] for i in range(8)]


@pytest.fixture(scope="module")
def sampler():
    model = Decoder(get_preset("tiny", vocab_size=64), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    return Sampler(graphdef, params, eos_ids=[], max_cache_len=512, seed=0)


def free_counts(out) -> list[int]:
    return [int(n) - int(f) for n, f in zip(out.num_tokens, out.forced_tokens, strict=True)]


def test_fixed_free_tokens_then_the_plan(sampler):
    gen = ToolForcingGenerator(sampler, PLAN, free_tokens=4)
    state, out = gen.generate(gen.prefill(PROMPTS), 100, jax.random.key(0))
    assert free_counts(out) == [4] * 8 and out.stop_reason == ["stop"] * 8
    assert all(out.tokens[i, 4:7].tolist() == PLAN[0] for i in range(8))
    state = gen.append(state, [[11, 12]] * 8)
    state, out = gen.generate(state, 100, jax.random.key(1))
    assert free_counts(out) == [4] * 8 and all(out.tokens[i, 4:6].tolist() == PLAN[1] for i in range(8))


def test_free_tokens_drawn_per_segment_and_kept_across_chunks(sampler):
    """With a range, each segment draws its own count in [low, high]: rows differ, and a new segment (after
    an append) draws again. A segment decoded in two calls (a budget of 2, then the rest) samples as many
    free tokens in all as the same seed gives in one call, and is forced only at its end."""
    whole = ToolForcingGenerator(sampler, PLAN, free_tokens=(3, 12), seed=7)
    state, out = whole.generate(whole.prefill(PROMPTS), 100, jax.random.key(0))
    first = free_counts(out)
    assert all(3 <= c <= 12 for c in first) and len(set(first)) > 1
    assert all(out.tokens[i, first[i]:first[i] + 3].tolist() == PLAN[0] for i in range(8))
    state = whole.append(state, [[11, 12]] * 8)
    _, out = whole.generate(state, 100, jax.random.key(1))
    second = free_counts(out)
    assert all(3 <= c <= 12 for c in second) and second != first

    chunked = ToolForcingGenerator(sampler, PLAN, free_tokens=(3, 12), seed=7)
    state, out = chunked.generate(chunked.prefill(PROMPTS), 2, jax.random.key(0))
    assert out.num_tokens.tolist() == [2] * 8 and out.stop_reason == ["length"] * 8
    assert out.forced_tokens.tolist() == [0] * 8
    _, out = chunked.generate(state, 100, jax.random.key(1))
    assert [2 + c for c in free_counts(out)] == first
    assert out.forced_tokens.tolist() == [3] * 8


def test_bad_free_tokens_are_refused(sampler):
    for bad in (-1, (5, 2), (-1, 3)):
        with pytest.raises(ValueError, match="free_tokens"):
            ToolForcingGenerator(sampler, PLAN, free_tokens=bad)


def test_forks_places_concats_and_extends_carry_each_rows_remaining_free_tokens(sampler):
    gen = ToolForcingGenerator(sampler, PLAN, free_tokens=(3, 12), seed=3)
    state, _ = gen.generate(gen.prefill(PROMPTS[:4]), 2, jax.random.key(0))  # every row mid-segment
    left = list(state.free_left)
    assert all(x >= 1 for x in left)
    fork = gen.fork(state, [2, 0])
    assert fork.free_left == [left[2], left[0]]
    both = gen.concat([state, fork])
    assert both.free_left == left + [left[2], left[0]]
    placed = gen.place(both, [1], fork, [0])
    assert placed.free_left == [left[0], left[2], left[2], left[3], left[2], left[0]]
    assert np.array_equal(placed.ids[1], state.ids[2])
    ids, forced = [list(r) for r in state.ids], list(state.forced)
    extended = gen.extend(state, fork)  # consumes state: fork's rows go into its batch's spare rows
    assert extended.free_left == left + [left[2], left[0]]
    assert extended.ids == ids + [ids[2], ids[0]] and extended.forced == forced + [forced[2], forced[0]]
    assert extended.inner.num_rows == 6 and extended.inner.batch_size == both.inner.batch_size


def test_the_wrapper_holds_its_samplers_background_compiles(sampler):
    """`compiles_held()` is the wrapped sampler's block (so a loop run over forced segments holds its
    compiles as one over the sampler would), and a block that does nothing for a sampler without one."""
    gen = ToolForcingGenerator(sampler, PLAN, free_tokens=2)
    with gen.compiles_held():
        assert sampler._compiles._hold_depth == 1
    assert sampler._compiles._hold_depth == 0
    with ToolForcingGenerator(object(), PLAN).compiles_held():
        pass

"""The sampler on an 8-device fake CPU mesh gives what it gives on one device."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from aepo_jax.parallel import make_mesh, shard_state
from aepo_jax.sampling import Sampler, SamplingParams
from tests.sampling.conftest import random_prompts


def test_eight_device_mesh_matches_single_device_greedy(tiny_model, greedy_sampler):
    if jax.device_count() < 8:
        pytest.skip("needs the 8 fake CPU devices set in tests/conftest.py")
    _, graphdef, state = tiny_model
    mesh = make_mesh({"data": 8, "fsdp": 1, "tensor": 1})
    sharded = Sampler(graphdef, shard_state(state, mesh), params=SamplingParams(greedy=True), mesh=mesh)
    prompts = random_prompts(30, [4, 11, 7])
    st, on_mesh = sharded.generate(sharded.prefill(prompts), 10)
    assert st.batch_size == 8  # bucketed to a multiple of the data axis
    assert len(st.arrays.cache.k[0].sharding.device_set) == 8
    st = sharded.append(st, [[5, 6, 7], [], [9]])
    _, on_mesh_after = sharded.generate(sharded.fork(st, [2, 0, 1]), 6)

    single = greedy_sampler
    ref, alone = single.generate(single.prefill(prompts), 10)
    ref = single.append(ref, [[5, 6, 7], [], [9]])
    _, alone_after = single.generate(single.fork(ref, [2, 0, 1]), 6)
    assert on_mesh.tokens.tolist() == alone.tokens.tolist()
    assert on_mesh_after.tokens.tolist() == alone_after.tokens.tolist()


DATA_FSDP_TENSOR = {"data": 2, "fsdp": 2, "tensor": 2}


def _assert_cache_layout(arrays, mesh):
    """k and v: rows over (data, fsdp), KV heads over tensor; every device holds exactly one shard."""
    expected = P(None, ("data", "fsdp"), "tensor", None, None)  # [L, B, KVH, S, Dh]
    for buffer in (arrays.cache.k, arrays.cache.v):
        sharding = NamedSharding(mesh, expected)
        assert buffer.sharding.is_equivalent_to(sharding, buffer.ndim), buffer.sharding
        layers, batch, heads, slots, dim = buffer.shape
        assert {s.data.shape for s in buffer.addressable_shards} == {(layers, batch // 4, heads // 2, slots, dim)}
        assert len(buffer.addressable_shards) == 8
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    assert arrays.slot_valid.sharding.is_equivalent_to(rows, 2)
    assert arrays.next_position.sharding.is_equivalent_to(rows, 1)


def test_cache_sharded_over_batch_axes_and_kv_heads_and_results_match_unsharded(tiny_model, greedy_sampler):
    """On a (data 2, fsdp 2, tensor 2) mesh the empty cache comes out of its jitted creator already
    split, prefill / generate / append / fork keep that layout, and tokens, log-probs and entropies
    equal the unsharded sampler's."""
    if jax.device_count() < 8:
        pytest.skip("needs the 8 fake CPU devices set in tests/conftest.py")
    _, graphdef, state = tiny_model
    mesh = make_mesh(DATA_FSDP_TENSOR)
    sharded = Sampler(graphdef, state, params=SamplingParams(greedy=True), mesh=mesh)
    _assert_cache_layout(sharded._empty_arrays(4, 128), mesh)
    prompts = random_prompts(32, [4, 11, 7])
    runs = []
    for sampler in (sharded, greedy_sampler):
        st = sampler.prefill(prompts)
        st, first = sampler.generate(st, 10)
        st = sampler.append(st, [[5, 6, 7], [], [9]])
        st = sampler.fork(st, [2, 0, 1])
        st, second = sampler.generate(st, 6)
        runs.append((first, second))
        if sampler is sharded:
            assert st.batch_size == 4  # a multiple of data x fsdp
            _assert_cache_layout(st.arrays, mesh)
    for on_mesh, alone in zip(runs[0], runs[1], strict=True):
        assert on_mesh.tokens.tolist() == alone.tokens.tolist()
        np.testing.assert_allclose(on_mesh.logp, alone.logp, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(on_mesh.entropy, alone.entropy, rtol=1e-4, atol=1e-5)


def test_cached_blocks_in_row_groups_on_a_mesh_match_single_device(tiny_model, greedy_sampler, monkeypatch):
    """With a tiny score budget, a 16-row append on 8 data shards attends in two groups of 8 rows (one
    per shard each); tokens equal the single-device sampler's."""
    if jax.device_count() < 8:
        pytest.skip("needs the 8 fake CPU devices set in tests/conftest.py")
    from aepo_jax.models import attention as attention_module

    monkeypatch.setattr(attention_module, "CACHED_SCORES_CHUNK_BYTES", 1)
    _, graphdef, state = tiny_model
    mesh = make_mesh({"data": 8, "fsdp": 1, "tensor": 1})
    sharded = Sampler(graphdef, shard_state(state, mesh), params=SamplingParams(greedy=True), mesh=mesh)
    prompts = random_prompts(36, [3 + (5 * i) % 13 for i in range(13)])  # 13 rows: a batch of 16
    results = random_prompts(37, [1 + (3 * i) % 7 for i in range(13)])
    st = sharded.append(sharded.prefill(prompts), results)
    assert st.batch_size == 16
    _, on_mesh = sharded.generate(st, 6)
    single = greedy_sampler
    _, alone = single.generate(single.append(single.prefill(prompts), results), 6)
    assert on_mesh.tokens.tolist() == alone.tokens.tolist()
    np.testing.assert_allclose(on_mesh.logp, alone.logp, rtol=1e-5, atol=1e-5)


def test_sub_batch_appends_over_a_leading_span_on_a_mesh_match_single_device(tiny_model, greedy_sampler):
    """On a (data 2, fsdp 2, tensor 2) mesh with a 512-slot cache, an append to 6 of 16 rows runs as two
    sub-batches of 4 rows over their first 128 slots; the cache keeps its layout, and tokens, log-probs
    and entropies after it equal the unsharded sampler's."""
    if jax.device_count() < 8:
        pytest.skip("needs the 8 fake CPU devices set in tests/conftest.py")
    from aepo_jax.sampling.jitted import rows_block_program

    _, graphdef, state = tiny_model
    mesh = make_mesh(DATA_FSDP_TENSOR)
    sharded = Sampler(graphdef, state, params=SamplingParams(greedy=True), mesh=mesh, max_cache_len=512,
                      min_cache_len=512)
    prompts = random_prompts(38, [3 + (5 * i) % 13 for i in range(16)])
    results = [[] for _ in prompts]
    for row, ids in zip([0, 3, 5, 8, 12, 14], random_prompts(39, [4, 9, 2, 6, 11, 5]), strict=True):
        results[row] = ids
    spans, call = [], sharded._call

    def spy(kind, program, *args, **kwargs):
        if program is rows_block_program:
            spans.append(args[8])
        return call(kind, program, *args, **kwargs)

    sharded._call = spy
    runs = []
    for sampler in (sharded, greedy_sampler):
        st, first = sampler.generate(sampler.prefill(prompts), 4)
        st = sampler.append(st, results)
        st, second = sampler.generate(st, 6)
        runs.append((first, second))
        if sampler is sharded:
            _assert_cache_layout(st.arrays, mesh)
    assert spans == [128, 128]
    for on_mesh, alone in zip(runs[0], runs[1], strict=True):
        assert on_mesh.tokens.tolist() == alone.tokens.tolist()
        np.testing.assert_allclose(on_mesh.logp, alone.logp, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(on_mesh.entropy, alone.entropy, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layerwise", [True, False])
def test_decode_of_a_few_rows_over_their_live_span_on_a_mesh_matches_single_device(tiny_model, greedy_sampler,
                                                                                    full_logits, layerwise):
    """On a (data 2, fsdp 2, tensor 2) mesh, a generate where 5 of 16 rows have a budget decodes those rows
    in half the batch over their first slots only (`rows_decode_program`), with the layerwise window and
    with the stacked scan; the cache keeps its layout, the other rows are untouched, and tokens, log-probs
    and entropies equal the unsharded sampler's; the decoded rows continue like a full forward."""
    if jax.device_count() < 8:
        pytest.skip("needs the 8 fake CPU devices set in tests/conftest.py")
    from aepo_jax.sampling.jitted import rows_decode_program

    _, graphdef, state = tiny_model
    mesh = make_mesh(DATA_FSDP_TENSOR)
    sharded = Sampler(graphdef, state, params=SamplingParams(greedy=True), mesh=mesh, max_cache_len=512,
                      min_cache_len=512, layerwise_decode=layerwise)
    prompts = random_prompts(40, [3 + (7 * i) % 17 for i in range(16)])
    budgets = [0] * 16
    for row, n in zip([1, 4, 6, 11, 15], [5, 9, 3, 8, 6], strict=True):
        budgets[row] = n
    calls, call = [], sharded._call

    def spy(kind, program, *args, **kwargs):
        if program is rows_decode_program:
            calls.append((args[3].shape[0], kwargs["span"]))
        return call(kind, program, *args, **kwargs)

    sharded._call = spy
    runs = []
    for sampler in (sharded, greedy_sampler):
        st = sampler.prefill(prompts)
        before = jax.device_get(st.arrays)
        st, out = sampler.generate(st, budgets)
        after = jax.device_get(st.arrays)
        if sampler is sharded:
            _assert_cache_layout(st.arrays, mesh)
            for row in (r for r in range(16) if budgets[r] == 0):
                np.testing.assert_array_equal(after.cache.k[:, row], before.cache.k[:, row])
                np.testing.assert_array_equal(after.slot_valid[row], before.slot_valid[row])
            for row in (r for r in range(16) if budgets[r] > 0):
                ids = prompts[row] + out.row_tokens(row)
                np.testing.assert_allclose(after.last_logits[row], full_logits(ids)[-1], rtol=1e-5, atol=1e-4)
        runs.append(sampler.generate(st, 4)[1])  # every row, after it
        runs.append(out)
    assert calls and all(rows == 8 and span < 512 for rows, span in calls), calls
    for on_mesh, alone in ((runs[1], runs[3]), (runs[0], runs[2])):
        assert on_mesh.tokens.tolist() == alone.tokens.tolist()
        np.testing.assert_allclose(on_mesh.logp, alone.logp, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(on_mesh.entropy, alone.entropy, rtol=1e-4, atol=1e-5)


def test_marks_and_marked_forks_on_a_mesh_match_single_device(tiny_model, greedy_sampler):
    """`mark` / `fork_marked` on a (data 2, fsdp 2, tensor 2) mesh: the marks are split over the batch
    axes like the rows they mark, the marked fork keeps the cache layout, and it continues as on one device."""
    if jax.device_count() < 8:
        pytest.skip("needs the 8 fake CPU devices set in tests/conftest.py")
    _, graphdef, state = tiny_model
    mesh = make_mesh(DATA_FSDP_TENSOR)
    sharded = Sampler(graphdef, state, params=SamplingParams(greedy=True), mesh=mesh)
    runs = []
    for sampler in (sharded, greedy_sampler):
        st, _ = sampler.generate(sampler.prefill(random_prompts(34, [4, 11, 7])), 5)
        marks = sampler.mark(st, [1, 2])
        st = sampler.append(st, [[5, 6], [7], [9, 3, 4]])
        st, _ = sampler.generate(st, 4)
        child = sampler.fork_marked(st, [2, 1, 2], marks, [1, 0, 1])
        if sampler is sharded:
            rows = NamedSharding(mesh, P(("data", "fsdp")))
            assert marks.arrays.cursor.sharding.is_equivalent_to(rows, 1)
            assert marks.arrays.last_logits.sharding.is_equivalent_to(NamedSharding(mesh, P(("data", "fsdp"), None)), 2)
            _assert_cache_layout(child.arrays, mesh)
        runs.append(sampler.generate(child, 6)[1])
    assert runs[0].tokens.tolist() == runs[1].tokens.tolist()
    np.testing.assert_allclose(runs[0].logp, runs[1].logp, rtol=1e-4, atol=1e-5)


def test_row_moves_on_a_mesh_plan_less_than_one_cache_of_temporaries():
    """Forks, places and grows move rows between the batch shards. Planned all layers at once, the
    compiler gathers whole caches (on this CPU mesh: 4x this device's cache for a 32-of-64-row take;
    at the 14B config on a TPU slice it refused the plan); one layer at a time, the temporaries of
    taking or placing half the rows stay below one cache (compiled memory analysis, 4 layers)."""
    if jax.device_count() < 8:
        pytest.skip("needs the 8 fake CPU devices set in tests/conftest.py")
    import jax.numpy as jnp

    from aepo_jax.sampling.cache_sharding import DecodeSharding, _empty_arrays
    from aepo_jax.sampling.jitted import place_program, take_program

    mesh = make_mesh(DATA_FSDP_TENSOR)
    layout = DecodeSharding(mesh)

    def arrays(batch):
        shapes = jax.eval_shape(lambda: _empty_arrays(4, batch, 512, 2, 32, 256, "float32"))
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, layout.of(shapes))

    index = jax.ShapeDtypeStruct((32,), jnp.int32, sharding=NamedSharding(mesh, P()))
    cache = 2 * 4 * (64 // 4) * (2 // 2) * 512 * 32 * 4  # this device's K and V of 64 rows: rows / 4, heads / 2
    with jax.set_mesh(mesh):
        take = take_program.lower(arrays(64), index, layout).compile().memory_analysis()
        place = place_program.lower(arrays(64), index, arrays(32), index, layout).compile().memory_analysis()
    assert take.temp_size_in_bytes < cache and place.temp_size_in_bytes < cache, (
        take.temp_size_in_bytes / cache, place.temp_size_in_bytes / cache)

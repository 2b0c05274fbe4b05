"""The sampler on an 8-device fake CPU mesh gives what it gives on one device."""

import jax
import pytest

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

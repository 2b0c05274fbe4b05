"""Mesh construction, the logical-axis rules, and a sharded forward on 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from aepo_jax.models import Decoder, KVCache, get_preset
from aepo_jax.parallel import (
    batch_sharding,
    logical_to_spec,
    make_mesh,
    shard_state,
    state_shardings,
)
from aepo_jax.parallel.sharding import require_heads_split


def test_make_mesh_fills_the_free_axis_and_uses_auto_axes():
    mesh = make_mesh({"data": -1, "tensor": 2})
    assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "tensor": 2}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_make_mesh_splits_physical_axes_when_the_slice_cannot_be_assembled_otherwise(monkeypatch):
    # jax.make_mesh refuses e.g. fsdp 8 on a 4x4x4 TPU slice (no product of whole physical axes is 8);
    # fake CPU devices have no physical topology, so stand its refusal in and check the fallback's mesh.
    def refuse(*args, **kwargs):
        raise NotImplementedError("Failed to find assignment for logical_axis_index 1 of size 8")

    monkeypatch.setattr(jax, "make_mesh", refuse)
    mesh = make_mesh({"data": -1, "fsdp": 2, "tensor": 2})
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ({"data": 3}, "does not divide the 8 devices"),
        ({"data": 2}, "uses 2 devices but 8 are available"),
        ({"model": 8}, "unknown mesh axes"),
        ({"data": -1, "fsdp": -1}, "at most one mesh axis may be -1"),
    ],
)
def test_make_mesh_rejects_bad_shapes_with_clear_errors(shape, message):
    with pytest.raises(ValueError, match=message):
        make_mesh(shape)


def test_logical_to_spec_maps_names_and_drops_indivisible_or_reused_axes():
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    assert logical_to_spec(("embed", "heads", "head_dim")) == P("fsdp", "tensor", None)
    assert logical_to_spec(("batch", None)) == P(("data", "fsdp"), None)
    assert logical_to_spec(("embed", "heads"), shape=(64, 9), mesh=mesh) == P("fsdp", None)  # 9 heads % 2
    assert logical_to_spec(("heads", "kv_heads"), shape=(4, 4), mesh=mesh) == P("tensor", None)  # tensor used once
    with pytest.raises(ValueError, match="logical axis 'bogus' has no sharding rule"):
        logical_to_spec(("bogus",))


@pytest.mark.parametrize(("tensor", "message"), [
    (8, "the mesh's tensor size 8 does not divide its 28 query heads"),
    (7, "the mesh's tensor size 7 does not divide its 4 key-value heads"),
])
def test_a_tensor_axis_that_cannot_split_the_heads_is_refused_naming_both_counts(tensor, message):
    """`logical_to_spec` would leave such weights unsplit, silently (Qwen2.5-7B: 28 / 4 heads)."""
    with pytest.raises(ValueError, match=rf"qwen2_5_7b has 28 query heads and 4 key-value heads: {message}.*"
                                         r"set mesh.shape with tensor one of \[1, 2, 4\]"):
        require_heads_split(28, 4, {"data": 1, "fsdp": 1, "tensor": tensor}, "qwen2_5_7b")
    for fits in ({"fsdp": 8, "tensor": 4}, {"data": 4}, {}):  # an axis left out is 1
        require_heads_split(28, 4, fits, "qwen2_5_7b")


def test_state_shardings_follow_parameter_metadata():
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    _, state = nnx.split(Decoder(get_preset("tiny"), rngs=nnx.Rngs(0)))
    shardings = state_shardings(state, mesh)
    assert shardings["embed"].get_value().spec == P("tensor", "fsdp")  # [vocab, embed]
    # Stacked [L, ...] layer parameters: the layer axis is never sharded.
    assert shardings["layers"]["attention"]["q_proj"].get_value().spec == P(None, "fsdp", "tensor", None)
    assert shardings["layers"]["mlp"]["down"].get_value().spec == P(None, "tensor", "fsdp")
    assert shardings["final_norm"]["scale"].get_value().spec == P(None)


def test_sharded_forward_on_8_devices_equals_single_device_forward():
    config = get_preset("tiny", qkv_bias=True, tie_embeddings=False)
    graphdef, state = nnx.split(Decoder(config, rngs=nnx.Rngs(0)))
    ids = jax.random.randint(jax.random.key(0), (4, 16), 0, config.vocab_size, dtype=jnp.int32)

    def forward(state, ids):
        return nnx.merge(graphdef, state)(ids)

    expected = jax.jit(forward)(state, ids)
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded_state = shard_state(state, mesh)
    q_proj = sharded_state["layers"]["attention"]["q_proj"].get_value()
    assert q_proj.sharding.spec == P(None, "fsdp", "tensor", None) and len(q_proj.addressable_shards) == 8
    assert q_proj.addressable_shards[0].data.shape == (config.n_layers, 32, 2, 16)
    with jax.set_mesh(mesh):
        got = jax.jit(forward)(sharded_state, jax.device_put(ids, batch_sharding(mesh, 2)))
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=0)


def test_sharded_cached_decode_step_equals_single_device():
    config = get_preset("tiny")
    graphdef, state = nnx.split(Decoder(config, rngs=nnx.Rngs(1)))
    ids = jax.random.randint(jax.random.key(1), (4, 6), 0, config.vocab_size, dtype=jnp.int32)

    def prefill(state, cache, ids):
        return nnx.merge(graphdef, state)(ids, kv_cache=cache)

    cache = KVCache.init(config, batch=4, length=8)
    expected, _ = jax.jit(prefill)(state, cache, ids)
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    cache_sharding = jax.sharding.NamedSharding(
        mesh, logical_to_spec(("layers", "batch", "kv_heads", "length", "head_dim")))  # [L, B, KVH, S, Dh]
    sharded_cache = cache.replace(k=jax.device_put(cache.k, cache_sharding), v=jax.device_put(cache.v, cache_sharding))
    with jax.set_mesh(mesh):
        got, new_cache = jax.jit(prefill, donate_argnums=1)(shard_state(state, mesh), sharded_cache, ids)
    assert int(new_cache.index) == 6
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=0)

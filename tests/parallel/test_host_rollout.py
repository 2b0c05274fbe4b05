"""`parallel.host_rollout` on one process: without fsdp the rollout mesh is the run's and parameters pass
through; with fsdp the sampler reads replicas of the weights on a data x tensor mesh; a copy in the compute
dtype samples exactly as the float32 weights (the multi-process behaviour is
`tests/training/test_multihost_agent_rollout.py`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from aepo_jax.models import Decoder, get_preset
from aepo_jax.parallel import make_mesh
from aepo_jax.parallel.host_rollout import HostRolloutPlacement, host_mesh_shape
from aepo_jax.parallel.sharding import shard_state
from aepo_jax.sampling import Sampler, SamplingParams


def test_one_process_keeps_the_run_mesh_and_passes_parameters_through():
    mesh = make_mesh({"data": -1})
    placement = HostRolloutPlacement(mesh, dtype="bfloat16")
    params = {"w": jnp.ones((4, 4), jnp.float32)}
    assert placement.mesh is mesh and not placement.per_host
    assert placement(params) is params  # no copy, no cast: the sampler uses the trainer's weights


def test_one_process_with_fsdp_samples_on_replicas_of_the_weights():
    """A mesh that splits the weights over fsdp would make the decode loop gather them at every token:
    the sampler reads whole copies instead (per tensor group), and draws what the run's shards draw."""
    import threading

    from aepo_jax.experiment import rollout_placement_from
    from configs.aepo_tiny import get_config

    config = get_preset("tiny", n_layers=2)
    graphdef, state = nnx.split(Decoder(config, rngs=nnx.Rngs(3)))
    mesh = make_mesh({"fsdp": 4, "tensor": 2})
    state = shard_state(state, mesh)
    placement = HostRolloutPlacement(mesh)
    assert placement.per_host and dict(placement.mesh.shape) == {"data": 4, "fsdp": 1, "tensor": 2}
    assert set(placement.mesh.devices.flat) == set(mesh.devices.flat)
    replicas = placement(state)
    assert placement(replicas) is replicas  # placed once per rollout: a second call is a no-op
    def distinct_shards(x):
        return len({tuple((i.start, i.stop) for i in index) for index in x.sharding.devices_indices_map(x.shape).values()})

    assert max(distinct_shards(x) for x in jax.tree.leaves(state)) == 8  # fsdp 4 x tensor 2
    for got, want in zip(jax.tree.leaves(replicas), jax.tree.leaves(state), strict=True):
        assert got.sharding.mesh == placement.mesh and distinct_shards(got) <= 2  # whole but for tensor
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Weights on one device (as a GGUF policy is loaded) reach the same replicas.
    from_one_device = placement(jax.device_put(jax.device_get(state), jax.devices()[0]))
    for got, want in zip(jax.tree.leaves(from_one_device), jax.tree.leaves(replicas), strict=True):
        assert got.sharding == want.sharding
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    outputs = []
    for weights, sampler_mesh in ((replicas, placement.mesh), (state, mesh)):
        sampler = Sampler(graphdef, weights, params=SamplingParams(temperature=1.0), seed=0, mesh=sampler_mesh)
        _, out = sampler.generate(sampler.prefill([[5, 9, 13, 2], [7, 3]]), 12, rng=jax.random.key(7))
        outputs.append(out)
    np.testing.assert_array_equal(outputs[0].tokens, outputs[1].tokens)
    np.testing.assert_allclose(outputs[0].logp, outputs[1].logp, rtol=1e-5, atol=1e-6)
    # One process: the copy is no collective, so a background rollout thread may make it.
    made = []
    thread = threading.Thread(target=lambda: made.append(HostRolloutPlacement(mesh)(state)))
    thread.start()
    thread.join()
    assert len(made) == 1
    cfg = get_config()
    cfg.rollout.sampler_weights = "run_mesh"
    assert not rollout_placement_from(cfg, mesh).per_host and rollout_placement_from(cfg, mesh).mesh is mesh
    cfg.rollout.sampler_weights = "sharded"
    with pytest.raises(ValueError, match="rollout.sampler_weights='sharded'"):
        rollout_placement_from(cfg, mesh)
    with pytest.raises(ValueError, match="needs one process"):
        HostRolloutPlacement(mesh, process_count=2, process_index=0, replicas=False)


def _decode_window_gathers(sampler: Sampler) -> set[tuple[int, ...]]:
    """Result shapes of the all-gathers in the compiled decode-window program a generate runs."""
    import re

    captured = {}
    call = sampler._call

    def capturing(kind, program, *args, **kwargs):
        if kind == "decode" and "max_steps" in kwargs and not captured:
            abstract = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) \
                if isinstance(x, jax.Array) else x
            captured.update(program=program, args=jax.tree.map(abstract, args), kwargs=kwargs)
        return call(kind, program, *args, **kwargs)

    sampler._call = capturing
    sampler.generate(sampler.prefill([[5, 9, 13, 2], [7, 3]]), 4, rng=jax.random.key(0))
    with jax.set_mesh(sampler.mesh):
        text = captured["program"].lower(*captured["args"], **captured["kwargs"]).compile().as_text()
    return {tuple(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\[([\d,]*)\]\S* all-gather\(", text)}


def test_the_decode_loop_on_replicas_gathers_no_weights():
    """What replicas are for: on fsdp shards the decode window gathers weights inside its loop (gather results
    the shape of a weight's tensor shard, one layer's or the whole stack's); on replicas it gathers none."""
    config = get_preset("tiny", n_layers=2)
    graphdef, state = nnx.split(Decoder(config, rngs=nnx.Rngs(3)))
    mesh = make_mesh({"fsdp": 4, "tensor": 2})
    state = shard_state(state, mesh)
    placement = HostRolloutPlacement(mesh)
    replicas = placement(state)
    weight_shapes = set()
    for x in jax.tree.leaves(replicas):
        shard = tuple(x.sharding.shard_shape(x.shape))
        weight_shapes |= {shard, shard[1:]} if len(shard) > 2 else {shard}
    gathers = {}
    for name, weights, sampler_mesh in (("run_mesh", state, mesh), ("replicas", replicas, placement.mesh)):
        sampler = Sampler(graphdef, weights, seed=0, mesh=sampler_mesh, layerwise_decode=False,
                          half_batch_decode=False)  # the accelerators' decode path
        gathers[name] = _decode_window_gathers(sampler) & weight_shapes
    assert gathers["run_mesh"], "the check finds nothing to catch: no weight gathers on the fsdp shards either"
    assert not gathers["replicas"], gathers["replicas"]


def test_host_mesh_keeps_the_run_tensor_size_and_refuses_one_that_spans_hosts():
    assert host_mesh_shape({"data": 1, "fsdp": 8, "tensor": 4}, 4) == {"data": 1, "fsdp": 1, "tensor": 4}
    assert host_mesh_shape({"data": -1, "fsdp": 2, "tensor": 2}, 8) == {"data": 4, "fsdp": 1, "tensor": 2}
    with pytest.raises(ValueError, match="tensor=8 does not divide the 4 devices of each host"):
        host_mesh_shape({"tensor": 8}, 4)


def test_a_copy_in_the_compute_dtype_samples_exactly_as_the_float32_weights():
    """bfloat16 compute, float32 master weights (biases and q/k norms on, as in Qwen2.5 / Qwen3): a
    sampler over the weights cast to bfloat16 draws the same tokens with the same log-probs and entropies,
    bit for bit, as one over the float32 weights. Every weight is cast to the compute dtype where used."""
    config = get_preset("tiny", dtype="bfloat16", param_dtype="float32", qkv_bias=True, qk_norm=True, n_layers=2)
    graphdef, state = nnx.split(Decoder(config, rngs=nnx.Rngs(3)))
    # Weights that bfloat16 does not represent exactly (norm scales and biases start at 1 and 0).
    state = jax.tree.map(lambda x: x + 0.01 * jax.random.normal(jax.random.key(5), x.shape, x.dtype), state)
    cast = jax.tree.map(lambda x: x.astype(jnp.bfloat16), state)
    assert any(not np.array_equal(np.asarray(a), np.asarray(b.astype(jnp.float32)))
               for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(cast)))
    prompts = [[5, 9, 13, 2], [7, 3], [11, 12, 14, 15, 16]]
    outputs = []
    for weights in (state, cast):
        sampler = Sampler(graphdef, weights, params=SamplingParams(temperature=1.0), seed=0)
        _, out = sampler.generate(sampler.prefill(prompts), 12, rng=jax.random.key(7))
        outputs.append(out)
    full, half = outputs
    np.testing.assert_array_equal(full.tokens, half.tokens)
    np.testing.assert_array_equal(full.logp, half.logp)
    np.testing.assert_array_equal(full.entropy, half.entropy)

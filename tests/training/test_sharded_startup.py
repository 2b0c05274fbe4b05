"""Sharded start-up on 8 fake CPU devices: after `build_run` (fresh init and HF checkpoint) and
the RL trainer's reference copy, every device holds exactly its shard of every parameter and
optimiser moment, as the logical-axis rules say, and the values are those of the unsharded model."""

import jax
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from aepo_jax.models import Decoder
from aepo_jax.models.hf_export import save_hf_checkpoint
from aepo_jax.training.build import build_run, init_model, model_config_from
from aepo_jax.training.rl_trainer import RLTrainer
from configs.aepo_tiny import get_config as aepo_config
from tests.training.sampling_fixture import (
    encode_digits,
    low_token_reward,
    make_sampling_rollout,
)

MESH = {"data": 1, "fsdp": 4, "tensor": 2}


def _config():
    c = aepo_config()
    c.mesh.shape = dict(MESH)
    c.model.vocab_size = 64
    c.log.progress_bar = False
    c.log.tensorboard = False
    return c


def _expected_specs(model_config):
    """Logical axes of every parameter, mapped to the mesh by hand-written rules (not the code under test)."""
    rules = {"vocab": "tensor", "embed": "fsdp", "heads": "tensor", "kv_heads": "tensor", "mlp": "tensor"}
    _, state = nnx.split(nnx.eval_shape(lambda: Decoder(model_config, rngs=nnx.Rngs(0))))
    specs = {}
    for path, variable in nnx.to_flat_state(state):
        names = variable.get_metadata()["out_sharding"]
        axes = []
        for name, size in zip(names, variable.shape):
            axis = rules.get(name)
            axes.append(axis if axis is not None and axis not in axes and size % MESH[axis] == 0 else None)
        specs[path] = P(*axes)
    return specs


def _assert_holds_only_its_shards(array, spec, mesh):
    """Every device holds one shard of the expected shard shape; some arrays really are split."""
    expected = jax.sharding.NamedSharding(mesh, spec)
    assert array.sharding.is_equivalent_to(expected, array.ndim), (array.sharding, spec)
    shard_shape = expected.shard_shape(array.shape)
    assert len(array.addressable_shards) == 8
    assert {shard.device for shard in array.addressable_shards} == set(mesh.devices.flat)
    for shard in array.addressable_shards:
        assert shard.data.shape == shard_shape


def _check_params(run, cfg, reference_params, rtol=0.0):
    """The loader's output, the parameters and Adam moments sit on their shards; parameters
    equal `reference_params`."""
    specs = _expected_specs(model_config_from(cfg))
    params = dict(nnx.to_flat_state(run.state.params))
    assert set(params) == set(specs)
    # the loader's own output is already on its shards (no unsharded copy for build_run to move)
    _, loaded = init_model(cfg, mesh=run.mesh)
    for path, variable in nnx.to_flat_state(loaded):
        _assert_holds_only_its_shards(variable.get_value(), specs[path], run.mesh)
    split = 0
    for path, variable in params.items():
        array = variable.get_value()
        _assert_holds_only_its_shards(array, specs[path], run.mesh)
        split += int(array.addressable_shards[0].data.size * 8 == array.size)
        np.testing.assert_allclose(np.asarray(array), np.asarray(reference_params[path].get_value()), rtol=rtol)
    assert split >= 2  # e.g. the [vocab, embed] table and the MLP kernels are split 8 ways
    moments = _adam_moments(run.state.opt_state)
    assert len(moments) == 2
    for tree in moments:
        for path, variable in nnx.to_flat_state(tree):
            _assert_holds_only_its_shards(variable.get_value(), specs[path], run.mesh)
    for leaf in (run.state.step, run.state.rng, run.state.rounds):
        assert leaf.sharding.is_equivalent_to(jax.sharding.NamedSharding(run.mesh, P()), leaf.ndim)


def _adam_moments(opt_state):
    """The first and second moment trees of the optimiser state (Adam-family `ScaleByAdamState`)."""
    found = []
    for node in jax.tree.leaves(opt_state, is_leaf=lambda x: hasattr(x, "mu") and hasattr(x, "nu")):
        if hasattr(node, "mu"):
            found += [node.mu, node.nu]
    return found


def test_fresh_init_is_born_sharded_and_equals_the_unsharded_init():
    cfg = _config()
    run = build_run(cfg)
    model_config = model_config_from(cfg)
    _, reference = nnx.split(Decoder(model_config, rngs=nnx.Rngs(int(cfg.seed))))  # eager, one device
    # same random draws; the jitted initialiser may round the last bit differently (fused multiply-add)
    _check_params(run, cfg, dict(nnx.to_flat_state(reference)), rtol=1e-6)


def test_hf_checkpoint_loads_into_its_shards(tmp_path):
    cfg = _config()
    model_config = model_config_from(cfg)
    saved = Decoder(model_config, rngs=nnx.Rngs(7))  # another seed than cfg.seed: the weights come from disk
    save_hf_checkpoint(saved, tmp_path / "hf")
    cfg.model.checkpoint_dir = str(tmp_path / "hf")
    run = build_run(cfg)
    _check_params(run, cfg, dict(nnx.to_flat_state(nnx.split(saved)[1])))


def test_reference_copy_keeps_the_parameter_shards(tmp_path):
    cfg = _config()
    cfg.objective.log_kl = True  # the trainer keeps a frozen reference copy
    graphdef = build_run(cfg).graphdef
    trainer = RLTrainer(cfg, str(tmp_path), rollout_fn=make_sampling_rollout(graphdef),
                        pipeline=iter(()), encode_prompt=encode_digits, reward_fn=low_token_reward)
    specs = _expected_specs(model_config_from(cfg))
    reference = dict(nnx.to_flat_state(trainer.reference_params))
    assert set(reference) == set(specs)
    for path, variable in reference.items():
        _assert_holds_only_its_shards(variable.get_value(), specs[path], trainer.run.mesh)
    for ref, live in zip(jax.tree.leaves(trainer.reference_params), jax.tree.leaves(trainer.state.params)):
        np.testing.assert_array_equal(np.asarray(ref), np.asarray(live))
    trainer.close()

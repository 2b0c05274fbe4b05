"""Every config parses, maps onto the objective presets, and (big ones) builds
its abstract model and sharded train state on the fake 8-device mesh."""

import glob
import importlib.util
import os

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType

from aepo_jax.models import get_preset
from aepo_jax.parallel import MESH_AXES, make_mesh, state_shardings
from aepo_jax.parallel.sharding import require_heads_split
from aepo_jax.training.build import (
    abstract_model,
    model_config_from,
    preset_from,
    step_config_from,
)
from aepo_jax.training.optimizer import optimizer_from_config
from aepo_jax.training.train_state import TrainState, train_state_shardings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = sorted(glob.glob(os.path.join(REPO, "configs", "*_tiny.py")))
SHIPPED = sorted(p for p in glob.glob(os.path.join(REPO, "configs", "*.py"))
                 if os.path.basename(p) not in ("__init__.py", "base.py"))
# Exact parameter counts of the released checkpoints (the safetensors totals of
# Qwen/Qwen3-14B and Qwen/Qwen2.5-7B-Instruct): a missing bias, norm or untied head shows.
BIG = {"aepo_qwen3_14b.py": 14_768_307_200, "aepo_qwen2_5_7b.py": 7_615_616_512}
FAMILIES = {"aepo", "arpo", "grpo", "dapo", "cispo", "gppo", "gigpo", "reinforce_pp", "gspo"}


def load_module(path: str):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_config(path: str):
    return load_module(path).get_config()


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_every_shipped_config_splits_its_models_heads_over_its_mesh(path):
    """The check a launch makes before it reads a checkpoint (`experiment_checks.require_mesh_fits_model`),
    on each config and variant with its own mesh (an axis of -1 counted as 1)."""
    module = load_module(path)
    for arg in (None, *getattr(module, "VARIANTS", ())):
        cfg = module.get_config(arg) if arg else module.get_config()
        model = model_config_from(cfg)
        shape = {axis: max(1, int(size)) for axis, size in cfg.mesh.shape.items()}
        require_heads_split(model.n_heads, model.n_kv_heads, shape, f"{os.path.basename(path)}:{arg or ''}")


def test_one_tiny_config_per_family():
    assert {os.path.basename(p)[: -len("_tiny.py")] for p in TINY} == FAMILIES


@pytest.mark.parametrize("path", TINY, ids=os.path.basename)
def test_tiny_config_parses_into_a_consistent_preset(path):
    cfg = load_config(path)
    family = os.path.basename(path)[: -len("_tiny.py")]
    assert cfg.name == f"{family}_tiny" and cfg.algorithm == family
    preset = preset_from(cfg)
    step = step_config_from(cfg, preset)
    assert step.loss == preset.loss_config()
    assert cfg.model.preset == "tiny"
    assert cfg.data.prompts_per_step * cfg.rollout.k <= 64  # CPU-sized
    assert cfg.rollout.initial_rollouts <= cfg.rollout.k


def test_family_differences_are_the_papers():
    cfgs = {os.path.basename(p)[: -len("_tiny.py")]: load_config(p) for p in TINY}
    assert cfgs["aepo"].objective.surrogate == "aepo" and cfgs["aepo"].objective.entropy_advantage
    assert cfgs["aepo"].rollout.strategy == "aepo" and cfgs["aepo"].rollout.penalty_slope == 0.05
    assert cfgs["arpo"].rollout.strategy == "arpo" and cfgs["arpo"].rollout.penalty_slope == 0.0
    assert cfgs["dapo"].objective.clip_high == 0.28 and cfgs["dapo"].objective.dynamic_sampling
    assert cfgs["cispo"].objective.dual_clip_c is None and cfgs["cispo"].objective.surrogate == "cispo"
    assert (cfgs["gspo"].objective.clip_low, cfgs["gspo"].objective.clip_high) == (3e-4, 4e-4)
    assert cfgs["reinforce_pp"].objective.kl_in_reward and cfgs["reinforce_pp"].objective.kl_coef > 0
    assert cfgs["gigpo"].objective.advantage == "gigpo" and cfgs["gigpo"].rollout.strategy == "arpo"
    assert cfgs["grpo"].rollout.strategy == "independent"


def test_unknown_objective_key_is_a_clear_error():
    cfg = load_config(TINY[0])
    cfg.objective.clip_hgih = 0.3
    with pytest.raises(ValueError, match=r"config.objective has keys \['clip_hgih'\]"):
        preset_from(cfg)


@pytest.mark.parametrize("name", sorted(BIG))
def test_big_config_builds_abstract_model_and_sharded_state(name):
    cfg = load_config(os.path.join(REPO, "configs", name))
    # spec §7 numbers
    assert cfg.optim.lr == 1e-6 and cfg.optim.weight_decay == 0.01 and cfg.optim.grad_clip_norm == 1.0
    assert cfg.objective.clip_low == 0.2 and cfg.objective.dual_clip_c == 3.0 and cfg.objective.kl_coef == 0.0
    assert (cfg.rollout.k, cfg.data.prompts_per_step) in ((12, 64), (16, 128))
    assert preset_from(cfg).surrogate == "aepo"
    assert set(cfg.mesh.shape) == {"data", "fsdp", "tensor"}
    # TPU kernels by default (the configs target v5p; GPUs override with --config.model.attention=cudnn),
    # with kv heads that divide over the tensor axis (splash runs per device, heads split over tensor).
    assert cfg.model.attention == "splash"
    assert get_preset(cfg.model.preset).n_kv_heads % cfg.mesh.shape["tensor"] == 0

    model_config = model_config_from(cfg)
    assert model_config.attention == "splash"
    _graphdef, params = abstract_model(model_config)  # ShapeDtypeStructs only
    leaves = jax.tree.leaves(params)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    count = sum(int(np.prod(x.shape)) for x in leaves)
    assert count == BIG[name]

    tx, _ = optimizer_from_config(cfg, cfg.train.total_steps)
    abstract_state = jax.eval_shape(lambda p: TrainState.create(p, tx, seed=0), params)
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})  # the fake mesh stands in for the real one
    shardings = train_state_shardings(abstract_state, tx, mesh)
    for leaf, sharding in zip(jax.tree.leaves(abstract_state.params), jax.tree.leaves(shardings.params)):
        shard = sharding.shard_shape(leaf.shape)  # raises if a sharded dim does not divide
        assert np.prod(shard) <= np.prod(leaf.shape)
    sharded = [s for s in jax.tree.leaves(shardings.params) if not s.is_fully_replicated]
    assert len(sharded) > len(jax.tree.leaves(shardings.params)) // 2

    # On the mesh the config asks for (one replica: data = 1), every sharded
    # dimension divides evenly by its mesh axes.
    shape = {axis: (1 if size == -1 else size) for axis, size in cfg.mesh.shape.items()}
    real_mesh = AbstractMesh(tuple(shape[a] for a in MESH_AXES), MESH_AXES, axis_types=(AxisType.Auto,) * 3)
    uneven = []
    for leaf, sharding in zip(leaves, jax.tree.leaves(state_shardings(params, real_mesh))):
        spec = tuple(sharding.spec) + (None,) * (len(leaf.shape) - len(sharding.spec))
        for dim, axes in zip(leaf.shape, spec):
            axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
            if dim % int(np.prod([shape[a] for a in axes])):
                uneven.append((leaf.shape, sharding.spec))
    assert not uneven


@pytest.mark.parametrize("path", TINY, ids=os.path.basename)
def test_a_tiny_config_refuses_an_argument_it_would_ignore(path):
    """`configs/aepo_tiny.py:release` ran the default config silently (the tiny configs take no variant)."""
    module = load_module(path)
    assert module.get_config(None).name == module.get_config("").name
    with pytest.raises(ValueError, match=r"unknown variant 'release'"):
        module.get_config("release")


def test_the_multihop_flaw_rate_reaches_the_sft_stage():
    """`sft.skip_python_prob` copied `env.early_answer_prob` when the file loaded, so an override of the
    latter left SFT on the file's 0.3."""
    from aepo_jax.experiment_sft import sft_config_from

    cfg = load_module(os.path.join(REPO, "configs", "demo.py")).get_config("multihop")
    cfg.env.early_answer_prob = 0.9
    assert sft_config_from(cfg).sft.skip_python_prob == 0.9


@pytest.mark.parametrize("algorithm", sorted(FAMILIES))
def test_objective_fields_keep_the_presets_types_and_the_optional_ones_take_none(algorithm):
    """Every None-valued preset field was a float placeholder (`overlong_buffer_len=16` became 16.0), and a
    dual clip the preset sets could not be turned off from the command line."""
    from configs.base import get_base_config
    from launch.config_args import nullable_keys

    cfg = get_base_config(algorithm)
    assert cfg.objective.get_type("overlong_buffer_len") is int
    assert cfg.objective.get_type("dual_clip_c") is float
    assert {"objective.dual_clip_c", "objective.overlong_buffer_len"} <= nullable_keys(cfg)
    assert "objective.clip_high" not in nullable_keys(cfg) and cfg.verbose_logs is False

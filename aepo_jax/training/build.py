"""Config -> the objects a run needs: model, algorithm preset, step settings,
optimiser, mesh and the sharded initial train state (DESIGN.md, Configs)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import ml_collections
import optax
from flax import nnx

from aepo_jax.models import Decoder, ModelConfig, get_preset
from aepo_jax.objectives import AlgorithmPreset
from aepo_jax.training.optimizer import optimizer_from_config
from aepo_jax.training.train_state import (
    TrainState,
    batch_shardings,
    train_state_shardings,
)
from aepo_jax.training.train_step import StepConfig

CONFIG_ONLY_OBJECTIVE_KEYS = ("log_kl", "max_resample_rounds")


def model_config_from(cfg: ml_collections.ConfigDict) -> ModelConfig:
    """The decoder config: preset, optional vocabulary override, float32 master weights."""
    overrides: dict[str, Any] = {"param_dtype": "float32"}
    if cfg.model.get("vocab_size") is not None:
        overrides["vocab_size"] = int(cfg.model.vocab_size)
    if cfg.model.get("compute_dtype"):
        overrides["dtype"] = cfg.model.compute_dtype
    overrides["remat"] = cfg.model.get("remat", "none")
    return get_preset(cfg.model.preset, **overrides)


def init_model(cfg: ml_collections.ConfigDict, model_config: ModelConfig | None = None) -> tuple[nnx.GraphDef, Any]:
    """(graphdef, float32 params): from `model.checkpoint_dir` when set, else random (seeded)."""
    model_config = model_config or model_config_from(cfg)
    if cfg.model.get("checkpoint_dir"):
        from aepo_jax.models.hf_checkpoint import load_hf_checkpoint

        model = load_hf_checkpoint(cfg.model.checkpoint_dir, dtype=model_config.dtype, param_dtype="float32",
                                   remat=model_config.remat)
        return nnx.split(model)
    return nnx.split(Decoder(model_config, rngs=nnx.Rngs(int(cfg.seed))))


def abstract_model(model_config: ModelConfig) -> tuple[nnx.GraphDef, Any]:
    """(graphdef, ShapeDtypeStruct params) without allocating any weights."""
    return nnx.split(nnx.eval_shape(lambda: Decoder(model_config, rngs=nnx.Rngs(0))))


def preset_from(cfg: ml_collections.ConfigDict) -> AlgorithmPreset:
    """The `AlgorithmPreset` the config describes (preset values plus overrides)."""
    known = {f.name for f in dataclasses.fields(AlgorithmPreset)} - {"name", "rollout"}
    fields = {k: v for k, v in cfg.objective.items() if k not in CONFIG_ONLY_OBJECTIVE_KEYS}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"config.objective has keys {unknown} that AlgorithmPreset does not know; known: {sorted(known)}")
    return AlgorithmPreset(name=cfg.algorithm, rollout=cfg.rollout.strategy, **fields)


def step_config_from(cfg: ml_collections.ConfigDict, preset: AlgorithmPreset) -> StepConfig:
    loss_kwargs = preset.policy_loss_kwargs()
    return StepConfig(
        surrogate=preset.surrogate,
        clip_low=loss_kwargs["clip_low"],
        clip_high=loss_kwargs["clip_high"],
        dual_clip_c=loss_kwargs["dual_clip_c"],
        loss_agg=loss_kwargs["loss_agg"],
        kl_coef=loss_kwargs["kl_coef"],
        kl_estimator=loss_kwargs["kl_estimator"],
        entropy_coef=loss_kwargs["entropy_coef"],
        temperature=float(cfg.rollout.temperature),
        micro_batch_size=int(cfg.train.micro_batch_size),
        compute_dtype=cfg.model.compute_dtype,
        logits_chunk_size=cfg.model.get("logits_chunk_size"),
    )


def data_parallel_size(mesh: jax.sharding.Mesh | None) -> int:
    """Devices the batch axis is split over (data x fsdp)."""
    if mesh is None:
        return 1
    return int(mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1))


def row_multiple(micro_batch_size: int, mesh: jax.sharding.Mesh | None) -> int:
    """Rows of every training batch are padded to a multiple of this."""
    return math.lcm(int(micro_batch_size), data_parallel_size(mesh))


def make_mesh_from(cfg: ml_collections.ConfigDict) -> jax.sharding.Mesh:
    from aepo_jax.parallel import make_mesh

    return make_mesh(dict(cfg.mesh.shape))


@dataclasses.dataclass
class RunParts:
    """What `build_run` returns; `state` is already placed on the mesh."""

    graphdef: nnx.GraphDef
    state: TrainState
    state_sharding: Any
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    mesh: jax.sharding.Mesh


def updates_per_step(cfg: ml_collections.ConfigDict) -> int:
    """Optimiser updates in one RL step: ppo_epochs x mini-batches of whole groups."""
    mini_batches = -(-int(cfg.data.prompts_per_step) // max(1, int(cfg.train.mini_batch_prompts)))
    return int(cfg.train.ppo_epochs) * mini_batches


def build_run(cfg: ml_collections.ConfigDict, graphdef: nnx.GraphDef | None = None, params: Any = None,
              updates_per_round: int = 1) -> RunParts:
    """Mesh, optimiser and the sharded initial `TrainState` for `cfg`.

    The lr schedule counts optimiser updates: `total_steps x updates_per_round`.
    """
    if graphdef is None:
        graphdef, params = init_model(cfg)
    mesh = make_mesh_from(cfg)
    tx, schedule = optimizer_from_config(cfg, int(cfg.train.total_steps) * updates_per_round)
    state = TrainState.create(params, tx, seed=int(cfg.seed))
    sharding = train_state_shardings(state, tx, mesh)
    return RunParts(graphdef, jax.device_put(state, sharding), sharding, tx, schedule, mesh)


def place_batch(batch: dict[str, Any], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """Host numpy batch -> device arrays sharded along the batch axis."""
    return jax.device_put(dict(batch), batch_shardings(batch, mesh))

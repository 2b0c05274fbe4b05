"""Config -> the objects a run needs: model, algorithm preset, step settings,
optimiser, mesh and the sharded initial train state (DESIGN.md, Configs)."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax
import ml_collections
import optax
from flax import nnx

from aepo_jax.models import Decoder, ModelConfig, get_preset
from aepo_jax.objectives import AlgorithmPreset
from aepo_jax.objectives.advantage_dispatch import overlong_buffer_len
from aepo_jax.training.optimizer import optimizer_from_config
from aepo_jax.training.train_state import (
    TrainState,
    batch_shardings,
    train_state_shardings,
)
from aepo_jax.training.train_step import StepConfig

CONFIG_ONLY_OBJECTIVE_KEYS = ("log_kl", "max_resample_rounds")
# `model.preset` value that takes the architecture from `model.checkpoint_dir`'s config.json.
CHECKPOINT_PRESET = "checkpoint"
# `config.model` keys that override the preset's sizes (the demo's tiny decoder states them all).
MODEL_SIZE_KEYS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim", "max_seq_len")


def model_config_from(cfg: ml_collections.ConfigDict) -> ModelConfig:
    """The decoder config: preset, optional vocabulary and size overrides, float32 master weights."""
    overrides: dict[str, Any] = {"param_dtype": "float32"}
    for key in ("vocab_size",) + MODEL_SIZE_KEYS:
        if cfg.model.get(key) is not None:
            overrides[key] = int(cfg.model[key])
    if cfg.model.get("compute_dtype"):
        overrides["dtype"] = cfg.model.compute_dtype
    if cfg.model.get("attention"):
        overrides["attention"] = cfg.model.attention
    overrides["remat"] = cfg.model.get("remat", "none")
    if cfg.model.preset == CHECKPOINT_PRESET:
        model_config = checkpoint_architecture(cfg).replace(**overrides)
    else:
        model_config = get_preset(cfg.model.preset, **overrides)
    # (A path that is not there yet, such as the paper configs' placeholders, fails when the weights load.)
    if cfg.model.get("checkpoint_dir") and os.path.isdir(cfg.model.checkpoint_dir):
        require_checkpoint_matches(model_config, cfg.model.checkpoint_dir, f"model.preset={cfg.model.preset!r}")
    return model_config


def checkpoint_architecture(cfg: ml_collections.ConfigDict) -> ModelConfig:
    """The architecture `model.checkpoint_dir`'s config.json describes, for `model.preset="checkpoint"`:
    a checkpoint no preset matches (a tied Llama-3.2 with its own rope scaling, say)."""
    from aepo_jax.models.hf_checkpoint import checkpoint_config

    if not cfg.model.get("checkpoint_dir"):
        raise ValueError(f"model.preset={CHECKPOINT_PRESET!r} takes the architecture from model.checkpoint_dir's "
                         "config.json; set model.checkpoint_dir")
    return checkpoint_config(cfg.model.checkpoint_dir)


# What a checkpoint's config.json must agree with the configured model on: the weights' shapes and the maths.
CHECKPOINT_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim",
                     "tie_embeddings", "qkv_bias", "qk_norm", "rope_theta", "rope_scaling", "rms_eps")


def require_checkpoint_matches(model_config: ModelConfig, checkpoint_dir: str, name: str) -> None:
    """A ValueError naming each field where `checkpoint_dir`'s config.json and the configured model differ.

    Training loads the checkpoint's own architecture, while shardings, the sampler, evaluation and the
    memory plan are built from the configured one: a mismatch would train one model under another's name
    (or fail only at a restore)."""
    from aepo_jax.models.hf_checkpoint import checkpoint_config

    found = checkpoint_config(checkpoint_dir)
    differ = [f"{field}: {getattr(model_config, field)!r} vs {getattr(found, field)!r}"
              for field in CHECKPOINT_FIELDS if getattr(model_config, field) != getattr(found, field)]
    if differ:
        raise ValueError(f"{name} does not describe the checkpoint in {checkpoint_dir} (configured vs config.json): "
                         + "; ".join(differ) + ". Choose the preset (or model.* sizes) of that checkpoint, or "
                         f"model.preset={CHECKPOINT_PRESET!r} to take its architecture from its config.json")


def init_model(cfg: ml_collections.ConfigDict, model_config: ModelConfig | None = None,
               mesh: jax.sharding.Mesh | None = None) -> tuple[nnx.GraphDef, Any]:
    """(graphdef, float32 params): from `model.checkpoint_dir` when set, else random (seeded).

    With a `mesh`, every parameter is created directly on its shards (DESIGN.md,
    Paper scale): checkpoint tensors are read from the memory-mapped safetensors
    one parameter at a time (each process builds the whole parameter on its host,
    then places its own devices' slices), and a fresh model is initialised
    inside one `jax.jit` whose `out_shardings` are the parameters' logical-axis
    shardings, so no device ever holds a full copy.
    """
    model_config = model_config or model_config_from(cfg)
    if cfg.model.get("checkpoint_dir"):
        from aepo_jax.models.hf_checkpoint import load_hf_checkpoint

        model = load_hf_checkpoint(cfg.model.checkpoint_dir, dtype=model_config.dtype, param_dtype="float32",
                                   mesh=mesh, remat=model_config.remat, attention=model_config.attention)
        return nnx.split(model)
    from aepo_jax.parallel import state_shardings

    seed = int(cfg.seed)
    graphdef, abstract = abstract_model(model_config)
    # Jitted with or without a mesh, so a run's initial weights do not depend on it
    # (eager and jitted initialisers differ in the last bit).
    create = jax.jit(lambda: nnx.split(Decoder(model_config, rngs=nnx.Rngs(seed)))[1],
                     out_shardings=None if mesh is None else state_shardings(abstract, mesh))
    return graphdef, create()


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
    preset = AlgorithmPreset(name=cfg.algorithm, rollout=cfg.rollout.strategy, **fields)
    if preset.overlong_shaping:  # a bad Lc for this budget fails here, not after the first rollout
        overlong_buffer_len(preset.overlong_buffer_len, int(cfg.rollout.max_response_len))
    return preset


def step_config_from(cfg: ml_collections.ConfigDict, preset: AlgorithmPreset,
                     mesh: jax.sharding.Mesh | None = None) -> StepConfig:
    """The train step's static settings; Dr. GRPO's constant `max_len` is `rollout.max_response_len`
    (`StepConfig.loss_max_len`). A flat micro-batch holds `train.micro_batch_size` rows, but at least one
    per device of the batch axes (data x fsdp of `mesh`), as a packed one does: fewer rows than devices
    cannot be split over them, and the micro-batch would leave devices idle or run replicated."""
    return StepConfig(
        loss=preset.loss_config(),
        temperature=float(cfg.rollout.temperature),
        micro_batch_size=max(int(cfg.train.micro_batch_size), data_parallel_size(mesh)),
        compute_dtype=cfg.model.compute_dtype,
        logits_chunk_size=cfg.model.get("logits_chunk_size"),
        loss_max_len=int(cfg.rollout.max_response_len),
    )


def data_parallel_size(mesh: jax.sharding.Mesh | None) -> int:
    """Devices the batch axis is split over (data x fsdp)."""
    if mesh is None:
        return 1
    return int(mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1))


def local_micro_batch_rows(micro_batch_size: int, local_data_parallel: int, data_parallel: int) -> int:
    """This process's rows of a micro-batch of `micro_batch_size` rows (`step_config_from`'s) split over
    `data_parallel` batch devices, `local_data_parallel` of them its own: what it packs a tree micro-batch
    to (one 8192-token row at the 14B config's micro-batch of 8 over 8 processes of one batch device)."""
    return max(1, -(-int(micro_batch_size) * int(local_data_parallel) // int(data_parallel)))


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


def mini_batch_prompts(cfg: ml_collections.ConfigDict) -> int:
    """`train.mini_batch_prompts`, the prompts (groups) of one PPO mini-batch; a ValueError below 1.

    0 or a negative value is refused rather than read as 1 (the smallest mini-batch, the most
    updates) or as "the whole batch": either guess would train on numbers the config never asked for.
    """
    value = int(cfg.train.mini_batch_prompts)
    if value < 1:
        raise ValueError(f"train.mini_batch_prompts={value}: a PPO mini-batch needs at least 1 prompt; for one "
                         f"update over the whole step set it to data.prompts_per_step={int(cfg.data.prompts_per_step)}")
    return value


def updates_per_step(cfg: ml_collections.ConfigDict) -> int:
    """Optimiser updates in one RL step: ppo_epochs x mini-batches of whole groups. A ValueError naming
    `train.ppo_epochs` below 1 (it surfaced as the schedule's "total_steps >= 1, got 0")."""
    epochs = int(cfg.train.ppo_epochs)
    if epochs < 1:
        raise ValueError(f"train.ppo_epochs={epochs}: each RL step makes at least one pass over its mini-batches")
    mini_batches = -(-int(cfg.data.prompts_per_step) // mini_batch_prompts(cfg))
    return epochs * mini_batches


def build_run(cfg: ml_collections.ConfigDict, graphdef: nnx.GraphDef | None = None, params: Any = None,
              updates_per_round: int = 1, mesh: jax.sharding.Mesh | None = None) -> RunParts:
    """Mesh, optimiser and the sharded initial `TrainState` for `cfg`.

    The lr schedule counts optimiser updates: `total_steps x updates_per_round`.
    `mesh`: the run's mesh when the composition root already built it (shared with
    the rollout sampler); default `make_mesh_from(cfg)`.
    """
    mesh = make_mesh_from(cfg) if mesh is None else mesh
    if graphdef is None:
        graphdef, params = init_model(cfg, mesh=mesh)
    tx, schedule = optimizer_from_config(cfg, int(cfg.train.total_steps) * updates_per_round)
    state, sharding = sharded_train_state(params, tx, int(cfg.seed), mesh)
    return RunParts(graphdef, state, sharding, tx, schedule, mesh)


def sharded_train_state(params: Any, tx: optax.GradientTransformation, seed: int,
                        mesh: jax.sharding.Mesh) -> tuple[TrainState, TrainState]:
    """`(TrainState, its shardings)` with every leaf created on its shards.

    The shardings come from an abstract evaluation of `TrainState.create`;
    parameters not already placed that way are moved shard by shard
    (`device_put`), and the optimiser state is initialised under `jax.jit`
    with `out_shardings`, so its moments are born sharded like their parameters
    (initialising first and sharding after builds the whole optimiser state on
    one device: about 177 GB at 14B).
    """
    abstract = jax.eval_shape(lambda p: TrainState.create(p, tx, seed=seed), params)
    sharding = train_state_shardings(abstract, tx, mesh)
    params = jax.device_put(params, sharding.params)
    # Everything but the parameters, born on its shards; the parameters are only read for their shapes.
    rest = jax.jit(lambda p: TrainState.create(p, tx, seed=seed).replace(params=None),
                   out_shardings=sharding.replace(params=None))(params)
    return rest.replace(params=params), sharding


def place_batch(batch: dict[str, Any], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """Host numpy batch -> device arrays sharded along the batch axis."""
    return jax.device_put(dict(batch), batch_shardings(batch, mesh))

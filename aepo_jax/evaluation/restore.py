"""Policy parameters for evaluation from a checkpoint the RL trainer wrote (DESIGN.md, Trainer).

The trainer saves a whole `TrainState` (params, optimiser state, step, RNG)
with `aepo_jax.training.checkpoint.Checkpointer` under `WORKDIR/checkpoints/
<step>/`. Evaluation accepts the run directory, its `checkpoints/` folder or
one step folder and reads only `params`, through an abstract target built from
the config (no weights are allocated before the restore), straight onto the
shards of the evaluation's mesh: a 14B run's float32 parameters are 56 GiB and
its Adam state twice that, more than one accelerator holds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import jax
import ml_collections
from flax import nnx

from aepo_jax.models import ModelConfig
from aepo_jax.parallel.multihost import first_process_value
from aepo_jax.parallel.sharding import state_shardings
from aepo_jax.training.build import abstract_model
from aepo_jax.training.checkpoint import (
    Checkpointer,
    DamagedCheckpointError,
    cut_short_note,
)


@dataclass(frozen=True)
class CheckpointLocation:
    """Where a trainer checkpoint lives.

    Attributes:
      manager_dir: the orbax manager directory (holds numbered step folders).
      step: the step to restore; None means the newest complete one.
      run_dir: the training workdir (tokenizer.model, config.json), when known.
    """

    manager_dir: str
    step: int | None
    run_dir: str | None


def _step_dirs(directory: str) -> list[int]:
    return sorted(int(name) for name in os.listdir(directory)
                  if name.isdigit() and os.path.isdir(os.path.join(directory, name)))


def locate_checkpoint(path: str) -> CheckpointLocation:
    """Resolve a run directory, its `checkpoints/` folder or a step folder; a clear error when none holds steps."""
    full = os.path.abspath(path)
    if not os.path.exists(full):
        raise FileNotFoundError(f"checkpoint directory {path!r} does not exist")
    if not os.path.isdir(full):
        raise NotADirectoryError(f"checkpoint path {path!r} is not a directory")
    name, parent = os.path.basename(full), os.path.dirname(full)
    if os.path.isdir(os.path.join(full, "checkpoints")):
        location = CheckpointLocation(os.path.join(full, "checkpoints"), None, full)
    elif name.isdigit() and os.path.isdir(os.path.join(full, "state")):
        run_dir = os.path.dirname(parent) if os.path.basename(parent) == "checkpoints" else None
        location = CheckpointLocation(parent, int(name), run_dir)
    else:
        location = CheckpointLocation(full, None, parent if name == "checkpoints" else None)
    if not _step_dirs(location.manager_dir):
        raise FileNotFoundError(
            f"no checkpoint in {path!r}: expected numbered step folders written by the trainer "
            f"(WORKDIR/checkpoints/<step>/state), found {sorted(os.listdir(location.manager_dir))[:10]}"
        )
    return location


def restore_policy_params(
    location: CheckpointLocation, cfg: ml_collections.ConfigDict, model_config: ModelConfig,
    mesh: jax.sharding.Mesh | None = None, device: jax.Device | None = None,
) -> tuple[nnx.GraphDef, Any, int]:
    """(graphdef, float32 params, step) from the trainer checkpoint at `location`: only the parameters
    are read, each onto its shards of `mesh` (as the trainer places them), or whole onto `device`
    (default: this process's first) without a mesh.

    Raises:
      FileNotFoundError: no complete step in the directory.
      ValueError: the checkpoint's parameters do not fit the model the config builds.
    """
    graphdef, abstract_params = abstract_model(model_config)
    if mesh is not None:
        shardings = state_shardings(abstract_params, mesh)
    else:
        single = jax.sharding.SingleDeviceSharding(device or jax.local_devices()[0])  # this process's own
        shardings = jax.tree.map(lambda _: single, abstract_params)
    checkpointer = Checkpointer(location.manager_dir, async_save=False)
    try:
        step = location.step if location.step is not None else checkpointer.latest_step()
        # The newest step can change while processes look (a run still training): all read the first one's.
        step = first_process_value(-1 if step is None else step)
        if step < 0:
            raise FileNotFoundError(f"no complete checkpoint in {location.manager_dir}"
                                    + cut_short_note(checkpointer))
        try:
            params = checkpointer.restore_params(abstract_params, step=step, shardings=shardings)
        except DamagedCheckpointError:  # its own message: which folder, and the older steps
            raise
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"checkpoint {location.manager_dir}/{step} does not fit the model built from the config "
                f"(preset {cfg.model.preset!r}, vocab_size {model_config.vocab_size}); use the config and "
                f"tokenizer of the training run: {err}"
            ) from err
    finally:
        checkpointer.close()
    return graphdef, params, int(step)

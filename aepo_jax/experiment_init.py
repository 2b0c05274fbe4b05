"""The checkpoint a run starts from (`model.init_checkpoint`, an SFT stage's): which step, fixed when the run
starts, so that its reference model stays the same across resumes (part of the composition root: `experiment.model_from`
reads it, the launcher pins it)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import ml_collections


def pin_init_checkpoint(cfg: ml_collections.ConfigDict) -> None:
    """Fix `model.init_checkpoint_step` when a run starts: the newest complete step of
    `model.init_checkpoint` (the same on every process), unless set. The run's config.json keeps it, so a
    resumed run rebuilds its reference model from the same step even after the init run saved newer ones."""
    from aepo_jax.evaluation.restore import locate_checkpoint
    from aepo_jax.parallel.multihost import first_process_value
    from aepo_jax.training.checkpoint import step_folders

    if not cfg.model.get("init_checkpoint") or cfg.model.get("init_checkpoint_step") is not None:
        return
    location = _located(cfg, locate_checkpoint)
    complete, _ = step_folders(location.manager_dir)
    step = first_process_value(location.step if location.step is not None else max(complete, default=-1))
    if step < 0:
        raise FileNotFoundError(f"model.init_checkpoint={cfg.model.init_checkpoint!r} holds no complete checkpoint")
    with cfg.unlocked():
        cfg.model.init_checkpoint_step = int(step)


def init_checkpoint_location(cfg: ml_collections.ConfigDict) -> Any:
    """Where `model.init_checkpoint` is, at step `model.init_checkpoint_step` when set (`pin_init_checkpoint`);
    a clear error when that step is gone or the path names another step."""
    from aepo_jax.evaluation.restore import locate_checkpoint
    from aepo_jax.training.checkpoint import step_folders

    location = _located(cfg, locate_checkpoint)
    pinned = cfg.model.get("init_checkpoint_step")
    if pinned is None:
        return location
    pinned = int(pinned)
    if location.step is not None and location.step != pinned:
        raise ValueError(f"model.init_checkpoint={cfg.model.init_checkpoint!r} is step {location.step} but "
                         f"model.init_checkpoint_step={pinned}")
    complete, _ = step_folders(location.manager_dir)
    if pinned not in complete:
        raise FileNotFoundError(
            f"model.init_checkpoint_step={pinned}: {location.manager_dir} holds no complete step {pinned} (it has "
            f"{complete}); this run started from that step, whose parameters are its reference model: put the "
            "step folder back, or start a new run")
    return replace(location, step=pinned)


def _located(cfg: ml_collections.ConfigDict, locate_checkpoint: Any) -> Any:
    """`locate_checkpoint(model.init_checkpoint)`, its error naming the key and, for a relative path, the
    directory it was read from (a run resumed from another directory reads its saved relative path there)."""
    import os

    path = str(cfg.model.init_checkpoint)
    try:
        return locate_checkpoint(path)
    except FileNotFoundError as error:
        where = "" if os.path.isabs(path) else f" (a relative path, read from the current directory {os.getcwd()})"
        raise FileNotFoundError(f"model.init_checkpoint={path!r}{where}: {error}") from error

"""The generated demo task's files for the composition root (`aepo_jax.experiment.environment_from`):
the `env` section of configs/demo.py -> `aepo_jax.envs.facts_task.write_task`."""

from __future__ import annotations

from typing import Any

import ml_collections


def demo_task(cfg: ml_collections.ConfigDict, directory: str) -> Any:
    """The towns task of `cfg.env` written to `directory` (`facts_task.write_task`: its env and file paths)."""
    from aepo_jax.envs.facts_task import write_task

    e = cfg.env
    kinds = tuple(k.strip() for k in str(e.kinds).split(",") if k.strip())
    return write_task(directory, seed=int(e.get("seed", cfg.seed)), n_towns=int(e.n_towns), n_train=int(e.n_train),
                      n_heldout=int(e.n_heldout), n_distractors=int(e.n_distractors), hops=int(e.hops), kinds=kinds,
                      heldout_fraction=float(e.heldout_fraction), max_syllables=int(e.max_syllables))

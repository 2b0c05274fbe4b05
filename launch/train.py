"""RL training entry point.

    python -m launch.train --config configs/aepo_tiny.py --workdir /tmp/run \
        [--config.train.total_steps=2 ...] [--resume]

Prints the resolved config and writes it to WORKDIR/config.json, then trains
with `aepo_jax.training.RLTrainer` over the real agentic rollout
(`aepo_jax.experiment`). An override of a key the config does not
have is refused with an error naming it. On several hosts the same command
runs on each (`launch/tpu_vm.sh`, `launch/gpu_multi.sh`).
"""

from __future__ import annotations

from absl import app

from launch.run_setup import define_run_flags

_CONFIG, _WORKDIR, _RESUME, _ALLOW_CONFIG_CHANGES = define_run_flags()


def make_rl_trainer(cfg, env, process_index: int, process_count: int):
    """An `RLTrainer` over the environment's real rollout (`aepo_jax.experiment.rl_trainer_from`), with its
    held-out validation (`aepo_jax.experiment_validation.validation_from`, `validation.every`)."""
    from aepo_jax.experiment import rl_trainer_from
    from aepo_jax.experiment_validation import validation_from

    trainer = rl_trainer_from(cfg, env, _WORKDIR.value, process_index=process_index, process_count=process_count)
    try:
        trainer.validation = validation_from(cfg, env, trainer.run.graphdef, trainer.rollout_fn.placement,
                                             _WORKDIR.value)
    except BaseException:
        trainer.close()
        raise
    return trainer


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from aepo_jax.training.rl_trainer import process_shares
    from launch.run_setup import run_training

    return run_training(_CONFIG.value, _WORKDIR.value, _RESUME.value, make_rl_trainer,
                        allow_config_changes=_ALLOW_CONFIG_CHANGES.value, process_shares=process_shares)


if __name__ == "__main__":
    from launch.config_args import run_with_config

    run_with_config(main, _CONFIG)

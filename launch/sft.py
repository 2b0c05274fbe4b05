"""Cold-start SFT entry point (next-token loss on generated tokens only).

    python -m launch.sft --config configs/aepo_tiny.py --workdir /tmp/sft \
        [--config.train.total_steps=50 ...] [--resume]

Data: `sft.path` (JSONL of {"question", "response"} with tool results as
<result> blocks) or, for the synthetic task, scripted solutions executed with
the real tools (`aepo_jax.envs.facts_sft`). Steps, optimiser and lengths
come from `sft.*` where set (the demo's SFT stage: `python -m launch.sft
--config configs/demo.py`), else from `train.*` / `optim.*`
(`aepo_jax.experiment_sft.sft_config_from`). The resolved config is printed
and saved; unknown override keys are refused. The final parameters are in
WORKDIR/checkpoints (orbax); start RL from them in a fresh workdir with
`--config.model.init_checkpoint=WORKDIR` (they are the RL run's policy and its
reference model; its step count, optimiser and data order start afresh). An RL
`--resume` of an SFT workdir is refused.
"""

from __future__ import annotations

from absl import app

from launch.run_setup import define_run_flags

_CONFIG, _WORKDIR, _RESUME, _ALLOW_CONFIG_CHANGES = define_run_flags()


def make_sft_trainer(cfg, env, process_index: int, process_count: int):
    """An `SFTTrainer` over the scripted or `sft.path` records (`aepo_jax.experiment_sft.sft_trainer_from`)."""
    from aepo_jax.experiment_sft import sft_trainer_from

    return sft_trainer_from(cfg, env, _WORKDIR.value, process_index=process_index)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from aepo_jax.experiment_sft import sft_config_from
    from launch.run_setup import run_training

    return run_training(sft_config_from(_CONFIG.value), _WORKDIR.value, _RESUME.value, make_sft_trainer,
                        allow_config_changes=_ALLOW_CONFIG_CHANGES.value)


if __name__ == "__main__":
    from launch.config_args import run_with_config

    run_with_config(main, _CONFIG)

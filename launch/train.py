"""RL training entry point.

    python -m launch.train --config configs/aepo_tiny.py --workdir /tmp/run \
        [--config.train.total_steps=2 ...] [--resume]

Prints the resolved config and writes it to WORKDIR/config.json, then trains
with `aepo_jax.training.RLTrainer` over the real agentic rollout
(`aepo_jax.training.agent_env`). An override of a key the config does not
have is refused with an error naming it. On several hosts the same command
runs on each (`launch/tpu_vm.sh`, `launch/gpu_multi.sh`).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file (configs/*.py[:arg])",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory: metrics, checkpoints, config")
_RESUME = flags.DEFINE_bool("resume", False, "continue from the newest complete checkpoint in WORKDIR")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from aepo_jax.parallel.distributed import maybe_initialize_distributed

    cfg = _CONFIG.value
    process_index, process_count = maybe_initialize_distributed(cfg.distributed)

    from aepo_jax.training.agent_env import build_agent_environment, pipeline_for
    from aepo_jax.training.build import init_model
    from aepo_jax.training.rl_trainer import RLTrainer
    from launch.run_setup import prepare_workdir

    workdir = _WORKDIR.value
    prepare_workdir(cfg, workdir, resume=_RESUME.value, process_index=process_index)
    env = build_agent_environment(cfg, workdir)
    trainer = None
    try:
        if not cfg.model.checkpoint_dir:
            with cfg.unlocked():
                cfg.model.vocab_size = int(env.tokenizer.vocab_size)
        graphdef, params = init_model(cfg)
        trainer = RLTrainer(
            cfg, workdir, rollout_fn=env.make_rollout_fn(cfg, graphdef, params),
            pipeline=pipeline_for(cfg, env.examples, process_index, process_count),
            encode_prompt=env.encode_prompt, reward_fn=env.reward_fn, graphdef=graphdef, params=params,
            pad_id=int(env.tokenizer.pad_id), process_index=process_index,
        )
        if _RESUME.value and trainer.restore_latest():
            print(f"resumed from step {int(trainer.state.rounds)}", flush=True)
        trainer.train()
    finally:
        if trainer is not None:
            trainer.close()
        env.close()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())  # config files import `configs.base`
    from launch.run_setup import check_config_arguments

    check_config_arguments(sys.argv[1:])
    app.run(main)

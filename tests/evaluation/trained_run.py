"""A run directory with a trainer checkpoint, for the `launch.evaluate` tests (the `trained_run` fixture).

It is made as `launch.train` makes it: `environment_from` (which trains and
keeps WORKDIR/tokenizer.model), the config's initial model with that
vocabulary, `build_run` for the sharded `TrainState` (AdamW state included),
and the trainer's `Checkpointer` for `WORKDIR/checkpoints/<step>`.
"""

from __future__ import annotations

from pathlib import Path

import jax

from aepo_jax.experiment import environment_from
from aepo_jax.training.build import build_run, init_model
from aepo_jax.training.checkpoint import Checkpointer
from configs.aepo_tiny import get_config

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = ["--config.data.num_examples=16", "--config.rollout.max_response_len=24", "--config.seed=7"]
STEP = 3


def run_config():
    cfg = get_config()
    cfg.data.num_examples = 16
    cfg.rollout.max_response_len = 24
    cfg.seed = 7
    return cfg


def make_trained_run(run_dir: Path):
    """(run_dir, config, the saved float32 params) after writing the run directory's files and checkpoint."""
    cfg = run_config()
    env = environment_from(cfg, str(run_dir))
    env.close()
    cfg.model.vocab_size = int(env.tokenizer.vocab_size)
    graphdef, params = init_model(cfg)
    parts = build_run(cfg, graphdef, params)
    with Checkpointer(str(run_dir / "checkpoints"), keep=2) as checkpointer:
        checkpointer.save(STEP, parts.state, {"epoch": 0, "index": 4}, force=True)
    return run_dir, cfg, jax.device_get(parts.state.params)

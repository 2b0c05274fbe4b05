"""`RLTrainer` refuses, before it builds anything or rolls anything out, settings that would fail only
after a whole rollout or train on wrong numbers (`rl_trainer.check_rl_config`); the step loop's
`checkpoint.every` means what configs/base.py says (0: the last step only; negative: refused)."""

import glob
import importlib
import os

import jax.numpy as jnp
import ml_collections
import optax
import pytest

from aepo_jax.training.checkpoint import step_folders
from aepo_jax.training.rl_trainer import RLTrainer, check_rl_config
from aepo_jax.training.step_loop import CheckpointedTrainer
from aepo_jax.training.train_state import TrainState
from configs.aepo_tiny import get_config as aepo_config
from tests.training.local_cluster import REPO


def _trainer(config, workdir):
    """A trainer of `config` whose parts are never reached: the checks come first."""
    def unused(*args):
        raise AssertionError("the trainer should have refused its config first")

    return RLTrainer(config, str(workdir), rollout_fn=unused, pipeline=iter(()), encode_prompt=unused,
                     reward_fn=unused)


def test_k_below_one_is_refused_at_construction(tmp_path):
    """`--config.rollout.k=0` ran into the first rollout and ended in a traceback from the rollout strategy."""
    config = aepo_config()
    config.rollout.k = 0
    with pytest.raises(ValueError, match=r"rollout\.k=0: every prompt needs at least one trajectory"):
        _trainer(config, tmp_path)


def test_rollout_ahead_with_recomputed_logp_old_is_refused_at_construction(tmp_path):
    config = aepo_config()
    config.train.rollout_ahead = True
    assert config.train.recompute_logp_old  # the default
    with pytest.raises(ValueError, match=r"train.rollout_ahead=True with train.recompute_logp_old=True.*"
                                         r"set train.recompute_logp_old=False"):
        _trainer(config, tmp_path)
    config.train.recompute_logp_old = False
    check_rl_config(config)  # the sampler's log-probs as the denominator: accepted


def test_rollouts_longer_than_the_training_rows_are_refused_at_construction(tmp_path):
    config = aepo_config()
    config.rollout.max_prompt_len, config.rollout.max_response_len = 448, 64
    config.train.max_seq_len = 511
    with pytest.raises(ValueError, match=r"rollout.max_prompt_len \+ rollout.max_response_len = 448 \+ 64 = 512 "
                                         r"exceeds train.max_seq_len=511"):
        _trainer(config, tmp_path)
    config.train.max_seq_len = 512
    check_rl_config(config)  # exactly full rows fit


@pytest.mark.parametrize("value", [0, -1])
def test_a_mini_batch_of_fewer_than_one_prompt_is_refused_at_construction(tmp_path, value):
    config = aepo_config()
    config.train.mini_batch_prompts = value
    with pytest.raises(ValueError, match=rf"train.mini_batch_prompts={value}: a PPO mini-batch needs at least 1 "
                                         r"prompt; for one update over the whole step set it to "
                                         rf"data.prompts_per_step={config.data.prompts_per_step}"):
        _trainer(config, tmp_path)
    config.train.mini_batch_prompts = 1
    check_rl_config(config)  # one prompt per mini-batch: accepted


def test_every_config_file_passes_the_trainer_checks():
    names = sorted(os.path.basename(path)[:-3] for path in glob.glob(os.path.join(REPO, "configs", "*.py")))
    names = [name for name in names if name not in ("__init__", "base")]
    assert "aepo_qwen3_14b" in names
    for name in names:
        check_rl_config(importlib.import_module(f"configs.{name}").get_config())


def test_a_micro_batch_of_no_rows_is_refused_at_construction_naming_the_field(tmp_path):
    """It was a ZeroDivisionError deep in the trainer's constructor."""
    config = aepo_config()
    config.train.micro_batch_size = 0
    with pytest.raises(ValueError, match=r"train.micro_batch_size=0: a micro-batch .* needs at least 1 row"):
        _trainer(config, tmp_path)


def test_no_ppo_epochs_is_refused_naming_the_field():
    """It surfaced from the schedule as "need warmup_steps >= 0 and total_steps >= 1, got 2, 0", naming
    neither the field nor the run's total_steps."""
    config = aepo_config()
    config.train.ppo_epochs = 0
    with pytest.raises(ValueError, match=r"train.ppo_epochs=0: each RL step makes at least one pass"):
        check_rl_config(config)


class CountingTrainer(CheckpointedTrainer):
    """The real step loop and checkpointer around a step that only counts."""

    progress_name = "count"

    def __init__(self, workdir: str, total_steps: int, every: int):
        self.config = ml_collections.ConfigDict({
            "train": {"total_steps": total_steps},
            "checkpoint": {"every": every, "keep": 10, "async_save": False},
            "log": {"tensorboard": False, "progress_bar": False, "console_every": 100},
        })
        self.state = TrainState.create({"w": jnp.zeros(2)}, optax.sgd(0.1), seed=0)
        self._open_outputs(workdir, process_index=0)

    def train_step(self) -> dict[str, float]:
        self.state = self.state.replace(rounds=self.state.rounds + 1)
        return {"loss": 0.0}


@pytest.mark.parametrize(("every", "saved"), [(0, [3]), (2, [2, 3])])
def test_checkpoint_every_zero_saves_only_the_last_step(tmp_path, every, saved):
    """`checkpoint.every=0` saved after every step (the loop read it as max(1, every))."""
    trainer = CountingTrainer(str(tmp_path), total_steps=3, every=every)
    try:
        trainer.train()
    finally:
        trainer.close()
    assert step_folders(str(tmp_path / "checkpoints")) == (saved, [])


def test_a_negative_checkpoint_period_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"checkpoint.every=-1: .* or 0 for a checkpoint only at the run's last step"):
        CountingTrainer(str(tmp_path), total_steps=3, every=-1)

"""A non-finite gradient in a real RL run: every such update is skipped, the weights stay finite and
unchanged, and metrics.jsonl and the console line say so (`skipped_updates`, `loss nan`)."""

import jax
import numpy as np

from aepo_jax.data import PromptPipeline
from aepo_jax.training.metrics_log import read_metrics
from aepo_jax.training.rl_trainer import RLTrainer
from configs.aepo_tiny import get_config as aepo_config
from tests.training.fixtures import tiny_model
from tests.training.sampling_fixture import (
    digit_examples,
    encode_digits,
    make_sampling_rollout,
    small_rl_config,
)


def nan_reward(example, trajectory) -> float:
    """A reward model that failed: NaN for every trajectory, so every advantage and gradient is NaN."""
    del example, trajectory
    return float("nan")


def test_an_rl_step_with_nonfinite_gradients_skips_its_updates_and_reports_them(tmp_path, capsys):
    config = small_rl_config(aepo_config, total_steps=1)
    config.log.console_every = 1
    graphdef, params = tiny_model(seed=config.seed)
    before = jax.tree.map(np.array, params)
    trainer = RLTrainer(config, str(tmp_path), rollout_fn=make_sampling_rollout(graphdef),
                        pipeline=PromptPipeline(digit_examples(16), config.data.prompts_per_step, seed=config.seed),
                        encode_prompt=encode_digits, reward_fn=nan_reward, graphdef=graphdef, params=params)
    try:
        trainer.train()
        after = jax.tree.map(np.asarray, trainer.state.params)
        step = int(trainer.state.step)
    finally:
        trainer.close()
    for old, new in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        np.testing.assert_array_equal(new, old)
    assert step == 0  # no optimiser update was applied
    (record,) = read_metrics(str(tmp_path))
    assert record["updates"] == 2 and record["skipped_updates"] == 2  # a count over the step's updates
    assert record["loss"] == "nan" and record["grad_norm"] == "nan"  # written, not dropped
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "loss nan" in line and "grad_norm nan" in line and line.endswith("skipped_updates 2")

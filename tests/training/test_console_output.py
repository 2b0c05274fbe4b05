"""Console output of the step loop: a tqdm bar with a postfix, a plain metrics
line every `log.console_every` steps (and at the last) written above the bar,
every step in metrics.jsonl."""

from __future__ import annotations

import re

import jax.numpy as jnp
import ml_collections
import optax
import pytest

from aepo_jax.training.metrics_log import MetricsLogger, read_metrics
from aepo_jax.training.step_loop import CheckpointedTrainer
from aepo_jax.training.train_state import TrainState


class CountingTrainer(CheckpointedTrainer):
    """The real step loop, logger and checkpointer around a step that only counts."""

    progress_name = "count"

    def __init__(self, workdir: str, total_steps: int, console_every: int):
        self.config = ml_collections.ConfigDict({
            "train": {"total_steps": total_steps},
            "checkpoint": {"every": 1000, "keep": 1, "async_save": False},
            "log": {"tensorboard": False, "progress_bar": True, "console_every": console_every},
        })
        self.state = TrainState.create({"w": jnp.zeros(2)}, optax.sgd(0.1), seed=0)
        self._open_outputs(workdir, process_index=0)

    def train_step(self) -> dict[str, float]:
        self.state = self.state.replace(rounds=self.state.rounds + 1)
        return {"loss": int(self.state.rounds) / 8, "reward_mean": 0.5}

    def _progress_postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"loss": f"{metrics['loss']:.3f}"}


def test_console_lines_come_every_n_steps_and_at_the_last_above_the_bar(tmp_path, capsys):
    trainer = CountingTrainer(str(tmp_path), total_steps=7, console_every=3)
    try:
        trainer.train(progress=True)
    finally:
        trainer.close()
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "step 3 | loss 0.375 | reward_mean 0.5",
        "step 6 | loss 0.75 | reward_mean 0.5",
        "step 7 | loss 0.875 | reward_mean 0.5",  # the last step, off the period
    ]
    # tqdm.write clears the bar (`\r` + blanks + `\r`) before each line and redraws it after;
    # a plain print() would leave the bar half-drawn in front of the line.
    assert len(re.findall(r"\r +\r\r", err)) == 3
    assert "7/7" in err and "loss=0.875" in err  # the bar, with its postfix, saw every step
    assert [r["step"] for r in read_metrics(str(tmp_path))] == list(range(1, 8))


def test_logger_console_period_and_forced_lines(tmp_path, capsys):
    with MetricsLogger(str(tmp_path), tensorboard=False, console_every=2) as log:
        for step in range(1, 6):
            log.log(step, {"loss": float(step)}, console=True if step == 1 else None)
        log.log(6, {"loss": 6.0}, console=False)
    assert [line.split(" |")[0] for line in capsys.readouterr().out.splitlines()] == ["step 1", "step 2", "step 4"]
    assert len(read_metrics(str(tmp_path))) == 6
    with pytest.raises(ValueError, match="console_every must be >= 1"):
        MetricsLogger(str(tmp_path), console_every=0)

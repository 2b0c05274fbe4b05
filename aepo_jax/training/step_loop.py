"""What the RL and SFT trainers share (DESIGN.md, Trainer): checkpoints with
the data position, the metrics log, and the step loop that saves every
`checkpoint.every` steps and at the last one (0: only at the last one and on a
preemption notice).

Console: a progress bar with the headline metrics as its postfix, plus a plain
metrics line every `log.console_every` steps and at the last step, written
above the bar (`metrics_log.write_console_line`); metrics.jsonl gets every step.

Validation (`validation.Validation`) runs after a due step's metrics line and
checkpoint. A preemption notice at a due step stops the run before validating
(the notice leaves seconds, a validation can take minutes); the step's
checkpoint then records the validation as owed (`VALIDATION_OWED_KEY`), and the
run resumed from it validates that step before training on. A run killed without
notice between a due step's checkpoint and its validation line is resumed the
same way: a resume at a due step whose line metrics.jsonl lacks validates it first.

A trainer subclasses `CheckpointedTrainer`, sets `config`, `state` and `run`
(a `RunParts`), calls `_open_outputs`, and provides `train_step()` plus the
data position (`_data_position` / `_restore_data_position`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import ml_collections

from aepo_jax.training.build import RunParts
from aepo_jax.training.checkpoint import Checkpointer
from aepo_jax.training.metrics_log import (
    DEFAULT_CONSOLE_EVERY,
    MetricsLogger,
    read_metrics,
)
from aepo_jax.training.preemption import Preempted, PreemptionWatch
from aepo_jax.training.validation import VALIDATION_PREFIX, Validation

# The key of a checkpoint's data position that names the stage which wrote it (`progress_name`).
STAGE_KEY = "stage"
# The key of a checkpoint's data position saying that the step's validation is owed: a preemption notice
# stopped the run before it (see the module docstring).
VALIDATION_OWED_KEY = "validation_owed"


def require_micro_batch_size(config: ml_collections.ConfigDict) -> None:
    """A ValueError naming `train.micro_batch_size` when it is below 1 (the RL and SFT trainers check it
    before building anything: SFT divided by it, RL silently took one row per device)."""
    rows = int(config.train.micro_batch_size)
    if rows < 1:
        raise ValueError(f"train.micro_batch_size={rows}: a micro-batch (the rows of one forward/backward pass) "
                         "needs at least 1 row")


class CheckpointedTrainer:
    """Checkpoint, resume, log and loop over `train_step()`; see the module docstring."""

    config: ml_collections.ConfigDict
    state: Any  # TrainState; `state.rounds` counts finished steps
    run: RunParts
    progress_name: str = "train"  # the stage: the progress bar's label, saved with each checkpoint
    validation: Validation | None = None  # held-out validation after some steps (the composition root sets it)
    _run_end: int | None = None  # the step the running `train()` call stops at (None outside one)
    _validation_owed: int | None = None  # a step whose validation a preemption notice put off (saved with it)
    _restored_step: int | None = None  # the checkpoint `restore_latest` continued from

    def _open_outputs(self, workdir: str, process_index: int) -> None:
        every = int(self.config.checkpoint.every)
        if every < 0:
            raise ValueError(f"checkpoint.every={every}: it is a number of steps between checkpoints, or 0 for "
                             "a checkpoint only at the run's last step and on a preemption notice")
        keep = int(self.config.checkpoint.keep)
        if keep < 1:  # orbax's max_to_keep=0 deletes every step, the one just saved too: the run ends with none
            raise ValueError(f"checkpoint.keep={keep}: it is how many checkpoints are kept, at least 1")
        self.checkpointer = Checkpointer(f"{workdir}/checkpoints", keep=keep,
                                         async_save=bool(self.config.checkpoint.async_save),
                                         clean_up_deletions=True)
        self.logger = MetricsLogger(workdir, tensorboard=bool(self.config.log.tensorboard),
                                    process_index=process_index,
                                    console_every=int(self.config.log.get("console_every", DEFAULT_CONSOLE_EVERY)))
        self.process_index = process_index

    # -- what a trainer provides -------------------------------------------
    def train_step(self) -> dict[str, float]:
        raise NotImplementedError

    def _data_position(self) -> dict:
        """JSON-able position of the data iterator, saved with each checkpoint."""
        return {}

    def _restore_data_position(self, position: dict) -> None:
        """Continue the data iterator from a saved (non-empty) position."""

    def _progress_postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {}

    # -- checkpoints -------------------------------------------------------
    def restore_latest(self) -> bool:
        """Continue from the newest complete checkpoint; False when there is none. A checkpoint another
        stage wrote (an SFT run's, resumed as RL) is refused before anything is read. A checkpoint that
        owes its step's validation makes the next `train()` validate it first."""
        step = self.checkpointer.agreed_latest_step()  # one step for every process
        if step is None:
            return False
        self._require_own_stage(step)
        self.state, position = self.checkpointer.restore(self.state, step=step, shardings=self.run.state_sharding)
        position.pop(STAGE_KEY, None)
        self._validation_owed = step if position.pop(VALIDATION_OWED_KEY, False) else None
        self._restored_step = step
        if position:
            self._restore_data_position(position)
        return True

    def _require_own_stage(self, step: int) -> None:
        saved = self.checkpointer.data_position(step).get(STAGE_KEY)
        if saved is not None and saved != self.progress_name:
            raise ValueError(
                f"checkpoint {self.checkpointer.directory}/{step} was written by the {saved!r} stage, not this "
                f"{self.progress_name!r} one: its step count, optimiser state and data position belong to that "
                f"run. To start from its parameters, start a fresh workdir with "
                f"--config.model.init_checkpoint={self.checkpointer.directory}")

    def _saved_position(self) -> dict:
        """The data position saved with a checkpoint, with the stage that wrote it (and, when a preemption
        notice put the step's validation off, that it is owed)."""
        position = {**self._data_position(), STAGE_KEY: self.progress_name}
        if self._validation_owed is not None and self._validation_owed == int(self.state.rounds):
            position[VALIDATION_OWED_KEY] = True
        return position

    def save(self, force: bool = False) -> None:
        self.checkpointer.save(int(self.state.rounds), self.state, self._saved_position(), force=force)

    # -- loop --------------------------------------------------------------
    def train(self, num_steps: int | None = None, progress: bool | None = None) -> list[dict[str, Any]]:
        """Run until `config.train.total_steps` (or `num_steps` more); returns the logged records.

        A preemption notice (SIGTERM, `preemption.PreemptionWatch`) saves the step reached and raises
        `preemption.Preempted` naming that step. A validation owed by the restored checkpoint runs first."""
        total = int(self.config.train.total_steps)
        start = int(self.state.rounds)
        end = total if num_steps is None else min(total, start + num_steps)
        show = bool(self.config.log.progress_bar) if progress is None else progress
        bar = None
        if show and self.process_index == 0:
            from tqdm import tqdm

            bar = tqdm(total=end - start, desc=self.progress_name, unit="step", dynamic_ncols=True)
        records = []
        every = int(self.config.checkpoint.every)  # 0: the last step and a preemption notice only
        self._run_end = end
        preempted_at = None
        watch = PreemptionWatch()
        try:
            owed, self._validation_owed = self._validation_owed, None
            if owed is None and self._restored_step == start and self.validation is not None and \
                    self.validation.due(start, total):
                owed = start  # a run killed (not preempted) between the step's checkpoint and its validation
            if (owed is not None and owed == start and self.validation is not None
                    and not self._validation_logged(start)):
                records.append(self._validate(start))
                if watch.reached(start):  # a notice that came while validating: `start` is saved already
                    preempted_at = start
            for _ in range(start, end if preempted_at is None else start):
                metrics = self.train_step()
                step = int(self.state.rounds)
                every_or_last = step % self.logger.console_every == 0 or step == end
                records.append(self.logger.log(step, metrics, console=every_or_last))
                preempted = watch.reached(step)
                due = self.validation is not None and self.validation.due(step, total)
                self._validation_owed = step if due and preempted else None  # saved with the step
                saved = (every > 0 and step % every == 0) or step == end or preempted
                if saved:
                    self.save(force=True)
                if due and not preempted:
                    records[-1].update(self._validate(step))
                    preempted = watch.reached(step)  # a notice that came while validating
                    if preempted and not saved:
                        self.save(force=True)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(self._progress_postfix(metrics))
                if preempted:
                    preempted_at = step
                    break
        finally:
            self._run_end = None
            if bar is not None:
                bar.close()
            try:  # the watch stays until the last save has committed: a SIGTERM meanwhile must not kill it
                self.checkpointer.wait_until_finished()
            finally:
                watch.close()
        if preempted_at is not None:
            raise Preempted(preempted_at, self.checkpointer.directory)
        return records

    def _validation_logged(self, step: int) -> bool:
        """Whether metrics.jsonl already has `step`'s validation line (an owed validation done by an earlier
        resume that then stopped before its next checkpoint), as process 0 reads it, on every process."""
        from aepo_jax.parallel.multihost import first_process_value

        logged = self.logger.active and os.path.exists(self.logger.path) and any(
            int(r.get("step", -1)) == step and any(k.startswith(VALIDATION_PREFIX) for k in r)
            for r in read_metrics(self.logger.path))
        return bool(first_process_value(int(logged)))

    def _validate(self, step: int) -> dict[str, Any]:
        """Validate the step's parameters, after its metrics line and checkpoint are written (a validation
        that fails or is killed loses neither), and log the scores as a second line of the step."""
        started = time.perf_counter()
        scores = self.validation(self.state.params)
        scores["val_s"] = time.perf_counter() - started
        return self.logger.log(step, scores, console=False)

    def close(self) -> None:
        self.checkpointer.close()
        self.logger.close()

"""The step loop shared by the RL and SFT trainers, on a trainer whose step only counts: a preemption notice at
a step due for validation, and the checkpoint folder the trainer opens."""

from __future__ import annotations

import os
import signal
import threading
from types import SimpleNamespace

import jax.numpy as jnp
import ml_collections
import pytest
from flax import struct

from aepo_jax.training.checkpoint import COMMIT_FILE_NAME
from aepo_jax.training.metrics_log import read_metrics
from aepo_jax.training.preemption import Preempted
from aepo_jax.training.step_loop import CheckpointedTrainer
from aepo_jax.training.validation import Validation

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="the preemption watch takes SIGTERM on the main thread only")


@struct.dataclass
class _CountingState:
    params: jnp.ndarray
    rounds: jnp.ndarray


class _CountingTrainer(CheckpointedTrainer):
    """A step adds 1 to the parameter; `notice_at`: the step during which a SIGTERM arrives."""

    progress_name = "count"

    def __init__(self, workdir: str, total_steps: int, validate_every: int, notice_at: int | None = None,
                 crash_at: int | None = None):
        self.config = ml_collections.ConfigDict({
            "train": {"total_steps": total_steps},
            "checkpoint": {"every": 0, "keep": 3, "async_save": False},
            "log": {"progress_bar": False, "tensorboard": False, "console_every": 1000},
        })
        self.state = _CountingState(params=jnp.float32(0.0), rounds=jnp.int32(0))
        self.run = SimpleNamespace(state_sharding=None)
        self.validated: list[tuple[int, float]] = []  # (step reached, the parameter validated)
        self.validation = Validation(validate_every, self._score)
        self.notice_at = notice_at
        self.crash_at = crash_at  # the step during which the process "dies" (an exception, nothing saved)
        self._open_outputs(workdir, process_index=0)

    def _score(self, params) -> dict[str, float]:
        self.validated.append((int(self.state.rounds), float(params)))
        return {"score": float(params)}

    def train_step(self) -> dict[str, float]:
        if int(self.state.rounds) + 1 == self.crash_at:
            raise RuntimeError(f"crashed during step {self.crash_at}")
        self.state = self.state.replace(params=self.state.params + 1, rounds=self.state.rounds + 1)
        if int(self.state.rounds) == self.notice_at:
            os.kill(os.getpid(), signal.SIGTERM)  # the watch's handler takes it
        return {"loss": float(self.state.params)}


@pytest.mark.parametrize(("notice_at", "validated_after_resume"), [
    (2, [(2, 2.0), (4, 4.0)]),  # a due step: validated first by the resumed run
    (4, [(4, 4.0)]),  # the last step: its (final) validation is owed too
    (3, [(4, 4.0)]),  # a step not due: nothing is owed
], ids=["due_step", "last_step", "step_not_due"])
def test_a_validation_a_preemption_notice_put_off_is_done_by_the_resumed_run(tmp_path, notice_at,
                                                                             validated_after_resume):
    """A SIGTERM at a step due for validation skipped that validation for good (the final one included): the
    step's checkpoint now records it as owed, and the resumed run validates the step's parameters first."""
    workdir = str(tmp_path / "run")
    first = _CountingTrainer(workdir, total_steps=4, validate_every=2, notice_at=notice_at)
    try:
        with pytest.raises(Preempted) as stopped:
            first.train()
    finally:
        first.close()
    assert stopped.value.step == notice_at
    assert first.validated == [(2, 2.0)] * (notice_at > 2)  # the notice stops the run before validating

    resumed = _CountingTrainer(workdir, total_steps=4, validate_every=2)
    try:
        assert resumed.restore_latest() and int(resumed.state.rounds) == notice_at
        resumed.logger.keep_through(notice_at)
        resumed.train()
    finally:
        resumed.close()
    assert resumed.validated == validated_after_resume
    val_lines = [(r["step"], r["val/score"]) for r in read_metrics(workdir) if "val/score" in r]
    assert val_lines == [(step, value) for step, value in [(2, 2.0)] * (notice_at > 2) + validated_after_resume]


def test_a_resumed_run_owes_nothing_after_the_owed_validation(tmp_path):
    """The owed validation runs once: a later checkpoint (a step not due) does not carry it on."""
    workdir = str(tmp_path / "run")
    first = _CountingTrainer(workdir, total_steps=6, validate_every=2, notice_at=2)
    with pytest.raises(Preempted):
        first.train()
    first.close()
    resumed = _CountingTrainer(workdir, total_steps=6, validate_every=2, notice_at=3)
    with pytest.raises(Preempted):
        resumed.restore_latest()
        resumed.train()
    resumed.close()
    again = _CountingTrainer(workdir, total_steps=6, validate_every=2)
    try:
        again.restore_latest()
        again.train()
    finally:
        again.close()
    assert resumed.validated == [(2, 2.0)] and again.validated == [(4, 4.0), (6, 6.0)]


class _NoticeDuringValidation(_CountingTrainer):
    """A SIGTERM arrives while the first validation runs."""

    def _score(self, params) -> dict[str, float]:
        if not self.validated:
            os.kill(os.getpid(), signal.SIGTERM)
        return super()._score(params)


def test_a_notice_during_the_owed_validation_stops_the_resumed_run_before_its_next_step(tmp_path):
    """A notice that came during the owed validation was read only after the next step, which may not finish
    within the notice's grace period (the step and its checkpoint lost with the machine)."""
    workdir = str(tmp_path / "run")
    first = _CountingTrainer(workdir, total_steps=6, validate_every=2, notice_at=2)
    with pytest.raises(Preempted):
        first.train()
    first.close()
    resumed = _NoticeDuringValidation(workdir, total_steps=6, validate_every=2)
    try:
        assert resumed.restore_latest()
        with pytest.raises(Preempted) as stopped:
            resumed.train()
    finally:
        resumed.close()
    assert stopped.value.step == 2 and int(resumed.state.rounds) == 2 and resumed.validated == [(2, 2.0)]
    again = _CountingTrainer(workdir, total_steps=6, validate_every=2)
    try:
        assert again.restore_latest() and int(again.state.rounds) == 2
        again.train()
    finally:
        again.close()
    assert again.validated == [(4, 4.0), (6, 6.0)]  # step 2's validation is logged: not done again
    assert [(r["step"], r["val/score"]) for r in read_metrics(workdir) if "val/score" in r] == [
        (2, 2.0), (4, 4.0), (6, 6.0)]


def test_an_owed_validation_already_logged_is_not_done_again_after_a_crash(tmp_path):
    """A resume that did the owed validation and then died before its next checkpoint left the flag in the
    checkpoint it resumed from: every later resume validated (and logged) the same step again."""
    workdir = str(tmp_path / "run")
    first = _CountingTrainer(workdir, total_steps=6, validate_every=2, notice_at=2)
    with pytest.raises(Preempted):
        first.train()
    first.close()
    for attempt in range(2):
        resumed = _CountingTrainer(workdir, total_steps=6, validate_every=2, crash_at=3)
        try:
            assert resumed.restore_latest() and int(resumed.state.rounds) == 2
            resumed.logger.keep_through(2)
            with pytest.raises(RuntimeError, match="crashed during step 3"):
                resumed.train()
        finally:
            resumed.close()
        assert resumed.validated == ([(2, 2.0)] if attempt == 0 else []), attempt
    assert [(r["step"], r["val/score"]) for r in read_metrics(workdir) if "val/score" in r] == [(2, 2.0)]


class _KilledDuringFirstValidation(_CountingTrainer):
    """The process dies (an exception here; a SIGKILL or an OOM kill on a machine) in the first validation."""

    def _score(self, params) -> dict[str, float]:
        raise RuntimeError("killed while validating")


def test_a_validation_a_kill_cut_short_is_done_by_the_resumed_run(tmp_path):
    """Only a preemption notice marked a validation owed: a run killed between a due step's checkpoint and
    its validation line resumed past it, and that step never got a validation line."""
    workdir = str(tmp_path / "run")
    first = _KilledDuringFirstValidation(workdir, total_steps=6, validate_every=2)
    first.config.checkpoint.every = 2
    try:
        with pytest.raises(RuntimeError, match="killed while validating"):
            first.train()
    finally:
        first.close()
    for attempt in range(2):  # the second resume finds every due step's line: it validates nothing again
        resumed = _CountingTrainer(workdir, total_steps=6, validate_every=2)
        resumed.config.checkpoint.every = 2
        try:
            assert resumed.restore_latest()
            resumed.train()
        finally:
            resumed.close()
        assert resumed.validated == ([(2, 2.0), (4, 4.0), (6, 6.0)] if attempt == 0 else []), attempt
    assert [(r["step"], r["val/score"]) for r in read_metrics(workdir) if "val/score" in r] == [
        (2, 2.0), (4, 4.0), (6, 6.0)]


def test_the_trainer_removes_a_deletion_cut_short_when_it_opens_its_checkpoints(tmp_path):
    """A step folder without its commit file, older than the newest complete step (orbax's max_to_keep
    deletion killed midway), is removed when the run starts; the complete steps stay."""
    workdir = str(tmp_path / "run")
    first = _CountingTrainer(workdir, total_steps=3, validate_every=100)
    first.config.checkpoint.every = 1
    first.train()
    first.close()
    checkpoints = os.path.join(workdir, "checkpoints")
    os.remove(os.path.join(checkpoints, "1", COMMIT_FILE_NAME))
    resumed = _CountingTrainer(workdir, total_steps=3, validate_every=100)
    try:
        assert sorted(os.listdir(checkpoints)) == ["2", "3"]
        assert resumed.restore_latest() and int(resumed.state.rounds) == 3
    finally:
        resumed.close()

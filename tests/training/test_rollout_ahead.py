"""`train.rollout_ahead`: step s + 1's rollout runs on a background thread while step s trains, with the
parameters step s started from. Checked against an independent reference (a synchronous run whose rollout
function samples with the previous step's parameters), for overlap, exact resume and error paths."""

import shutil
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aepo_jax.parallel.device_turns import off_device_turn
from aepo_jax.training.rollout_ahead import THREAD_NAME, RolloutAhead
from configs.aepo_tiny import get_config as aepo_config
from tests.training.fixtures import tiny_model
from tests.training.sampling_fixture import (
    make_sampling_rollout,
    sampling_trainer,
    small_rl_config,
)

STEPS = 3


def _config(ahead: bool, total_steps: int = STEPS):
    c = small_rl_config(aepo_config, total_steps)
    c.train.rollout_ahead = ahead
    # rollout_ahead needs the sampler's log-probs as the ratio's denominator; the synchronous reference too,
    # so that both train on the same numbers.
    c.train.recompute_logp_old = False
    return c


def _trainer(config, workdir, rollout_fn=None):
    return sampling_trainer(config, workdir, rollout_fn)


class PreviousParamsRollout:
    """The reference: a synchronous rollout function that samples with the parameters of its previous
    call (the first call's own), i.e. step s with the parameters step s - 1 started from."""

    def __init__(self, rollout_fn):
        self.rollout_fn, self.previous = rollout_fn, None

    def __call__(self, prompts, k, params, key, rng):
        use = params if self.previous is None else self.previous
        self.previous = jax.tree.map(jnp.copy, params)  # the train step donates `params` afterwards
        return self.rollout_fn(prompts, k, use, key, rng)


def _assert_same_params(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def ahead_run(tmp_path_factory):
    """A full rollout_ahead run of STEPS steps (checkpoints at 2, with step 2's rollout in flight, and 3)."""
    workdir = tmp_path_factory.mktemp("ahead")
    trainer = _trainer(_config(ahead=True), workdir)
    try:
        records = trainer.train()
    finally:
        trainer.close()
    return trainer, records, workdir


def test_rollout_ahead_equals_a_synchronous_run_whose_rollouts_sample_with_the_previous_steps_params(
        ahead_run, tmp_path):
    ahead, ahead_records, _ = ahead_run
    graphdef, _ = tiny_model(seed=0)
    reference = _trainer(_config(ahead=False), tmp_path / "reference",
                         PreviousParamsRollout(make_sampling_rollout(graphdef)))
    reference_records = reference.train()
    reference.close()
    _assert_same_params(ahead.state.params, reference.state.params)
    np.testing.assert_array_equal(np.asarray(ahead.state.rng), np.asarray(reference.state.rng))
    assert ahead.pipeline.state() == reference.pipeline.state()
    for a, r in zip(ahead_records, reference_records, strict=True):
        assert a["reward_mean"] == r["reward_mean"] and a["loss"] == r["loss"]
    assert [r["rollout_stale_params"] for r in ahead_records] == [0.0, 1.0, 1.0]
    # the staleness is real: a synchronous run with fresh parameters ends elsewhere
    fresh = _trainer(_config(ahead=False), tmp_path / "fresh")
    fresh.train()
    fresh.close()
    assert any(not np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree.leaves(ahead.state.params), jax.tree.leaves(fresh.state.params)))


def test_rollout_ahead_resumes_exactly_from_a_checkpoint_saved_while_a_rollout_was_in_flight(ahead_run, tmp_path):
    ahead, _, workdir = ahead_run
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2", "3"]
    assert (workdir / "checkpoints" / "2" / "rollout_params").is_dir()
    # Keep only the checkpoint at step 2: it was saved while step 2's rollout ran on the background thread.
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(workdir / "checkpoints" / "2", resumed_dir / "checkpoints" / "2")
    resumed = _trainer(_config(ahead=True), resumed_dir)
    assert resumed.restore_latest()
    assert int(resumed.state.rounds) == 2
    (record,) = resumed.train()
    resumed.close()
    assert record["rollout_stale_params"] == 1.0  # the restored rollout parameters, not the current ones
    _assert_same_params(resumed.state.params, ahead.state.params)
    np.testing.assert_array_equal(np.asarray(resumed.state.rng), np.asarray(ahead.state.rng))
    assert resumed.pipeline.state() == ahead.pipeline.state()


def test_rollout_ahead_runs_the_next_rollout_while_this_step_updates(tmp_path):
    graphdef, _ = tiny_model(seed=0)
    sample = make_sampling_rollout(graphdef)
    # A handshake that only overlap can complete: step s's first update starts only once step s + 1's rollout
    # has started, and that rollout samples only once the update has started. Run one after the other, the
    # first wait would time out. The two threads take turns at the devices (`parallel.device_turns`): the
    # rollout waits for the update without its turn (as for tool results), then samples in a turn the
    # trainer offers before its next mini-batch, so it has finished before the step's last update.
    started = [threading.Event() for _ in range(STEPS)]
    updating = [threading.Event() for _ in range(STEPS)]
    finished = [threading.Event() for _ in range(STEPS)]
    threads, rollout_turns, update_turns, done_before_last_update = [], [], [], []
    updates_of_step: dict[int, int] = {}

    def rollout_fn(prompts, k, params, key, rng):
        step = len(threads)
        threads.append(threading.current_thread().name)
        started[step].set()
        with off_device_turn():  # a wait outside the devices, as for tool results: the update may run
            overlapped = step == 0 or updating[step - 1].wait(timeout=120)
        if not overlapped:
            raise TimeoutError(f"step {step}'s rollout never overlapped step {step - 1}'s update")
        if step > 0:
            rollout_turns.append(trainer._ahead.turns.holds())
        out = sample(prompts, k, params, key, rng)
        finished[step].set()
        return out

    trainer = _trainer(_config(ahead=True), tmp_path, rollout_fn)
    train_step = trainer._train_step

    def handshaking_train_step(state, batch):
        step = int(state.rounds)
        updates_of_step[step] = updates_of_step.get(step, 0) + 1
        if step + 1 < STEPS and updates_of_step[step] == 1:
            if not started[step + 1].wait(timeout=120):
                raise TimeoutError(f"step {step + 1}'s rollout had not started when step {step}'s update began")
            updating[step].set()
            deadline = time.monotonic() + 120  # the rollout now waits for its turn to sample
            while not trainer._ahead.turns.waiting() and time.monotonic() < deadline:
                time.sleep(0.001)
        elif step + 1 < STEPS:  # a later mini-batch: the turn offered before it let the rollout sample
            done_before_last_update.append(finished[step + 1].is_set())
        if trainer._ahead.pending_step is not None:
            update_turns.append(trainer._ahead.turns.holds())
        return train_step(state, batch)

    trainer._train_step = handshaking_train_step
    try:
        records = trainer.train()
    finally:
        trainer.close()
    assert len(records) == STEPS
    assert threads[0] == threading.current_thread().name
    assert all(name.startswith(THREAD_NAME) for name in threads[1:]), threads
    assert rollout_turns == [True] * (STEPS - 1) and update_turns and all(update_turns), (rollout_turns, update_turns)
    assert done_before_last_update == [True] * (STEPS - 1), (done_before_last_update, updates_of_step)


def test_rollout_ahead_raises_what_the_background_rollout_raised(tmp_path):
    graphdef, _ = tiny_model(seed=0)
    sample = make_sampling_rollout(graphdef)
    calls = []

    def rollout_fn(prompts, k, params, key, rng):
        calls.append(len(calls))
        if len(calls) == 2:
            raise ConnectionError("search server gone")
        return sample(prompts, k, params, key, rng)

    trainer = _trainer(_config(ahead=True), tmp_path, rollout_fn)
    with pytest.raises(ConnectionError, match="search server gone"):
        trainer.train()
    trainer.close()
    assert int(trainer.state.rounds) == 1  # step 0 finished; step 1 stopped at its rollout


def test_rollout_ahead_refuses_several_processes_for_a_rollout_that_may_span_them(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match="rollout_ahead with 2 processes needs a rollout function that samples on"):
        _trainer(_config(ahead=True), tmp_path)


def test_a_pending_rollout_is_refused_for_another_step_or_key():
    ahead = RolloutAhead()
    key = jax.random.key(0)
    ahead.launch(1, key, lambda: "rollout 1")
    with pytest.raises(RuntimeError, match="already|still pending"):
        ahead.launch(2, key, lambda: "rollout 2")
    with pytest.raises(RuntimeError, match="launched for step 1 with another key than step 1"):
        ahead.take(1, jax.random.key(1))
    ahead.launch(2, key, lambda: "rollout 2")
    with pytest.raises(RuntimeError, match="launched for step 2 with another key than step 3"):
        ahead.take(3, key)
    assert ahead.take(3, key) is None  # nothing pending any more
    ahead.launch(4, key, lambda: "rollout 4")
    assert ahead.take(4, key)[0] == "rollout 4"
    ahead.close()

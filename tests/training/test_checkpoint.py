"""Orbax checkpoints: exact round trip, keep-N, a SIGKILL mid-save, a deletion cut short, a damaged step,
and a save whose folder cannot be made."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from aepo_jax.training.checkpoint import (
    COMMIT_FILE_NAME,
    Checkpointer,
    cut_short_note,
)
from aepo_jax.training.optimizer import make_optimizer
from aepo_jax.training.train_state import TrainState
from tests.child_process import child_env


class _TwoLayer(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.dense = nnx.Linear(6, 8, rngs=rngs)
        self.norm = nnx.RMSNorm(8, rngs=rngs)


def _state(seed: int = 0) -> TrainState:
    _, params = nnx.split(_TwoLayer(nnx.Rngs(seed)))
    tx, _ = make_optimizer(1e-2, total_steps=10)
    state = TrainState.create(params, tx, seed=seed)
    grads = jax.tree.map(jnp.ones_like, state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return state.replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state, step=state.step + 1)


def test_round_trip_restores_identical_structure_values_and_data_position(tmp_path):
    state = _state()
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(1, state, {"epoch": 0, "next_index": 7})
    with Checkpointer(str(tmp_path)) as ckpt:
        zeros = jax.tree.map(jnp.zeros_like, state)
        restored, position = ckpt.restore(zeros)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    assert isinstance(restored.opt_state, tuple)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert position == {"epoch": 0, "next_index": 7}


def _replace_leaf(tree, dotted: str, value):
    """`tree` with the leaf whose key path starts with `dotted` replaced by `value`."""
    def pick(path, leaf):
        names = ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
        return value if names.startswith(dotted) else leaf
    return jax.tree_util.tree_map_with_path(pick, tree)


def test_a_target_of_another_shape_is_refused_before_any_read_and_another_dtype_is_cast(tmp_path):
    state = _state()
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(1, state)
    wider = _replace_leaf(state, "params.dense.kernel", jnp.zeros((6, 9), jnp.float32))
    with Checkpointer(str(tmp_path)) as ckpt, pytest.raises(
            ValueError, match=r"does not fit the target at params\.dense\.kernel\.value: "
                              r"saved float32\[6, 8\], target float32\[6, 9\]"):
        ckpt.restore(wider)
    halved = _replace_leaf(state, "params.norm.scale", jnp.ones((8,), jnp.bfloat16))
    with Checkpointer(str(tmp_path)) as ckpt:
        cast, _ = ckpt.restore(halved)
        restored, _ = ckpt.restore(state)  # the matching target still restores
    saved_scale = np.asarray(state.params["norm"]["scale"].value)
    assert cast.params["norm"]["scale"].value.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(cast.params["norm"]["scale"].value),
                                  np.asarray(jnp.asarray(saved_scale).astype(jnp.bfloat16)))
    np.testing.assert_array_equal(np.asarray(restored.params["dense"]["kernel"].value),
                                  np.asarray(state.params["dense"]["kernel"].value))


def test_keeps_only_newest_n_steps(tmp_path):
    state = _state()
    with Checkpointer(str(tmp_path), keep=2) as ckpt:
        for step in range(1, 5):
            ckpt.save(step, state.replace(step=jnp.int32(step)))
            ckpt.wait_until_finished()
        assert ckpt.all_steps() == [3, 4]
        restored, _ = ckpt.restore(state)
    assert int(restored.step) == 4


def test_restore_onto_requested_sharding(tmp_path):
    state = _state()
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(1, state)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    shardings = jax.tree.map(lambda _: replicated, state)
    with Checkpointer(str(tmp_path)) as ckpt:
        restored, _ = ckpt.restore(state, shardings=shardings)
    leaf = jax.tree.leaves(restored.params)[0]
    assert leaf.sharding == replicated
    assert len(leaf.devices()) == 8


_SAVER = textwrap.dedent(
    """
    import sys, time
    import jax.numpy as jnp
    from aepo_jax.training.checkpoint import Checkpointer
    directory = sys.argv[1]
    ckpt = Checkpointer(directory, keep=5)
    small = {"w": jnp.full((4, 4), 1.5, jnp.float32), "step": jnp.int32(1)}
    ckpt.save(1, small, {"next_index": 11})
    ckpt.wait_until_finished()
    print("STEP1_DONE", flush=True)
    # ~200 MB so that the save of step 2 takes long enough to be interrupted.
    big = {"w": jnp.full((4, 4), 2.5, jnp.float32), "step": jnp.int32(2),
           "blobs": [jnp.full((1024, 1024, 8), float(i), jnp.float32) for i in range(6)]}
    ckpt.save(2, big, {"next_index": 22})
    print("STEP2_STARTED", flush=True)
    time.sleep(600)
    """
)


def test_sigkill_during_save_leaves_previous_checkpoint_restorable(tmp_path):
    """A save cut short is never taken for a complete step: the step's folder is written in place and
    exists half-written (as a gcsfuse folder rename cut short would leave it), without its commit file."""
    directory = str(tmp_path / "ckpt")
    env = child_env()
    proc = subprocess.Popen(
        [sys.executable, "-c", _SAVER, directory], stdout=subprocess.PIPE, text=True, env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    try:
        assert proc.stdout.readline().strip() == "STEP1_DONE"
        deadline = time.time() + 120
        while not os.path.isdir(os.path.join(directory, "2")):
            assert time.time() < deadline, "step-2 save never started"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not os.path.exists(os.path.join(directory, "2", COMMIT_FILE_NAME)), "save finished before the kill"

    target = {"w": jnp.zeros((4, 4), jnp.float32), "step": jnp.int32(0)}
    with Checkpointer(directory, keep=5) as ckpt:
        assert ckpt.latest_step() == 1
        assert ckpt.uncommitted_steps() == [2] and "steps [2] have no" in cut_short_note(ckpt)
        restored, position = ckpt.restore(target)
        np.testing.assert_array_equal(np.asarray(restored["w"]), np.full((4, 4), 1.5, np.float32))
        assert int(restored["step"]) == 1
        assert position == {"next_index": 11}
        # The resumed run saves step 2 again over what was cut short.
        ckpt.save(2, {**target, "step": jnp.int32(2)}, {"next_index": 22})
        ckpt.wait_until_finished()
        assert ckpt.latest_step() == 2 and ckpt.uncommitted_steps() == []


def test_the_demo_stages_refuse_a_run_dir_with_checkpoints_before_training(tmp_path):
    """Re-running the notebook's SFT cell trained the whole stage again, then failed at its first save
    (orbax: step 3 already exists) with the metrics appended to the first run's."""
    from aepo_jax.experiment import train_rl
    from aepo_jax.experiment_sft import train_sft
    from configs.demo import get_config

    run_dir = tmp_path / "sft"
    os.makedirs(run_dir / "checkpoints" / "3")
    (run_dir / "checkpoints" / "3" / COMMIT_FILE_NAME).write_text("")
    os.makedirs(run_dir / "checkpoints" / "4")  # cut short: counted too
    with pytest.raises(ValueError, match=r"sft already holds checkpoints \(steps \[3, 4\]\): remove that folder"):
        train_sft(get_config("smoke"), None, str(tmp_path), str(run_dir))  # no environment: nothing ran
    with pytest.raises(ValueError, match=r"sft already holds checkpoints"):
        train_rl(get_config("smoke"), None, None, None, str(tmp_path), str(run_dir))


def test_a_checkpoint_directory_that_cannot_be_written_is_refused_before_training(tmp_path):
    """It was found at the first save, after the training (with checkpoint.every=0, all of it), and orbax's
    background threads then held the process for 300 s."""
    from aepo_jax.training.checkpoint import Checkpointer

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(PermissionError, match=r"checkpoint directory .*a_file/checkpoints is not writable"):
        Checkpointer(str(blocker / "checkpoints"))
    Checkpointer(str(tmp_path / "fine" / "checkpoints")).close()
    assert os.listdir(tmp_path / "fine" / "checkpoints") == []  # the probe leaves nothing behind


def _saved_steps(directory: str, steps, keep: int = 3) -> dict:
    small = {"w": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64), "step": jnp.int32(0)}  # 16 KB of data to cut
    with Checkpointer(directory, keep=keep, async_save=False) as ckpt:
        for step in steps:
            ckpt.save(step, {**small, "step": jnp.int32(step)}, {"next_index": step})
    return small


def _cut_deletion_short(step_dir) -> None:
    """What a process killed while orbax's max_to_keep deleted `step_dir` file by file leaves: the commit
    file and some of the files gone, the rest still there."""
    os.remove(os.path.join(step_dir, COMMIT_FILE_NAME))
    state = os.path.join(step_dir, "state")
    for name in sorted(os.listdir(state))[::2]:
        path = os.path.join(state, name)
        if os.path.isfile(path):
            os.remove(path)


def test_a_deletion_cut_short_is_named_as_such_and_removed_when_the_owner_opens_the_folder(tmp_path):
    """A kill while max_to_keep deleted an old step left its folder without the commit file for good, and
    it was reported as a save cut short. Older than the newest complete step, it is a deletion cut short:
    the training run's Checkpointer (process 0) removes it; a save cut short (newer) stays, to be saved over."""
    directory = str(tmp_path / "ckpt")
    target = _saved_steps(directory, [1, 2, 3])
    _cut_deletion_short(os.path.join(directory, "1"))
    os.makedirs(os.path.join(directory, "4", "state"))  # a save cut short
    with Checkpointer(directory, keep=3) as reader:  # a reader (an evaluation) leaves the folder as it is
        note = cut_short_note(reader)
        assert "steps [4] have no" in note and "saves were cut short" in note
        assert "steps [1] have no" in note and "deleting them beyond checkpoint.keep" in note
    assert sorted(os.listdir(directory)) == ["1", "2", "3", "4"]
    with Checkpointer(directory, keep=3, clean_up_deletions=True) as owner:
        assert sorted(os.listdir(directory)) == ["2", "3", "4"]
        assert owner.latest_step() == 3 and owner.uncommitted_steps() == [4]
        restored, _ = owner.restore(target)
        assert int(restored["step"]) == 3
        owner.save(4, {**target, "step": jnp.int32(4)}, {"next_index": 4})
        owner.wait_until_finished()
        assert owner.all_steps() == [2, 3, 4] and owner.uncommitted_steps() == []


def test_an_uncommitted_folder_is_never_removed_without_a_newer_complete_step(tmp_path):
    """The only folders are uncommitted (saves cut short, no complete step): nothing is removed."""
    directory = str(tmp_path / "ckpt")
    _saved_steps(directory, [1, 2])
    for step in ("1", "2"):
        os.remove(os.path.join(directory, step, COMMIT_FILE_NAME))
    Checkpointer(directory, clean_up_deletions=True).close()
    assert sorted(os.listdir(directory)) == ["1", "2"]


def _truncate_arrays(step_dir) -> None:
    """Cut every array data file of the step's state to half its length (a disk that filled up, a copy cut
    short): the step keeps its commit file."""
    data = os.path.join(step_dir, "state", "ocdbt.process_0", "d")
    assert os.listdir(data)
    for name in os.listdir(data):
        path = os.path.join(data, name)
        os.truncate(path, os.path.getsize(path) // 2)


def test_a_damaged_newest_step_names_its_folder_and_the_older_steps_instead_of_a_tensorstore_trace(tmp_path):
    """A truncated array file in the newest committed step gave a raw TensorStore traceback on resume. The
    error names the step folder and the older complete steps to fall back to (by moving the damaged one
    away); nothing is restored in its place."""
    from aepo_jax.training.checkpoint import DamagedCheckpointError

    directory = str(tmp_path / "ckpt")
    target = _saved_steps(directory, [1, 2, 3])
    _truncate_arrays(os.path.join(directory, "3"))
    with Checkpointer(directory) as ckpt:
        assert ckpt.latest_step() == 3  # still committed: it is not skipped
        with pytest.raises(DamagedCheckpointError) as caught:
            ckpt.restore(target)
        message = str(caught.value)
        assert f"checkpoint {directory}/3 cannot be read" in message
        assert "Older complete steps: [1, 2]" in message and f"mv {directory}/3 " in message
        assert "TensorStore({" not in message and len(message) < 1200
        assert isinstance(caught.value, ValueError)  # the launcher turns it into one `error:` line
        restored, position = ckpt.restore(target, step=2)  # the fallback it names works
        assert int(restored["step"]) == 2 and position == {"next_index": 2}


def test_a_damaged_only_step_says_there_is_nothing_to_fall_back_to(tmp_path):
    from aepo_jax.training.checkpoint import DamagedCheckpointError

    directory = str(tmp_path / "ckpt")
    target = _saved_steps(directory, [1])
    with open(os.path.join(directory, "1", "data", "metadata"), "w") as f:
        f.write('{"next_')  # the data position, cut short
    with Checkpointer(directory) as ckpt:
        with pytest.raises(DamagedCheckpointError, match=r"checkpoint .*/1 cannot be read .*no older complete step"):
            ckpt.data_position(1)
        with pytest.raises(DamagedCheckpointError, match=r"/1 cannot be read"):
            ckpt.restore(target)


@pytest.mark.parametrize("item", ["state", "data"])
def test_a_step_that_lost_an_items_folder_is_a_damaged_step(tmp_path, item):
    """A committed step whose `state/` or `data/` folder is gone (a partial copy, a cleanup by hand) gave
    orbax's `KeyError: 'Item "state" was not found in the checkpoint...'` as a traceback on resume."""
    import shutil

    from aepo_jax.training.checkpoint import DamagedCheckpointError

    directory = str(tmp_path / "ckpt")
    target = _saved_steps(directory, [1, 2])
    shutil.rmtree(os.path.join(directory, "2", item))
    with Checkpointer(directory) as ckpt:
        with pytest.raises(DamagedCheckpointError, match=r"checkpoint .*/2 cannot be read.*Older complete steps: \[1\]"):
            ckpt.restore(target)
        restored, _ = ckpt.restore(target, step=1)
        assert int(restored["step"]) == 1


def test_a_target_of_another_structure_is_not_taken_for_a_damaged_step(tmp_path):
    from aepo_jax.training.checkpoint import DamagedCheckpointError

    directory = str(tmp_path / "ckpt")
    target = _saved_steps(directory, [1])
    with Checkpointer(directory) as ckpt, pytest.raises(ValueError, match="tree structures do not match") as caught:
        ckpt.restore({**target, "extra": jnp.zeros(3)})
    assert not isinstance(caught.value, DamagedCheckpointError)


_FOLDER_GONE = textwrap.dedent(
    """
    import os, shutil, sys, time
    import jax.numpy as jnp
    from aepo_jax.training.checkpoint import Checkpointer
    directory = sys.argv[1]
    ckpt = Checkpointer(directory)  # asynchronous saves
    ckpt.save(1, {"w": jnp.ones(4)}, {})
    ckpt.wait_until_finished()
    shutil.rmtree(directory)
    open(directory, "w").close()  # a file where the folder was: no step folder can be made
    started = time.monotonic()
    try:
        ckpt.save(2, {"w": jnp.ones(4)}, {})
        ckpt.wait_until_finished()
    except OSError as err:
        print("REFUSED", type(err).__name__, flush=True)
    try:
        ckpt.close()
    except OSError:
        pass
    print(f"EXITING after {time.monotonic() - started:.1f} s", flush=True)
    """
)


def test_a_save_that_cannot_make_its_folder_fails_at_once_and_the_process_exits(tmp_path):
    """Orbax made the step folder on a background thread by default: a folder that could not be made left
    the save's threads waiting 300 s for it, holding the process before it could exit."""
    directory = str(tmp_path / "ckpt")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", _FOLDER_GONE, directory], capture_output=True, text=True,
                         env=child_env(), timeout=150, check=False,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED NotADirectoryError" in out.stdout, out.stdout + out.stderr[-3000:]
    assert time.monotonic() - started < 120


def test_reading_only_the_params_of_a_damaged_step_names_it_too(tmp_path):
    """`restore_params` (what evaluation reads) gave the raw TensorStore trace, which evaluation then called
    a checkpoint that does not fit the model."""
    from aepo_jax.training.checkpoint import DamagedCheckpointError

    directory = str(tmp_path / "ckpt")
    state = {"params": {"w": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64)}, "step": jnp.int32(0)}
    with Checkpointer(directory, async_save=False) as ckpt:
        for step in (1, 2):
            ckpt.save(step, {**state, "step": jnp.int32(step)}, {"next_index": step})
    _truncate_arrays(os.path.join(directory, "2"))
    with Checkpointer(directory) as ckpt:
        with pytest.raises(DamagedCheckpointError, match=rf"checkpoint {directory}/2 cannot be read.*Older complete "
                                                         r"steps: \[1\]"):
            ckpt.restore_params(state["params"], step=2)
        np.testing.assert_array_equal(ckpt.restore_params(state["params"], step=1)["w"], state["params"]["w"])


def test_reading_only_the_params_of_an_uncommitted_step_is_refused(tmp_path):
    """`restore_params` opened the step's folder directly, past the manager's commit check: evaluating
    `.../checkpoints/2` of a save cut short (no commit file) read its values as a finished step's."""
    directory = str(tmp_path / "ckpt")
    state = {"params": {"w": jnp.arange(16, dtype=jnp.float32).reshape(4, 4)}, "step": jnp.int32(0)}
    with Checkpointer(directory, async_save=False) as ckpt:
        for step in (1, 2):
            ckpt.save(step, {**state, "step": jnp.int32(step)}, {"next_index": step})
    os.remove(os.path.join(directory, "2", COMMIT_FILE_NAME))
    with Checkpointer(directory) as ckpt:
        with pytest.raises(FileNotFoundError, match=rf"checkpoint {directory}/2 was never completed .*complete "
                                                    r"steps: \[1\]"):
            ckpt.restore_params(state["params"], step=2)
        with pytest.raises(FileNotFoundError, match=rf"checkpoint {directory}/7 does not exist"):
            ckpt.restore_params(state["params"], step=7)
        np.testing.assert_array_equal(ckpt.restore_params(state["params"], step=1)["w"], state["params"]["w"])

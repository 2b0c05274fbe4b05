"""Orbax checkpoints: exact round trip, keep-N, and a SIGKILL mid-save."""

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

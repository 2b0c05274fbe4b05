"""Orbax checkpoints of the train state plus the data-pipeline position.

Saves are asynchronous and keep the newest `keep` steps. Orbax writes each
step in place and, once every file is written, a `commit_success.txt` in it
(`COMMIT_FILE` atomicity), so a process killed mid-save leaves only complete
steps visible: `latest_step()` and `restore()` use the newest committed one
(tested with a SIGKILLed subprocess). Orbax's default on a local path, a
temporary folder renamed when done, is atomic on a local disk but not on a
gcsfuse bucket, which renames a folder object by object: a preempted rename
could leave a partial step (with its commit file, written before the rename)
that looked complete. Steps saved that way carry the commit file too, so
their runs resume unchanged.
Restoring goes through an abstract target (shapes, dtypes, shardings), so
optax tuples come back as tuples and arrays land on the requested devices.
The target's shapes are checked against the step's metadata before any array
is read, so a checkpoint of another model is a `ValueError` naming the leaf
(and no half-started read is left behind); a target of another dtype gets the
saved values cast to it.

A step whose files cannot be read (a disk that filled up, a file cut short
after the save) is a `DamagedCheckpointError` naming its folder and the older
complete steps to fall back to by hand; no older step is taken silently.

Orbax deletes a step beyond `keep` file by file, in no set order: a process
killed meanwhile leaves a partial folder older than the newest complete step.
Without its commit file orbax never looks at it again, so the trainer's
process 0 removes it when it opens the directory (`remove_cut_short_deletions`);
with the commit file still there it counts as a step, and orbax deletes it
again at the next save. An uncommitted folder newer than the newest complete
step is a save cut short, which the resumed run saves again over.

Step folders are made before `save` returns (orbax's `AsyncOptions(
create_directories_asynchronously=False)`): a folder that cannot be made is an
OSError there, where by default orbax's background threads waited 300 s for
it before the process could exit.

A run that rolls out ahead (`train.rollout_ahead`) also saves the parameters
its next rollout samples with (item `rollout_params`), so a resumed run
samples that rollout as the uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from typing import Any, Self

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from aepo_jax.parallel.distributed import wait_for_every_process
from aepo_jax.run_paths import require_local_path
from aepo_jax.training.tree_paths import path_names


def _leaves_by_path(tree: Any, is_leaf: Any = None) -> dict[tuple[str, ...], Any]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    return {path_names(path): leaf for path, leaf in leaves}


def check_fits_metadata(abstract: Any, metadata: Any, where: str) -> None:
    """Raise ValueError naming the first leaf whose shape differs from the saved one.

    Leaves are matched by key path; a target with leaves the checkpoint lacks
    (or the other way round) is left to orbax, which names the missing keys.
    """
    is_array_meta = lambda x: hasattr(x, "shape") and hasattr(x, "dtype")
    saved = _leaves_by_path(metadata, is_leaf=is_array_meta)
    for path, leaf in _leaves_by_path(abstract).items():
        stored = saved.get(path)
        if stored is None or not is_array_meta(stored) or not hasattr(leaf, "shape"):
            continue
        if tuple(stored.shape) != tuple(leaf.shape):
            raise ValueError(
                f"checkpoint {where} does not fit the target at {'.'.join(path)}: saved "
                f"{jnp.dtype(stored.dtype).name}{list(stored.shape)}, target "
                f"{jnp.dtype(leaf.dtype).name}{list(leaf.shape)}"
            )


def abstract_like(tree: Any, shardings: Any | None = None) -> Any:
    """ShapeDtypeStructs of `tree`, optionally with new `shardings` (same structure)."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    if shardings is None:
        return abstract
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )


COMMIT_FILE_NAME = "commit_success.txt"  # what orbax's COMMIT_FILE protocol writes last into a step
ROLLOUT_PARAMS = "rollout_params"  # the item of the parameters the next rollout samples with


def step_folders(directory: str) -> tuple[list[int], list[int]]:
    """(complete steps, uncommitted step folders) in a checkpoint folder, read from the disk alone (no
    manager, no collective): a step is complete once orbax has written its commit file. An uncommitted
    folder is a save cut short, or (older than the newest complete step) a deletion cut short
    (`split_cut_short`)."""
    if not os.path.isdir(directory):
        return [], []
    steps = sorted(int(n) for n in os.listdir(directory) if n.isdigit())
    complete = [s for s in steps if os.path.exists(os.path.join(directory, str(s), COMMIT_FILE_NAME))]
    return complete, [s for s in steps if s not in complete]


def split_cut_short(complete: list[int], uncommitted: list[int]) -> tuple[list[int], list[int]]:
    """(saves cut short, deletions cut short) among the `uncommitted` step folders.

    Orbax saves steps in increasing order and deletes the oldest beyond `keep` only after a newer step has
    committed, so an uncommitted folder older than the newest complete step is a deletion cut short (never
    the run's only checkpoint: that newer complete step exists); any other is a save cut short."""
    newest = max(complete, default=None)
    deletions = [s for s in uncommitted if newest is not None and s < newest]
    return [s for s in uncommitted if s not in deletions], deletions


def require_writable(directory: str) -> None:
    """A PermissionError (an OSError) naming `directory` when a step folder cannot be made in it: found at the
    first save, a read-only or immutable folder, a quota or an unmounted bucket lost the training done
    before it (with checkpoint.every=0, all of it), and orbax's background threads then hung for 300 s."""
    probe = os.path.join(directory, f".write-probe-{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as err:
        raise PermissionError(f"checkpoint directory {directory} is not writable ({err}): fix it before "
                              "training, or no step can be saved") from err


def require_no_checkpoints(run_dir: str) -> None:
    """A ValueError, before anything is trained, when `run_dir`'s checkpoints/ already holds steps: a
    fresh run there would fail only at its first save, once the training is done (orbax refuses to
    overwrite a step), with its metrics appended to the earlier run's."""
    complete, cut_short = step_folders(os.path.join(run_dir, "checkpoints"))
    steps = complete + cut_short
    if steps:
        raise ValueError(f"{run_dir} already holds checkpoints (steps {sorted(steps)}): remove that folder to "
                         "train again from the start, or choose another")


def cut_short_note(checkpointer: Checkpointer) -> str:
    """": steps [...] have no commit file ..." for a folder with uncommitted step folders, saying which
    were saves and which deletions cut short; else ""."""
    complete, uncommitted = step_folders(checkpointer.directory)
    saves, deletions = split_cut_short(complete, uncommitted)
    notes = []
    if saves:
        notes.append(f"steps {saves} have no {COMMIT_FILE_NAME} (their saves were cut short; they are never "
                     "restored)")
    if deletions:
        notes.append(f"steps {deletions} have no {COMMIT_FILE_NAME} (older than step {max(complete)}: orbax was "
                     "deleting them beyond checkpoint.keep when the process stopped; never restored, and removed "
                     "when the run next starts)")
    return (": " + "; ".join(notes)) if notes else ""


def remove_cut_short_deletions(directory: str) -> list[int]:
    """Remove the step folders of deletions cut short (`split_cut_short`) from `directory`; returns their steps.

    Call on one process only, while no save or deletion runs there. A folder that cannot be removed is
    left with a warning: it is never restored, only a leftover."""
    complete, uncommitted = step_folders(directory)
    _, deletions = split_cut_short(complete, uncommitted)
    removed = []
    for step in deletions:
        try:
            shutil.rmtree(os.path.join(directory, str(step)))
            removed.append(step)
        except OSError as err:
            warnings.warn(f"could not remove {directory}/{step}, an old checkpoint whose deletion was cut short "
                          f"({err}); it is never restored, remove it by hand", stacklevel=2)
    return removed


def agree_on_latest_step(views: list[list[int]], directory: str) -> int | None:
    """The newest complete step of process 0's view (`views`: every process's complete steps), which every
    process must see complete too; a ValueError naming the processes that do not (a listing that lags
    on a network filesystem's cache: they would resume from an older step and train on mismatched
    state)."""
    newest = max(views[0], default=None)
    lagging = [process for process, steps in enumerate(views) if newest is not None and newest not in steps]
    if lagging:
        seen = {process: max(views[process], default=None) for process in lagging}
        raise ValueError(f"process 0 resumes from step {newest} of {directory}, but processes {lagging} do not "
                         f"see that step complete (their newest: {seen}): every host must see the same "
                         "checkpoint folder; wait for the shared filesystem to catch up (or remount it) and "
                         "resume again")
    return newest


class DamagedCheckpointError(ValueError):
    """A complete (committed) step whose files cannot be read; the message names its folder and the older
    complete steps to fall back to. A ValueError, as a checkpoint that does not fit the model is."""


# What reading a step's damaged or missing files raises: tensorstore's status errors about a file, and
# orbax's JSON metadata (a truncated `_METADATA`, or the data position) that no longer parses.
_FILE_ERROR = re.compile(r"^[A-Z_]+: Error (reading|decoding|opening) ")
# orbax's KeyError for an item whose folder is gone from a committed step (`state/` or `data/` deleted).
_MISSING_ITEM = re.compile(r'Item "[^"]+" was not found in the checkpoint')


def _read_failure(err: BaseException) -> BaseException | None:
    """The error in `err`'s chain that says a file could not be read, or None (a read that failed for
    another reason: a target of another structure, memory)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, (json.JSONDecodeError, OSError)) or _FILE_ERROR.match(str(err)) or \
                (isinstance(err, KeyError) and _MISSING_ITEM.search(str(err))):
            return err
        err = err.__cause__ or err.__context__
    return None


class Checkpointer:
    """Thin wrapper over `ocp.CheckpointManager` with items `state`, `data` and, when given,
    `rollout_params`."""

    def __init__(self, directory: str, keep: int = 3, async_save: bool = True, save_every: int = 1,
                 clean_up_deletions: bool = False):
        """`clean_up_deletions`: process 0 removes the folders of deletions cut short first (the
        training run that owns the directory; not a reader such as an evaluation of a run still training,
        which would race its deletions)."""
        self.directory = os.path.abspath(require_local_path(directory, "checkpoint directory"))
        if jax.process_index() == 0:
            require_writable(self.directory)
            if clean_up_deletions:  # before the processes meet below: none lists the steps meanwhile
                remove_cut_short_deletions(self.directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            save_interval_steps=save_every,
            enable_async_checkpointing=async_save,
            create=True,
            atomicity_options=ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE),
            # A step folder that cannot be made fails `save` itself (see the module docstring).
            async_options=ocp.options.AsyncOptions(create_directories_asynchronously=False),
        )
        # The manager's first step is a device collective over every process; they meet here first, so a
        # host that started up slower than the others does not fail that collective (see the barrier).
        # The name holds no path: hosts may mount the run's folder at different paths.
        wait_for_every_process("checkpoint.Checkpointer")
        self._manager = ocp.CheckpointManager(
            self.directory, options=options,
            item_handlers={"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
                           ROLLOUT_PARAMS: ocp.StandardCheckpointHandler()},
        )

    def save(self, step: int, state: Any, data_position: dict | None = None, force: bool = False,
             rollout_params: Any = None) -> bool:
        """Start saving `state`, the JSON-able `data_position` and (when given) `rollout_params` at
        `step`; returns if saved."""
        items = {"state": ocp.args.StandardSave(state), "data": ocp.args.JsonSave(dict(data_position or {}))}
        if rollout_params is not None:
            items[ROLLOUT_PARAMS] = ocp.args.StandardSave(rollout_params)
        return self._manager.save(int(step), args=ocp.args.Composite(**items), force=force)

    def latest_step(self) -> int | None:
        """Newest complete step on disk (unfinished temporary saves are ignored)."""
        self._manager.reload()
        return self._manager.latest_step()

    def agreed_latest_step(self) -> int | None:
        """`latest_step` as process 0 sees it, checked to be complete on every process
        (`agree_on_latest_step`; a collective)."""
        from aepo_jax.parallel.multihost import gather_objects

        return agree_on_latest_step(gather_objects(self.all_steps()), self.directory)

    def all_steps(self) -> list[int]:
        self._manager.reload()
        return list(self._manager.all_steps())

    def uncommitted_steps(self) -> list[int]:
        """Step folders without a commit file: saves cut short (never restored)."""
        return step_folders(self.directory)[1]

    def restore(self, target: Any, step: int | None = None, shardings: Any | None = None) -> tuple[Any, dict]:
        """Restore (state, data_position) at `step` (default newest complete).

        Args:
          target: a concrete or abstract state with the saved structure.
          shardings: optional pytree of shardings for the restored arrays; by
            default those of `target` (if it has any).
        """
        if step is None:
            step = self.latest_step()
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        abstract = abstract_like(target, shardings)
        with self._reading(step):
            self._check_fits(step, "state", abstract)
            restored = self._manager.restore(
                int(step),
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract),
                    data=ocp.args.JsonRestore(),
                ),
            )
        return restored.state, dict(restored.data or {})

    def data_position(self, step: int) -> dict:
        """Only the JSON data position saved at `step` (no array is read)."""
        with self._reading(step):
            restored = self._manager.restore(int(step), args=ocp.args.Composite(data=ocp.args.JsonRestore()))
        return dict(restored.data or {})

    @contextlib.contextmanager
    def _reading(self, step: int) -> Iterator[None]:
        """Turn a failure to read `step`'s files into a `DamagedCheckpointError` (other errors pass)."""
        try:
            yield
        except Exception as err:
            failure = _read_failure(err)
            if failure is None:
                raise
            raise DamagedCheckpointError(self._damaged_message(int(step), failure)) from err

    def _damaged_message(self, step: int, failure: BaseException) -> str:
        folder = os.path.join(self.directory, str(step))
        cause = (str(failure).splitlines() or [type(failure).__name__])[0][:300]
        message = (f"checkpoint {folder} cannot be read ({type(failure).__name__}: {cause}): its files are "
                   "damaged or missing (a disk that filled up, a file cut short or changed after the save). "
                   "Nothing was restored, and no older step is taken in its place silently (that would undo "
                   "the training since it).")
        older = [s for s in step_folders(self.directory)[0] if s < step]
        if not older:
            return message + (f" There is no older complete step in {self.directory} to fall back to: the run "
                              "must start again from step 0 (in a new workdir, or after moving this one away).")
        aside = os.path.join(os.path.dirname(self.directory), f"damaged-step-{step}")
        return message + (f" Older complete steps: {older}. To continue from step {older[-1]} (the steps after it "
                          f"are trained again), move the damaged folder out of the checkpoint folder, e.g. "
                          f"`mv {folder} {aside}`, and resume again.")

    def restore_params(self, target: Any, step: int, shardings: Any | None = None) -> Any:
        """Only the `params` of the `TrainState` saved at `step`, shaped like `target` (checked against the
        saved shapes) and placed by `shardings`. The optimiser state is never read: evaluating a run needs
        neither its memory (twice the parameters' with Adam) nor the run's optimiser settings."""
        self._require_committed(int(step))
        item = {"params": abstract_like(target, shardings)}
        restore_args = jax.tree.map(
            lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding, global_shape=a.shape, dtype=a.dtype), item)
        # The manager's `state` handler restores whole trees; the PyTree handler it wraps reads a subtree.
        with self._reading(step), ocp.PyTreeCheckpointer() as reader:
            self._check_fits(step, "state", item)
            restored = reader.restore(os.path.join(self.directory, str(int(step)), "state"),
                                      args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args,
                                                                  partial_restore=True))
        return restored["params"]

    def _require_committed(self, step: int) -> None:
        """A FileNotFoundError unless `step` is a complete save. Reading a step's item by its folder (as
        `restore_params` does) bypasses the manager's check: a save cut short was read as good, its
        missing chunks as fill values."""
        complete, uncommitted = step_folders(self.directory)
        if step in complete:
            return
        what = (f"was never completed (no {COMMIT_FILE_NAME}: a save cut short, or still being written)"
                if step in uncommitted else "does not exist")
        raise FileNotFoundError(f"checkpoint {self.directory}/{step} {what}; complete steps: {complete or 'none'}")

    def has_rollout_params(self, step: int) -> bool:
        """Whether `step` holds a `rollout_params` item (saved by a run that rolls out ahead)."""
        return os.path.isdir(os.path.join(self.directory, str(int(step)), ROLLOUT_PARAMS))

    def restore_rollout_params(self, target: Any, step: int, shardings: Any | None = None) -> Any:
        """The `rollout_params` item of `step`, shaped like `target` (checked against the saved shapes)."""
        if not self.has_rollout_params(step):
            raise FileNotFoundError(f"checkpoint {self.directory}/{int(step)} has no {ROLLOUT_PARAMS}")
        abstract = abstract_like(target, shardings)
        with self._reading(step):
            self._check_fits(step, ROLLOUT_PARAMS, abstract)
            restored = self._manager.restore(int(step), args=ocp.args.Composite(
                **{ROLLOUT_PARAMS: ocp.args.StandardRestore(abstract)}))
        return restored[ROLLOUT_PARAMS]

    def _check_fits(self, step: int, item: str, abstract: Any) -> None:
        """`check_fits_metadata` of `abstract` (a tree, or a subtree under its own keys) against item `item`
        saved at `step`, before anything is read."""
        metadata = self._manager.item_metadata(int(step))
        saved = metadata[item] if metadata is not None and item in metadata else None
        if saved is not None:
            check_fits_metadata(abstract, getattr(saved, "tree", saved), f"{self.directory}/{int(step)}")

    def wait_until_finished(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

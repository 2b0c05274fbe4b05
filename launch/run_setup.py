"""Shared start-up of the `launch` training entry points: check the settings before anything is built,
check that every host sees one WORKDIR, print and save the resolved config, refuse to mix a new run
into an old workdir, and report a configuration error as one line (`launch.config_args` checks the
command line before this runs)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import warnings
from collections.abc import Callable, Iterator, Sequence

import ml_collections

from launch.config_args import configuration_errors, quiet_library_logs
from launch.resume_check import (
    check_resume_config,
    check_run_sources,
    keep_fixed_settings,
    write_run_sources,
)

# Held (flock) by process 0 of the run that trains in a workdir, for the whole run.
WORKDIR_LOCK = ".run.lock"


def require_workdir(workdir: str) -> None:
    """`error: ...` (SystemExit) when WORKDIR is a URL (`run_paths.require_local_path`) or a path that exists
    and is not a folder (a file given by mistake: a traceback out of `os.makedirs` before)."""
    from aepo_jax.run_paths import require_local_path

    try:
        require_local_path(workdir, "--workdir")
    except ValueError as err:
        raise SystemExit(f"error: {err}") from err
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise SystemExit(f"error: --workdir {workdir} exists and is not a folder; a run's workdir is a folder "
                         "(created if missing) for its config, metrics and checkpoints: choose another path")


@contextlib.contextmanager
def workdir_lock(workdir: str) -> Iterator[None]:
    """Hold WORKDIR/.run.lock while a run trains there; a second run in the same workdir (a duplicated job, a
    relaunch while the old process lives) exits naming it instead of mixing its checkpoints and metrics into
    the first's. The lock is the kernel's (`flock`), so a crashed run leaves none behind; on a filesystem
    without `flock` the run goes on with a warning."""
    require_workdir(workdir)
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, WORKDIR_LOCK)
    handle = open(path, "a+")  # noqa: SIM115 - held open for the duration of the run
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise SystemExit(f"error: another run is training in {workdir} (lock {path} held by {holder}); "
                             "stop it first or choose another --workdir") from None
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            warnings.warn(f"{workdir}: this filesystem cannot lock files ({err}); "
                          "nothing stops a second run from using the same workdir", stacklevel=2)
        else:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
            handle.flush()
        yield
    finally:
        handle.close()


def prepare_workdir(cfg: ml_collections.ConfigDict, workdir: str, resume: bool, process_index: int = 0,
                    allow_config_changes: bool = False) -> str:
    """Create WORKDIR, print the config, write WORKDIR/config.json and sources.json (the fingerprints of the
    files the run starts from, `aepo_jax.run_sources`); a resumed run checks both against the saved ones
    instead (`launch.resume_check`) and leaves the config's writing to the run. Returns config.json's path.

    Without `resume`, a workdir that already holds checkpoints is an error, so
    a run never silently trains on top of (or next to) another one; with it, a workdir without one
    is an error too (an unmounted bucket or a mistyped path would otherwise start again from step 0).
    A fresh start in a workdir whose earlier attempt died before its first checkpoint moves that
    attempt's metrics.jsonl and tensorboard/ aside (`metrics_log.set_aside_earlier_attempt`), so its
    records do not mix into the new run's.
    """
    from aepo_jax.training.checkpoint import step_folders
    from aepo_jax.training.metrics_log import set_aside_earlier_attempt

    require_workdir(workdir)
    checkpoints = os.path.join(workdir, "checkpoints")
    complete, cut_short = step_folders(checkpoints)
    if not resume and complete:
        raise SystemExit(f"{workdir} already has checkpoints; pass --resume to continue that run "
                         "or choose another --workdir")
    if resume and not complete:
        detail = f" (steps {cut_short} were cut short while saving)" if cut_short else \
            " (is the bucket mounted? is --workdir right?)"
        raise SystemExit(f"--resume: {checkpoints} holds no complete checkpoint{detail}; leave out --resume "
                         "to start the run again")
    if resume and complete[-1] > int(cfg.train.total_steps):
        raise SystemExit(f"--resume: the run's newest checkpoint is step {complete[-1]}, past its "
                         f"total_steps={cfg.train.total_steps}: there is nothing left to train; resume with "
                         f"a total_steps of at least {complete[-1]}")
    path = os.path.join(workdir, "config.json")
    if resume:
        keep_fixed_settings(cfg, workdir)  # the init checkpoint's step the run started from
    resolved = json.loads(cfg.to_json_best_effort())
    if resume:
        changed = check_resume_config(workdir, resolved, allow_config_changes, keep_old=process_index == 0)
        if changed and process_index == 0:
            print(f"--resume: config changes accepted: {changed}", flush=True)
        check_run_sources(workdir, cfg, allow_config_changes, keep_old=process_index == 0)
    if process_index == 0:
        os.makedirs(workdir, exist_ok=True)
        print("resolved config:\n" + str(cfg), flush=True)
        if not resume:
            moved = set_aside_earlier_attempt(workdir)
            if moved:
                print(f"a fresh start: the earlier attempt's records were moved to {moved}", flush=True)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(resolved, f, indent=2, sort_keys=True)
            write_run_sources(workdir, cfg)
    return path


def define_run_flags() -> tuple:
    """`--config`, `--workdir`, `--resume` and `--allow_config_changes` of the training entry points (call
    once, at import), listed by the entry point's `--help`."""
    from absl import flags
    from ml_collections import config_flags

    # The flags are the calling entry point's own (its key flags, which `--help` lists), not this module's.
    flags.disclaim_key_flags()
    config = config_flags.DEFINE_config_file("config", None, "experiment config file (configs/*.py[:arg])",
                                             lock_config=True)
    flags.declare_key_flag("config")  # config_flags names the module that called it: this one
    workdir = flags.DEFINE_string("workdir", None, "run directory: metrics, checkpoints, config")
    resume = flags.DEFINE_bool("resume", False, "continue from the newest complete checkpoint in WORKDIR")
    allow_changes = flags.DEFINE_bool("allow_config_changes", False,
                                      "with --resume: accept config settings that differ from the run's "
                                      "(launch/resume_check.py; the old config is kept beside it)")
    flags.mark_flags_as_required(["config", "workdir"])
    return config, workdir, resume, allow_changes


def require_same_run(cfg: ml_collections.ConfigDict, env) -> None:
    """A ValueError on every process when the processes hold different configs, data or tokenizers
    (`parallel.agreement`): each reads its own command line and builds its own environment."""
    from aepo_jax.data.pipeline import data_digest
    from aepo_jax.experiment_tokenizer import tokenizer_fingerprint
    from aepo_jax.parallel.agreement import digest, require_agreement

    require_agreement({"config": digest(json.loads(cfg.to_json_best_effort())),
                       "training data": data_digest(env.examples), "held-out data": data_digest(env.heldout),
                       "tokenizer": digest(tokenizer_fingerprint(env.tokenizer))})


def process_environment_dir(workdir: str, process_index: int) -> str:
    """Where a process keeps its environment's files (task files, tfds data, tokenizer): WORKDIR for
    the first process, WORKDIR/env-process-N for the others, so hosts that share the workdir never
    write the same files at once."""
    return workdir if process_index == 0 else os.path.join(workdir, f"env-process-{process_index}")


def process_environment(cfg: ml_collections.ConfigDict, workdir: str, process_index: int):
    """This process's `Environment` (`aepo_jax.experiment.environment_from`) in its own folder
    (`process_environment_dir`). With several processes the first builds its own first; the others
    then start from a copy of its tokenizer (when it trained one), so every process encodes alike."""
    from aepo_jax.experiment import environment_from
    from aepo_jax.experiment_tokenizer import TOKENIZER_FILES, copy_tokenizer_files
    from aepo_jax.parallel.distributed import wait_for_every_process

    env_dir = process_environment_dir(workdir, process_index)
    if process_index == 0:
        env = environment_from(cfg, env_dir)
        try:
            wait_for_every_process("run_setup.first_environment")
        except BaseException:
            env.close()  # its tools' processes
            raise
        return env
    wait_for_every_process("run_setup.first_environment")
    trained = os.path.join(workdir, TOKENIZER_FILES[0])
    if not cfg.tokenizer.get("kind") and not cfg.tokenizer.get("path") and not os.path.exists(trained):
        raise ValueError(f"process {process_index} does not see {trained}, "
                         "which the first process trained: every host must see the same --workdir (a shared "
                         "folder or bucket mount)")
    os.makedirs(env_dir, exist_ok=True)
    copy_tokenizer_files(workdir, env_dir)
    return environment_from(cfg, env_dir)


def check_before_start(cfg: ml_collections.ConfigDict, process_index: int = 0, process_count: int = 1,
                       process_shares: Callable | None = None) -> None:
    """The settings a launch checks before any tool or model starts (after `jax.distributed` starts, so that
    every device is known): the agent loop's (`experiment.loop_config_from`), an attention kernel this
    platform has, a mesh shape that fits the devices (`training.build.make_mesh_from`) and a
    `model.checkpoint_dir` that is a checkpoint (its config.json, `models.hf_checkpoint.checkpoint_config`).
    `process_shares(cfg, mesh, process_index, process_count)` is the trainer's own check of what each
    process takes (RL: `training.rl_trainer.process_shares`, the global batch sizes divided by the
    processes). A bad one exits with `error: MESSAGE` (`config_args.configuration_errors`), as it would
    later while the run is built, but before the checkpoint is read and the environment built."""
    from aepo_jax.experiment import loop_config_from
    from aepo_jax.experiment_checks import require_runnable_attention
    from aepo_jax.models.hf_checkpoint import checkpoint_config
    from aepo_jax.training.build import make_mesh_from

    with configuration_errors(bool(cfg.get("verbose_logs", False))):
        loop_config_from(cfg)
        require_runnable_attention(cfg)
        mesh = make_mesh_from(cfg)
        if process_shares is not None:
            process_shares(cfg, mesh, process_index, process_count)
        # (A GGUF policy brings its own weights: `model_from` reads no checkpoint_dir then.)
        if cfg.model.get("checkpoint_dir") and cfg.tokenizer.get("kind") != "gguf":
            try:
                checkpoint_config(cfg.model.checkpoint_dir)
            except NotADirectoryError as err:
                raise SystemExit(f"error: {err}") from err


# Written by process 0 at every multi-process start, read by every process (`require_shared_workdir`).
SHARED_WORKDIR_TOKEN = ".shared-workdir-"


def shared_workdir_error(workdir: str, tokens_read: Sequence[str | None], expected: str) -> str | None:
    """The error for the processes whose `tokens_read` (process i's read of the token file process 0 wrote in
    WORKDIR; None: no such file) are not `expected`, or None when every process read it."""
    missing = [index for index, token in enumerate(tokens_read) if token != expected]
    if not missing:
        return None
    return (f"--workdir {workdir} is not one folder shared by every host: process(es) {missing} of "
            f"{len(tokens_read)} do not see the file process 0 wrote in it. It must be one shared folder at the "
            "same path on every host (e.g. the same bucket mounted with gcsfuse on every host, or a Filestore or "
            "NFS share), not each host's own disk: checkpoints are written by every host together, and the "
            "first save would wait forever")


def require_shared_workdir(workdir: str, process_index: int, process_count: int) -> None:
    """With several processes, a ValueError on every process unless every one sees the file process 0 writes
    (atomically) in WORKDIR: hosts given the same path on their own disks (a relative path, a bucket mounted
    on some hosts only) trained a step and then hung forever in the first checkpoint save. A collective:
    every process calls it at the same point. Each start writes a file of another name, so a filesystem
    cache (gcsfuse's) cannot answer with an earlier start's; process 0 removes it once all have read."""
    if process_count == 1:
        return
    from aepo_jax.atomic_write import write_json_atomically
    from aepo_jax.parallel.multihost import gather_objects
    from aepo_jax.run_paths import require_local_path

    require_local_path(workdir, "--workdir")
    token = None
    if process_index == 0:
        token = secrets.token_hex(16)
        os.makedirs(workdir, exist_ok=True)
        write_json_atomically(os.path.join(workdir, SHARED_WORKDIR_TOKEN + token), token)
    expected = gather_objects(token)[0]  # every process waits here until process 0 has written it
    path = os.path.join(workdir, SHARED_WORKDIR_TOKEN + expected)
    try:
        with open(path, encoding="utf-8") as f:
            read = json.load(f)
    except (OSError, ValueError):
        read = None
    tokens_read = gather_objects(read)
    if process_index == 0:
        with contextlib.suppress(OSError):
            os.remove(path)
    error = shared_workdir_error(workdir, tokens_read, expected)
    if error:
        raise ValueError(error)


def run_training(cfg: ml_collections.ConfigDict, workdir: str, resume: bool, make_trainer,
                 allow_config_changes: bool = False, process_shares: Callable | None = None) -> int:
    """The body `launch.train` and `launch.sft` share.

    Initialises multi-host JAX when the environment asks for it, checks the settings
    (`check_before_start`, with the trainer's `process_shares`) and that every process sees the one
    WORKDIR (`require_shared_workdir`), prepares
    WORKDIR, builds the environment (`aepo_jax.experiment.environment_from`:
    task, tokenizer, tools; each process in its own folder, `process_environment`), sizes a fresh model's vocabulary to the tokenizer,
    then `make_trainer(cfg, env,
    process_index, process_count)` -> a trainer that is resumed (with
    `resume`), trained and closed; the environment's processes are stopped
    whatever happens. A ValueError or FileNotFoundError while the run is built
    (not while it trains) exits with `error: MESSAGE`
    (`config_args.configuration_errors`; its traceback too with `verbose_logs`).
    """
    from aepo_jax.parallel.distributed import maybe_initialize_distributed

    verbose = bool(cfg.get("verbose_logs", False))
    quiet_library_logs(verbose)
    with configuration_errors(verbose):
        process_index, process_count = maybe_initialize_distributed(cfg.distributed)

    from aepo_jax.experiment import start_runtime
    from aepo_jax.parallel.peer_failure import peer_failure_watch
    from aepo_jax.training.preemption import Preempted

    # Several processes: one's failure ends them all at once, with its reason (`parallel.peer_failure`); the
    # checks too, since one host may fail one alone (its own copy of model.checkpoint_dir missing, say).
    with peer_failure_watch(quiet=(Preempted,)):
        require_workdir(workdir)
        check_before_start(cfg, process_index, process_count, process_shares)
        with configuration_errors(verbose):  # e.g. a gs:// train.compilation_cache_dir
            try:
                start_runtime(cfg)
            except NotADirectoryError as err:
                raise SystemExit(f"error: {err}") from err
        with configuration_errors(verbose):  # raised on every process alike
            require_shared_workdir(workdir, process_index, process_count)
        with workdir_lock(workdir) if process_index == 0 else contextlib.nullcontext():
            return _train_in(cfg, workdir, resume, make_trainer, allow_config_changes, process_index,
                             process_count)


def _train_in(cfg: ml_collections.ConfigDict, workdir: str, resume: bool, make_trainer, allow_config_changes: bool,
              process_index: int, process_count: int) -> int:
    """`run_training` once the workdir is this run's."""
    from aepo_jax.experiment import fit_model_to_tokenizer, save_run_files
    from aepo_jax.experiment_init import pin_init_checkpoint
    from aepo_jax.parallel.peer_failure import announce_failure
    from aepo_jax.training.checkpoint import cut_short_note
    from aepo_jax.training.preemption import Preempted

    prepare_workdir(cfg, workdir, resume=resume, process_index=process_index,
                    allow_config_changes=allow_config_changes)
    try:
        pin_init_checkpoint(cfg)  # saved in config.json below, before any step
    except (FileNotFoundError, NotADirectoryError) as err:
        raise SystemExit(f"error: {err}") from err
    verbose = bool(cfg.get("verbose_logs", False))
    with configuration_errors(verbose):  # a bad data.path, tokenizer or task setting
        env = process_environment(cfg, workdir, process_index)
    if process_count > 1:
        with configuration_errors(verbose):  # raised on every process alike
            try:
                require_same_run(cfg, env)
            except BaseException:
                env.close()
                raise
    trainer = None
    try:
        with configuration_errors(verbose):  # building the run; errors while it trains are not caught
            fit_model_to_tokenizer(cfg, env)
            if process_index == 0:
                save_run_files(cfg, workdir, env, workdir)  # config.json again, now with the vocabulary size
            trainer = make_trainer(cfg, env, process_index, process_count)
        if resume:
            try:
                restored = trainer.restore_latest()
            except ValueError as err:  # another stage's checkpoint, or one that does not fit the model
                raise SystemExit(f"error: {err}") from err
            if not restored:
                raise SystemExit(f"--resume: no complete checkpoint under {workdir}/checkpoints"
                                 + cut_short_note(trainer.checkpointer))
            step = int(trainer.state.rounds)
            dropped = trainer.logger.keep_through(step)  # the records after it are logged again
            print(f"resumed from step {step}" + (f" ({dropped} later metrics lines dropped)" if dropped else ""),
                  flush=True)
        try:
            trainer.train()
        except Preempted as err:  # saved; a non-zero exit, so a scheduler relaunches it
            raise SystemExit(str(err)) from None
    except BaseException as err:  # the peers learn of it before this process cleans up (which may wait on them)
        announce_failure(err, quiet=(Preempted,))
        raise
    finally:
        if trainer is not None:
            trainer.close()
        env.close()
    return 0

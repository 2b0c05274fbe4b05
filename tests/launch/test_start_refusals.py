"""What `launch.run_setup.run_training` refuses right after `jax.distributed` starts, before a checkpoint is read
or an environment built, each as one `error:` line: per-process shares of the global batch sizes, a mesh
that does not fit the devices, a `model.checkpoint_dir` that is not there, a bad compilation cache folder,
and a WORKDIR that is not one folder shared by every host (`require_shared_workdir`).

Several processes are simulated in-process: `maybe_initialize_distributed` reports the process index and
count, and `gather_objects` answers as the other processes would."""

from __future__ import annotations

import json
import os

import pytest
from absl import logging as absl_logging

from aepo_jax.parallel import distributed, multihost
from aepo_jax.training.rl_trainer import process_shares
from configs.aepo_tiny import get_config
from launch import run_setup


@pytest.fixture(autouse=True)
def _keep_absl_verbosity():
    before = absl_logging.get_verbosity()
    yield
    absl_logging.set_verbosity(before)


def _as_process(monkeypatch, index: int, count: int) -> None:
    monkeypatch.setattr(distributed, "maybe_initialize_distributed", lambda mode: (index, count))


def _unreached(*args):
    raise AssertionError("the run should have stopped before its environment and trainer")


@pytest.fixture
def nothing_built(monkeypatch):
    monkeypatch.setattr(run_setup, "process_environment", _unreached)


@pytest.mark.parametrize(("edits", "message"), [
    ({"data.prompts_per_step": 3},
     r"^error: data.prompts_per_step=3 is global and must be divisible by the 2 processes"),
    ({"data.prompts_per_step": 2, "train.mini_batch_prompts": 1},
     r"^error: train.mini_batch_prompts=1 is global and must be divisible by the 2 processes"),
])
def test_batch_sizes_that_do_not_divide_by_the_processes_are_refused_before_anything_is_built(
        tmp_path, monkeypatch, nothing_built, capsys, edits, message):
    """They were refused by RLTrainer.__init__, after the model was loaded and the environment built."""
    _as_process(monkeypatch, 0, 2)
    cfg = get_config()
    for dotted, value in edits.items():
        section, name = dotted.split(".")
        cfg[section][name] = value
    with pytest.raises(SystemExit, match=message):
        run_setup.run_training(cfg, str(tmp_path / "run"), False, _unreached, process_shares=process_shares)
    assert "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("key", "value", "message"), [
    ("mesh.shape", {"data": 3, "fsdp": 1, "tensor": 1},
     r"^error: mesh shape \{'data': 3, 'fsdp': 1, 'tensor': 1\} \(product 3\) does not divide the 8 devices"),
    ("model.checkpoint_dir", "/nonexistent/Qwen3-14B",
     r"^error: checkpoint directory does not exist: /nonexistent/Qwen3-14B"),
    ("train.compilation_cache_dir", "gs://b/xla", r"^error: train.compilation_cache_dir 'gs://b/xla' is a gs:// URL"),
])
def test_a_bad_mesh_checkpoint_dir_or_cache_dir_is_one_line_before_anything_is_built(
        tmp_path, nothing_built, capsys, key, value, message):
    """The mesh and the checkpoint folder were met after the environment was built; a gs:// compilation
    cache folder was a traceback."""
    cfg = get_config()
    section, name = key.split(".")
    cfg[section][name] = value
    with pytest.raises(SystemExit, match=message):
        run_setup.run_training(cfg, str(tmp_path / "run"), False, _unreached)
    assert "Traceback" not in capsys.readouterr().err


def test_a_compilation_cache_dir_that_is_a_file_is_one_line(tmp_path, nothing_built):
    (tmp_path / "cache").write_text("")
    cfg = get_config()
    cfg.train.compilation_cache_dir = str(tmp_path / "cache")
    with pytest.raises(SystemExit, match=r"^error: train.compilation_cache_dir .*cache exists and is not a directory"):
        run_setup.run_training(cfg, str(tmp_path / "run"), False, _unreached)


def test_one_process_takes_every_share():
    from aepo_jax.training.build import make_mesh_from

    cfg = get_config()
    cfg.data.prompts_per_step, cfg.train.mini_batch_prompts = 3, 1
    assert process_shares(cfg, make_mesh_from(cfg), 0, 1) == (3, 1, 8)


# -- a WORKDIR every host sees ----------------------------------------------------------------------------

def test_every_process_must_read_the_token_process_0_wrote():
    assert run_setup.shared_workdir_error("/mnt/b/run", ["t0", "t0", "t0"], "t0") is None
    error = run_setup.shared_workdir_error("/mnt/b/run", ["t0", None, "old", "t0"], "t0")
    assert error.startswith("--workdir /mnt/b/run is not one folder shared by every host: process(es) [1, 2] of 4 "
                            "do not see the file process 0 wrote in it")
    assert "the same bucket mounted" in error


def _gather_as(views: list):
    """A `gather_objects` for this process: its own object in its place, the others' from `views` (one list per
    call)."""
    calls = iter(views)

    def gather(obj):
        others = next(calls)
        return [obj if other is ... else other for other in others]

    return gather


def test_a_host_with_its_own_folder_at_the_workdirs_path_stops_the_run(tmp_path, monkeypatch, nothing_built, capsys):
    """Process 1 of 2, whose WORKDIR is its own disk: process 0's token file is not there. Before, the run
    trained its first step and then hung forever in the first checkpoint save."""
    _as_process(monkeypatch, 1, 2)
    monkeypatch.setattr(multihost, "gather_objects", _gather_as([["a1b2", ...], ["a1b2", ...]]))
    workdir = str(tmp_path / "run")
    with pytest.raises(SystemExit, match=rf"^error: --workdir {workdir} is not one folder shared by every host: "
                                         r"process\(es\) \[1\] of 2 do not see the file process 0 wrote in it\. It "
                                         r"must be one shared folder"):
        run_setup.run_training(get_config(), workdir, False, _unreached)
    assert "Traceback" not in capsys.readouterr().err


def test_a_host_that_sees_the_shared_workdir_goes_on(tmp_path, monkeypatch):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / f"{run_setup.SHARED_WORKDIR_TOKEN}a1b2").write_text(json.dumps("a1b2"))
    monkeypatch.setattr(multihost, "gather_objects", _gather_as([["a1b2", ...], ["a1b2", ...]]))
    run_setup.require_shared_workdir(str(workdir), 1, 2)


def test_process_0_writes_a_new_token_file_each_start_and_removes_it(tmp_path, monkeypatch):
    seen = []

    def gather(obj):
        seen.append((obj, sorted(os.listdir(tmp_path / "run"))))
        return [obj, obj]

    monkeypatch.setattr(multihost, "gather_objects", gather)
    run_setup.require_shared_workdir(str(tmp_path / "run"), 0, 2)
    (token, files), (read, _) = seen
    assert files == [f"{run_setup.SHARED_WORKDIR_TOKEN}{token}"] and read == token and len(token) == 32
    assert os.listdir(tmp_path / "run") == []
    run_setup.require_shared_workdir(str(tmp_path / "run"), 0, 2)
    assert seen[2][0] != token


def test_one_process_needs_no_shared_workdir(tmp_path, monkeypatch):
    monkeypatch.setattr(multihost, "gather_objects", _unreached)
    run_setup.require_shared_workdir(str(tmp_path / "run"), 0, 1)
    assert not (tmp_path / "run").exists()


def test_a_workdir_that_is_a_file_is_one_line_before_anything_is_built(tmp_path, nothing_built, capsys):
    """`os.makedirs` on it gave a FileExistsError traceback."""
    (tmp_path / "run").write_text("")
    with pytest.raises(SystemExit, match=r"^error: --workdir .*/run exists and is not a folder"):
        run_setup.run_training(get_config(), str(tmp_path / "run"), False, _unreached)
    assert "Traceback" not in capsys.readouterr().err


def test_a_path_error_while_the_run_is_built_is_one_line(tmp_path):
    """A run's metrics.jsonl that is a folder (IsADirectoryError out of the trainer's logger) was a traceback."""
    from launch.config_args import configuration_errors

    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(SystemExit, match=r"^error: \[Errno 21\] Is a directory: .*metrics.jsonl"), \
            configuration_errors():
        open(tmp_path / "metrics.jsonl", "a").close()  # what MetricsLogger does
    with pytest.raises(RuntimeError), configuration_errors():  # other errors are no configuration error
        raise RuntimeError("while training")

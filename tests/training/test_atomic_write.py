"""RUN_DIR/config.json is replaced whole at every start: a kill while it is written leaves the old one."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import ml_collections
import pytest

from aepo_jax.atomic_write import write_json_atomically
from aepo_jax.experiment import config_from_run, save_run_files


def _run_config(lr: float) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"optim": {"lr": lr}, "train": {"total_steps": 4}, "name": "run"})


def test_a_write_cut_short_leaves_the_previous_config_json_whole(tmp_path, monkeypatch):
    """save_run_files rewrote config.json in place: a kill mid-write left it truncated, and the run could no
    longer be resumed (the resume reads it first). The new text goes to a temporary file replaced in one step."""
    env = SimpleNamespace(task_dir=None)
    save_run_files(_run_config(1e-3), str(tmp_path), env, str(tmp_path))
    before = (tmp_path / "config.json").read_text()

    real_dump = json.dump

    def dump_then_die(value, f, **kwargs):  # half the text reaches the file, then the process "dies"
        text = json.dumps(value, **kwargs)
        f.write(text[: len(text) // 2])
        f.flush()
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(json, "dump", dump_then_die)
    with pytest.raises(KeyboardInterrupt):
        save_run_files(_run_config(5e-4), str(tmp_path), env, str(tmp_path))
    monkeypatch.setattr(json, "dump", real_dump)
    assert (tmp_path / "config.json").read_text() == before
    assert config_from_run(str(tmp_path)).optim.lr == 1e-3
    assert sorted(os.listdir(tmp_path)) == ["config.json"]  # no temporary file left behind

    save_run_files(_run_config(5e-4), str(tmp_path), env, str(tmp_path))
    assert config_from_run(str(tmp_path)).optim.lr == 5e-4


def test_the_written_file_reads_back_with_the_usual_permissions(tmp_path):
    path = tmp_path / "value.json"
    write_json_atomically(str(path), {"b": 1, "a": [1, 2]})
    assert json.loads(path.read_text()) == {"a": [1, 2], "b": 1}
    assert path.read_text().startswith('{\n  "a"')  # indented, keys sorted (as before)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as `open` creates a file, not mkstemp's 0o600

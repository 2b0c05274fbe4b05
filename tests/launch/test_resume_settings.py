"""What a resume may change, through the run's own config (`launch/run_config.py:RUN_DIR`): `--config.total_steps`
lengthens the run the trainer reads (`train.total_steps`), and a resume that only changes the launcher
(`distributed`) is accepted."""

from __future__ import annotations

import json

import pytest
from absl import flags
from ml_collections import config_flags

from configs.aepo_tiny import get_config as tiny_config
from configs.base import get_base_config
from launch.resume_check import (
    RESUME_MAY_CHANGE,
    check_resume_config,
    flatten,
    may_change,
)
from launch.run_config import CONFIG_FILE


def _saved_run(tmp_path, **edits) -> str:
    saved = json.loads(tiny_config().to_json_best_effort())
    for dotted, value in edits.items():
        node = saved
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node[part]
        node[leaf] = value
    (tmp_path / "config.json").write_text(json.dumps(saved))
    return str(tmp_path)


def _parse(argv: list[str]):
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=values, sys_argv=argv, lock_config=True)
    values(argv)
    return values["config"].value


def test_total_steps_on_the_runs_own_config_sets_the_length_the_trainer_reads(tmp_path):
    """The README's "run longer": `--config launch/run_config.py:RUN --config.total_steps=3` set only the
    top-level key (config.json keeps no link), so the resumed run stopped at its old train.total_steps."""
    run = _saved_run(tmp_path)
    cfg = _parse(["prog", "--config", f"{CONFIG_FILE}:{run}", "--config.total_steps=3"])
    assert (cfg.total_steps, cfg.train.total_steps) == (3, 3)
    cfg = _parse(["prog", "--config", f"{CONFIG_FILE}:{run}", "--config.train.total_steps=4"])
    assert (cfg.total_steps, cfg.train.total_steps) == (4, 4)


def test_every_link_of_the_defaults_is_made_again():
    """Whatever keys the defaults link (today total_steps <-> train.total_steps), the rebuilt config links them."""
    from launch.run_config import _linked_keys

    linked = [sorted(keys) for keys, _ in _linked_keys(get_base_config("aepo"))]
    assert ["total_steps", "train.total_steps"] in linked


def test_a_saved_config_whose_linked_fields_disagree_is_refused(tmp_path):
    from launch.run_config import get_config

    run = _saved_run(tmp_path, total_steps=3, train__total_steps=1)
    with pytest.raises(ValueError, match=r"config.json: total_steps=3, train.total_steps=1 differ, but they are one "
                                         r"setting"):
        get_config(run)


def test_a_resume_that_only_changes_the_launcher_is_accepted(tmp_path):
    """A run started with `python -m launch.train` (distributed='auto') resumed through gpu_multi.sh or
    tpu_vm.sh (which add --config.distributed=on) was refused: "distributed." was listed as a section."""
    run = _saved_run(tmp_path)
    current = json.loads(tiny_config().to_json_best_effort())
    current["distributed"] = "on"
    assert check_resume_config(run, current, allow_changes=False, keep_old=False) == ["distributed"]


def test_each_resumable_setting_is_listed_as_what_it_is_in_the_config():
    """A section ends with "." and a plain key does not: "distributed." matched nothing."""
    keys = flatten(json.loads(get_base_config("aepo").to_json_best_effort()))
    for allowed in RESUME_MAY_CHANGE:
        if allowed.endswith("."):
            assert any(key.startswith(allowed) for key in keys), f"{allowed!r} names no section"
        else:
            assert not any(key.startswith(allowed + ".") for key in keys), f"{allowed!r} is a section: end it with '.'"
            assert may_change(allowed)

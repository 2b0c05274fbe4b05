"""`launch.run_setup.run_training` reports a configuration error raised while it builds the run (the
distributed start-up, the environment, the trainer) as one `error: ...` line, its traceback only with
`verbose_logs`, and leaves an error raised while the run trains as it is."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from absl import logging as absl_logging

from configs.aepo_tiny import get_config
from launch import run_setup


@pytest.fixture(autouse=True)
def _keep_absl_verbosity():
    before = absl_logging.get_verbosity()
    yield
    absl_logging.set_verbosity(before)


@pytest.fixture
def fake_environment(monkeypatch):
    """`process_environment` without the task, tokenizer and tools (a 512-id tokenizer)."""
    closed = []
    env = SimpleNamespace(tokenizer=SimpleNamespace(vocab_size=512), pretrained=None, task_dir=None,
                          close=lambda: closed.append(True))
    monkeypatch.setattr(run_setup, "process_environment", lambda cfg, workdir, process_index: env)
    return closed


def _refusing_trainer(cfg, env, process_index, process_count):
    raise ValueError("train.micro_batch_size=0: a micro-batch needs at least 1 row")


def test_a_value_the_trainer_refuses_is_one_line(tmp_path, fake_environment, capsys):
    with pytest.raises(SystemExit, match=r"^error: train.micro_batch_size=0: a micro-batch needs at least 1 row\n"
                                         r"  \(ValueError at .*test_run_training_errors.py:\d+; "
                                         r"--config.verbose_logs=True prints the traceback\)$"):
        run_setup.run_training(get_config(), str(tmp_path), False, _refusing_trainer)
    assert "Traceback" not in capsys.readouterr().err
    assert fake_environment == [True]  # the environment's processes were stopped


def test_verbose_logs_prints_the_traceback_too(tmp_path, fake_environment, capsys):
    cfg = get_config()
    cfg.verbose_logs = True
    with pytest.raises(SystemExit, match=r"^error: train.micro_batch_size=0"):
        run_setup.run_training(cfg, str(tmp_path), False, _refusing_trainer)
    err = capsys.readouterr().err
    assert "Traceback" in err and "_refusing_trainer" in err


def test_an_error_while_training_is_not_taken_for_a_configuration_error(tmp_path, fake_environment):
    def trainer(cfg, env, process_index, process_count):
        def train():
            raise ValueError("a bug in a step")
        return SimpleNamespace(train=train, close=lambda: None)

    with pytest.raises(ValueError, match="a bug in a step"):
        run_setup.run_training(get_config(), str(tmp_path), False, trainer)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("data.path", "/nonexistent.jsonl", r"^error: data.path='/nonexistent.jsonl': no such file"),
    ("distributed", "true", r"^error: distributed mode must be one of \('auto', 'on', 'off'\), got 'true'\n"),
])
def test_a_bad_setting_met_while_the_run_is_built_is_one_line_naming_it(tmp_path, capsys, key, value, message):
    """A missing data.path was a FileNotFoundError traceback that did not name the setting; a bad
    `distributed` a ValueError traceback."""
    cfg = get_config()
    section, name = key.rpartition(".")[::2]
    (cfg[section] if section else cfg)[name] = value

    def unreached(*args):
        raise AssertionError("the run should have stopped before its trainer")

    with pytest.raises(SystemExit, match=message):
        run_setup.run_training(cfg, str(tmp_path / "run"), False, unreached)
    assert "Traceback" not in capsys.readouterr().err

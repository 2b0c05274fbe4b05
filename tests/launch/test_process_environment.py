"""`launch.run_setup.process_environment`: a process other than the first builds its environment in its own
folder, starting from the first process's trained tokenizer, and stops with an error naming the file
when it cannot see it (the workdir is not shared between hosts). One process plays the part of
process 1 here: the barrier is a no-op with one process."""

import pytest

from configs.aepo_tiny import get_config
from launch.run_setup import process_environment, process_environment_dir


def _config():
    cfg = get_config()
    cfg.data.num_examples = 8
    return cfg


def test_a_later_process_starts_from_the_first_ones_tokenizer(tmp_path):
    cfg = _config()
    first = process_environment(cfg, str(tmp_path), 0)
    first.close()
    second = process_environment(cfg, str(tmp_path), 1)
    second.close()
    folder = tmp_path / "env-process-1"
    assert process_environment_dir(str(tmp_path), 1) == str(folder)
    assert (folder / "tokenizer.model").read_bytes() == (tmp_path / "tokenizer.model").read_bytes()
    assert second.tokenizer.encode("When was Brindle founded?") == first.tokenizer.encode("When was Brindle founded?")
    assert (folder / "task").is_dir() and second.task_dir == str(folder / "task")


def test_a_later_process_that_cannot_see_the_first_ones_tokenizer_stops(tmp_path):
    with pytest.raises(ValueError, match=r"process 1 does not see .*tokenizer.model.* same --workdir"):
        process_environment(_config(), str(tmp_path), 1)
    assert not (tmp_path / "env-process-1").exists()  # nothing built

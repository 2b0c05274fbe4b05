"""A run path that is a URL is refused where it enters, before anything is written under the mangled
local folder that `os.path` would make of it (`aepo_jax/run_paths.py`)."""

from __future__ import annotations

import pytest

from aepo_jax.parallel import enable_compilation_cache
from aepo_jax.run_paths import require_local_path
from aepo_jax.training.checkpoint import Checkpointer
from launch.run_setup import prepare_workdir


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a mangled "gs:/bucket/..." folder would appear here
    return tmp_path


def test_local_paths_pass_and_urls_are_refused_naming_the_setting(in_tmp):
    assert require_local_path(in_tmp / "run", "--workdir") == str(in_tmp / "run")
    assert require_local_path("runs/a", "--workdir") == "runs/a"
    for url in ("gs://bucket/run", "s3://bucket/run", "file:///tmp/run"):
        with pytest.raises(ValueError, match=r"--workdir .* URL.*mount"):
            require_local_path(url, "--workdir")


def test_checkpointer_compilation_cache_and_workdir_refuse_a_bucket_url(in_tmp):
    from configs.aepo_tiny import get_config

    with pytest.raises(ValueError, match="checkpoint directory 'gs://b/run/checkpoints' is a gs:// URL"):
        Checkpointer("gs://b/run/checkpoints")
    with pytest.raises(ValueError, match="train.compilation_cache_dir"):
        enable_compilation_cache("gs://b/xla_cache")
    with pytest.raises(SystemExit, match="--workdir 'gs://b/run' is a gs:// URL"):
        prepare_workdir(get_config(), "gs://b/run", resume=False)
    assert list(in_tmp.iterdir()) == []  # nothing written anywhere

"""`train.compilation_cache_dir`: the helper sets JAX's cache directory, and refuses a file."""

import jax
import pytest

from aepo_jax.parallel import enable_compilation_cache


def test_sets_jax_cache_dir_and_creates_it(tmp_path):
    before = jax.config.jax_compilation_cache_dir
    try:
        path = enable_compilation_cache(tmp_path / "xla_cache")
        assert path.is_dir() and jax.config.jax_compilation_cache_dir == str(path)
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_empty_setting_leaves_the_cache_off():
    before = jax.config.jax_compilation_cache_dir
    assert enable_compilation_cache("") is None
    assert jax.config.jax_compilation_cache_dir == before


def test_a_file_path_raises_naming_it(tmp_path):
    target = tmp_path / "not_a_dir"
    target.write_text("x")
    with pytest.raises(NotADirectoryError, match="not_a_dir exists and is not a directory"):
        enable_compilation_cache(target)

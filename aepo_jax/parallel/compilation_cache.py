"""JAX's persistent compilation cache, switched on from the config (`train.compilation_cache_dir`).

A paper-size train step takes minutes to compile; with the cache, a restarted
run (or another process on the same host) reloads the executable instead.
Called once at start-up by the composition root, before the first jit.
"""

from __future__ import annotations

from pathlib import Path

import jax

from aepo_jax.run_paths import require_local_path


def enable_compilation_cache(directory: str | Path | None) -> Path | None:
    """Points `jax_compilation_cache_dir` at `directory` (created if needed); "" or None leaves it off.

    Returns the directory used, or None when the cache stays off.
    """
    if not directory:
        return None
    path = Path(require_local_path(directory, "train.compilation_cache_dir")).expanduser()
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"train.compilation_cache_dir {path} exists and is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    return path

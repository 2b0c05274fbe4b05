"""Replace a run's small files whole: a process killed while writing leaves the old file or the new one,
never a truncated one (RUN_DIR/config.json is rewritten at every start, and a resume reads it first)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable
from typing import Any


def write_json_atomically(path: str, value: Any) -> None:
    """Write `value` as indented, key-sorted JSON to `path`, atomically (`write_file_atomically`)."""

    def write(temporary: str) -> None:
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=2, sort_keys=True)

    write_file_atomically(path, write)


def write_file_atomically(path: str, write: Callable[[str], None]) -> None:
    """`write(temporary path)` in the same folder, the file flushed to the disk (fsync), then `os.replace`
    puts it at `path` (atomic on a POSIX filesystem); the temporary is removed if anything fails."""
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # Created as `open` would create the file (0o666 less the umask; mkstemp's would be 0o600).
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        write(temporary)
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    _sync_folder(directory)


def _sync_folder(directory: str) -> None:
    """fsync `directory`, so that the rename itself survives a power loss (best effort: not every
    filesystem lets a folder be opened or synced)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

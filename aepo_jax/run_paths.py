"""Run directories are local paths (a disk every host mounts at the same place), never URLs.

Every file of a run (config, tokenizer, metrics, checkpoints, the compilation
cache) goes through the local filesystem, where "gs://bucket/run" is just the
relative folder "gs:/bucket/run": a URL would quietly put a slice's checkpoints
on each host's own disk, to be lost with the VMs. A bucket is used through a
mount (gcsfuse, or a Filestore/NFS share) at the same path on every host.
"""

from __future__ import annotations

import os

URL_SEPARATOR = "://"


def require_local_path(path: str | os.PathLike, what: str) -> str:
    """`path` as a string; a ValueError naming `what` when it is a URL (see module docstring)."""
    text = os.fspath(path)
    if URL_SEPARATOR in text:
        scheme = text.split(URL_SEPARATOR, 1)[0]
        raise ValueError(
            f"{what} {text!r} is a {scheme}:// URL, but a run's files are written through the local filesystem "
            f"(it would become the folder {os.path.abspath(text)!r} on each host's own disk): mount the bucket "
            "at the same path on every host (e.g. gcsfuse BUCKET /mnt/BUCKET, or a Filestore share) and pass "
            "the mounted path"
        )
    return text

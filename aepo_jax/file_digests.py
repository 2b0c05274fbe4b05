"""Digests of a file's bytes: whole (data read in full anyway) or sampled (checkpoints of many GB)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_READ_BYTES = 1 << 20
# A sampled digest reads this many blocks of SAMPLE_BYTES, spread evenly over the file (first and last included).
SAMPLE_BLOCKS = 16
SAMPLE_BYTES = 1 << 16


def file_digest(path: str | Path, length: int = 12) -> str:
    """The first `length` hex digits of the SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_READ_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()[:length]


def sampled_file_digest(path: str | Path, length: int = 16) -> str:
    """SHA-256 (first `length` hex digits) of a file's size and of SAMPLE_BLOCKS blocks spread evenly over it:
    the whole file when it is no larger than those blocks. Reads about 1 MiB of a checkpoint shard of many GB,
    so a resume can tell another checkpoint (a fine-tune of the same shapes changes every block) without
    reading its weights; a change confined to the bytes between the blocks goes unseen."""
    size = os.path.getsize(path)
    if size <= SAMPLE_BLOCKS * SAMPLE_BYTES:
        return file_digest(path, length)
    digest = hashlib.sha256(f"size {size}\0".encode())
    last = size - SAMPLE_BYTES
    with open(path, "rb") as f:
        for index in range(SAMPLE_BLOCKS):
            f.seek(last * index // (SAMPLE_BLOCKS - 1))
            digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()[:length]

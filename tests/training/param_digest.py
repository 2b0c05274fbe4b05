"""Digests of parameter trees for the multi-process tests: equal on two processes only if the values are."""

from __future__ import annotations

import hashlib

import jax
import numpy as np


def shard_digest(params) -> str:
    """SHA-256 over this process's own shards of every parameter (its devices' memory), one per
    distinct index, in index order."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        shards = {}
        for shard in leaf.addressable_shards:
            start = tuple(s.start or 0 for s in shard.index)
            shards.setdefault(start, np.asarray(shard.data))
        for start in sorted(shards):
            h.update(repr(start).encode() + shards[start].tobytes())
    return h.hexdigest()


def value_digest(params) -> str:
    """SHA-256 over the whole value of every parameter (numpy arrays or arrays this process holds whole)."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        value = np.asarray(leaf)
        h.update(repr((value.shape, value.dtype.str)).encode() + value.tobytes())
    return h.hexdigest()

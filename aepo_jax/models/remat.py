"""Rematerialisation of the scanned decoder block, chosen by name (`ModelConfig.remat`).

"none" keeps every activation of every layer for the backward pass (fastest,
most memory); "block" keeps only each layer's input and recomputes the rest of
the block in the backward pass (least memory); any other value names one of
`jax.checkpoint_policies` that take no arguments, e.g.
"dots_with_no_batch_dims_saveable" keeps the weight matmul outputs and
recomputes the rest (attention scores, norms, activations).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

REMAT_POLICIES = (
    "nothing_saveable",
    "everything_saveable",
    "dots_saveable",
    "checkpoint_dots",
    "dots_with_no_batch_dims_saveable",
    "checkpoint_dots_with_no_batch_dims",
)
REMAT_CHOICES = ("none", "block", *REMAT_POLICIES)


def check_remat(name: Any) -> str:
    """`name` if it is a known remat setting, else a ValueError listing the choices."""
    if name not in REMAT_CHOICES:
        raise ValueError(f"unknown remat setting {name!r}; choose one of {list(REMAT_CHOICES)}")
    return name


def remat_block(fn: Callable, name: str) -> Callable:
    """`fn` (a scan body) wrapped in `jax.checkpoint` as `name` asks; unchanged for "none"."""
    check_remat(name)
    if name == "none":
        return fn
    policy = None if name == "block" else getattr(jax.checkpoint_policies, name)
    # prevent_cse=False is safe (and faster) inside lax.scan, which already blocks CSE across iterations.
    return jax.checkpoint(fn, policy=policy, prevent_cse=False)

"""Shape buckets: a rollout compiles one program per bucket, not one per call."""

from __future__ import annotations


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    if n < 1:
        raise ValueError(f"next_power_of_two needs n >= 1, got {n}")
    return 1 << (n - 1).bit_length()


def bucket_batch(rows: int, multiple: int = 1) -> int:
    """Batch size for `rows` real rows: a power of two, and a multiple of the data-axis size."""
    if multiple < 1:
        raise ValueError(f"bucket_batch needs multiple >= 1, got {multiple}")
    size = next_power_of_two(max(rows, 1))
    return -(-size // multiple) * multiple


def bucket_length(n: int, minimum: int) -> int:
    """Length bucket for n: a power of two, at least `minimum`."""
    return max(next_power_of_two(max(n, 1)), minimum)

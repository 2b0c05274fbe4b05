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


def attention_span(needed: int, n_slots: int, minimum: int) -> int:
    """Leading cache slots a block or decode window reads: the smallest of minimum * 2^i and
    1.5 * minimum * 2^i that holds `needed` slots, capped at the cache's `n_slots`.

    Two buckets per octave keep the slots read at most 1.5x the live ones (one extra
    compiled program per octave of cache length)."""
    span = minimum
    while span < needed:
        span = span * 3 // 2 if span & (span - 1) == 0 else span * 4 // 3
    return min(span, n_slots)


def span_ladder(span: int, n_slots: int, minimum: int) -> list[int]:
    """`span` (an `attention_span` bucket) and every larger bucket up to the cache's `n_slots`: the
    spans a decode window that needs `span` slots may also read."""
    spans = [span]
    while spans[-1] < n_slots:
        spans.append(attention_span(spans[-1] + 1, n_slots, minimum))
    return spans

"""Peak KV caches alive during a run of a `Sampler`: how many of its largest decode-state caches a
rollout holds at once, the factor a per-device memory plan of one cache must be multiplied by.

After every program the sampler runs, the live stacked caches (`[L, B, KVH, S, Dh]` arrays of the
sampler's model) are summed in row-slots (B x S; K and V count once) and compared with the largest
single cache seen. What a program holds only inside itself (its temporaries) is not counted here;
`benchmarks/memory_plan.py` compiles those. Benchmark instrumentation: it wraps the sampler's program
runner while it is open.
"""

from __future__ import annotations

from typing import Any, Self

import jax


class LiveCacheCensus:
    """Counts `sampler`'s live caches after each of its programs, inside a `with` block."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.peak_row_slots = 0  # most B x S of all live caches together
        self.largest_row_slots = 0  # B x S of the largest single cache
        self.largest_batch = 0
        self._runner = None

    def __enter__(self) -> Self:
        self._runner = self.sampler._call  # the one place every program run goes through

        def counted(kind: str, program, *args, **kwargs):
            out = self._runner(kind, program, *args, **kwargs)
            self._count()
            return out

        self.sampler._call = counted
        return self

    def __exit__(self, *exc) -> None:
        del self.sampler._call  # back to the class's method
        self._runner = None

    def _count(self) -> None:
        c = self.sampler.config
        total = 0
        for array in jax.live_arrays():
            shape = array.shape
            if len(shape) == 5 and (shape[0], shape[2], shape[4]) == (c.n_layers, c.n_kv_heads, c.head_dim):
                total += shape[1] * shape[3]
                self.largest_row_slots = max(self.largest_row_slots, shape[1] * shape[3])
                self.largest_batch = max(self.largest_batch, shape[1])
        self.peak_row_slots = max(self.peak_row_slots, total // 2)  # K and V: one cache

    @property
    def peak_caches(self) -> float:
        """The most cache alive at once, in largest single caches."""
        return self.peak_row_slots / self.largest_row_slots if self.largest_row_slots else 0.0

"""Compiles off the caller's path: a shape variant of a sampler program that is not compiled yet
runs as a compiled variant that holds it (a longer attention span, block or decode window), while
the exact variant compiles on a background thread and is used from the first call after it is ready.

A rollout meets new shapes now and then (a batch, block or span bucket it has not met before); on
this 2-core CPU each costs 0.5-0.9 s of XLA compile, on a TPU slice at the paper's scale minutes, and
without this the whole rollout waits for it. A larger variant gives the same tokens up to float
rounding (it attends over, or feeds, more masked entries), so a run that uses this is reproducible
only up to that rounding: the sampler's `compile_in_background` option says whether it is on.

XLA compiles on its client's own thread pool, at the process's priority, whichever thread asks (on
a 2-core CPU host, about 3% of a background compile's CPU time ran on the lowered-priority thread),
so a background compile takes cores from a rollout's own programs. `held()` therefore queues the
exact variants a block of calls lacks and starts compiling them when the block ends: the agent loop
holds them for a whole run (`LoopConfig.background_compile`), so they compile after it, for
instance while a training step keeps an accelerator busy and the host idle.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax

# Niceness of the background compile thread (Linux: per thread). It covers what runs on that thread:
# tracing and lowering to StableHLO. XLA's own compile runs on XLA's thread pool, at normal priority.
COMPILE_THREAD_NICENESS = 19


def abstract_arrays(tree: Any) -> Any:
    """`tree` with every array replaced by its shape and dtype (and its sharding when that is a mesh's),
    so a program can be lowered without holding (or racing a donation of) the arrays themselves.

    A single-device array's sharding is left out: a committed single-device sharding in the
    abstract arguments lowers to a program the later call does not find in the compile cache."""

    def abstract(x: Any) -> Any:
        if not isinstance(x, jax.Array):
            return x
        sharding = x.sharding if isinstance(x.sharding, jax.sharding.NamedSharding) else None
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=getattr(x, "weak_type", False))

    return jax.tree.map(abstract, tree)


class BackgroundCompiler:
    """Which shape variants a sampler has compiled, and background compiles of the ones it lacks.

    Variants are named by hashable keys that identify a compiled program (program, batch, cache
    length, block or window length, span, static options). With `enabled=False` every call runs its
    exact variant (`choose` returns 0) and nothing compiles in the background. Inside `held()`, the
    compiles asked for wait in a queue until the outermost `held()` block ends.
    """

    def __init__(self, enabled: bool, context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):
        self.enabled = bool(enabled)
        self._context = context  # entered around each background lowering (the sampler's mesh)
        self._ready: set[Hashable] = set()
        self._pending: dict[Hashable, Future] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._held: dict[Hashable, tuple[Any, tuple, dict]] = {}  # compiles asked for inside `held()`
        self._hold_depth = 0
        self.fallback_calls = 0  # calls that ran a larger compiled variant than they needed
        self.background_compiles = 0  # exact variants compiled on the background thread
        self.held_compiles = 0  # compiles asked for inside `held()` and started when it ended

    def choose(self, keys: Sequence[Hashable]) -> int:
        """Index of the variant to run among `keys` (the exact one first, then larger ones in order of
        preference): the exact one when it is compiled; else the first compiled larger one; else
        the exact one (compiled on the spot, after a background compile of it already under way)."""
        self._collect()
        if not self.enabled or keys[0] in self._ready:
            return 0
        for index, key in enumerate(keys[1:], 1):
            if key in self._ready:
                self.fallback_calls += 1
                return index
        self._held.pop(keys[0], None)  # it compiles here instead
        pending = self._pending.pop(keys[0], None)
        # A background compile of it that has not started is dropped (it compiles here, not after the
        # compiles queued before it); one under way is waited for rather than compiled twice.
        if pending is not None and not pending.cancel() and pending.exception() is None:
            self._ready.add(keys[0])
        return 0

    def has_ready(self, prefix: tuple) -> bool:
        """Whether some compiled variant's key starts with `prefix` (keys that are tuples)."""
        self._collect()
        return any(isinstance(key, tuple) and key[: len(prefix)] == prefix for key in self._ready)

    def knows(self, key: Hashable) -> bool:
        """Whether the variant `key` is compiled, or its compile is queued, held or under way (with the
        option off: always, since nothing compiles in the background)."""
        return not self.enabled or key in self._ready or key in self._pending or key in self._held

    def ran(self, key: Hashable) -> None:
        """Records that the variant `key` ran (so it is compiled)."""
        self._ready.add(key)

    def compile_later(self, key: Hashable, program: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """Compiles `program(*args, **kwargs)` (the variant `key`) on the background thread, unless it is
        compiled or under way. Arrays are read for their shapes only, here, before this returns."""
        if self.knows(key):
            return
        abstract_args, abstract_kwargs = abstract_arrays(tuple(args)), abstract_arrays(dict(kwargs))
        if self._hold_depth:
            self._held[key] = (program, abstract_args, abstract_kwargs)
            return
        self._submit(key, program, abstract_args, abstract_kwargs)

    @contextlib.contextmanager
    def held(self):
        """Within this block, compiles asked for wait in a queue (calls meanwhile run a compiled larger
        variant, or compile on the spot where there is none); they start in the background when the
        outermost block ends, even if it ends with an error."""
        self._hold_depth += 1
        try:
            yield self
        finally:
            self._hold_depth -= 1
            if not self._hold_depth:
                while self._held:
                    key, (program, args, kwargs) = next(iter(self._held.items()))
                    del self._held[key]
                    self.held_compiles += 1
                    self._submit(key, program, args, kwargs)

    def _submit(self, key: Hashable, program: Any, abstract_args: tuple, abstract_kwargs: dict) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampler-compile",
                                                initializer=lower_thread_priority)
        self._pending[key] = self._executor.submit(self._compile, program, abstract_args, abstract_kwargs)

    def wait(self) -> None:
        """Blocks until every background compile has finished (they are then ready)."""
        for future in list(self._pending.values()):
            future.exception()
        self._collect()

    def _compile(self, program: Any, args: tuple, kwargs: dict) -> None:
        with self._context():
            program.lower(*args, **kwargs).compile()
        self.background_compiles += 1

    def _collect(self) -> None:
        """Moves finished background compiles to the ready set (a failed one is dropped: the exact
        variant then compiles on the spot, where its error surfaces)."""
        for key, future in list(self._pending.items()):
            if future.done():
                del self._pending[key]
                if future.exception() is None:
                    self._ready.add(key)


def lower_thread_priority(niceness: int = COMPILE_THREAD_NICENESS) -> bool:
    """Makes the calling thread yield the CPU to the process's other threads (Linux, where niceness
    is per thread); returns whether it did. Elsewhere it changes nothing, since setting it there
    would lower the whole process."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
    except OSError:
        return False
    return True

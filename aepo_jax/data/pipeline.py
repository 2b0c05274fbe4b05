"""Deterministic, resumable batches of prompts, sharded by process.

Epoch `e` visits the examples in the order of a permutation drawn from
`numpy.random.default_rng([seed, e])`, so the order depends only on the seed
and the epoch (a fresh shuffle per epoch), never on how many batches were
taken before. `batch_size` is global (`data.prompts_per_step`): each step
takes the next `batch_size` indices of that order and process `p` keeps
slice `p` of `process_count` equal shares, so processes see disjoint prompts
and all take the same number of steps. The incomplete tail
of an epoch is dropped. `state()` is a small JSON-able dict the trainer
checkpoints; `restore(state)` continues with exactly the batches an
uninterrupted run would have produced.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from aepo_jax.data.records import Example


class PromptPipeline:
    """An endless iterator over batches (lists of examples) for one process.

    Args:
      examples: the whole dataset (every process passes the same list).
      batch_size: examples per step over all processes; each process gets
        `batch_size / process_count` of them (it must divide).
      seed: shuffling seed.
      process_index: this process (e.g. `jax.process_index()`).
      process_count: number of processes (e.g. `jax.process_count()`).
      shuffle: False keeps the file order every epoch (evaluation).
    """

    def __init__(
        self,
        examples: Sequence[Example],
        batch_size: int,
        *,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 1,
        shuffle: bool = True,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if process_count < 1 or not 0 <= process_index < process_count:
            raise ValueError(
                f"need 0 <= process_index < process_count, got {process_index} of {process_count}"
            )
        if batch_size % process_count:
            raise ValueError(f"batch_size={batch_size} (data.prompts_per_step, global) is not divisible by "
                             f"the {process_count} processes")
        if len(examples) < batch_size:
            raise ValueError(f"dataset has {len(examples)} examples, fewer than one global batch ({batch_size})")
        self._examples = list(examples)
        self.batch_size = batch_size // process_count  # this process's share
        self.seed = int(seed)
        self.process_index = process_index
        self.process_count = process_count
        self.shuffle = shuffle
        self.steps_per_epoch = len(self._examples) // batch_size
        self._epoch = 0
        self._position = 0  # steps already taken in the current epoch
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        n = len(self._examples)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def __iter__(self) -> Iterator[list[Example]]:
        return self

    def __next__(self) -> list[Example]:
        if self._position == self.steps_per_epoch:
            self._epoch += 1
            self._position = 0
            self._order = self._epoch_order(self._epoch)
        global_batch = self.batch_size * self.process_count
        start = self._position * global_batch + self.process_index * self.batch_size
        indices = self._order[start : start + self.batch_size]
        self._position += 1
        return [self._examples[i] for i in indices]

    @property
    def epoch(self) -> int:
        """Epochs completed before the current one (0 during the first)."""
        return self._epoch

    def state(self) -> dict[str, Any]:
        """JSON-able position: seed, epoch and steps taken within it (plus a size check)."""
        return {
            "seed": self.seed,
            "epoch": self._epoch,
            "position": self._position,
            "num_examples": len(self._examples),
            "global_batch": self.batch_size * self.process_count,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a `state()`; refuses one taken with another seed, dataset or batch."""
        expected = {
            "seed": self.seed,
            "num_examples": len(self._examples),
            "global_batch": self.batch_size * self.process_count,
        }
        for key, value in expected.items():
            if key in state and state[key] != value:
                raise ValueError(
                    f"pipeline state has {key}={state[key]!r} but this pipeline has {value!r}"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.steps_per_epoch:
            raise ValueError(
                f"pipeline state epoch={epoch}, position={position} is out of range "
                f"(steps per epoch {self.steps_per_epoch})"
            )
        self._epoch, self._position = epoch, position
        self._order = self._epoch_order(epoch)

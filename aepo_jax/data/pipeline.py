"""Deterministic, resumable batches of prompts, sharded by process.

`batch_size` is global (`data.prompts_per_step`): each step takes the next
`batch_size` indices of the stream and process `p` keeps slice `p` of
`process_count` equal shares, so processes see disjoint prompts and all take
the same number of steps. An epoch is `steps_per_epoch = n // batch_size`
steps.

- Shuffled (the default): epoch `e` visits the examples in the order of a
  permutation drawn from `numpy.random.default_rng([seed, e])`, so the order
  depends only on the seed and the epoch (a fresh shuffle per epoch), never on
  how many batches were taken before. The incomplete tail of an epoch is
  dropped (a different tail each epoch).
- Unshuffled: the file order as one continuous stream across epochs: global
  step `s` holds rows `(s * batch_size + i) mod n`, so every row is seen
  (restarting each epoch at row 0 would drop the same tail every epoch).

`state()` is a small JSON-able dict the trainer checkpoints; `restore(state)`
continues with exactly the batches an uninterrupted run would have produced,
and refuses a state taken over other data (`data_digest`: the examples'
questions and answers in order, not the file's path) or under the other
`shuffle` setting (a position names other rows in the other stream). A state
saved before a check's key existed restores with a warning that it cannot be
made: refusing it would strand every older checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from aepo_jax.data.records import PARSER_VERSION, Example

# Version of the saved position. 2: the unshuffled stream runs on across epochs (1, unversioned, restarted
# each epoch at row 0, so an unshuffled position past epoch 0 means other rows unless n % batch == 0).
STATE_VERSION = 2
# What a mismatch of a state's field means, where the value alone does not say.
_MISMATCH_NOTES = {
    "shuffle": " (data.shuffle): the shuffled and unshuffled streams take other rows at the same position; resume "
               "with the data.shuffle the position was saved under",
}


def data_digest(examples: Sequence[Example]) -> str:
    """A short SHA-256 of the examples' questions and gold answers in order: what a position indexes into.

    Not the ids: a row without one gets an id made from the file's name (`records.read_examples`), so a
    renamed copy of the same data would look changed.
    """
    digest = hashlib.sha256()
    for example in examples:
        fields = [str(example.get("question")), [str(a) for a in example.get("answers", ())]]
        digest.update(json.dumps(fields).encode("utf-8") + b"\n")
    return digest.hexdigest()[:16]


class PromptPipeline:
    """An endless iterator over batches (lists of examples) for one process.

    Args:
      examples: the whole dataset (every process passes the same list).
      batch_size: examples per step over all processes; each process gets
        `batch_size / process_count` of them (it must divide).
      seed: shuffling seed.
      process_index: this process (e.g. `jax.process_index()`).
      process_count: number of processes (e.g. `jax.process_count()`).
      shuffle: False reads the file order as one continuous stream (evaluation).
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
        self._digest = data_digest(self._examples)
        self.batch_size = batch_size // process_count  # this process's share
        self.global_batch = batch_size
        self.seed = int(seed)
        self.process_index = process_index
        self.process_count = process_count
        self.shuffle = shuffle
        self.steps_per_epoch = len(self._examples) // batch_size
        self._epoch = 0
        self._position = 0  # steps already taken in the current epoch
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> np.ndarray | None:
        """The shuffled epoch's permutation (None unshuffled: `_global_indices` needs none)."""
        if not self.shuffle:
            return None
        return np.random.default_rng([self.seed, epoch]).permutation(len(self._examples))

    def _global_indices(self) -> np.ndarray:
        """The indices of the current step's whole global batch (every process's share, in order)."""
        if self._order is not None:
            start = self._position * self.global_batch
            return self._order[start : start + self.global_batch]
        step = self._epoch * self.steps_per_epoch + self._position
        return (step * self.global_batch + np.arange(self.global_batch)) % len(self._examples)

    def __iter__(self) -> Iterator[list[Example]]:
        return self

    def __next__(self) -> list[Example]:
        if self._position == self.steps_per_epoch:
            self._epoch += 1
            self._position = 0
            self._order = self._epoch_order(self._epoch)
        start = self.process_index * self.batch_size
        indices = self._global_indices()[start : start + self.batch_size]
        self._position += 1
        return [self._examples[int(i)] for i in indices]

    @property
    def epoch(self) -> int:
        """Epochs (of `steps_per_epoch` steps) completed before the current one (0 during the first)."""
        return self._epoch

    def state(self) -> dict[str, Any]:
        """JSON-able position: seed, epoch and steps taken within it (plus shuffle, size and content checks)."""
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "shuffle": bool(self.shuffle),
            "epoch": self._epoch,
            "position": self._position,
            "num_examples": len(self._examples),
            "global_batch": self.global_batch,
            "data_digest": self._digest,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a `state()`; refuses one taken with another seed, shuffle setting, dataset or batch."""
        expected = {
            "seed": self.seed,
            "shuffle": bool(self.shuffle),
            "num_examples": len(self._examples),
            "global_batch": self.global_batch,
        }
        for key, value in expected.items():
            if key in state and state[key] != value:
                raise ValueError(
                    f"pipeline state has {key}={state[key]!r} but this pipeline has {value!r}"
                    f"{_MISMATCH_NOTES.get(key, '')}"
                )
        self._check_digest(state)
        self._check_shuffle_known(state)
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.steps_per_epoch:
            raise ValueError(
                f"pipeline state epoch={epoch}, position={position} is out of range "
                f"(steps per epoch {self.steps_per_epoch})"
            )
        self._check_version(state, epoch)
        self._epoch, self._position = epoch, position
        self._order = self._epoch_order(epoch)

    def _check_shuffle_known(self, state: dict[str, Any]) -> None:
        """Warn that a state saved before `shuffle` was kept cannot be checked against this pipeline's setting.

        Accepted, not refused: such a state was most likely taken under the same config, and nothing in it tells
        the two streams apart."""
        if "shuffle" not in state:
            warnings.warn(
                f"pipeline state has no shuffle setting (saved by an older aepo_jax): cannot check that it was "
                f"taken with shuffle={self.shuffle}, as this pipeline's; resumed under the other setting it names "
                f"other rows", stacklevel=3,
            )

    def _check_digest(self, state: dict[str, Any]) -> None:
        """Refuse a position saved over other examples (same count, other ids or questions)."""
        saved = state.get("data_digest")
        if saved is None:
            warnings.warn(
                "pipeline state has no data_digest (saved by an older aepo_jax): cannot check that it was "
                "taken over this data", stacklevel=3,
            )
        elif saved != self._digest:
            raise ValueError(
                f"pipeline state has data_digest={saved!r} but this pipeline's examples have "
                f"{self._digest!r}: the data changed (other questions or answers, or another order) since the "
                f"position was saved, or this aepo_jax reads it otherwise than the one that saved it (record "
                f"parser version {PARSER_VERSION} writes a whole-number float answer such as 72.0 as '72' since "
                f"version 3); the position cannot be checked against these examples: start a new run"
            )

    def _check_version(self, state: dict[str, Any], epoch: int) -> None:
        """Refuse a position whose meaning differs in this version (rather than resume at other rows)."""
        version = int(state.get("version", 1))
        if version > STATE_VERSION:
            raise ValueError(
                f"pipeline state version {version} is newer than this aepo_jax's ({STATE_VERSION})"
            )
        tail = len(self._examples) % self.global_batch
        if version < 2 and not self.shuffle and epoch > 0 and tail:
            raise ValueError(
                f"pipeline state version {version} (epoch={epoch}) was saved by an unshuffled pipeline that "
                f"restarted every epoch at row 0 and dropped the last {tail} rows; this version reads the "
                f"rows as one continuous stream, so that position names other rows here and cannot be "
                f"resumed"
            )

"""Held-out validation during training (spec §6: greedy decoding): which steps run it, and the function
that scores the current parameters (the composition root builds it: `experiment_validation.validation_from`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Prefix of the validation metrics in a step's record (`val/pass@1`, `val/<data source>/mean_f1`, ...).
VALIDATION_PREFIX = "val/"


@dataclass(frozen=True)
class Validation:
    """Run `score(params) -> {name: value}` after every `every`-th step and after the run's last one
    (`train.total_steps`).

    The names it returns are logged under `VALIDATION_PREFIX` as a second metrics line of that step
    (`step_loop`: written after the step's own line and checkpoint); the parameters are the step's
    updated ones (what its checkpoint saves). A due step that a preemption notice stops is not validated
    then: its checkpoint records the validation as owed, and the run resumed from it validates that step
    (the same parameters) before training on (`step_loop`)."""

    every: int
    score: Callable[[Any], dict[str, float]]

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"validation.every must be >= 1 to validate (0 turns validation off), got {self.every}")

    def due(self, step: int, last_step: int) -> bool:
        return step % self.every == 0 or step == last_step

    def __call__(self, params: Any) -> dict[str, float]:
        return {VALIDATION_PREFIX + name: float(value) for name, value in self.score(params).items()}

"""The estimators' `adv/*` diagnostics of a step split over processes, merged as the RL trainer merges them
(`process_metric_weights` + `merge_metrics`), equal the same diagnostics of the whole batch in one process.
They were plain means of the per-process values (a count such as GiGPO's step groups averaged, a mean
over 3 rows weighing what a mean over 5 rows weighs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from aepo_jax.objectives import compute_advantages
from aepo_jax.objectives.presets import get_preset
from aepo_jax.parallel.multihost import merge_metrics
from aepo_jax.training.process_metric_weights import (
    SUMMED_METRICS,
    process_metric_weights,
)

GROUPS = np.array([0, 0, 0, 1, 1, 2, 2, 2])
PARTS = (np.arange(0, 3), np.arange(3, 8))  # whole groups per process, 3 rows and 5 rows
WIDTH = 10
STEP_STARTS = [[0, 4]] * len(GROUPS)


def _batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    lengths = np.array([10, 3, 7, 0, 9, 5, 2, 8])  # row 3: no policy token (a real-row mean leaves it out)
    mask = (np.arange(WIDTH)[None, :] < lengths[:, None]).astype(np.float32)
    tokens = rng.integers(1, 4, size=(len(GROUPS), WIDTH))
    tokens[:, :4] = tokens[GROUPS * 0, :4]  # every step 0 of a group starts from the same state
    tokens[GROUPS == 2, 4:6] = 7  # shared step states inside group 2
    return {"rewards": rng.normal(size=len(GROUPS)).astype(np.float32), "mask": mask,
            "entropy": rng.uniform(0.1, 3.0, size=mask.shape).astype(np.float32) * mask,
            "response_lengths": np.array([30, 12, 25, 4, 32, 20, 8, 28]), "tokens": tokens}


def _metrics(preset, batch, rows) -> dict[str, float]:
    _, metrics = compute_advantages(
        preset, batch["rewards"][rows], GROUPS[rows], batch["mask"][rows], entropy=batch["entropy"][rows],
        response_lengths=batch["response_lengths"][rows], max_response_len=32, tokens=batch["tokens"][rows],
        step_starts=[STEP_STARTS[i] for i in rows])
    return {f"adv/{k}": float(v) for k, v in metrics.items()}


@pytest.mark.parametrize("preset", [
    dataclasses.replace(get_preset("dapo"), entropy_advantage=True, entropy_advantage_scope="group"),
    get_preset("gigpo"),
], ids=["dapo_with_group_entropy_advantage", "gigpo"])
def test_merged_advantage_diagnostics_equal_the_whole_batchs(preset):
    batch = _batch()
    whole = _metrics(preset, batch, np.arange(len(GROUPS)))
    parts = []
    for rows in PARTS:
        metrics = _metrics(preset, batch, rows)
        parts.append((metrics, process_metric_weights(metrics, batch["mask"][rows])))
    merged = merge_metrics(parts, SUMMED_METRICS)
    assert set(merged) == set(whole)
    assert len(whole) >= 3
    for key, value in whole.items():
        assert merged[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key

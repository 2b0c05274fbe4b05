"""The train benchmark's MFU, printed peak and JSON peak are one figure."""

from __future__ import annotations

import pytest

from benchmarks.train_bench import apply_peak


def _rows():
    return [{"config": "a", "model_tflops_per_s_best_step": 0.05}, {"config": "b", "model_tflops_per_s_best_step": 0.08}]


def test_every_row_uses_the_highest_peak_reading():
    rows = _rows()
    peak = apply_peak(rows, [80e9, 100e9, 90e9])
    assert peak == 100e9  # what the print and the JSON's peak_flops show
    assert [r["peak_tflops_per_s"] for r in rows] == [0.1, 0.1]
    assert [r["mfu"] for r in rows] == pytest.approx([0.5, 0.8])


def test_a_given_peak_overrides_the_readings():
    rows = _rows()
    assert apply_peak(rows, [], peak_tflops=0.2) == pytest.approx(0.2e12)
    assert [r["mfu"] for r in rows] == pytest.approx([0.25, 0.4])

"""The decode profile reads a profiler trace's accelerator kernels and adds them up per step and kind."""

from __future__ import annotations

import gzip
import json

import pytest

from benchmarks.decode_profile import device_events, kernel_kind, summarize


def _write_trace(folder, events):
    run = folder / "plugins" / "profile" / "run1"
    run.mkdir(parents=True)
    with gzip.open(run / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_kernel_kinds_drop_xla_numeric_suffixes_only():
    assert kernel_kind("gemm_fusion_dot_1278") == "gemm_fusion_dot"
    assert kernel_kind("gemm_fusion_dot.23") == "gemm_fusion_dot"
    assert kernel_kind("input_scatter_fusion.1_2") == "input_scatter_fusion"
    assert kernel_kind("nvjet_sm90_tss_168x64_64x7_2x1_v_bz_TNN") == "nvjet_sm90_tss_168x64_64x7_2x1_v_bz_TNN"
    assert kernel_kind("memcpy128") == "memcpy128"


def test_only_the_accelerator_is_counted_and_each_lane_is_summed_per_step(tmp_path):
    meta = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 7, "args": {"name": "Stream #14(Compute)"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 8, "args": {"name": "Stream #74(MemcpyD2D)"}},
    ]
    kernels = [
        {"ph": "X", "pid": 1, "tid": 1, "name": "PjitFunction(decode)", "ts": 0, "dur": 500.0},  # host: left out
        {"ph": "X", "pid": 2, "tid": 7, "name": "gemm_fusion_dot_1", "ts": 0, "dur": 3.0},
        {"ph": "X", "pid": 2, "tid": 7, "name": "gemm_fusion_dot_2", "ts": 5, "dur": 5.0},
        {"ph": "X", "pid": 2, "tid": 7, "name": "input_scatter_fusion", "ts": 11, "dur": 2.0},
        {"ph": "X", "pid": 2, "tid": 8, "name": "memcpy128", "ts": 0, "dur": 4.0},
    ]
    _write_trace(tmp_path, meta + kernels)
    events = device_events(tmp_path)
    assert sorted(e["name"] for e in events) == ["gemm_fusion_dot_1", "gemm_fusion_dot_2", "input_scatter_fusion",
                                                 "memcpy128"]
    lanes = summarize(events, steps=2, top=5)
    compute = lanes["/device:GPU:0 | Stream #14(Compute)"]
    assert compute["events_per_step"] == 1.5
    assert compute["busy_ms_per_step"] == pytest.approx(10.0 / 1e3 / 2)
    assert [(row["name"], row["calls_per_step"]) for row in compute["top"]] == [("gemm_fusion_dot", 1.0),
                                                                             ("input_scatter_fusion", 0.5)]
    assert compute["top"][0]["share"] == pytest.approx(0.8)
    assert lanes["/device:GPU:0 | Stream #74(MemcpyD2D)"]["busy_ms_per_step"] == pytest.approx(4.0 / 1e3 / 2)


def test_a_run_without_a_trace_is_an_error_not_an_empty_profile(tmp_path):
    with pytest.raises(RuntimeError, match="no \\*.trace.json.gz"):
        device_events(tmp_path)

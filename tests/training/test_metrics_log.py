"""Metrics JSONL logging and the plotting script."""

import json
import os
import struct
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from aepo_jax.training.metrics_log import (
    MetricsLogger,
    read_metrics,
    set_aside_earlier_attempt,
    to_python_scalar,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_jsonl_has_one_object_per_step_with_python_scalars(tmp_path, capsys):
    with MetricsLogger(str(tmp_path), tensorboard=False, console_every=1) as log:
        log.log(1, {"loss": jnp.float32(0.5), "reward_mean": np.float64(0.25), "tool_calls_mean": 2})
        log.log(2, {"loss": jnp.float32(jnp.nan), "reward_mean": 1.0})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"step": 1, "loss": 0.5, "reward_mean": 0.25, "tool_calls_mean": 2},
        {"step": 2, "loss": "nan", "reward_mean": 1.0},
    ]
    assert "step 1 | loss 0.5 | reward_mean 0.25" in capsys.readouterr().out


def test_nonfinite_values_are_written_and_printed_not_dropped(tmp_path, capsys):
    with MetricsLogger(str(tmp_path), tensorboard=False, console_every=1) as log:
        log.log(1, {"loss": jnp.float32(jnp.nan), "grad_norm": np.float32(np.inf), "learning_rate": -np.inf,
                    "skipped_updates": jnp.int32(1)})
        log.log(2, {"loss": 0.5, "grad_norm": 1.0, "skipped_updates": 0})
    first, second = read_metrics(str(tmp_path))
    assert (first["loss"], first["grad_norm"], first["learning_rate"]) == ("nan", "inf", "-inf")
    assert np.isnan(float(first["loss"])) and float(first["learning_rate"]) == -np.inf  # float() reads them back
    assert (first["skipped_updates"], second["skipped_updates"]) == (1, 0)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["step 1 | loss nan | grad_norm inf | learning_rate -inf | skipped_updates 1",
                     "step 2 | loss 0.5 | grad_norm 1"]  # a skipped update is a warning: shown when not zero


def test_non_zero_process_writes_nothing(tmp_path):
    with MetricsLogger(str(tmp_path / "w"), process_index=1) as log:
        log.log(1, {"loss": 1.0})
    assert not os.path.exists(tmp_path / "w")


def test_array_metric_is_rejected():
    with pytest.raises(ValueError, match="must be scalars"):
        to_python_scalar(np.zeros(3))


def test_plot_metrics_writes_png(tmp_path):
    with MetricsLogger(str(tmp_path), console=False, tensorboard=False) as log:
        for step in range(1, 6):
            log.log(step, {"reward_mean": step / 5, "entropy_mean": 1.0 / step, "tool_calls_mean": 1.5,
                           "branch_top3_fraction": 0.9})
        log.log(6, {"reward_mean": np.nan, "entropy_mean": np.inf, "tool_calls_mean": 1.5})  # left out of the curves
    assert len(read_metrics(str(tmp_path))) == 6
    out = subprocess.run([sys.executable, "-m", "launch.plot_metrics", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000


def test_plot_metrics_missing_file_is_a_clear_error(tmp_path, capsys):
    """A run directory that is not there was reported as "no metrics file at DIR", with a traceback."""
    from launch.plot_metrics import main

    for workdir in (tmp_path, tmp_path / "no_such_run"):
        assert main([str(workdir)]) == 1
        assert capsys.readouterr().err == f"error: no metrics file at {workdir / 'metrics.jsonl'}\n"
    # The demo's workdir holds its stages' runs: they are named.
    for stage in ("sft", "aepo"):
        with MetricsLogger(str(tmp_path / stage), console=False, tensorboard=False) as logger:
            logger.log(1, {"loss": 1.0})
    assert main([str(tmp_path)]) == 1
    assert capsys.readouterr().err.endswith(f"; the runs in it: aepo, sft (plot one: {tmp_path / 'aepo'})\n")


def test_a_resumed_run_keeps_the_records_through_its_step_and_drops_a_cut_line(tmp_path):
    with MetricsLogger(str(tmp_path), console=False, tensorboard=False) as logger:
        for step in (1, 2, 3):
            logger.log(step, {"loss": float(step)})
    with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 4, "lo')  # a preempted write
    with MetricsLogger(str(tmp_path), console=False, tensorboard=False) as logger:
        assert logger.keep_through(2) == 2
        logger.log(3, {"loss": 30.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(str(tmp_path))] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_a_broken_line_before_the_last_is_an_error_not_a_silent_loss(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with MetricsLogger(str(tmp_path), console=False, tensorboard=False) as logger, \
            pytest.raises(ValueError, match="line 2 is not a JSON record"):
        logger.keep_through(5)


def test_setting_an_earlier_attempt_aside_never_overwrites_one_set_aside_before(tmp_path):
    assert set_aside_earlier_attempt(str(tmp_path), stamp="T") == []  # nothing there
    for attempt in (1, 2):
        with MetricsLogger(str(tmp_path), console=False, tensorboard=False) as log:
            log.log(1, {"loss": float(attempt)})
        set_aside_earlier_attempt(str(tmp_path), stamp="T")  # two restarts within one second
    assert not (tmp_path / "metrics.jsonl").exists()
    assert read_metrics(str(tmp_path / "metrics.abandoned-T.jsonl"))[0]["loss"] == 1.0
    assert read_metrics(str(tmp_path / "metrics.abandoned-T-2.jsonl"))[0]["loss"] == 2.0


def _tensorboard_view(logdir) -> list[tuple[int, float]]:
    """(step, loss) as TensorBoard shows them: event files read in name order, and a SessionLog START
    at step s (a writer's `purge_step`) hides the events read before it at step s and after."""
    event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")
    shown: list[tuple[int, float]] = []
    for path in sorted(logdir.iterdir()):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            if event.HasField("session_log") and event.session_log.status == event.session_log.START:
                shown = [(step, value) for step, value in shown if step < event.step]
            for value in event.summary.value:
                if value.tag == "loss":
                    shown.append((event.step, value.simple_value))
    return shown


def test_a_resumed_run_hides_the_replayed_steps_from_tensorboard_too(tmp_path):
    pytest.importorskip("tensorboardX")
    with MetricsLogger(str(tmp_path), console=False) as logger:
        assert logger.has_tensorboard
        for step in (1, 2, 3, 4):
            logger.log(step, {"loss": float(step)})
    with MetricsLogger(str(tmp_path), console=False) as logger:  # the same second: files must not collide
        logger.keep_through(2)
        for step in (3, 4):
            logger.log(step, {"loss": 10.0 * step})
    assert _tensorboard_view(tmp_path / "tensorboard") == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_tensorboard_gets_the_finite_values_and_metrics_jsonl_every_value(tmp_path, caplog):
    """Each step printed six tensorboardX "NaN or Inf found in input tensor" warnings: the branch statistics
    of a step without branches are NaN."""
    pytest.importorskip("tensorboardX")
    with MetricsLogger(str(tmp_path), console=False) as logger:
        assert logger.has_tensorboard
        logger.log(1, {"loss": np.nan, "grad_norm": np.inf})
        logger.log(2, {"loss": 2.0, "grad_norm": 1.0})
    assert "NaN or Inf" not in caplog.text
    assert _tensorboard_view(tmp_path / "tensorboard") == [(2, 2.0)]
    assert [r["loss"] for r in read_metrics(str(tmp_path))] == ["nan", 2.0]

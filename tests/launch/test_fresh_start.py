"""A fresh start in a workdir whose earlier attempt died before its first checkpoint: the attempt's
metrics.jsonl and tensorboard/ are moved aside, not appended to (`launch.run_setup.prepare_workdir`)."""

from aepo_jax.training.metrics_log import MetricsLogger, read_metrics
from configs.aepo_tiny import get_config
from launch.run_setup import prepare_workdir


def test_a_fresh_start_moves_the_dead_attempts_records_aside(tmp_path, capsys):
    workdir = str(tmp_path)
    prepare_workdir(get_config(), workdir, resume=False)
    with MetricsLogger(workdir, console=False, tensorboard=False) as log:  # attempt 1: 7 steps, then a crash
        for step in range(1, 8):
            log.log(step, {"loss": 1.0})
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "events.out").write_text("attempt 1")

    prepare_workdir(get_config(), workdir, resume=False)  # allowed: no complete checkpoint yet
    with MetricsLogger(workdir, console=False, tensorboard=False) as log:
        for step in range(1, 4):
            log.log(step, {"loss": 2.0})

    assert [(r["step"], r["loss"]) for r in read_metrics(workdir)] == [(1, 2.0), (2, 2.0), (3, 2.0)]
    assert not (tmp_path / "tensorboard").exists()
    (old_metrics,) = tmp_path.glob("metrics.abandoned-*.jsonl")
    assert [r["step"] for r in read_metrics(str(old_metrics))] == list(range(1, 8))  # kept whole, beside
    (old_tensorboard,) = tmp_path.glob("tensorboard.abandoned-*")
    assert (old_tensorboard / "events.out").read_text() == "attempt 1"
    assert str(old_metrics) in capsys.readouterr().out  # the start says where they went


def test_a_first_fresh_start_moves_nothing(tmp_path):
    prepare_workdir(get_config(), str(tmp_path), resume=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "sources.json"]


def test_a_second_run_in_a_held_workdir_exits_naming_it(tmp_path):
    """Two runs started in one workdir both trained, their metrics interleaved (steps 1,2,3,1,4,2,...) and
    their checkpoints overwrote each other; the second now exits before touching anything, and the lock
    is free again once the first ends."""
    import pytest

    from launch.run_setup import workdir_lock

    workdir = str(tmp_path / "run")
    with workdir_lock(workdir):
        prepare_workdir(get_config(), workdir, resume=False)
        with MetricsLogger(workdir, console=False, tensorboard=False) as log:
            log.log(1, {"loss": 1.0})
        with pytest.raises(SystemExit, match=r"another run is training in .*run .*held by pid \d+"), \
                workdir_lock(workdir):
            prepare_workdir(get_config(), workdir, resume=False)  # (would set the live run's metrics aside)
        assert [r["step"] for r in read_metrics(workdir)] == [1]
    with workdir_lock(workdir):  # released
        pass

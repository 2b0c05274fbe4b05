"""Two seeded runs of `python -m launch.train` on the tiny AEPO config write the
same metrics.jsonl, except the wall-clock metrics (`WALL_CLOCK_METRICS`).

The runs are separate processes with different PYTHONHASHSEED values, so a
result that depended on set or dict-of-string iteration order, thread timing in
the tool or reward pools, or the start time would show up as a difference. The
objective gets a small entropy bonus so that every step really updates the
parameters (a random tiny policy earns equal rewards in a group, hence zero
advantages), and step 2 rolls out with the updated model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from aepo_jax.training.metrics_log import (
    WALL_CLOCK_METRICS,
    read_metrics,
    without_wall_clock,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_RUN = [
    "--config", "configs/aepo_tiny.py", "--config.deterministic=True", "--config.total_steps=2",
    "--config.data.num_examples=16", "--config.data.prompts_per_step=2", "--config.rollout.k=2",
    "--config.rollout.initial_rollouts=1", "--config.rollout.max_response_len=16", "--config.rollout.max_tool_calls=1",
    "--config.train.mini_batch_prompts=2", "--config.train.micro_batch_size=2", "--config.train.max_seq_len=512",
    "--config.objective.entropy_coef=0.01", "--config.checkpoint.async_save=False",
    "--config.log.progress_bar=False", "--config.log.tensorboard=False",
]


def test_two_seeded_tiny_runs_write_identical_metrics(tmp_path):
    # One after the other: the second run loads the first's programs from the persistent
    # compilation cache (JAX_COMPILATION_CACHE_DIR, inherited from tests/conftest.py) instead of
    # compiling them again at the same time. A cache hit is the same executable for the same
    # program, and a program that depended on the hash seed would miss and compile anew.
    workdirs = []
    for hash_seed in ("1", "2"):
        workdir = tmp_path / f"run{hash_seed}"
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="", PYTHONHASHSEED=hash_seed)
        process = subprocess.Popen(
            [sys.executable, "-m", "launch.train", *TINY_RUN, "--workdir", str(workdir)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)  # its own process group: a failed test takes its tools down too
        try:
            output, _ = process.communicate(timeout=850)  # pytest.ini allows 900 for the whole test
            assert process.returncode == 0, output[-3000:]
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        workdirs.append(workdir)
    first, second = (read_metrics(str(workdir)) for workdir in workdirs)
    assert [r["step"] for r in first] == [1, 2]
    assert all(r["grad_norm"] > 0 for r in first)  # the update really moved the parameters
    assert WALL_CLOCK_METRICS & set(first[0])  # the excluded keys exist (names kept in sync)
    for a, b in zip(first, second, strict=True):
        differing = {k: (a.get(k), b.get(k)) for k in without_wall_clock(a).keys() | without_wall_clock(b).keys()
                     if a.get(k) != b.get(k)}
        assert not differing, json.dumps(differing, indent=1)


def test_deterministic_bounds_the_python_tool_by_cpu_time_not_wall_clock():
    """A call that sleeps past `tool_timeout_s` but uses almost no CPU: the default
    wall-clock limit stops it (on a slow enough machine any call could be stopped
    so), `deterministic=True` lets it finish; a CPU-bound loop is stopped either way."""
    from aepo_jax.experiment import DETERMINISTIC_WALL_FACTOR, sandbox_limits
    from aepo_jax.tools import PythonSandbox
    from configs.base import get_base_config

    cfg = get_base_config()
    cfg.rollout.tool_timeout_s = 1.0
    assert sandbox_limits(cfg).wall_seconds == 1.0
    sleeper, spinner = "import time\ntime.sleep(1.5)\nprint('done')", "while True:\n    pass"
    with PythonSandbox(sandbox_limits(cfg), pool_size=1) as sandbox:
        assert sandbox.run(sleeper).status == "timeout"
    cfg.deterministic = True
    limits = sandbox_limits(cfg)
    assert (limits.cpu_seconds, limits.wall_seconds) == (1, DETERMINISTIC_WALL_FACTOR * 1.0)
    with PythonSandbox(limits, pool_size=1) as sandbox:
        slept = sandbox.run(sleeper)
        assert (slept.status, slept.stdout) == ("ok", "done\n")
        spun = sandbox.run(spinner)
        assert spun.status == "timeout" and "CPU-time limit" in spun.traceback

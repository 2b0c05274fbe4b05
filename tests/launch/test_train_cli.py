"""`python -m launch.train` end to end on the embedded task: the real sampler,
agent loop, tools (search server, python sandbox) and AEPO rollout for two
steps; metrics, checkpoint, saved config; seeded runs that repeat; clear
errors for bad invocations.

The two-step run is seeded and `deterministic`, and a second run of the same
command (another process, another PYTHONHASHSEED) must write the same
metrics.jsonl except the wall-clock metrics (issue 17). The second run loads
the first's programs from the persistent compilation cache (tests/conftest.py,
inherited through tests/child_process.py): a cache hit is the same executable
for the same program, and a program that depended on the hash seed would miss
and compile anew.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from aepo_jax.training.metrics_log import (
    WALL_CLOCK_METRICS,
    read_metrics,
    without_wall_clock,
)
from tests.child_process import child_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--config.data.prompts_per_step=2", "--config.rollout.k=2", "--config.rollout.initial_rollouts=1",
         "--config.rollout.max_response_len=16", "--config.rollout.max_tool_calls=1",
         "--config.train.mini_batch_prompts=2", "--config.train.micro_batch_size=2",
         "--config.log.progress_bar=false", "--config.log.tensorboard=false"]
# The seeded two-step run. The objective gets a small entropy bonus so that every step really
# updates the parameters (a random tiny policy earns equal rewards in a group, hence zero
# advantages), and step 2 rolls out with the updated model; log_kl: the reference model's KL
# is logged too.
SEEDED_RUN = ["--config", "configs/aepo_tiny.py", "--config.deterministic=True", "--config.total_steps=2",
              "--config.data.num_examples=16", "--config.train.max_seq_len=512",
              "--config.objective.entropy_coef=0.01", "--config.objective.log_kl=true",
              "--config.checkpoint.async_save=False", *SMALL]


def _launch(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "launch.train", *args], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def _seeded_run(workdir, hash_seed: str) -> str:
    """The seeded run in `workdir` under PYTHONHASHSEED=`hash_seed`; its console output."""
    process = subprocess.Popen(
        [sys.executable, "-m", "launch.train", *SEEDED_RUN, "--workdir", str(workdir)],
        cwd=REPO, env=child_env(PYTHONHASHSEED=hash_seed), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)  # its own process group: a failed run takes its tools down too
    try:
        output, _ = process.communicate(timeout=850)  # pytest.ini allows 900 for the whole test
        assert process.returncode == 0, output[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return output


def test_unknown_override_key_is_refused_by_name(tmp_path):
    out = _launch("--config", "configs/aepo_tiny.py", "--workdir", str(tmp_path), "--config.train.bogus_key=1")
    assert out.returncode != 0
    assert "unknown config key 'train.bogus_key'" in out.stderr
    assert "total_steps" in out.stderr  # lists the keys that do exist
    assert not os.path.exists(tmp_path / "metrics.jsonl")


def test_deterministic_with_the_continuous_schedule_is_refused_before_anything_starts(tmp_path):
    out = _launch("--config", "configs/aepo_tiny.py", "--workdir", str(tmp_path), "--config.deterministic=True",
                  "--config.rollout.schedule=continuous")
    assert out.returncode != 0
    error, where = out.stderr.strip().splitlines()[-2:]
    assert error.startswith("error: config.deterministic=True asks for rollouts")
    assert where.startswith("  (ValueError at ") and "aepo_jax/experiment.py:" in where
    assert not os.path.exists(tmp_path / "config.json")  # refused before the workdir is written


def test_an_attention_kernel_this_platform_lacks_is_refused_before_anything_starts(tmp_path):
    """splash is a TPU kernel: on this CPU the run failed only at its first program, after the tools,
    the model and the optimiser were built."""
    out = _launch("--config", "configs/aepo_tiny.py", "--workdir", str(tmp_path), "--config.model.attention=splash",
                  "--config.total_steps=1", *SMALL)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-2] == (
        "error: model.attention='splash' runs only on tpu, but this process runs on 'cpu': "
        "set model.attention='dense' (e.g. --config.model.attention=dense)")
    assert not os.path.exists(tmp_path / "config.json")  # refused before the workdir is written


@pytest.mark.parametrize("module", ["launch.train", "launch.sft", "launch.evaluate"])
def test_missing_config_file_is_one_clear_line(tmp_path, module):
    missing = str(tmp_path / "no_such_config.py")
    out = subprocess.run([sys.executable, "-m", module, "--config", missing + ":arg", "--workdir", str(tmp_path),
                          "--checkpoint", "none"], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode != 0
    assert out.stderr.strip() == f"config file not found: {missing} (from --config {missing}:arg)"


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run")
    return workdir, _seeded_run(workdir, hash_seed="1")


def test_two_aepo_steps_write_metrics_checkpoint_and_config(two_step_run):
    workdir, out = two_step_run
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        for key in ("step", "reward_mean", "entropy_mean", "loss", "tool_calls_mean", "rollout_s", "train_s"):
            assert key in record, key
        assert -1.0 <= record["reward_mean"] <= 1.1  # qa_f1 reward range (format failures give -1)
        assert record["entropy_mean"] > 0
    assert "2" in os.listdir(workdir / "checkpoints")
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["total_steps"] == 2 and saved["algorithm"] == "aepo" and saved["rollout"]["k"] == 2
    assert "resolved config:" in out


def test_existing_run_needs_resume_flag(two_step_run):
    workdir, _ = two_step_run
    out = _launch(*SEEDED_RUN, "--workdir", str(workdir))
    assert out.returncode != 0
    assert "pass --resume" in out.stderr


def test_resume_without_a_checkpoint_is_refused_before_anything_starts(tmp_path):
    """An unmounted bucket or a mistyped --workdir looks like an empty folder: --resume must not start
    the run again from step 0 there."""
    out = _launch(*SEEDED_RUN, "--workdir", str(tmp_path / "nothing_here"), "--resume", timeout=300)
    assert out.returncode != 0
    assert "holds no complete checkpoint" in out.stderr and "leave out --resume" in out.stderr


def test_resume_with_a_changed_learning_rate_is_refused_naming_it(two_step_run):
    workdir, _ = two_step_run
    saved = (workdir / "config.json").read_text()
    out = _launch(*SEEDED_RUN, "--workdir", str(workdir), "--resume", "--config.optim.lr=0.5", timeout=300)
    assert out.returncode != 0
    assert "optim.lr: 0.001 -> 0.5" in out.stderr and "--allow_config_changes" in out.stderr
    assert (workdir / "config.json").read_text() == saved  # the run's config is left as it was


def test_every_key_the_plots_and_console_ask_for_is_emitted(two_step_run):
    from aepo_jax.training.metric_keys import CONSOLE_KEYS, PLOT_PANELS

    workdir, out = two_step_run
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    emitted = set().union(*records)
    wanted = {key for _, keys in PLOT_PANELS for key in keys} | set(CONSOLE_KEYS)
    assert wanted <= emitted, sorted(wanted - emitted)
    assert "kl_ref_rollout" in out  # the console line shows the KL it was asked for


def test_plot_metrics_draws_the_run(two_step_run):
    workdir, _ = two_step_run
    out = subprocess.run([sys.executable, "-m", "launch.plot_metrics", str(workdir)], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert (workdir / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_a_second_seeded_run_writes_identical_metrics(two_step_run, tmp_path):
    first_dir, _ = two_step_run
    _seeded_run(tmp_path / "again", hash_seed="2")
    first, second = read_metrics(str(first_dir)), read_metrics(str(tmp_path / "again"))
    assert [r["step"] for r in first] == [1, 2]
    assert all(r["grad_norm"] > 0 for r in first)  # the update really moved the parameters
    assert WALL_CLOCK_METRICS & set(first[0])  # the excluded keys exist (names kept in sync)
    for a, b in zip(first, second, strict=True):
        differing = {k: (a.get(k), b.get(k)) for k in without_wall_clock(a).keys() | without_wall_clock(b).keys()
                     if a.get(k) != b.get(k)}
        assert not differing, json.dumps(differing, indent=1)


def test_a_preemption_notice_saves_the_step_reached_and_the_run_resumes_from_it(tmp_path):
    """SIGTERM (a preempted VM, a scheduler's cancel) mid-run: the step in progress finishes, is saved
    although it is no checkpoint step, and the run exits non-zero; `--resume` continues from that step."""
    workdir = tmp_path / "run"
    run = [*SEEDED_RUN, "--workdir", str(workdir), "--config.total_steps=40", "--config.checkpoint.every=1000"]
    process = subprocess.Popen([sys.executable, "-m", "launch.train", *run], cwd=REPO, env=child_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        metrics = workdir / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().strip()):  # the first step is done
            assert process.poll() is None and time.monotonic() < deadline, "the run ended before its first step"
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode != 0, output[-3000:]
    steps = [r["step"] for r in read_metrics(str(workdir))]
    reached = steps[-1]
    assert 1 <= reached < 40 and steps == list(range(1, reached + 1))
    assert f"preempted: saved step {reached}" in output
    assert sorted(os.listdir(workdir / "checkpoints")) == [str(reached)]
    out = _launch(*run, "--resume", f"--config.total_steps={reached + 1}", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resumed from step {reached}" in out.stdout
    assert [r["step"] for r in read_metrics(str(workdir))] == list(range(1, reached + 2))

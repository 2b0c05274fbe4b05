"""`python -m launch.train` end to end on the embedded task: the real sampler,
agent loop, tools (search server, python sandbox) and AEPO rollout for two
steps; metrics, checkpoint, saved config; clear errors for bad invocations."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--config.data.prompts_per_step=2", "--config.rollout.k=2", "--config.rollout.initial_rollouts=1",
         "--config.rollout.max_response_len=16", "--config.rollout.max_tool_calls=1",
         "--config.train.mini_batch_prompts=2", "--config.train.micro_batch_size=2",
         "--config.log.progress_bar=false", "--config.log.tensorboard=false"]


def _launch(*args, timeout=900):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")  # one CPU device, as a user would run it
    return subprocess.run([sys.executable, "-m", "launch.train", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_unknown_override_key_is_refused_by_name(tmp_path):
    out = _launch("--config", "configs/aepo_tiny.py", "--workdir", str(tmp_path), "--config.train.bogus_key=1")
    assert out.returncode != 0
    assert "unknown config key 'train.bogus_key'" in out.stderr
    assert "total_steps" in out.stderr  # lists the keys that do exist
    assert not os.path.exists(tmp_path / "metrics.jsonl")


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
    out = _launch("--config", "configs/aepo_tiny.py", "--workdir", str(workdir), "--config.total_steps=2",
                  "--config.objective.log_kl=true", *SMALL)  # log_kl: the reference model's KL is logged too
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return workdir, out


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
    assert "resolved config:" in out.stdout


def test_existing_run_needs_resume_flag(two_step_run):
    workdir, _ = two_step_run
    out = _launch("--config", "configs/aepo_tiny.py", "--workdir", str(workdir), "--config.total_steps=2", *SMALL)
    assert out.returncode != 0
    assert "pass --resume" in out.stderr


def test_every_key_the_plots_and_console_ask_for_is_emitted(two_step_run):
    from aepo_jax.training.metric_keys import CONSOLE_KEYS, PLOT_PANELS

    workdir, out = two_step_run
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    emitted = set().union(*records)
    wanted = {key for _, keys in PLOT_PANELS for key in keys} | set(CONSOLE_KEYS)
    assert wanted <= emitted, sorted(wanted - emitted)
    assert "kl_ref_rollout" in out.stdout  # the console line shows the KL it was asked for


def test_plot_metrics_draws_the_run(two_step_run):
    workdir, _ = two_step_run
    out = subprocess.run([sys.executable, "-m", "launch.plot_metrics", str(workdir)], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert (workdir / "curves.png").read_bytes()[:4] == b"\x89PNG"

"""What `launch/tpu_vm.sh run` sends to every worker, checked with a fake `gcloud` that runs the ssh command
as a worker would (in a folder holding `aepo-jax/.venv/bin/python`, a fake that records its arguments and
environment): every argument arrives whole, FORWARD_ENV's values arrive without being printed, the run
goes on in the background with a log per worker, and settings that cannot work are refused before any
gcloud call."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "launch/tpu_vm.sh")
SETTINGS = ("TPU_NAME", "ZONE", "ACCELERATOR_TYPE", "RUNTIME_VERSION", "PROJECT", "REPO_URL", "BRANCH", "PYTHON",
            "FORWARD_ENV", "START_CHECK_S")


@pytest.fixture
def slice_(tmp_path):
    """(environment for the script, the worker's home, the gcloud argument log, the python record)."""
    home, bin_dir = tmp_path / "worker", tmp_path / "bin"
    venv = home / "aepo-jax" / ".venv" / "bin"
    venv.mkdir(parents=True)
    bin_dir.mkdir()
    calls, record = tmp_path / "gcloud.log", tmp_path / "python.record"
    python = venv / "python"
    python.write_text("#!/usr/bin/env bash\n"
                      f"{{ printf '[%s]\\n' \"$@\"; env | grep -E '^(SECRET_KEY|XLA_FLAGS)=' ; }} > {record}.part\n"
                      f"mv {record}.part {record}\n")
    python.chmod(0o755)
    gcloud = bin_dir / "gcloud"
    gcloud.write_text("#!/usr/bin/env bash\n"
                      f"{{ printf '%s\\n' \"$@\"; echo ---; }} >> {calls}\n"
                      # scp FILE TPU:PATH: the file lands at PATH under the worker's home
                      f'[[ "$4" == scp ]] && {{ cp "$5" "{home}/${{6#*:}}"; exit; }}\n'
                      'cmd=""; while [[ $# -gt 0 ]]; do [[ "$1" == --command ]] && { cmd="$2"; shift; }; shift; done\n'
                      f'[[ -z "$cmd" ]] || (cd {home} && env -i HOME={home} PATH=/usr/bin:/bin bash -c "$cmd")\n')
    gcloud.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS and k != "SECRET_KEY"}
    env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    env["START_CHECK_S"] = "0"  # the fake python is done at once
    return env, home, calls, record


def _run(env, *args):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=env, check=False)


def _recorded(record, timeout_s: float = 10.0) -> list[str]:
    """The fake python's record, once the background run has written it."""
    deadline = time.monotonic() + timeout_s
    while not record.exists():
        assert time.monotonic() < deadline, "the worker's python never ran"
        time.sleep(0.05)
    return record.read_text().splitlines()


def test_every_argument_reaches_the_workers_whole(slice_):
    """CONFIG and WORKDIR went into the ssh command unquoted: a path with a space split into two arguments."""
    env, _, _, record = slice_
    out = _run(env, "run", "configs/my config.py:release", "/mnt/my bucket/run14b", "--config.name=it's a run",
               '--config.mesh.shape={"data": 1, "fsdp": 8, "tensor": 4}')
    assert out.returncode == 0, out.stderr
    assert _recorded(record)[:9] == [
        "[-m]", "[launch.train]", "[--config]", "[configs/my config.py:release]", "[--workdir]",
        "[/mnt/my bucket/run14b]", "[--config.distributed=on]", "[--config.name=it's a run]",
        '[--config.mesh.shape={"data": 1, "fsdp": 8, "tensor": 4}]']


def test_the_run_goes_on_in_the_background_with_a_log_per_worker(slice_):
    """The training ran inside the ssh session: a closed laptop or a dropped connection ended it."""
    env, home, calls, record = slice_
    out = _run(env, "run", "configs/aepo_tiny.py", "/mnt/b/run")
    assert out.returncode == 0, out.stderr
    _recorded(record)
    command = calls.read_text().split("--command\n", 1)[1]
    assert "nohup " in command and "< /dev/null &" in command
    hostname = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    assert (home / "aepo-jax" / "logs" / f"train-{hostname}.log").exists()
    assert f"log ~/aepo-jax/logs/train-{hostname}.log" in out.stdout


def test_forwarded_variables_arrive_on_the_workers_and_are_not_printed(slice_):
    """The workers' environment is the ssh session's: a judge's API key, XLA_FLAGS or LIBTPU_INIT_ARGS set
    here never reached them."""
    env, _, _, record = slice_
    secret = "sk-very secret'$(touch /tmp/pwned)"
    out = _run({**env, "SECRET_KEY": secret, "XLA_FLAGS": "--xla_dump_to=/tmp/d --xla_x=1",
                "FORWARD_ENV": "SECRET_KEY XLA_FLAGS"}, "run", "configs/aepo_tiny.py", "/mnt/b/run")
    assert out.returncode == 0, out.stderr
    seen = _recorded(record)
    assert f"SECRET_KEY={secret}" in seen and "XLA_FLAGS=--xla_dump_to=/tmp/d --xla_x=1" in seen
    assert "secret" not in out.stdout + out.stderr


def test_forwarded_values_are_on_no_command_line_and_leave_no_file_behind(slice_):
    """The values travelled inside the ssh command, so `ps` on this machine showed them while gcloud ran
    (they were in gcloud's and ssh's arguments)."""
    env, home, calls, record = slice_
    local_tmp = home.parent / "local_tmp"
    local_tmp.mkdir()
    out = _run({**env, "SECRET_KEY": "sk-very-secret-value", "FORWARD_ENV": "SECRET_KEY", "TMPDIR": str(local_tmp)},
               "run", "configs/aepo_tiny.py", "/mnt/b/run")
    assert out.returncode == 0, out.stderr
    assert "SECRET_KEY=sk-very-secret-value" in _recorded(record)
    assert "sk-very-secret-value" not in calls.read_text()
    folder = home / ".aepo-jax"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert list(folder.iterdir()) == [] and list(local_tmp.iterdir()) == []


@pytest.mark.parametrize(("args", "extra", "message"), [
    (("run", "configs/aepo_tiny.py", "run14b"), {}, "WORKDIR 'run14b' must be an absolute path"),
    (("evaluate", "mnt/b/run"), {}, "WORKDIR 'mnt/b/run' must be an absolute path"),
    (("run", "configs/aepo_tiny.py", "/mnt/b/run"), {"FORWARD_ENV": "NOT_SET_ANYWHERE"},
     "FORWARD_ENV names NOT_SET_ANYWHERE, which is not set here"),
    (("run", "configs/aepo_tiny.py", "/mnt/b/run"), {"FORWARD_ENV": "A;B"}, "no environment variable name"),
    (("create",), {}, "error: set REPO_URL to the git URL every worker clones"),
    (("install",), {}, "error: set REPO_URL"),
])
def test_settings_that_cannot_work_are_refused_before_any_gcloud_call(slice_, args, extra, message):
    """A relative WORKDIR is each worker's own folder (the first checkpoint then waits forever); an unset
    REPO_URL cloned a placeholder URL after the slice was created."""
    env, _, calls, _ = slice_
    out = _run({**env, **extra}, *args)
    assert out.returncode == 2
    assert message in out.stderr
    assert not calls.exists()


def test_a_training_that_fails_at_once_fails_the_command_with_its_log(slice_):
    """Started in the background, a run refused at start (a bad setting) looked like a run under way."""
    env, home, _, _ = slice_
    python = home / "aepo-jax" / ".venv" / "bin" / "python"
    python.write_text("#!/usr/bin/env bash\necho 'error: train.mini_batch_prompts=1 is global'\nexit 1\n")
    out = _run({**env, "START_CHECK_S": "1"}, "run", "configs/aepo_tiny.py", "/mnt/b/run")
    assert out.returncode != 0
    assert "the training exited at once" in out.stderr and "error: train.mini_batch_prompts=1" in out.stderr


def test_a_second_run_while_a_training_still_runs_is_refused(slice_):
    env, home, _, record = slice_
    logs = home / "aepo-jax" / "logs"
    logs.mkdir()
    (logs / "train.pid").write_text(f"{os.getpid()}\n")  # a process that is alive
    out = _run(env, "run", "configs/aepo_tiny.py", "/mnt/b/run")
    assert out.returncode != 0 and "a training started earlier still runs" in out.stderr
    assert not record.exists()


def test_evaluate_none_is_the_base_models_evaluation(slice_):
    """`launch.evaluate --checkpoint none` needs no run directory; the absolute-path check refused it."""
    env, _, _, record = slice_
    out = _run(env, "evaluate", "none", "--config", "configs/aepo_tiny.py")
    assert out.returncode == 0, out.stderr
    assert _recorded(record)[:4] == ["[-m]", "[launch.evaluate]", "[--checkpoint]", "[none]"]

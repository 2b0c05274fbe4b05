"""The TPU VM and multi-host GPU launch scripts, and the one-shot GPU benchmark script, are valid bash and
refuse bad usage."""

import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = ["launch/tpu_vm.sh", "launch/gpu_multi.sh", "benchmarks/gpu_sampler_check.sh"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_bash_syntax(script):
    out = subprocess.run(["bash", "-n", os.path.join(REPO, script)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


def test_tpu_script_without_a_command_prints_usage():
    out = subprocess.run(["bash", os.path.join(REPO, "launch/tpu_vm.sh")], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 2
    assert "launch/tpu_vm.sh create" in out.stderr
    assert "--rename-dir-limit" in out.stderr and "docs/attention.md" in out.stderr  # the whole header


def test_gpu_script_requires_coordinator_environment():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SLURM_"))}
    out = subprocess.run(["bash", os.path.join(REPO, "launch/gpu_multi.sh"), "configs/aepo_tiny.py", "/tmp/w"],
                         capture_output=True, text=True, env=env, check=False)
    assert out.returncode != 0
    assert "JAX_COORDINATOR_ADDRESS" in out.stderr


def test_gpu_script_in_an_salloc_shell_still_requires_the_coordinator_environment(tmp_path):
    """A shell inside `salloc -N4` sees SLURM_NTASKS but is no task of an srun step (no SLURM_PROCID): the
    script went on without the JAX_* variables, and JAX's SLURM detection then failed it. It tests
    SLURM_PROCID, as `detect_multihost` does; a task of an srun step goes on."""
    fake = tmp_path / "python"
    fake.write_text("#!/usr/bin/env bash\nexit 0\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SLURM_"))}
    env.update(PYTHON=str(fake), SLURM_NTASKS="4", SLURM_JOB_ID="7")
    script = [os.path.join(REPO, "launch/gpu_multi.sh"), "configs/aepo_tiny.py", "/tmp/w"]
    out = subprocess.run(["bash", *script], capture_output=True, text=True, env=env, check=False)
    assert out.returncode != 0 and "JAX_COORDINATOR_ADDRESS" in out.stderr
    out = subprocess.run(["bash", *script], capture_output=True, text=True, env={**env, "SLURM_PROCID": "0"},
                         check=False)
    assert out.returncode == 0, out.stderr


def test_gpu_sampler_check_without_an_output_folder_prints_usage_and_writes_nothing(tmp_path):
    out = subprocess.run(["bash", os.path.join(REPO, "benchmarks/gpu_sampler_check.sh")], capture_output=True,
                         text=True, check=False, cwd=tmp_path)
    assert out.returncode != 0
    assert "usage: gpu_sampler_check.sh OUT_DIR" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_tpu_create_installs_the_tested_versions_with_the_extras_the_paper_configs_need(tmp_path):
    """`create` runs gcloud (faked here: it records its arguments) with an install command on every
    worker: the constraints CI tests, the `hf` extra (tokenizer.json) and the `server` extra (the
    search server and tools), behind a Python >= 3.11 check."""
    log = tmp_path / "gcloud.log"
    fake = tmp_path / "bin" / "gcloud"
    fake.parent.mkdir()
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" >> {log}\nprintf -- "---\\n" >> {log}\n')
    fake.chmod(0o755)
    settings = ("TPU_NAME", "ZONE", "ACCELERATOR_TYPE", "RUNTIME_VERSION", "PROJECT", "REPO_URL", "BRANCH", "PYTHON")
    env = {k: v for k, v in os.environ.items() if k not in settings}
    env["PATH"] = f"{fake.parent}:{os.environ['PATH']}"
    env["REPO_URL"] = "https://example.org/aepo-jax.git"  # required (tests/launch/test_tpu_vm_script.py)
    out = subprocess.run(["bash", os.path.join(REPO, "launch/tpu_vm.sh"), "create"], capture_output=True,
                         text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr
    create, ssh = log.read_text().split("---\n")[:2]
    assert "--accelerator-type\nv5p-64\n" in create
    log.unlink()  # `install` alone: only the install command, on an existing slice
    out = subprocess.run(["bash", os.path.join(REPO, "launch/tpu_vm.sh"), "install"], capture_output=True,
                         text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr
    assert log.read_text().split("---\n")[:-1] == [ssh]
    install = ssh.split("--command\n", 1)[1]
    assert ".venv/bin/pip install -q -c constraints.txt -e '.[hf,server,tensorboard]' 'jax[tpu]'" in install
    assert "sys.version_info >= (3, 11)" in install
    assert "git clone --branch main https://example.org/aepo-jax.git aepo-jax" in install
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
        setup = f.read()
    assert '"hf":' in setup and '"server":' in setup and '"tensorboard":' in setup and 'python_requires=">=3.11"' in setup


def test_gpu_script_on_one_node_hands_train_a_one_process_launch(tmp_path):
    """One node (JAX_NUM_PROCESSES=1): the script runs `launch.train` with distributed=on (faked python
    here: it records its arguments and JAX environment), and those initialise one named process
    (`initialize_arguments`; a bare initialize() fails on a GPU node)."""
    from aepo_jax.parallel.distributed import initialize_arguments

    log = tmp_path / "python.log"
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > {log}\nenv | grep ^JAX_ >> {log}\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SLURM_"))}
    env.update(PYTHON=str(fake), JAX_COORDINATOR_ADDRESS="localhost:12345", JAX_NUM_PROCESSES="1",
               JAX_PROCESS_ID="0")
    out = subprocess.run(["bash", os.path.join(REPO, "launch/gpu_multi.sh"), "configs/aepo_tiny.py", "/tmp/w",
                          "--config.model.attention=dense"], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr
    lines = log.read_text().splitlines()
    assert lines[:6] == ["-m", "launch.train", "--config", "configs/aepo_tiny.py", "--workdir", "/tmp/w"]
    assert "--config.distributed=on" in lines and "--config.model.attention=dense" in lines
    seen = dict(line.split("=", 1) for line in lines if line.startswith("JAX_"))
    assert initialize_arguments("on", seen) == {"coordinator_address": "localhost:12345", "num_processes": 1,
                                                "process_id": 0}


def test_gpu_script_install_hint_has_the_extras_and_the_tested_versions():
    """The install line matches the Makefile's: the constraints CI tests and the `hf` and `server` extras
    (tokenizer.json, the search server and tools), plus a CUDA build of jax."""
    with open(os.path.join(REPO, "launch/gpu_multi.sh"), encoding="utf-8") as f:
        script = f.read()
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as f:
        makefile = f.read()
    assert "-c constraints.txt -e '.[hf,server]'" in makefile
    assert "pip install -c constraints.txt -e '.[hf,server,tensorboard]' 'jax[cuda12]'" in script


def test_gpu_script_runs_the_repositorys_launch_from_any_directory(tmp_path):
    """`python -m launch.train` found `launch` only from the repository root (or an installed package): the
    script now puts its own repository first on PYTHONPATH; CONFIG and WORKDIR stay the caller's paths."""
    log = tmp_path / "python.log"
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$PYTHONPATH" "$@" > {log}\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SLURM_")) and k != "PYTHONPATH"}
    env.update(PYTHON=str(fake), JAX_COORDINATOR_ADDRESS="localhost:12345", JAX_NUM_PROCESSES="1",
               JAX_PROCESS_ID="0")
    out = subprocess.run(["bash", os.path.join(REPO, "launch/gpu_multi.sh"), "my_config.py", "run"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert out.returncode == 0, out.stderr
    lines = log.read_text().splitlines()
    assert lines[0] == REPO
    assert lines[1:7] == ["-m", "launch.train", "--config", "my_config.py", "--workdir", "run"]

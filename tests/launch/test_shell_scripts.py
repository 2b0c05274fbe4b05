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
    assert ".venv/bin/pip install -q -c constraints.txt -e '.[hf,server]' 'jax[tpu]'" in install
    assert "sys.version_info >= (3, 11)" in install
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
        setup = f.read()
    assert '"hf":' in setup and '"server":' in setup and 'python_requires=">=3.11"' in setup

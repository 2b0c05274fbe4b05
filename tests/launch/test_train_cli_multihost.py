"""`python -m launch.train` on two real processes (`jax.distributed` on loopback, 4 fake CPU devices each),
as every host of a TPU slice runs it: the real agent rollout on each host's own devices, with
`train.rollout_ahead`. Resumed with `--resume` from its step-2 checkpoint (saved while step 3's rollout
was in flight), a run writes the same step 3 as the uninterrupted run, so the checkpoint (with the next
rollout's parameters and the data position before its draw) is exact across processes."""

import os
import shutil

import pytest

from aepo_jax.training.metrics_log import read_metrics, without_wall_clock
from tests.training.local_cluster import outputs, start_processes, stderr_of

TIMEOUT_S = 400
RUN = ["-m", "launch.train", "--config", "configs/aepo_tiny.py", "--config.deterministic=True",
       "--config.data.num_examples=16", "--config.train.max_seq_len=512",
       # Every step updates the parameters even with equal rewards (no advantage) in a group.
       "--config.objective.entropy_coef=0.01", "--config.checkpoint.async_save=False",
       '--config.mesh.shape={"data": -1, "fsdp": 2, "tensor": 2}', "--config.train.rollout_ahead=True",
       "--config.train.recompute_logp_old=False",
       "--config.data.prompts_per_step=2", "--config.rollout.k=2", "--config.rollout.initial_rollouts=1",
       "--config.rollout.max_response_len=16", "--config.rollout.max_tool_calls=1",
       "--config.train.mini_batch_prompts=2", "--config.train.micro_batch_size=2",
       "--config.log.progress_bar=false", "--config.log.tensorboard=false"]


def _launch(workdir, steps: int, *flags: str) -> None:
    outputs(start_processes([*RUN, f"--config.total_steps={steps}", "--workdir", str(workdir), *flags], 2, 4),
            TIMEOUT_S)


@pytest.mark.slow  # two two-process launches, each starting the environment and compiling the trainer
def test_two_process_launch_with_rollout_ahead_resumes_exactly(tmp_path):
    every_step = ["--config.checkpoint.every=1", "--config.checkpoint.keep=3"]
    _launch(tmp_path / "whole", 3, *every_step)
    # The run as it stood after step 2: its checkpoint was saved while step 3's rollout was in flight.
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "3")
    metrics = tmp_path / "resumed" / "metrics.jsonl"
    with open(metrics, "a", encoding="utf-8") as f:  # step 3's record is there, and a write cut short after it
        f.write('{"step": 4, "lo')
    _launch(tmp_path / "resumed", 3, *every_step, "--resume")
    whole = read_metrics(str(tmp_path / "whole" / "metrics.jsonl"))
    resumed = read_metrics(str(metrics))
    assert [r["step"] for r in whole] == [r["step"] for r in resumed] == [1, 2, 3]
    assert [r["rollout_stale_params"] for r in whole] == [0.0, 1.0, 1.0]
    assert [r["trajectories"] for r in whole] == [4.0, 4.0, 4.0]  # both processes' rollouts, gathered
    assert [without_wall_clock(r) for r in resumed] == [without_wall_clock(r) for r in whole]
    assert os.path.isdir(tmp_path / "resumed" / "checkpoints" / "2" / "rollout_params")
    # Each process builds its task files and tools in its own folder; the second encodes with a copy of
    # the tokenizer the first trained.
    second = tmp_path / "whole" / "env-process-1"
    assert (second / "tokenizer.model").read_bytes() == (tmp_path / "whole" / "tokenizer.model").read_bytes()
    assert sorted(os.listdir(second / "task")) == sorted(os.listdir(tmp_path / "whole" / "task"))


@pytest.mark.slow  # a two-process launch, stopped by a preemption notice to one host
def test_a_preemption_notice_to_one_host_saves_one_agreed_step_on_both(tmp_path):
    """SIGTERM to the second host only: jax's preemption service makes both hosts agree on a step, both
    save it (one collective checkpoint) and exit non-zero; nothing is left half-saved."""
    import signal
    import time

    workdir = tmp_path / "run"
    procs = start_processes([*RUN, "--config.total_steps=40", "--config.checkpoint.every=1000",
                             "--workdir", str(workdir)], 2, 4)
    try:
        metrics, deadline = workdir / "metrics.jsonl", time.monotonic() + TIMEOUT_S
        while not (metrics.exists() and metrics.read_text().strip()):
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, "no first step"
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGTERM)
        results = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode != 0 for p in procs), [r[1][-2000:] for r in results]
    steps = [r["step"] for r in read_metrics(str(metrics))]
    reached = steps[-1]
    assert 1 <= reached < 40 and steps == list(range(1, reached + 1))
    assert all(f"preempted: saved step {reached}" in err for _, err in results), [r[1][-2000:] for r in results]
    assert sorted(os.listdir(workdir / "checkpoints")) == [str(reached)]
    assert os.path.exists(workdir / "checkpoints" / str(reached) / "commit_success.txt")


def test_processes_started_with_different_configs_are_refused_on_every_host(tmp_path):
    """Each host reads its own command line: a host started with another learning rate trained on, its
    parameters drifting from the replica the others held. Now every process stops before the model is
    built, with one `error:` naming what differs."""
    import socket
    import subprocess
    import sys

    from tests.child_process import child_env
    from tests.training.local_cluster import REPO

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for pid, lr in enumerate(("1e-6", "0.05")):
        env = child_env(4, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(pid))
        procs.append(subprocess.Popen([sys.executable, *RUN, "--config.total_steps=1", f"--config.optim.lr={lr}",
                                       "--workdir", str(tmp_path / "run")],
                                      env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    errors = [err for _, err in stderr_of(procs, TIMEOUT_S)]
    for p, err in zip(procs, errors):
        assert p.returncode != 0
        assert "error: the processes of this run hold different config (config: process 0 " in err, err[-3000:]
    assert not (tmp_path / "run" / "checkpoints").exists() or not os.listdir(tmp_path / "run" / "checkpoints")


@pytest.mark.parametrize("failing", [0, 1])
def test_one_process_failing_ends_every_process_at_once_with_its_reason(tmp_path, failing):
    """A failure on one host (the first: it cannot write the checkpoint folder; the second: it cannot make
    its environment's folder) left the other blocked at its next barrier; the failing one then waited in
    jax's shutdown barrier, and after about 340 s the coordination service aborted both (SIGABRT), the
    healthy host printing nothing about why. Now the failure is announced: every process exits at once,
    the healthy one naming the failed process and its error (process 0, which hosts the coordination
    service, leaving last)."""
    import time

    workdir = tmp_path / "run"
    workdir.mkdir()
    blocked = "checkpoints" if failing == 0 else "env-process-1"
    (workdir / blocked).write_text("a file where a folder should be")
    start = time.monotonic()
    procs = start_processes([*RUN, "--config.total_steps=1", "--workdir", str(workdir)], 2, 4)
    errors = [err for _, err in stderr_of(procs, TIMEOUT_S)]
    healthy = 1 - failing
    assert [p.returncode for p in procs] == [1, 1], [e[-3000:] for e in errors]
    assert blocked in errors[failing] and "Error" in errors[failing], errors[failing][-3000:]
    assert (f"error: process {failing} failed: " in errors[healthy]
            and f"(process {healthy} stops too)" in errors[healthy]), errors[healthy][-3000:]
    assert "Check failure stack trace" not in errors[0] + errors[1]  # no process lost the service first
    assert time.monotonic() - start < 200  # not the 300 s shutdown barrier


SFT_RUN = ["-m", "launch.sft", "--config", "configs/aepo_tiny.py", "--config.data.num_examples=16",
           "--config.train.max_seq_len=1024", "--config.checkpoint.async_save=False",
           '--config.mesh.shape={"data": -1, "fsdp": 2, "tensor": 2}', "--config.sft.num_sequences=8",
           "--config.sft.batch_size=8", "--config.sft.steps=1", "--config.train.micro_batch_size=4",
           "--config.log.progress_bar=false", "--config.log.tensorboard=false"]


@pytest.mark.slow  # a one-process and a two-process SFT launch
def test_two_process_sft_starts_from_an_init_checkpoint_on_every_host(tmp_path):
    """`launch.sft` with `model.init_checkpoint` read the checkpoint onto `jax.devices()[0]` (no mesh),
    which on the second host is another host's device: it failed there ("does not fit the model"). Now
    the weights are read onto the trainer's mesh, and both hosts train from them."""
    first = tmp_path / "first"
    outputs(start_processes([*SFT_RUN, "--workdir", str(first)], 1, 4), TIMEOUT_S)
    second = tmp_path / "second"
    outputs(start_processes([*SFT_RUN, f"--config.model.init_checkpoint={first}", "--workdir", str(second)], 2, 4),
            TIMEOUT_S)
    assert [r["step"] for r in read_metrics(str(second / "metrics.jsonl"))] == [1]
    assert os.listdir(second / "checkpoints") == ["1"]

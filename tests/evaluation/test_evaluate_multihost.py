"""`python -m launch.evaluate` on two real processes (4 CPU devices each, `jax.distributed` on loopback).

Each process restores its shards of the parameters, copies them whole to its own
devices and samples its share of every batch of questions there; the first
process writes the outputs. Greedy decoding makes the result independent of how
the questions were split, so it must equal a one-process evaluation exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.child_process import child_env
from tests.evaluation.trained_run import OVERRIDES, REPO, STEP
from tests.training.local_cluster import outputs, result_lines, start_processes

# 5 questions in batches of 4: the second batch's single question leaves the second process without one.
QUESTIONS = ["--max_questions", "5", "--questions_per_batch", "4", "--progress=false"]


def evaluate_args(run_dir, out, *extra: str) -> list[str]:
    return ["-m", "launch.evaluate", "--config", "configs/aepo_tiny.py", "--checkpoint", str(run_dir),
            "--out", str(out), *QUESTIONS, *OVERRIDES, *extra]


def read_outputs(out) -> tuple[list[dict], list[dict], dict]:
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return samples, json.loads((out / "reports.json").read_text()), json.loads((out / "eval_config.json").read_text())


def without_traj_id(sample: dict) -> dict:
    return {key: value for key, value in sample.items() if key != "traj_id"}


def test_two_process_greedy_evaluation_equals_one_process(trained_run, tmp_path):
    run_dir, _, _ = trained_run
    greedy = ["--n", "1", "--greedy"]
    single = subprocess.run([sys.executable, *evaluate_args(run_dir, tmp_path / "one", *greedy)], check=False,
                            cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    procs = start_processes(evaluate_args(run_dir, tmp_path / "two", *greedy, "--mesh", "data=-1,tensor=2"), 2, 4)
    stdout = outputs(procs, timeout_s=400)
    assert "pass@1" in stdout[0] and "wrote" in stdout[0]  # the first process reports and writes ...
    assert "pass@1" not in stdout[1] and "wrote" not in stdout[1]  # ... the second neither
    samples, reports, meta = read_outputs(tmp_path / "two")
    want_samples, want_reports, want_meta = read_outputs(tmp_path / "one")
    assert [s["question_id"] for s in samples] == [f"heldout-{i}" for i in range(5)]
    # traj_id numbers the trajectories of one rollout call, and each process makes its own calls.
    assert [without_traj_id(s) for s in samples] == [without_traj_id(s) for s in want_samples]
    assert reports == want_reports
    assert meta["processes"] == 2 and meta["mesh"] == {"data": 4, "fsdp": 1, "tensor": 2}
    assert want_meta["processes"] == 1 and meta["step"] == want_meta["step"] == STEP
    # Each process ran its own tools, with its own copy of the run's tokenizer.
    assert (tmp_path / "two" / "env-process-1" / "tokenizer.model").read_bytes() == \
        (run_dir / "tokenizer.model").read_bytes()


def test_two_process_tree_evaluation_reports_every_question_and_its_tree(trained_run, tmp_path):
    run_dir, _, _ = trained_run
    procs = start_processes(evaluate_args(run_dir, tmp_path / "two", "--n", "2", "--strategy", "aepo"), 2, 4)
    outputs(procs, timeout_s=400)
    samples, reports, meta = read_outputs(tmp_path / "two")
    ids = [s["question_id"] for s in samples]
    assert sorted(set(ids)) == [f"heldout-{i}" for i in range(5)] and ids == sorted(ids)
    assert reports[0]["num_questions"] == 5 and meta["processes"] == 2
    tree = json.loads((tmp_path / "two" / "tree_stats.json").read_text())["all"]
    assert tree["num_prompts"] == 5 and len(tree["global_budgets"]) == 5  # both processes' rollout stats
    # Both processes' rollout counters are summed: every global trajectory's own tokens were decoded
    # (a branch shares its parent's prefix, so only the global ones are counted here).
    assert tree["decode_tokens"] >= sum(s["response_length"] for s in samples if s["is_global"]) > 0


def test_processes_that_disagree_or_fail_all_raise_instead_of_waiting():
    procs = start_processes([str(REPO / "tests" / "evaluation" / "multihost_eval_worker.py")], 2, 1)
    results = [json.loads(line.split(" ", 1)[1]) for line in result_lines(procs, timeout_s=120)]
    assert [r["part"] for r in results] == [0, 1]
    for r in results:
        assert r["same"] == "ok"
        assert r["other_prompts"].startswith("ValueError: the processes hold different questions or prompts")
        assert r["gaps"] == "RuntimeError: the processes' shares do not cover the 3 questions once each"
        # Questions in input order; rollout stats (AEPO's per-prompt budgets) in (batch, part) order.
        assert r["merged"] == ["q0", "q1", "q2", "q3"] and r["stats"] == ["b0p0", "b0p1", "b1p0", "b1p1"]
    assert results[0]["failed"] == "RuntimeError: evaluation failed on another process (process 1: " \
                                   "RuntimeError: tool server down)"
    assert results[1]["failed"] == "RuntimeError: tool server down"  # its own error, re-raised


def test_sampling_on_the_run_mesh_is_refused_on_two_processes_before_anything_starts(trained_run, tmp_path):
    run_dir, _, _ = trained_run
    procs = start_processes(evaluate_args(run_dir, tmp_path / "two", "--sampler_weights", "run_mesh"), 2, 4)
    errors = []
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        errors.append((proc.returncode, err))
    for code, err in errors:
        assert code != 0 and "rollout.sampler_weights='run_mesh') needs one process" in err
        assert "Traceback" not in err
    assert not (tmp_path / "two" / "env").exists()  # no tools started, nothing read

"""`python -m launch.evaluate` on a checkpoint written with the trainer's own code
(`tests/evaluation/trained_run.py`), and restore errors."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from aepo_jax.evaluation.restore import locate_checkpoint, restore_policy_params
from aepo_jax.parallel.mesh import make_mesh
from aepo_jax.parallel.sharding import state_shardings
from aepo_jax.training.build import model_config_from
from tests.child_process import child_env
from tests.evaluation.trained_run import OVERRIDES, REPO, STEP


def test_restore_returns_the_saved_parameters_from_any_checkpoint_path(trained_run):
    run_dir, cfg, saved = trained_run
    for path in (run_dir, run_dir / "checkpoints", run_dir / "checkpoints" / str(STEP)):
        location = locate_checkpoint(str(path))
        assert location.run_dir == str(run_dir)
        _, params, step = restore_policy_params(location, cfg, model_config_from(cfg))
        assert step == STEP
        leaves, expected = jax.tree.leaves(params), jax.tree.leaves(saved)
        assert len(leaves) == len(expected) > 0
        for got, want in zip(leaves, expected, strict=True):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_restore_reads_only_the_parameters_onto_the_mesh_whatever_the_optimiser(trained_run):
    run_dir, cfg, saved = trained_run
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    other = cfg.copy_and_resolve_references()
    other.optim.grad_clip_norm = 0.0  # another optimiser state tree: a whole-TrainState restore would not fit
    for config in (cfg, other):
        _, params, step = restore_policy_params(locate_checkpoint(str(run_dir)), config, model_config_from(config),
                                                mesh=mesh)
        assert step == STEP
        expected_shardings = jax.tree.leaves(state_shardings(params, mesh))
        leaves, expected = jax.tree.leaves(params), jax.tree.leaves(saved)
        assert len(leaves) == len(expected) == len(expected_shardings) > 0
        assert any(not leaf.sharding.is_fully_replicated for leaf in leaves)
        for got, want, sharding in zip(leaves, expected, expected_shardings, strict=True):
            assert got.sharding == sharding and got.dtype == want.dtype
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_bad_checkpoint_paths_and_mismatched_models_are_clear_errors(trained_run, tmp_path):
    run_dir, cfg, _ = trained_run
    with pytest.raises(FileNotFoundError, match="does not exist"):
        locate_checkpoint(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        locate_checkpoint(str(tmp_path / "empty"))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(NotADirectoryError):
        locate_checkpoint(str(tmp_path / "file.txt"))
    other = cfg.copy_and_resolve_references()
    other.model.vocab_size = int(cfg.model.vocab_size) + 64
    with pytest.raises(ValueError, match="does not fit the model"):
        restore_policy_params(locate_checkpoint(str(run_dir)), other, model_config_from(other))


def run_cli(*args: str, timeout: float = 240, devices: int = 1) -> subprocess.CompletedProcess:
    env = child_env(devices)
    return subprocess.run([sys.executable, "-m", "launch.evaluate", "--config", "configs/aepo_tiny.py", *args],
                          check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_cli_evaluates_a_trainer_checkpoint_and_writes_json_and_csv(trained_run, tmp_path):
    run_dir, _, _ = trained_run
    out = tmp_path / "eval"
    proc = run_cli("--checkpoint", str(run_dir), "--n", "2", "--max_questions", "2", "--questions_per_batch", "2",
                   "--out", str(out), "--progress=false", *OVERRIDES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pass@1" in proc.stdout and "synthetic_facts" in proc.stdout
    reports = json.loads((out / "reports.json").read_text())
    assert [r["dataset"] for r in reports] == ["synthetic_facts"]
    report = reports[0]
    assert set(report) == {"dataset", "num_questions", "samples_per_question", "pass_at_k", "mean_f1",
                           "tool_calls_per_question", "mean_response_length", "correctness", "math_timeouts"}
    assert report["correctness"] == "math_equiv" and report["math_timeouts"] == 0
    assert report["num_questions"] == 2 and report["samples_per_question"] == 2
    assert set(report["pass_at_k"]) == {"1", "2"}
    with open(out / "reports.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["dataset", "questions", "n", "pass@1_pct", "pass@2_pct", "f1_pct", "tool_calls", "resp_len",
                       "correct_by"]
    assert rows[1][:3] == ["synthetic_facts", "2", "2"] and rows[1][-1] == "math_equiv"
    # The CSV's numbers are the JSON's (percent), not only its labels.
    csv_values = [float(v) for v in rows[1][3:8]]
    json_values = [100 * report["pass_at_k"]["1"], 100 * report["pass_at_k"]["2"], 100 * report["mean_f1"],
                   report["tool_calls_per_question"], report["mean_response_length"]]
    np.testing.assert_allclose(csv_values, json_values, atol=0.051)  # the CSV rounds to one decimal
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and {s["question_id"] for s in samples} == {"heldout-0", "heldout-1"}
    # pass@1 in the JSON is the mean of the per-sample correctness the samples file records, pass@2 the share
    # of questions with a correct sample (n = k = 2).
    assert report["pass_at_k"]["1"] == pytest.approx(np.mean([s["correct"] for s in samples]))
    assert report["pass_at_k"]["2"] == pytest.approx(np.mean([
        any(s["correct"] for s in samples if s["question_id"] == qid) for qid in ("heldout-0", "heldout-1")]))
    assert report["mean_response_length"] == pytest.approx(np.mean([s["response_length"] for s in samples]))
    meta = json.loads((out / "eval_config.json").read_text())
    assert meta["step"] == STEP and meta["n"] == 2 and meta["temperature"] == 0.6 and meta["top_p"] == 0.95
    assert meta["split"] == "heldout" and meta["data_path"] is None
    assert meta["correctness"] == {"synthetic_facts": "math_equiv"} and meta["math_timeouts"] == 0
    assert meta["questions_per_batch"] == 2 and meta["processes"] == 1  # sampled results depend on both
    # The run's tokenizer was reused, not retrained.
    assert (out / "env" / "tokenizer.model").read_bytes() == (run_dir / "tokenizer.model").read_bytes()


def test_cli_with_a_data_path_records_no_split_and_the_rule_of_each_source(trained_run, tmp_path):
    """--data_path replaced the split, but eval_config.json still recorded split 'heldout'; a source no tag
    matched was scored by the default rule without a word; a tree strategy's pass@k had no caveat."""
    run_dir, _, _ = trained_run
    data = tmp_path / "questions.jsonl"
    rows = [{"id": "f1", "question": "How many people live in Brindle?", "answer": "42",
             "data_source": "athlete_bios"},
            {"id": "f2", "question": "How many people live in Ostwick?", "answer": "7", "data_source": "hotpot_dev"}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "eval"
    proc = run_cli("--checkpoint", str(run_dir), "--data_path", str(data), "--n", "2", "--questions_per_batch", "2",
                   "--strategy", "arpo", "--out", str(out), "--progress=false", *OVERRIDES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'athlete_bios' matches no tag" in proc.stderr and "'hotpot_dev'" not in proc.stderr
    meta = json.loads((out / "eval_config.json").read_text())
    assert meta["split"] is None and meta["data_path"] == str(data)
    assert meta["correctness"] == {"athlete_bios": "exact_match", "hotpot_dev": "exact_match"}
    reports = {r["dataset"]: r for r in json.loads((out / "reports.json").read_text())}
    assert reports["athlete_bios"]["correctness"] == "exact_match"
    assert "correct_by" in proc.stdout
    assert "note: arpo samples of a question share prefixes" in proc.stdout and (out / "tree_stats.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n", "0"], "error: --n must be >= 1 (samples per question), got --n 0"),
        (["--questions_per_batch", "-1"], "error: --questions_per_batch must be >= 0 (0 = the default), got -1"),
        (["--max_questions", "-2"], "error: --max_questions must be >= 0 (0 = the default), got -2"),
        (["--greedy", "--n", "2"], "error: --greedy needs --n 1 (greedy samples are identical), got --n 2"),
        (["--split", "train", "--data_path", "q.jsonl"],
         ("error: --data_path 'q.jsonl' replaces the config's split, so --split train would be ignored: pass one "
          "of them")),
    ],
)
def test_cli_refuses_bad_flag_values_before_starting_anything(tmp_path, args, message):
    """`--n 0` failed with a traceback after the model and tools were built."""
    proc = run_cli("--checkpoint", "none", *args, "--out", str(tmp_path / "o"), timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in proc.stderr and not (tmp_path / "o").exists()


@pytest.mark.parametrize(("rows", "message"), [
    ([], r"error: dataset file for split 'train' has no rows"),
    ([{"id": "a", "question": "q1", "answer": "x"}, {"id": "a", "question": "q2", "answer": "y"}],
     r"error: 1 question id\(s\) occur more than once, e.g. \['a'\]"),
])
def test_cli_refuses_an_empty_or_duplicated_data_file_in_one_line_before_the_model(tmp_path, rows, message):
    """Both were tracebacks; duplicates only after the model was built and the tools started."""
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    proc = run_cli("--checkpoint", "none", "--data_path", str(data), "--out", str(tmp_path / "o"), timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert re.search(message, proc.stderr.strip().splitlines()[-1]), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "o" / "reports.json").exists()


def test_cli_refuses_a_missing_checkpoint_directory_before_starting_anything(tmp_path):
    proc = run_cli("--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), timeout=120)
    assert proc.returncode != 0
    assert "does not exist" in proc.stderr and "nope" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "o").exists()


def test_cli_refuses_a_bucket_url_before_starting_anything(tmp_path):
    proc = run_cli("--checkpoint", "gs://bucket/run14b", "--out", str(tmp_path / "o"), timeout=120)
    assert proc.returncode != 0
    assert "--checkpoint 'gs://bucket/run14b' is a gs:// URL" in proc.stderr and "mount" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "o").exists()


def test_cli_refuses_a_mesh_whose_tensor_axis_cannot_split_the_models_heads(trained_run, tmp_path):
    """The tiny model's 2 key-value heads over tensor=4 were left unsplit, silently."""
    run_dir, _, _ = trained_run
    proc = run_cli("--checkpoint", str(run_dir), "--mesh", "data=2,fsdp=1,tensor=4", "--out", str(tmp_path / "o"),
                   "--progress=false", *OVERRIDES, devices=8)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: model.preset='tiny' has 4 query heads and 2 key-value heads: the mesh's tensor size 4 does not "
        "divide its 2 key-value heads, so its attention weights would not be split over tensor; set mesh.shape "
        "with tensor one of [1, 2]")

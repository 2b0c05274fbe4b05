"""A run directory rebuilds its own run: `launch.sft` on the demo config, then `launch.evaluate --checkpoint RUN`.

The SFT run uses the demo's own config (`configs/demo.py:smoke`, the demo
task, its tokenizer and its model from `config.model`) with a tiny step
count; the evaluation gets no `--config`: the run's config.json, tokenizer
and task files rebuild the environment and the model, and the checkpoint
must fit it. The process must exit cleanly (no tracebacks at exit).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.child_process import child_env

REPO = Path(__file__).resolve().parents[2]
ENV = child_env()


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=900, check=False)


def test_demo_config_sft_run_is_evaluated_from_its_run_dir_alone(tmp_path):
    run = tmp_path / "run"
    sft = _run("launch.sft", "--config", "configs/demo.py:smoke", "--workdir", str(run), "--config.sft.steps=2",
               "--config.sft.num_sequences=8", "--config.sft.batch_size=4", "--config.log.progress_bar=false",
               "--config.log.tensorboard=false")
    assert sft.returncode == 0, sft.stdout[-2000:] + sft.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]  # sft.steps, not train.total_steps
    saved = json.loads((run / "config.json").read_text())
    assert saved["train"]["total_steps"] == 2 and saved["model"]["d_model"] == 32
    assert saved["model"]["vocab_size"] > 0  # sized to the tokenizer before it was saved
    for name in ("tokenizer.model", "task/corpus.jsonl", "task/heldout.jsonl"):
        assert (run / name).stat().st_size > 0, name

    out = tmp_path / "eval"
    ev = _run("launch.evaluate", "--checkpoint", str(run), "--n", "1", "--max_questions", "2",
              "--questions_per_batch", "2", "--out", str(out), "--progress=false")
    assert ev.returncode == 0, ev.stdout[-2000:] + ev.stderr[-3000:]
    assert "Traceback" not in ev.stderr and "Event loop is closed" not in ev.stderr, ev.stderr[-3000:]
    assert "from step 2" in ev.stdout
    (report,) = json.loads((out / "reports.json").read_text())
    assert report["num_questions"] == 2 and report["dataset"] == "synthetic_facts"
    meta = json.loads((out / "eval_config.json").read_text())
    assert meta["config"]["model"]["d_model"] == 32 and meta["step"] == 2
    # The run's tokenizer was reused, not retrained from the task text.
    assert (out / "env" / "tokenizer.model").read_bytes() == (run / "tokenizer.model").read_bytes()


def test_an_unknown_reward_is_refused_before_anything_runs(tmp_path):
    """`--reward=f1` (a misspelt qa_f1) passed as a free string and failed with a KeyError after the
    first batch's rollout; it is now a flag error naming the choices."""
    done = _run("launch.evaluate", "--reward=f1", "--checkpoint", str(tmp_path / "no_run"))
    assert done.returncode != 0
    assert "--reward" in done.stderr and "qa_f1" in done.stderr and "math_equiv" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "no_run").exists()

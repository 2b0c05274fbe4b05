"""The whole demo pipeline end to end at its smallest setting (configs/demo.py:smoke),
as a script and as the Colab notebook.

Real parts throughout: generated task files, a trained SentencePiece
tokenizer, the search server process, the python sandbox, SFT and AEPO
updates, orbax checkpoints, held-out evaluation through the agent loop.
The notebook test sits in this file so that it runs after the script's
pipeline in the same test worker and reuses its compiled programs (the
persistent compilation cache of tests/conftest.py).
"""

import json
import math
import os
import sys

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "aepo_small_model.ipynb")
sys.path.insert(0, ROOT)

from configs.demo import get_config
from launch.demo import format_table, run_demo


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("demo"))
    cfg = get_config("smoke")
    lines = []
    report = run_demo(cfg, workdir, progress=False, log=lines.append)
    return workdir, report, lines


def test_report_json_has_the_promised_keys_and_fractions(smoke_report):
    workdir, _, _ = smoke_report
    with open(os.path.join(workdir, "report.json"), encoding="utf-8") as f:
        report = json.load(f)
    assert {"sft", "aepo", "seconds"} <= set(report)
    for side in ("sft", "aepo"):
        assert {"pass@1", "tool_calls", "pass@k", "entropy", "python_rate"} <= set(report[side])
        assert 0.0 <= report[side]["pass@1"] <= 1.0
        assert report[side]["pass@1"] <= report[side]["pass@k"] <= 1.0
        assert report[side]["tool_calls"] >= 0.0
    assert report["seconds"] > 0


def test_every_stage_reports_and_leaves_its_artifacts(smoke_report):
    workdir, report, lines = smoke_report
    assert [line[:5] for line in lines if line.startswith("[")] == ["[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]"]
    for name in ("tokenizer.model", "task/corpus.jsonl", "task/heldout.jsonl", "sft/metrics.jsonl",
                 "aepo/metrics.jsonl", "sft_curves.png", "aepo_curves.png"):
        assert os.path.getsize(os.path.join(workdir, name)) > 0, name
    assert os.listdir(os.path.join(workdir, "aepo", "checkpoints"))
    for stage in ("sft", "aepo"):  # each stage's run dir rebuilds its run alone (launch.evaluate --checkpoint)
        for name in ("config.json", "tokenizer.model", "task/heldout.jsonl"):
            assert os.path.getsize(os.path.join(workdir, stage, name)) > 0, (stage, name)
    table = format_table(report)
    assert "| pass@1 |" in table and not any(math.isnan(report[s]["pass@1"]) for s in ("sft", "aepo"))


def test_notebook_executes_at_smoke_size(tmp_path, monkeypatch):
    """The Colab notebook runs headless at its smallest setting, so it cannot rot."""
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("AEPO_NOTEBOOK_SIZE", "smoke")
    monkeypatch.setenv("AEPO_NOTEBOOK_WORKDIR", str(tmp_path / "run"))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": ROOT}}).execute()
    outputs = "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for out in cell.get("outputs", []))
    assert "size=smoke" in outputs
    assert "global + " in outputs and "#0 [global" in outputs  # the rollout tree was printed
    assert os.path.exists(tmp_path / "run" / "aepo" / "metrics.jsonl")


def test_an_attention_kernel_this_platform_lacks_is_refused_before_the_demo_starts(tmp_path):
    """splash is a TPU kernel: on this CPU the demo failed only at its first program."""
    import subprocess

    from tests.child_process import child_env

    out = subprocess.run([sys.executable, "-m", "launch.demo", "--config", "configs/demo.py:smoke",
                          "--config.model.attention=splash", "--workdir", str(tmp_path / "demo")],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-2] == (
        "error: model.attention='splash' runs only on tpu, but this process runs on 'cpu': "
        "set model.attention='dense' (e.g. --config.model.attention=dense)")
    assert out.stderr.strip().splitlines()[-1].startswith("  (ValueError at ")
    assert not (tmp_path / "demo").exists()  # nothing built

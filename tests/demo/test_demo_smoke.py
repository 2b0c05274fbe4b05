"""The whole demo pipeline end to end at its smallest setting (configs/demo.py:smoke).

Real parts throughout: generated task files, a trained SentencePiece
tokenizer, the search server process, the python sandbox, SFT and AEPO
updates, orbax checkpoints, held-out evaluation through the agent loop.
"""

import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

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

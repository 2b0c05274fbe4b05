"""benchmarks/packing_bench.json (cited by docs/packing.md) was run at an older commit; the current code
reproduces every count and ratio in it, only the times are that run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.packing_bench import case_layout

RECORD = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "packing_bench.json").read_text())
TIMES = {"t_flat_s", "t_tree_s", "time_ratio", "time_over_slot_ratio"}


def test_the_record_names_its_runs_commit():
    assert all(meta["commit"] == "0f19e36" for meta in RECORD["meta"])


@pytest.mark.parametrize("case", RECORD["results"], ids=lambda r: f"{r['model']}-k{r['k']}-p{r['prompt_len']}")
def test_the_current_code_reproduces_the_recorded_counts(case):
    meta = next(m for m in RECORD["meta"] if case["model"] in m["args"]["models"].split(","))
    _, _, counts = case_layout(case["model"], case["k"], case["prompt_len"], case["prompts"],
                               meta["args"]["tokens_per_micro_batch"], meta["args"]["seed"])
    recorded = {key: value for key, value in case.items() if key not in TIMES}
    assert {key: counts[key] for key in recorded} == recorded

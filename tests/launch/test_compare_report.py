"""launch.compare's table (root-credited columns, NaN where nothing branched) and its entropy-curve PNG."""

from __future__ import annotations

import json
import math

import pytest

from launch.compare import (
    COLUMNS,
    _tail_mean,
    _write,
    format_markdown,
    merge_compare,
    plot_entropy_curves,
    summarise,
)


def run(algorithm, seed, pass1, roots, curve):
    row = {key: 0.5 for key, _, _ in COLUMNS}
    row.update({"algorithm": algorithm, "seed": seed, "pass@1": pass1, "train_branch_roots": roots,
                "entropy_curve": curve})
    return row


def test_summary_and_markdown_carry_the_root_credited_columns(tmp_path):
    runs = [run("aepo", 0, 0.2, 3.0, [1.0, 0.9]), run("aepo", 1, 0.4, 5.0, [1.1, 0.7]),
            run("grpo", 0, 0.1, math.nan, [1.2, 1.0])]
    table = summarise(runs)
    assert math.isclose(table["aepo"]["pass@1"][0], 0.3) and math.isclose(table["aepo"]["pass@1"][1], 0.1)
    assert table["aepo"]["train_branch_roots"] == (4.0, 1.0)
    assert all(math.isnan(v) for v in table["grpo"]["train_branch_roots"])  # GRPO never branches
    text = format_markdown({"pass@1": 0.0, "tool_calls": 1.0, "python_rate": 0.0}, table, [0, 1])
    assert "roots with branches (train, end)" in text and "largest root's branch share" in text
    assert "| grpo |" in text and "n/a" in text.split("| grpo |")[1]
    png = plot_entropy_curves(runs, str(tmp_path / "entropy.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_parts_run_in_parallel_merge_into_one_table(tmp_path):
    from types import SimpleNamespace

    cfg = SimpleNamespace(train=SimpleNamespace(total_steps=3))
    sft = {"pass@1": 0.04, "tool_calls": 1.0, "python_rate": 0.0}
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for directory, seed, value in ((a, 0, 0.2), (b, 1, 0.4)):
        directory.mkdir()
        _write(str(directory), cfg, sft, [run("aepo", seed, value, 2.0, [1.0, math.nan])], [seed], 10.0)
    merged = merge_compare([str(a), str(b)], str(tmp_path / "out"))
    assert [r["seed"] for r in merged["runs"]] == [0, 1] and merged["seeds"] == [0, 1]
    assert math.isclose(merged["summary"]["aepo"]["pass@1"][0], 0.3)
    assert json.loads((tmp_path / "out" / "compare.json").read_text())["rl_steps"] == 3
    assert (tmp_path / "out" / "entropy_curves.png").exists()
    c.mkdir()
    _write(str(c), cfg, {**sft, "pass@1": 0.05}, [run("aepo", 2, 0.1, 2.0, [1.0])], [2], 10.0)
    with pytest.raises(ValueError, match="same SFT"):
        merge_compare([str(a), str(c)], str(tmp_path / "bad"))


def test_tail_means_skip_the_nonfinite_values_metrics_jsonl_writes_as_strings():
    records = [{"step": 1, "reward_mean": 1.0}, {"step": 2, "reward_mean": 2.0}, {"step": 3, "reward_mean": "nan"},
               {"step": 4, "reward_mean": 4.0}, {"step": 5, "reward_mean": "inf"}]
    assert _tail_mean(records, "reward_mean") == pytest.approx(7.0 / 3)
    assert math.isnan(_tail_mean([{"step": 1, "reward_mean": "nan"}], "reward_mean"))
